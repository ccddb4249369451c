"""Prometheus pushes between the API and the writers: retried through outages, dead-lettered
when their own data fails, so a push answered 202 is stored, still being retried, or in the
dead-letter stream with its error, never lost.

What the door parsed waits in the payload stash (console.queues) beside a small Celery task,
which stores it without parsing it again (fleet.ingest.prometheus.packed; a text body stashed
before that is parsed with the door's options and receive time, so the same samples). A
database that cannot be reached (anything but bad data, see ``ingest_stream.is_outage``) is an
outage: the task is retried with capped backoff and the body stays stashed. Anything else is the
push's own fault, and the body moves to ``goodput:ingest:prometheus:dead`` with its error;
``manage.py replay_dead_letters`` lists and replays these beside the GPU batches.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from console import counters
from console.queues import STASH_PREFIX, STASH_TTL_SECONDS, drop_payload, redis_client, register_pending, stash_payload

logger = logging.getLogger(__name__)

DEAD_LETTERS = "goodput:ingest:prometheus:dead"
DEAD_LETTERS_MAX = 1000  # bodies are up to 5 MB each; past this the oldest go, and say so in the log
# Pushes accepted and not yet stored or dead-lettered (key -> accepted at): they count toward
# the queue's depth, so the door answers 429 instead of stashing bodies without end while the
# writers cannot write (a retrying task sits in a worker, not in the queue).
PENDING = "goodput:ingest:prometheus:pending"
RETRY_BASE_SECONDS = 2
RETRY_CAP_SECONDS = 60
# About a day of retries at the cap, the stash's lifetime: then the push is a dead letter.
MAX_RETRIES = 24 * 3600 // RETRY_CAP_SECONDS


def retry_delay(retries: int) -> int:
    """Seconds before retry number ``retries`` + 1: 2, 4, 8, ... capped at a minute."""
    return min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2 ** min(retries, 10))


def accepted(key: str) -> None:
    """A push was queued: it counts as waiting work until done() or dead_letter()."""
    client = redis_client()
    client.zadd(PENDING, {key: time.time()})


def done(key: str) -> None:
    redis_client().zrem(PENDING, key)


def pending(client: Any) -> int:
    """Pushes waiting, counting only those whose body can still be in the stash."""
    return int(client.zcount(PENDING, time.time() - STASH_TTL_SECONDS, "+inf"))


def keep_waiting(key: str) -> None:
    """A push is being retried: keep its body in the stash as long again (an outage of a day
    must not expire it before it is stored or dead-lettered)."""
    redis_client().expire(STASH_PREFIX + key, STASH_TTL_SECONDS)


register_pending(pending)


def dead_letter(*, site_id: int, key: str, body: bytes | str, options: dict[str, Any], error: BaseException) -> None:
    """Keep a push that failed on its own data, with its error, and drop its stash."""
    text = f"{error.__class__.__name__}: {error}"[:1000]
    client = redis_client()
    client.xadd(
        DEAD_LETTERS,
        {
            "key": key,
            "site": str(site_id),
            "options": json.dumps(options),
            "body": body.encode() if isinstance(body, str) else body,
            "error": text,
        },
        maxlen=DEAD_LETTERS_MAX,
        approximate=True,
    )
    drop_payload(key)
    done(key)
    counters.increment("goodput_ingest_dead_letters_total")
    if client.xlen(DEAD_LETTERS) >= DEAD_LETTERS_MAX:
        logger.error("%s holds %d pushes, its limit: the oldest are being dropped", DEAD_LETTERS, DEAD_LETTERS_MAX)
    logger.error("Prometheus push %s moved to %s: %s", key, DEAD_LETTERS, text)


def dead_letters(count: int = 100) -> list[tuple[str, dict[str, str]]]:
    """The oldest dead pushes: (entry id, {key, site, bytes, error})."""
    rows = redis_client().xrange(DEAD_LETTERS, count=count)
    return [
        (
            entry_id.decode(),
            {
                "key": fields.get(b"key", b"").decode(errors="replace"),
                "site": fields.get(b"site", b"").decode(errors="replace"),
                "bytes": str(len(fields.get(b"body", b""))),
                "error": fields.get(b"error", b"").decode(errors="replace"),
            },
        )
        for entry_id, fields in rows
    ]


def replay_dead_letters(count: int | None = None) -> int:
    """Queue dead pushes again (once their cause is fixed). Their batch keys still guard against
    storing any of them twice."""
    from fleet.ingest.tasks import ingest_prometheus_batch

    client = redis_client()
    moved = 0
    while count is None or moved < count:
        page = client.xrange(DEAD_LETTERS, count=min(100, count - moved) if count is not None else 100)
        if not page:
            break
        for entry_id, fields in page:
            key = fields[b"key"].decode()
            options = json.loads(fields[b"options"])
            stash_payload(key, fields[b"body"])
            accepted(key)
            ingest_prometheus_batch.apply_async(args=[int(fields[b"site"]), key, None, options, options.get("now")])
            client.xdel(DEAD_LETTERS, entry_id)
            moved += 1
    return moved
