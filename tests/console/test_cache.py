"""The shared cache opens one Redis connection per process, not one per request: under ASGI each
request runs in an async context of its own, and Django keeps a cache object per context."""

from __future__ import annotations

import asyncio

import pytest
import redis
from asgiref.sync import sync_to_async
from django.core.cache import caches

from tests.conftest import redis_url


def _connections_opened(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The Redis connections this process opens from now on. Counted here, not from the server's
    total: parallel workers and their stacks connect to the same server meanwhile."""
    opened: list[object] = []
    real = redis.connection.Connection._connect

    def counting(self: redis.connection.Connection) -> object:
        opened.append(self)
        return real(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counting)
    return opened


def test_requests_in_their_own_contexts_share_one_redis_connection(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings.CACHES = {"default": {"BACKEND": "console.cache.SharedRedisCache", "LOCATION": redis_url()}}
    backends = set()

    def request() -> None:  # what a view does with the cache, in the thread ASGI gives it
        cache = caches["default"]
        backends.add(id(cache))
        cache.set("goodput-test-cache", 1, timeout=10)
        assert cache.get("goodput-test-cache") == 1

    async def serve(n: int) -> None:
        for _ in range(n):
            await asyncio.create_task(sync_to_async(request)())  # a task: a context of its own

    asyncio.run(serve(1))  # the process's client connects once
    opened = _connections_opened(monkeypatch)
    asyncio.run(serve(20))
    assert len(backends) > 1  # Django did build a cache object per context ...
    assert opened == []  # ... and they shared the client's connection


def test_cache_calls_share_one_client_object(settings) -> None:  # type: ignore[no-untyped-def]
    settings.CACHES = {"default": {"BACKEND": "console.cache.SharedRedisCache", "LOCATION": redis_url()}}
    client = caches["default"]._cache
    assert client.get_client() is client.get_client(write=True)  # not a new redis.Redis per call
    caches["default"].set("goodput-test-cache", "x", timeout=10)
    assert caches["default"].get("goodput-test-cache") == "x"
