"""How much work waits in the broker: the input to ingest back-pressure and to /metrics."""

from __future__ import annotations

import time

import redis
from django.conf import settings

_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    """The process's client for the broker's Redis (queues, the payload stash, ingest streams)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=5)
    return _client


# Redis streams whose entries are queued work too (the ingest lanes); apps register theirs.
_streams: list[str] = []


def register_stream(name: str) -> None:
    if name not in _streams:
        _streams.append(name)


_depth: tuple[float, int] = (0.0, 0)
DEPTH_CACHE_SECONDS = 0.25


def queue_depth(queue: str = "celery") -> int:
    """Work waiting for a worker: messages in a Celery queue plus entries in the registered
    streams (0 in eager mode, where nothing queues).

    Read at most four times a second per process: at 100 batches a second, a round trip each
    would be pure overhead. Raises redis.RedisError when the broker cannot be reached.
    """
    global _depth
    if settings.EAGER_TASKS:
        return 0
    now = time.monotonic()
    if now - _depth[0] > DEPTH_CACHE_SECONDS:
        pipe = redis_client().pipeline(transaction=False)
        pipe.llen(queue)
        for stream in _streams:
            pipe.xlen(stream)
        _depth = (now, sum(int(n) for n in pipe.execute()))
    return _depth[1]


def reset() -> None:
    global _client, _depth
    _client = None
    _depth = (0.0, 0)


# --- payload stash ------------------------------------------------------------------------------
# Before Prometheus pushes travelled on their stream (fleet.ingest.push_queue), a push's parse
# waited here beside a small Celery task; a task queued before a deploy still finds its body here.
STASH_PREFIX = "goodput:payload:"
STASH_TTL_SECONDS = 24 * 3600


def stash_payload(key: str, data: bytes) -> None:
    redis_client().set(STASH_PREFIX + key, data, ex=STASH_TTL_SECONDS)


def take_payload(key: str) -> bytes | None:
    return redis_client().get(STASH_PREFIX + key)


def drop_payload(key: str) -> None:
    redis_client().delete(STASH_PREFIX + key)
