"""Counters shared by every process (web and workers): one Redis hash in production, process
memory in embedded mode (one process). Read by /metrics.

Increments add up in process memory and a background thread writes them to Redis once a second
(and at exit): at a hundred requests a second, a round trip per increment cost more than the
counting was worth. /metrics may therefore lag by up to a second.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections import Counter

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

HASH = "goodput:counters"
FLUSH_SECONDS = 1.0
_local: Counter[str] = Counter()  # embedded mode: the counters themselves
_pending: Counter[str] = Counter()  # production: increments not yet written to Redis
_lock = threading.Lock()
_flush_lock = threading.Lock()
_client: redis.Redis | None = None
_flusher_pid: int | None = None  # the process whose flusher thread runs (a fork has none)


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
    with _lock:
        if not settings.REDIS_URL:
            _local[key] += amount
            return
        _pending[key] += amount
        if _flusher_pid != os.getpid():
            _start_flusher()


def _start_flusher() -> None:
    """(With _lock held.) A daemon thread that writes pending increments once a second."""
    global _flusher_pid
    _flusher_pid = os.getpid()

    def run() -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            flush()

    threading.Thread(target=run, name="goodput-counters", daemon=True).start()


def flush() -> None:
    """Write pending increments to Redis; kept for the next flush if Redis is unavailable.

    One flush at a time (_flush_lock): a snapshot that flushes returns only after increments a
    concurrent flush had already taken are in Redis too.
    """
    client = _redis()
    if client is None:
        return
    with _flush_lock:
        with _lock:
            if not _pending:
                return
            taken = dict(_pending)
            _pending.clear()
        try:
            pipe = client.pipeline(transaction=False)
            for key, amount in taken.items():
                pipe.hincrby(HASH, key, amount)
            pipe.execute()
        except redis.RedisError:  # counting must never fail a request
            logger.debug("%d counter(s) not recorded yet", len(taken), exc_info=True)
            with _lock:
                _pending.update(taken)


def _after_fork_in_child() -> None:
    """A forked child (a Celery pool process) starts with a fresh lock (the parent's flusher may
    have held it at the fork) and without the parent's pending increments (the parent writes them)."""
    global _lock, _flush_lock
    _lock = threading.Lock()
    _flush_lock = threading.Lock()
    _pending.clear()


atexit.register(flush)  # Celery's pool processes exit without atexit: see console.celery
os.register_at_fork(after_in_child=_after_fork_in_child)


def snapshot() -> dict[str, int]:
    """Every counter: 'name{labels}' -> value."""
    client = _redis()
    if client is None:
        with _lock:
            return dict(_local)
    flush()  # this process's own increments, at least, are up to date
    return {k.decode(): int(v) for k, v in client.hgetall(HASH).items()}


def reset() -> None:
    """Forget everything (tests) and the client (a changed REDIS_URL)."""
    global _client
    with _lock:
        _local.clear()
        _pending.clear()
    if _client is not None:
        with contextlib.suppress(redis.RedisError):
            _client.delete(HASH)
    _client = None
