"""How much work waits in the broker: the input to ingest back-pressure and to /metrics."""

from __future__ import annotations

import redis
from django.conf import settings

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    return _client


def queue_depth(queue: str = "celery") -> int:
    """Messages waiting in a Celery queue (0 in eager mode, where nothing queues).

    Raises redis.RedisError when the broker cannot be reached.
    """
    if settings.EAGER_TASKS:
        return 0
    return int(_redis().llen(queue))


def reset() -> None:
    global _client
    _client = None
