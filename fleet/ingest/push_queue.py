"""Prometheus pushes between the API and the writers: the ingest stream's second lane
(fleet.ingest.stream), so a push answered 202 is stored, still waiting through an outage, or in
the dead-letter stream with its error, never lost.

The door queues what it parsed (fleet.ingest.prometheus.packed; a text body queued before that
mark existed is parsed with the door's options and receive time, so the same samples) with its
options; drainers take up to ``INGEST_FOLD_BATCHES`` pushes at a time and store them together
(``prometheus.store_expositions``: the node series of a fold in one transaction a site, one COPY
a table), as the GPU lane folds its batches. A node_exporter push costs a stream entry, not a
Celery task, a stash and a transaction of its own. Outages leave the pushes pending and retry;
a push whose own data fails moves to ``goodput:ingest:prometheus:dead`` with its error, and
``manage.py replay_dead_letters`` lists and replays these beside the GPU batches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleet.ingest import stream


@dataclass(frozen=True)
class QueuedPush:
    """A push off the stream: its site, idempotency key, what the door parsed, and when queued."""

    site_id: int
    key: str
    exposition: Any  # fleet.ingest.prometheus.Exposition
    enqueued_at: datetime | None


def _decode(fields: dict[bytes, bytes]) -> QueuedPush:
    from fleet.ingest.prometheus import unpacked

    enqueued = fields.get(b"e")
    return QueuedPush(
        site_id=int(fields[b"s"]),
        key=fields[b"k"].decode(),
        exposition=unpacked(fields[b"d"], json.loads(fields[b"o"])),
        enqueued_at=datetime.fromisoformat(enqueued.decode()) if enqueued else None,
    )


def _store(pushes: list[QueuedPush]) -> int:
    from fleet.ingest.prometheus import store_expositions

    return store_expositions(pushes)


PROMETHEUS = stream.Lane(
    name="prometheus",
    stream="goodput:ingest:prometheus",
    dead_letters="goodput:ingest:prometheus:dead",
    reclaim_check="goodput:ingest:prometheus:reclaim-check",
    slot_prefix="goodput:ingest:prometheus:drainer",
    task="drain_prometheus_ingest",
    decode=_decode,
    store=_store,
    label=lambda push: push.key,
)
STREAM, DEAD_LETTERS = PROMETHEUS.stream, PROMETHEUS.dead_letters


def enqueue(
    *, site_id: int, key: str, payload: bytes, options: dict[str, Any], samples: int, enqueued_at: datetime
) -> None:
    """Queue a validated push (its parsed values) for the writers. Raises redis.RedisError (or the
    broker's error from scheduling a drain) when the queue is unavailable; a retry with the same
    key is safe either way (see stream.add)."""
    entry = {
        "k": key,
        "s": site_id,
        "n": samples,
        "e": enqueued_at.isoformat(),
        "o": json.dumps(options),
        "d": payload,
    }
    stream.add(PROMETHEUS, entry)


def drain(slot: int | None = None, token: str | None = None, *, consumer: str | None = None) -> int:
    return stream.drain(slot, token, consumer=consumer, lane=PROMETHEUS)


def dead_letters(count: int = 100) -> list[tuple[str, dict[str, str]]]:
    """The oldest dead pushes: (entry id, {key, site, samples, error})."""
    return stream.dead_letters(count, PROMETHEUS)


def replay_dead_letters(count: int | None = None) -> int:
    """Queue dead pushes again (once their cause is fixed). Their batch keys still guard against
    storing any of them twice."""
    return stream.replay_dead_letters(count, PROMETHEUS)
