"""Counters shared by every process (web and workers): one Redis hash in production, process
memory in embedded mode (one process). Read by /metrics.

One process-wide client and one HINCRBY per increment: Django's cache would open a client per
request under ASGI and make three round trips.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

HASH = "goodput:counters"
_local: Counter[str] = Counter()
_lock = threading.Lock()
_client: redis.Redis | None = None


def _redis() -> redis.Redis | None:
    global _client
    if not settings.REDIS_URL:
        return None
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    return _client


def _key(name: str, labels: dict[str, str]) -> str:
    suffix = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{suffix}}}"


def increment(name: str, amount: int = 1, **labels: str) -> None:
    key = _key(name, labels)
    client = _redis()
    if client is None:
        with _lock:
            _local[key] += amount
        return
    try:
        client.hincrby(HASH, key, amount)
    except redis.RedisError:  # counting must never fail a request
        logger.debug("counter %s not recorded", key, exc_info=True)


def snapshot() -> dict[str, int]:
    """Every counter: 'name{labels}' -> value."""
    client = _redis()
    if client is None:
        with _lock:
            return dict(_local)
    return {k.decode(): int(v) for k, v in client.hgetall(HASH).items()}


def reset() -> None:
    """Forget everything (tests) and the client (a changed REDIS_URL)."""
    global _client
    with _lock:
        _local.clear()
    if _client is not None:
        with contextlib.suppress(redis.RedisError):
            _client.delete(HASH)
    _client = None
