"""The ingest queues: Redis streams between the API and the writers, one *lane* each (GPU sample
batches here; Prometheus pushes, fleet.ingest.push_queue).

The API appends each validated batch (GPU samples as binary COPY rows of registered GPUs, see
``telemetry.copyrows``, or as MessagePack samples to register, ``ingest.encode_rows``; a push as
the door parsed it) and, in the same round trip, takes a free drainer slot of its lane
if there is one (at most ``INGEST_DRAINERS`` a lane, each held under an owner token); taking a
slot schedules the lane's Celery drain task. A drain reads the stream through a consumer group,
up to ``INGEST_FOLD_BATCHES`` entries at a time, writes them together through the lane's
``store`` (GPU batches in one transaction through ``telemetry.store_gpu_batches``; several past
``INGEST_FOLD_SAMPLES`` samples), then deletes and acknowledges them, and goes on until the
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
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError

from console import counters
from console.queues import redis_client
from fleet.ingest.batches import decode_rows, encode_rows
from fleet.telemetry import copyrows
from fleet.telemetry.store import PendingBatch, store_gpu_batches

logger = logging.getLogger(__name__)

GROUP = "writers"
SLOT_TTL_SECONDS = 60
CONSUMER_IDLE_MS = 3600 * 1000
OUTAGE_RETRY_SECONDS = 5
DEAD_LETTERS_MAX = 1000  # about 200 MB of MessagePack at 1,000 samples a batch


@dataclass(frozen=True)
class Lane:
    """One stream of queued batches and the drainers that write it.

    ``decode`` turns an entry's fields into a batch (raising on anything undecodable: a dead
    letter), ``store`` writes a fold of batches and returns what it stored (raising an outage to
    keep them pending, anything else to have them retried one by one), ``label`` names a batch in
    the log. ``task`` is the Celery task (in fleet.ingest.tasks) that runs ``drain`` for it."""

    name: str
    stream: str
    dead_letters: str
    reclaim_check: str
    slot_prefix: str
    task: str
    decode: Callable[[dict[bytes, bytes]], Any]
    store: Callable[[list[Any]], int]
    label: Callable[[Any], str]

    def slot_keys(self) -> list[str]:
        return [f"{self.slot_prefix}:{n}" for n in range(settings.INGEST_DRAINERS)]


def _gpu_batch(fields: dict[bytes, bytes]) -> PendingBatch:
    site_id, key = int(fields[b"s"]), fields[b"k"].decode()
    enqueued_at = datetime.fromisoformat(fields[b"e"].decode())
    if b"r" in fields:  # formatted rows of registered GPUs (telemetry.copyrows)
        return PendingBatch(site_id, key, enqueued_at=enqueued_at, rows=copyrows.decode(fields[b"r"], fields[b"i"]))
    return PendingBatch(site_id, key, decode_rows(fields[b"d"]), enqueued_at)


GPU = Lane(
    name="gpu",
    stream="goodput:ingest:gpu",
    dead_letters="goodput:ingest:gpu:dead",
    reclaim_check="goodput:ingest:reclaim-check",
    slot_prefix="goodput:ingest:drainer",
    task="drain_gpu_ingest",
    decode=_gpu_batch,
    store=lambda batches: store_gpu_batches(batches),  # looked up at each call (tests patch it)
    label=lambda batch: batch.key,
)
STREAM, DEAD_LETTERS, RECLAIM_CHECK = GPU.stream, GPU.dead_letters, GPU.reclaim_check


def slot_keys(lane: Lane = GPU) -> list[str]:
    return lane.slot_keys()


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


_tokens = itertools.count()


def owner_token() -> str:
    """A token naming one slot holder: unique among every process's holders (host, process,
    a count), which is all a slot asks of it. Not a secret: no one gains by guessing it, so
    reading the system's randomness on every request bought nothing."""
    return f"{socket.gethostname()}:{os.getpid()}:{next(_tokens)}"


def enqueue(
    *,
    site_id: int,
    key: str,
    samples: Sequence[Any],
    enqueued_at: datetime,
    gpus: Mapping[str, tuple[int, int]] | None = None,
) -> None:
    """Queue a validated GPU batch for a writer (see ``add``): as COPY rows when ``gpus`` (uuid ->
    (id, site), the door's lookup) holds every GPU it names, otherwise as samples to register."""
    entry: dict[str, Any] = {"k": key, "s": site_id, "n": len(samples), "e": enqueued_at.isoformat()}
    rows = copyrows.format_registered(samples, gpus) if gpus else None
    if rows is not None:
        entry["r"], entry["i"] = rows.data, copyrows.encode_index(rows.index)
    else:
        entry["d"] = encode_rows(samples)
    add(GPU, entry)


def add(lane: Lane, entry: dict[str, Any]) -> None:
    """Queue an entry on the lane's stream and, in the same round trip, take a free drainer slot
    (scheduling a drain for it). Raises redis.RedisError (or the broker's error from scheduling a
    drain) when the queue is unavailable; the entry may then be queued or not (the beat's drain
    writes it if it is), and a retry with the same key is safe either way."""
    client = redis_client()
    token, keys = owner_token(), lane.slot_keys()
    pipe = client.pipeline(transaction=False)
    pipe.xadd(lane.stream, entry)  # type: ignore[arg-type]
    pipe.evalsha(_TAKE_SLOT_SHA, len(keys), *keys, SLOT_TTL_SECONDS, token)
    try:
        _, slot = pipe.execute()
    except redis.exceptions.NoScriptError:  # a restarted Redis: the entry is in, the script is not
        slot = _take_slot(lane, client, token)
    if slot >= 0:
        _schedule_drain(lane, int(slot), token)


def _take_slot(lane: Lane, client: redis.Redis, token: str) -> int:
    return int(client.register_script(_TAKE_SLOT)(keys=lane.slot_keys(), args=[SLOT_TTL_SECONDS, token]))


def _refresh_slot(lane: Lane, client: redis.Redis, slot: int, token: str) -> bool:
    return bool(client.register_script(_OWNED)(keys=[lane.slot_keys()[slot]], args=[token, SLOT_TTL_SECONDS]))


def _release_slot(lane: Lane, client: redis.Redis, slot: int, token: str) -> None:
    client.register_script(_OWNED)(keys=[lane.slot_keys()[slot]], args=[token])


def _schedule_drain(lane: Lane, slot: int | None, token: str | None, *, countdown: float | None = None) -> None:
    from fleet.ingest import tasks

    try:
        getattr(tasks, lane.task).apply_async(args=[slot, token], countdown=countdown)
    except Exception:
        if slot is not None and token is not None:  # nobody will drain for this slot: free it
            _release_slot(lane, redis_client(), slot, token)
        raise


def consumer_name() -> str:
    """This writer in the consumer group: host, process and thread (a threads pool runs several)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


def ensure_group(client: redis.Redis, lane: Lane = GPU) -> None:
    try:
        client.xgroup_create(lane.stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def drain(slot: int | None = None, token: str | None = None, *, consumer: str | None = None, lane: Lane = GPU) -> int:
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
    ensure_group(client, lane)
    # No slot named (or one past a since-lowered INGEST_DRAINERS): run as the beat's drain does.
    periodic = slot is None or token is None or not 0 <= slot < len(lane.slot_keys())
    if periodic:
        token = owner_token()
        slot = _take_slot(lane, client, token)
        if slot < 0:  # a drainer is at work; it takes stranded entries over when it next starts
            _check_later_for_stranded(lane, client)
            return 0
    assert slot is not None and token is not None
    consumer = consumer or consumer_name()
    fold = settings.INGEST_FOLD_BATCHES
    deadline = time.monotonic() + settings.INGEST_DRAIN_SECONDS
    owned, stored = True, 0
    try:
        entries = _own_pending(lane, client, consumer, fold) or _reclaim(lane, client, consumer, fold)
        while True:
            if not entries:
                entries = _read_fold(lane, client, consumer, fold)
            if not entries and owned:
                # Free the slot, then look once more: a batch queued while we were finishing saw
                # the slot taken and scheduled nobody, so it is ours.
                _release_slot(lane, client, slot, token)
                owned = False
                entries = _read_new(lane, client, consumer, fold)
            if not entries:
                break
            stored += _write(lane, client, entries)
            entries = []
            if owned:
                owned = _refresh_slot(lane, client, slot, token)
            if time.monotonic() > deadline:
                # Hand over to a fresh task before the broker thinks this one is lost.
                if owned:
                    owned = False
                    _schedule_drain(lane, slot, token)
                else:
                    _schedule_drain(lane, None, None)
                break
    except Exception as exc:
        if not is_outage(exc):
            raise
        counters.increment("goodput_ingest_write_failures_total", reason="outage")
        logger.warning(
            "%s ingest writer: the database is unavailable (%s); retrying in %d s", lane.name, exc, OUTAGE_RETRY_SECONDS
        )
        if owned:  # keep the slot: the retry is this drainer's
            owned = False
            _refresh_slot(lane, client, slot, token)
            _schedule_drain(lane, slot, token, countdown=OUTAGE_RETRY_SECONDS)
        else:
            _schedule_drain(lane, None, None, countdown=OUTAGE_RETRY_SECONDS)
        return stored
    finally:
        if owned:
            _release_slot(lane, client, slot, token)
    _check_later_for_stranded(lane, client)
    if periodic:  # the beat's run also tidies the group
        _forget_idle_consumers(lane, client)
    return stored


def oldest_waiting_seconds(lanes: Sequence[Lane] | None = None) -> float | None:
    """How long the oldest batch still waiting for a writer has waited, over the lanes (every
    registered one by default; None: none waits).

    Entries leave a stream once written, so its first entry is the oldest unwritten batch. An
    entry's id is the Redis server's clock in milliseconds when it was added, and the age is taken
    on that clock too, so clock skew between hosts cannot fake a backlog. Raises redis.RedisError
    when the broker cannot be reached."""
    lanes = LANES if lanes is None else lanes
    pipe = redis_client().pipeline(transaction=False)
    for lane in lanes:
        pipe.xrange(lane.stream, count=1)
    pipe.time()
    *firsts, (seconds, micros) = pipe.execute()
    ages = [max(0.0, seconds + micros / 1e6 - int(first[0][0].split(b"-", 1)[0]) / 1000) for first in firsts if first]
    return max(ages) if ages else None


def is_outage(exc: BaseException) -> bool:
    """A database failure that is not the batch's own data (connection lost, read-only, deadlock,
    timeout, schema mismatch): retry later rather than give up on the batch."""
    if isinstance(exc, (DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError)):
        return False
    return isinstance(exc, (DatabaseError, psycopg.Error))


def _forget_idle_consumers(lane: Lane, client: redis.Redis) -> None:
    """Drop consumers that hold nothing and have not read for an hour (writers that are gone)."""
    for consumer in client.xinfo_consumers(lane.stream, GROUP):
        if not consumer["pending"] and consumer["idle"] > CONSUMER_IDLE_MS:
            client.xgroup_delconsumer(lane.stream, GROUP, consumer["name"])


def _own_pending(lane: Lane, client: redis.Redis, consumer: str, count: int) -> list[tuple[bytes, Any]]:
    response = client.xreadgroup(GROUP, consumer, {lane.stream: "0"}, count=count)
    return list(response[0][1]) if response else []


def _reclaim(lane: Lane, client: redis.Redis, consumer: str, count: int) -> list[tuple[bytes, Any]]:
    idle_ms = settings.INGEST_RECLAIM_SECONDS * 1000
    _, claimed, *_ = client.xautoclaim(lane.stream, GROUP, consumer, min_idle_time=idle_ms, start_id="0-0", count=count)
    if claimed:
        logger.warning("took over %d %s ingest batch(es) a writer left pending", len(claimed), lane.name)
    return list(claimed)


def _read_new(lane: Lane, client: redis.Redis, consumer: str, count: int) -> list[tuple[bytes, Any]]:
    try:
        response = client.xreadgroup(GROUP, consumer, {lane.stream: ">"}, count=count)
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        ensure_group(client, lane)  # the stream was deleted (a flushed Redis) and came back
        response = client.xreadgroup(GROUP, consumer, {lane.stream: ">"}, count=count)
    return list(response[0][1]) if response else []


def _read_fold(lane: Lane, client: redis.Redis, consumer: str, fold: int) -> list[tuple[bytes, Any]]:
    """New entries for a fold. A short read waits ``INGEST_FOLD_WAIT_MS`` once and takes what
    came meanwhile: a writer that keeps up would otherwise commit every few batches, and each
    commit costs the database a state upsert of every GPU in it, whatever the fold's size."""
    entries = _read_new(lane, client, consumer, fold)
    if entries and len(entries) < fold and settings.INGEST_FOLD_WAIT_MS:
        time.sleep(settings.INGEST_FOLD_WAIT_MS / 1000)
        entries += _read_new(lane, client, consumer, fold - len(entries))
    return entries


def _sample_count(fields: dict[bytes, bytes] | None) -> int:
    try:
        return int(fields[b"n"]) if fields else 0
    except (KeyError, ValueError):
        return 0  # a malformed entry: decoding it will send it to the dead letters


def _write(lane: Lane, client: redis.Redis, entries: list[tuple[bytes, Any]]) -> int:
    """Write what one read took off the stream, in folds of at most INGEST_FOLD_SAMPLES samples."""
    limit = settings.INGEST_FOLD_SAMPLES
    stored, fold, size = 0, [], 0
    for entry in entries:
        samples = _sample_count(entry[1])
        if fold and size + samples > limit:
            stored += _write_fold(lane, client, fold)
            fold, size = [], 0
        fold.append(entry)
        size += samples
    return stored + _write_fold(lane, client, fold)


def _write_fold(lane: Lane, client: redis.Redis, entries: list[tuple[bytes, Any]]) -> int:
    """Write a fold; delete and acknowledge its entries once committed.

    An outage of the database propagates (the entries stay pending). Any other failure of a fold
    is retried batch by batch, so one bad batch cannot hold back the rest.
    """
    fields_of = dict(entries)
    done: list[bytes] = []
    batches: list[tuple[bytes, Any]] = []
    for entry_id, fields in entries:
        if fields is None:  # deleted while pending: nothing left to write
            done.append(entry_id)
            continue
        try:
            batches.append((entry_id, lane.decode(fields)))
        except Exception as exc:  # anything undecodable is a dead letter, never a retry loop
            _dead_letter(lane, client, entry_id, fields, exc)
            done.append(entry_id)
    try:
        stored = lane.store([b for _, b in batches]) if batches else 0
    except Exception as exc:
        _acknowledge(lane, client, done)
        if is_outage(exc):
            raise
        if len(batches) == 1:  # it failed alone: its own data
            entry_id, batch = batches[0]
            logger.error("%s ingest batch %s failed", lane.name, lane.label(batch), exc_info=exc)
            _dead_letter(lane, client, entry_id, fields_of[entry_id], exc)
            _acknowledge(lane, client, [entry_id])
            return 0
        return _write_one_by_one(lane, client, batches, fields_of, exc)
    _acknowledge(lane, client, done + [entry_id for entry_id, _ in batches])
    return stored


def _write_one_by_one(
    lane: Lane,
    client: redis.Redis,
    batches: list[tuple[bytes, Any]],
    fields_of: dict[bytes, Any],
    fold_error: Exception,
) -> int:
    """A fold failed: write its batches one at a time and dead-letter those that fail alone. If
    every one fails, the fault is not theirs (a bug, a schema mismatch): leave them pending."""
    stored, failed = 0, []
    for entry_id, batch in batches:
        try:
            written = lane.store([batch])
        except Exception as exc:
            if is_outage(exc):
                raise
            failed.append((entry_id, batch, exc))
            continue
        _acknowledge(lane, client, [entry_id])
        stored += written
    if len(failed) == len(batches):
        raise fold_error
    for entry_id, batch, exc in failed:
        logger.error("%s ingest batch %s failed on its own", lane.name, lane.label(batch), exc_info=exc)
        _dead_letter(lane, client, entry_id, fields_of[entry_id], exc)
        _acknowledge(lane, client, [entry_id])
    return stored


def _acknowledge(lane: Lane, client: redis.Redis, entry_ids: list[bytes]) -> None:
    """Delete, then acknowledge, in one MULTI: an entry is never left acknowledged but still
    counted in the stream (a pending entry without data is skipped on its next read)."""
    if entry_ids:
        pipe = client.pipeline(transaction=True)
        pipe.xdel(lane.stream, *entry_ids)
        pipe.xack(lane.stream, GROUP, *entry_ids)
        pipe.execute()


def _dead_letter(lane: Lane, client: redis.Redis, entry_id: bytes, fields: dict[bytes, bytes], exc: Exception) -> None:
    error = f"{exc.__class__.__name__}: {exc}"
    client.xadd(
        lane.dead_letters,
        {**fields, b"error": error[:1000], b"entry": entry_id},
        maxlen=DEAD_LETTERS_MAX,
        approximate=True,
    )
    counters.increment("goodput_ingest_dead_letters_total")
    if client.xlen(lane.dead_letters) >= DEAD_LETTERS_MAX:
        logger.error("%s is full (%d entries): the oldest are being dropped", lane.dead_letters, DEAD_LETTERS_MAX)
    logger.error("ingest entry %s moved to %s: %s", entry_id.decode(), lane.dead_letters, error)


_DEAD_FIELDS = {"key": b"k", "site": b"s", "samples": b"n", "error": b"error"}


def dead_letters(count: int = 100, lane: Lane = GPU) -> list[tuple[str, dict[str, str]]]:
    """The oldest dead letters: (entry id, {key, site, samples, error})."""
    rows = redis_client().xrange(lane.dead_letters, count=count)
    return [
        (
            entry_id.decode(),
            {name: fields.get(field, b"").decode(errors="replace") for name, field in _DEAD_FIELDS.items()},
        )
        for entry_id, fields in rows
    ]


def replay_dead_letters(count: int | None = None, lane: Lane = GPU) -> int:
    """Put dead letters back on the stream (once their cause is fixed) and schedule a drain.
    Their batch keys still guard against writing any of them twice."""
    client = redis_client()
    moved = 0
    while count is None or moved < count:
        page = client.xrange(lane.dead_letters, count=min(100, count - moved) if count is not None else 100)
        if not page:
            break
        for entry_id, fields in page:
            original = {k: v for k, v in fields.items() if k not in (b"error", b"entry")}
            pipe = client.pipeline(transaction=True)
            pipe.xadd(lane.stream, original)  # type: ignore[arg-type]
            pipe.xdel(lane.dead_letters, entry_id)
            pipe.execute()
            moved += 1
    if moved:
        _schedule_drain(lane, None, None)
    return moved


def _check_later_for_stranded(lane: Lane, client: redis.Redis) -> None:
    """If entries are still pending with other consumers (a writer that died, or one still at
    work), make sure a drain runs once they can be taken over."""
    pending = client.xpending(lane.stream, GROUP)
    if not pending or not pending.get("pending"):
        return
    if client.set(lane.reclaim_check, "1", nx=True, ex=settings.INGEST_RECLAIM_SECONDS):
        _schedule_drain(lane, None, None, countdown=settings.INGEST_RECLAIM_SECONDS + 0.5)


# The lanes the console drains (queue depth, backlog age): GPU batches here, Prometheus pushes
# from fleet.ingest.push_queue.
LANES: list[Lane] = [GPU]


def register_lane(lane: Lane) -> None:
    if lane not in LANES:
        LANES.append(lane)
