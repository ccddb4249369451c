"""Figures computed once an interval for every process and reader, kept in the shared cache.

A page's summary (the fleet page's site rows and worst GPUs, the serving SLO overview) costs the
same to compute for the hundredth reader as for the first, and grows with the fleet. ``fresh``
computes it at most once an interval across all web processes and sockets: a read within the
interval is a cache lookup; an expired value is still answered while one caller (holding a lock
in the cache) recomputes it on a thread of its own, so no reader waits; with nothing kept (a
first read, a flushed Redis) the caller computes it. A cache that cannot be reached costs a
computation, never an error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import connections
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

T = TypeVar("T")
_KEY = "figures:{}"
_LOCK_SECONDS = 30
_clock = time.time  # the tests move it


def fresh(name: str, compute: Callable[[], T], *, seconds: int | None = None) -> T:
    """``compute()``'s value as of about ``seconds`` (default FLEET_SUMMARY_SECONDS; 0 computes on
    every read) ago, shared by every process."""
    seconds = settings.FLEET_SUMMARY_SECONDS if seconds is None else seconds
    if seconds <= 0:
        return compute()
    key = _KEY.format(name)
    try:
        held = cache.get(key)
        if held is not None and (_clock() - held[0] < seconds or not cache.add(f"{key}:lock", 1, _LOCK_SECONDS)):
            return held[1]  # fresh, or another caller is recomputing it
    except RedisError as exc:
        logger.warning("figures %s computed without the cache (%s)", name, exc.__class__.__name__)
        return compute()
    if held is None:
        value = compute()
        keep(name, value, seconds=seconds)
        return value
    _in_background(lambda: _recompute(name, key, compute, seconds))
    return held[1]


def keep(name: str, value: Any, *, seconds: int | None = None) -> None:
    """Store a value just computed for ``fresh`` readers (a push's rows, written back)."""
    seconds = settings.FLEET_SUMMARY_SECONDS if seconds is None else seconds
    if seconds <= 0:
        return
    try:
        cache.set(_KEY.format(name), (_clock(), value), timeout=max(60, seconds * 10))
    except RedisError as exc:
        logger.warning("figures %s not kept (%s)", name, exc.__class__.__name__)


def _recompute(name: str, key: str, compute: Callable[[], Any], seconds: int) -> None:
    try:
        keep(name, compute(), seconds=seconds)
    except Exception:
        logger.exception("figures %s not recomputed", name)
    finally:
        with contextlib.suppress(RedisError):  # else the lock expires on its own
            cache.delete(f"{key}:lock")


def _background(work: Callable[[], None]) -> None:
    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()  # this thread's own connections

    threading.Thread(target=run, name="figures", daemon=True).start()


_in_background = _background  # the tests run it in place
