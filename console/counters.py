"""Counters shared by every process (web and workers), kept in the cache: Redis in production,
process memory in embedded mode (one process). Read by /metrics."""

from __future__ import annotations

from django.core.cache import cache

PREFIX = "counter:"
_INDEX = "counter-index"


def _key(name: str, labels: dict[str, str]) -> str:
    suffix = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{PREFIX}{name}{{{suffix}}}"


def increment(name: str, amount: int = 1, **labels: str) -> None:
    key = _key(name, labels)
    try:
        if cache.add(key, amount, timeout=None):
            index = cache.get(_INDEX) or set()
            if key not in index:
                cache.set(_INDEX, index | {key}, timeout=None)
        else:
            cache.incr(key, amount)
    except Exception:  # counting must never fail a request
        pass


def snapshot() -> dict[str, int]:
    """Every counter: 'name{labels}' -> value."""
    keys = cache.get(_INDEX) or set()
    values = cache.get_many(list(keys))
    return {k[len(PREFIX) :]: int(v) for k, v in values.items()}
