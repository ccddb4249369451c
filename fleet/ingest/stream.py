"""The GPU-sample ingest queue: a Redis stream between the API and the writers.

The API appends each validated batch (as MessagePack rows, see ``ingest.encode_rows``) and, in
the same round trip, takes a free drainer slot if there is one (at most ``INGEST_DRAINERS``,
each held under an owner token); taking a slot schedules a Celery ``drain_gpu_ingest`` task. A
drain reads the stream through a consumer group, up to ``INGEST_FOLD_BATCHES`` entries at a
time, writes them in one transaction (several past ``INGEST_FOLD_SAMPLES`` samples) through
``telemetry.store_gpu_batches``, then deletes and acknowledges them, and goes on until the
stream is empty or its time budget (``INGEST_DRAIN_SECONDS``, well under the broker's visibility
timeout) is spent, when it hands its slot to a fresh task. Under load the entries pile up and
the folds grow, so the cost per batch of a commit, the state upsert and the task itself falls
as the rate rises. A beat task drains too, when a slot is free: the safety net for a batch whose
drain was never scheduled (an API process that died between the two steps).

Nothing is lost and nothing is written twice:

* an entry is deleted only after its transaction committed;
* a writer killed mid-fold leaves its entries pending in the group: the same writer takes its
  own back first on its next drain, any drain takes over entries pending longer than
  ``INGEST_RECLAIM_SECONDS``, and a drain that leaves entries pending elsewhere schedules a check
  for when they become claimable;
* the batch key, claimed in the batch's transaction, makes a second write of a committed batch a
  no-op (two copies of one batch in the same fold are written once), so taking over an entry
  that was in fact still being written is safe;
* an outage of the database (anything but bad data) leaves the entries pending and retries in
  ``OUTAGE_RETRY_SECONDS``; a batch whose own data fails (undecodable, or a data or integrity
  error when written alone) moves to the dead-letter stream with its error, from where
  ``manage.py replay_dead_letters`` puts it back once the cause is fixed. If every batch of a
  fold fails alone, the fault is not theirs: they stay pending.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError

from console import counters
from console.queues import redis_client
from fleet.ingest.batches import decode_rows, encode_rows
from fleet.telemetry.store import PendingBatch, store_gpu_batches

logger = logging.getLogger(__name__)

STREAM = "goodput:ingest:gpu"
GROUP = "writers"
DEAD_LETTERS = "goodput:ingest:gpu:dead"
RECLAIM_CHECK = "goodput:ingest:reclaim-check"
SLOT_TTL_SECONDS = 60
CONSUMER_IDLE_MS = 3600 * 1000
OUTAGE_RETRY_SECONDS = 5
DEAD_LETTERS_MAX = 1000  # about 200 MB of MessagePack at 1,000 samples a batch


def slot_keys() -> list[str]:
    return [f"goodput:ingest:drainer:{n}" for n in range(settings.INGEST_DRAINERS)]


# Take the first free drainer slot (SET NX with a TTL, the owner's token as value); its index, or
# -1 when all are taken.
_TAKE_SLOT = """
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[2], 'NX', 'EX', ARGV[1]) then return i - 1 end
end
return -1
"""
_TAKE_SLOT_SHA = hashlib.sha1(_TAKE_SLOT.encode()).hexdigest()  # Redis names scripts by their SHA-1
# Refresh (ARGV[2] = TTL) or free (no ARGV[2]) a slot, only if the caller still owns it.
_OWNED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return redis.call('DEL', KEYS[1])
"""


def enqueue(*, site_id: int, key: str, samples: Sequence[Any], enqueued_at: datetime) -> None:
    """Queue a validated batch for a writer. Raises redis.RedisError (or the broker's error from
    scheduling a drain) when the queue is unavailable; the batch may then be queued or not (the
    beat's drain writes it if it is), and a retry with the same key is safe either way."""
    client = redis_client()
    entry = {"k": key, "s": site_id, "n": len(samples), "e": enqueued_at.isoformat(), "d": encode_rows(samples)}
    token, keys = secrets.token_hex(8), slot_keys()
    pipe = client.pipeline(transaction=False)
    pipe.xadd(STREAM, entry)  # type: ignore[arg-type]
    pipe.evalsha(_TAKE_SLOT_SHA, len(keys), *keys, SLOT_TTL_SECONDS, token)
    try:
        _, slot = pipe.execute()
    except redis.exceptions.NoScriptError:  # a restarted Redis: the entry is in, the script is not
        slot = _take_slot(client, token)
    if slot >= 0:
        _schedule_drain(int(slot), token)


def _take_slot(client: redis.Redis, token: str) -> int:
    return int(client.register_script(_TAKE_SLOT)(keys=slot_keys(), args=[SLOT_TTL_SECONDS, token]))


def _refresh_slot(client: redis.Redis, slot: int, token: str) -> bool:
    return bool(client.register_script(_OWNED)(keys=[slot_keys()[slot]], args=[token, SLOT_TTL_SECONDS]))


def _release_slot(client: redis.Redis, slot: int, token: str) -> None:
    client.register_script(_OWNED)(keys=[slot_keys()[slot]], args=[token])


def _schedule_drain(slot: int | None, token: str | None, *, countdown: float | None = None) -> None:
    from fleet.ingest.tasks import drain_gpu_ingest

    try:
        drain_gpu_ingest.apply_async(args=[slot, token], countdown=countdown)
    except Exception:
        if slot is not None and token is not None:  # nobody will drain for this slot: free it
            _release_slot(redis_client(), slot, token)
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


def drain(slot: int | None = None, token: str | None = None, *, consumer: str | None = None) -> int:
    """Write queued batches until the stream is empty or the time budget is spent; return the
    samples stored.

    ``slot`` and ``token``: the drainer slot the API took for this task. Without them (the beat's
    run, a reclaim check) the drain takes a free slot itself, or leaves the work to the drainer
    that holds one. Order of work: this writer's own pending entries (a fold that failed or was
    cut short), entries other writers have held for longer than INGEST_RECLAIM_SECONDS, then new
    entries.
    """
    if settings.EAGER_TASKS:
        return 0  # embedded mode has no stream: the API writes each batch itself
    client = redis_client()
    ensure_group(client)
    # No slot named (or one past a since-lowered INGEST_DRAINERS): run as the beat's drain does.
    periodic = slot is None or token is None or not 0 <= slot < len(slot_keys())
    if periodic:
        token = secrets.token_hex(8)
        slot = _take_slot(client, token)
        if slot < 0:  # a drainer is at work; it takes stranded entries over when it next starts
            _check_later_for_stranded(client)
            return 0
    assert slot is not None and token is not None
    consumer = consumer or consumer_name()
    fold = settings.INGEST_FOLD_BATCHES
    deadline = time.monotonic() + settings.INGEST_DRAIN_SECONDS
    owned, stored = True, 0
    try:
        entries = _own_pending(client, consumer, fold) or _reclaim(client, consumer, fold)
        while True:
            if not entries:
                entries = _read_new(client, consumer, fold)
            if not entries and owned:
                # Free the slot, then look once more: a batch queued while we were finishing saw
                # the slot taken and scheduled nobody, so it is ours.
                _release_slot(client, slot, token)
                owned = False
                entries = _read_new(client, consumer, fold)
            if not entries:
                break
            stored += _write(client, entries)
            entries = []
            if owned:
                owned = _refresh_slot(client, slot, token)
            if time.monotonic() > deadline:
                # Hand over to a fresh task before the broker thinks this one is lost.
                if owned:
                    owned = False
                    _schedule_drain(slot, token)
                else:
                    _schedule_drain(None, None)
                break
    except Exception as exc:
        if not is_outage(exc):
            raise
        counters.increment("goodput_ingest_write_failures_total", reason="outage")
        logger.warning("ingest writer: the database is unavailable (%s); retrying in %d s", exc, OUTAGE_RETRY_SECONDS)
        if owned:  # keep the slot: the retry is this drainer's
            owned = False
            _refresh_slot(client, slot, token)
            _schedule_drain(slot, token, countdown=OUTAGE_RETRY_SECONDS)
        else:
            _schedule_drain(None, None, countdown=OUTAGE_RETRY_SECONDS)
        return stored
    finally:
        if owned:
            _release_slot(client, slot, token)
    _check_later_for_stranded(client)
    if periodic:  # the beat's run also tidies the group
        _forget_idle_consumers(client)
    return stored


def oldest_waiting_seconds() -> float | None:
    """How long the oldest GPU batch still waiting for a writer has waited (None: none waits).

    Entries leave the stream once written, so its first entry is the oldest unwritten batch. An
    entry's id is the Redis server's clock in milliseconds when it was added, and the age is taken
    on that clock too, so clock skew between hosts cannot fake a backlog. Raises redis.RedisError
    when the broker cannot be reached."""
    pipe = redis_client().pipeline(transaction=False)
    pipe.xrange(STREAM, count=1)
    pipe.time()
    first, (seconds, micros) = pipe.execute()
    if not first:
        return None
    millis = int(first[0][0].split(b"-", 1)[0])
    return max(0.0, seconds + micros / 1e6 - millis / 1000)


def is_outage(exc: BaseException) -> bool:
    """A database failure that is not the batch's own data (connection lost, read-only, deadlock,
    timeout, schema mismatch): retry later rather than give up on the batch."""
    if isinstance(exc, (DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError)):
        return False
    return isinstance(exc, (DatabaseError, psycopg.Error))


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


def _sample_count(fields: dict[bytes, bytes] | None) -> int:
    try:
        return int(fields[b"n"]) if fields else 0
    except (KeyError, ValueError):
        return 0  # a malformed entry: decoding it will send it to the dead letters


def _write(client: redis.Redis, entries: list[tuple[bytes, Any]]) -> int:
    """Write what one read took off the stream, in folds of at most INGEST_FOLD_SAMPLES samples."""
    limit = settings.INGEST_FOLD_SAMPLES
    stored, fold, size = 0, [], 0
    for entry in entries:
        samples = _sample_count(entry[1])
        if fold and size + samples > limit:
            stored += _write_fold(client, fold)
            fold, size = [], 0
        fold.append(entry)
        size += samples
    return stored + _write_fold(client, fold)


def _write_fold(client: redis.Redis, entries: list[tuple[bytes, Any]]) -> int:
    """Write a fold; delete and acknowledge its entries once committed.

    An outage of the database propagates (the entries stay pending). Any other failure of a fold
    is retried batch by batch, so one bad batch cannot hold back the rest.
    """
    fields_of = dict(entries)
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
    try:
        stored = store_gpu_batches([b for _, b in batches])
    except Exception as exc:
        _acknowledge(client, done)
        if is_outage(exc):
            raise
        if len(batches) == 1:  # it failed alone: its own data
            entry_id, batch = batches[0]
            logger.error("ingest batch %s failed", batch.key, exc_info=exc)
            _dead_letter(client, entry_id, fields_of[entry_id], exc)
            _acknowledge(client, [entry_id])
            return 0
        return _write_one_by_one(client, batches, fields_of, exc)
    _acknowledge(client, done + [entry_id for entry_id, _ in batches])
    return stored


def _write_one_by_one(
    client: redis.Redis, batches: list[tuple[bytes, PendingBatch]], fields_of: dict[bytes, Any], fold_error: Exception
) -> int:
    """A fold failed: write its batches one at a time and dead-letter those that fail alone. If
    every one fails, the fault is not theirs (a bug, a schema mismatch): leave them pending."""
    stored, failed = 0, []
    for entry_id, batch in batches:
        try:
            written = store_gpu_batches([batch])
        except Exception as exc:
            if is_outage(exc):
                raise
            failed.append((entry_id, batch, exc))
            continue
        _acknowledge(client, [entry_id])
        stored += written
    if len(failed) == len(batches):
        raise fold_error
    for entry_id, batch, exc in failed:
        logger.error("ingest batch %s failed on its own", batch.key, exc_info=exc)
        _dead_letter(client, entry_id, fields_of[entry_id], exc)
        _acknowledge(client, [entry_id])
    return stored


def _acknowledge(client: redis.Redis, entry_ids: list[bytes]) -> None:
    """Delete, then acknowledge, in one MULTI: an entry is never left acknowledged but still
    counted in the stream (a pending entry without data is skipped on its next read)."""
    if entry_ids:
        pipe = client.pipeline(transaction=True)
        pipe.xdel(STREAM, *entry_ids)
        pipe.xack(STREAM, GROUP, *entry_ids)
        pipe.execute()


def _dead_letter(client: redis.Redis, entry_id: bytes, fields: dict[bytes, bytes], exc: Exception) -> None:
    error = f"{exc.__class__.__name__}: {exc}"
    client.xadd(
        DEAD_LETTERS, {**fields, b"error": error[:1000], b"entry": entry_id}, maxlen=DEAD_LETTERS_MAX, approximate=True
    )
    counters.increment("goodput_ingest_dead_letters_total")
    logger.error("ingest entry %s moved to %s: %s", entry_id.decode(), DEAD_LETTERS, error)


_DEAD_FIELDS = {"key": b"k", "site": b"s", "samples": b"n", "error": b"error"}


def dead_letters(count: int = 100) -> list[tuple[str, dict[str, str]]]:
    """The oldest dead letters: (entry id, {key, site, samples, error})."""
    rows = redis_client().xrange(DEAD_LETTERS, count=count)
    return [
        (
            entry_id.decode(),
            {name: fields.get(field, b"").decode(errors="replace") for name, field in _DEAD_FIELDS.items()},
        )
        for entry_id, fields in rows
    ]


def replay_dead_letters(count: int | None = None) -> int:
    """Put dead letters back on the stream (once their cause is fixed) and schedule a drain.
    Their batch keys still guard against writing any of them twice."""
    client = redis_client()
    moved = 0
    while count is None or moved < count:
        page = client.xrange(DEAD_LETTERS, count=min(100, count - moved) if count is not None else 100)
        if not page:
            break
        for entry_id, fields in page:
            original = {k: v for k, v in fields.items() if k not in (b"error", b"entry")}
            pipe = client.pipeline(transaction=True)
            pipe.xadd(STREAM, original)  # type: ignore[arg-type]
            pipe.xdel(DEAD_LETTERS, entry_id)
            pipe.execute()
            moved += 1
    if moved:
        _schedule_drain(None, None)
    return moved


def _check_later_for_stranded(client: redis.Redis) -> None:
    """If entries are still pending with other consumers (a writer that died, or one still at
    work), make sure a drain runs once they can be taken over."""
    pending = client.xpending(STREAM, GROUP)
    if not pending or not pending.get("pending"):
        return
    if client.set(RECLAIM_CHECK, "1", nx=True, ex=settings.INGEST_RECLAIM_SECONDS):
        _schedule_drain(None, None, countdown=settings.INGEST_RECLAIM_SECONDS + 0.5)
