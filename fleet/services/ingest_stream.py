"""The GPU-sample ingest queue: a Redis stream between the API and the writers.

The API appends each validated batch (as MessagePack rows, see ``ingest.encode_rows``) and, in
the same round trip, takes a free drainer slot if there is one; taking a slot schedules a Celery
``drain_gpu_ingest`` task. A drain reads the stream through a consumer group, up to
``INGEST_FOLD_BATCHES`` entries at a time, writes them in one transaction (or several, past
``INGEST_FOLD_SAMPLES`` samples)
(``telemetry.store_gpu_batches``), then acknowledges and deletes them, and goes on until the
stream is empty. Under load the entries pile up and the folds grow, so the cost per batch of a
commit, the state upsert and the task itself falls as the rate rises.

Nothing is lost and nothing is written twice:

* an entry is deleted only after its transaction committed;
* a writer killed mid-fold leaves its entries pending in the group: the same process takes its
  own back first on its next drain, any drain takes over entries pending longer than
  ``INGEST_RECLAIM_SECONDS``, and a drain that leaves entries pending elsewhere schedules a check
  for when they become claimable;
* the batch key, claimed in the batch's transaction, makes a second write of a committed batch a
  no-op, so taking over an entry that was in fact still being written is safe;
* an entry that fails on its own (not an outage of the database) moves to a dead-letter stream
  with its error instead of blocking the queue behind it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError

from console import counters
from console.queues import redis_client
from fleet.services.ingest import decode_rows, encode_rows
from fleet.services.telemetry import PendingBatch, store_gpu_batches

logger = logging.getLogger(__name__)

STREAM = "goodput:ingest:gpu"
GROUP = "writers"
DEAD_LETTERS = "goodput:ingest:gpu:dead"
RECLAIM_CHECK = "goodput:ingest:reclaim-check"
SLOT_TTL_SECONDS = 60
CONSUMER_IDLE_MS = 3600 * 1000


def slot_keys() -> list[str]:
    return [f"goodput:ingest:drainer:{n}" for n in range(settings.INGEST_DRAINERS)]


# Take the first free drainer slot (SET NX with a TTL); its index, or -1 when all are taken.
_TAKE_SLOT = """
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ARGV[1]) then return i - 1 end
end
return -1
"""
_TAKE_SLOT_SHA = hashlib.sha1(_TAKE_SLOT.encode()).hexdigest()  # Redis names scripts by their SHA-1


def enqueue(*, site_id: int, key: str, samples: Sequence[Any], enqueued_at: datetime) -> None:
    """Queue a validated batch for a writer. Raises redis.RedisError (or the broker's error from
    scheduling a drain) when the queue is unavailable; the batch may then be queued or not, and a
    retry with the same key is safe either way."""
    client = redis_client()
    entry = {"k": key, "s": site_id, "n": len(samples), "e": enqueued_at.isoformat(), "d": encode_rows(samples)}
    keys = slot_keys()
    pipe = client.pipeline(transaction=False)
    pipe.xadd(STREAM, entry)  # type: ignore[arg-type]
    pipe.evalsha(_TAKE_SLOT_SHA, len(keys), *keys, SLOT_TTL_SECONDS)
    try:
        _, slot = pipe.execute()
    except redis.exceptions.NoScriptError:  # a restarted Redis: the entry is in, the script is not
        client.script_load(_TAKE_SLOT)
        slot = client.evalsha(_TAKE_SLOT_SHA, len(keys), *keys, SLOT_TTL_SECONDS)
    if slot >= 0:
        _schedule_drain(int(slot))


def _schedule_drain(slot: int | None, *, countdown: float | None = None) -> None:
    from fleet.tasks import drain_gpu_ingest

    try:
        drain_gpu_ingest.apply_async(args=[slot], countdown=countdown)
    except Exception:
        if slot is not None:  # nobody will drain for this slot: free it for the next batch
            redis_client().delete(slot_keys()[slot])
        raise


def consumer_name() -> str:
    """This writer in the consumer group: host, process and thread (a threads pool runs several)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


def ensure_group(client: redis.Redis) -> None:
    try:
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def drain(slot: int | None = None, *, consumer: str | None = None) -> int:
    """Write queued batches until the stream is empty; return the samples stored.

    Order of work: this process's own pending entries (a fold that failed or was cut short),
    entries other writers have held for longer than INGEST_RECLAIM_SECONDS, then new entries.
    """
    if settings.EAGER_TASKS:
        return 0  # embedded mode has no stream: the API writes each batch itself
    client = redis_client()
    consumer = consumer or consumer_name()
    slot_key = slot_keys()[slot] if slot is not None and slot < settings.INGEST_DRAINERS else None
    fold = settings.INGEST_FOLD_BATCHES
    ensure_group(client)
    stored = 0
    try:
        entries = _own_pending(client, consumer, fold) or _reclaim(client, consumer, fold)
        while True:
            if not entries:
                entries = _read_new(client, consumer, fold)
            if not entries and slot_key:
                # Free the slot, then look once more: a batch queued while we were finishing saw
                # the slot taken and scheduled nobody, so it is ours.
                client.delete(slot_key)
                slot_key = None
                entries = _read_new(client, consumer, fold)
            if not entries:
                break
            stored += _write(client, entries)
            entries = []
            if slot_key:
                client.expire(slot_key, SLOT_TTL_SECONDS)
    finally:
        if slot_key:
            client.delete(slot_key)
    _check_later_for_stranded(client)
    if slot is None:  # the periodic run (beat) also tidies the group
        _forget_idle_consumers(client)
    return stored


def _forget_idle_consumers(client: redis.Redis) -> None:
    """Drop consumers that hold nothing and have not read for an hour (writers that are gone)."""
    for consumer in client.xinfo_consumers(STREAM, GROUP):
        if not consumer["pending"] and consumer["idle"] > CONSUMER_IDLE_MS:
            client.xgroup_delconsumer(STREAM, GROUP, consumer["name"])


def _own_pending(client: redis.Redis, consumer: str, count: int) -> list[tuple[bytes, Any]]:
    response = client.xreadgroup(GROUP, consumer, {STREAM: "0"}, count=count)
    return list(response[0][1]) if response else []


def _reclaim(client: redis.Redis, consumer: str, count: int) -> list[tuple[bytes, Any]]:
    idle_ms = settings.INGEST_RECLAIM_SECONDS * 1000
    _, claimed, *_ = client.xautoclaim(STREAM, GROUP, consumer, min_idle_time=idle_ms, start_id="0-0", count=count)
    if claimed:
        logger.warning("took over %d ingest batch(es) a writer left pending", len(claimed))
    return list(claimed)


def _read_new(client: redis.Redis, consumer: str, count: int) -> list[tuple[bytes, Any]]:
    try:
        response = client.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=count)
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        ensure_group(client)  # the stream was deleted (a flushed Redis) and came back
        response = client.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=count)
    return list(response[0][1]) if response else []


def _batch(fields: dict[bytes, bytes]) -> PendingBatch:
    return PendingBatch(
        site_id=int(fields[b"s"]),
        key=fields[b"k"].decode(),
        samples=decode_rows(fields[b"d"]),
        enqueued_at=datetime.fromisoformat(fields[b"e"].decode()),
    )


def _write(client: redis.Redis, entries: list[tuple[bytes, Any]]) -> int:
    """Write what one read took off the stream, in folds of at most INGEST_FOLD_SAMPLES samples."""
    limit = settings.INGEST_FOLD_SAMPLES
    stored, fold, size = 0, [], 0
    for entry in entries:
        samples = int(entry[1].get(b"n", 0)) if entry[1] else 0
        if fold and size + samples > limit:
            stored += _write_fold(client, fold)
            fold, size = [], 0
        fold.append(entry)
        size += samples
    return stored + _write_fold(client, fold)


def _write_fold(client: redis.Redis, entries: list[tuple[bytes, Any]]) -> int:
    """Write a fold; acknowledge and delete its entries once committed.

    An outage of the database propagates (the entries stay pending for a later drain). Any other
    failure of a fold is retried batch by batch, so one bad batch cannot hold back the rest; a
    batch that fails alone goes to the dead-letter stream.
    """
    done: list[bytes] = []
    batches: list[tuple[bytes, PendingBatch]] = []
    for entry_id, fields in entries:
        if fields is None:  # deleted while pending: nothing left to write
            done.append(entry_id)
            continue
        try:
            batches.append((entry_id, _batch(fields)))
        except Exception as exc:  # anything undecodable is a dead letter, never a retry loop
            _dead_letter(client, entry_id, fields, exc)
            done.append(entry_id)
    stored = 0
    try:
        stored = store_gpu_batches([b for _, b in batches])
        done += [entry_id for entry_id, _ in batches]
    except (OperationalError, InterfaceError):
        _acknowledge(client, done)
        raise
    except Exception as exc:
        if len(batches) == 1:
            entry_id, batch = batches[0]
            logger.exception("ingest batch %s failed", batch.key)
            _dead_letter(client, entry_id, dict(entries)[entry_id], exc)
            done.append(entry_id)
        else:
            _acknowledge(client, done)
            return sum(_write_fold(client, [(entry_id, dict(entries)[entry_id])]) for entry_id, _ in batches)
    _acknowledge(client, done)
    counters.increment("goodput_ingest_samples_stored_total", stored)
    return stored


def _acknowledge(client: redis.Redis, entry_ids: list[bytes]) -> None:
    if entry_ids:
        pipe = client.pipeline(transaction=False)
        pipe.xack(STREAM, GROUP, *entry_ids)
        pipe.xdel(STREAM, *entry_ids)
        pipe.execute()


def _dead_letter(client: redis.Redis, entry_id: bytes, fields: dict[bytes, bytes], exc: Exception) -> None:
    error = f"{exc.__class__.__name__}: {exc}"
    client.xadd(DEAD_LETTERS, {**fields, b"error": error[:1000], b"entry": entry_id}, maxlen=10_000, approximate=True)
    counters.increment("goodput_ingest_dead_letters_total")
    logger.error("ingest entry %s moved to %s: %s", entry_id.decode(), DEAD_LETTERS, error)


def _check_later_for_stranded(client: redis.Redis) -> None:
    """If entries are still pending with other consumers (a writer that died, or one still at
    work), make sure a drain runs once they can be taken over."""
    pending = client.xpending(STREAM, GROUP)
    if not pending or not pending.get("pending"):
        return
    if client.set(RECLAIM_CHECK, "1", nx=True, ex=settings.INGEST_RECLAIM_SECONDS):
        _schedule_drain(None, countdown=settings.INGEST_RECLAIM_SECONDS + 0.5)
