"""The shared cache opens one Redis connection per process, not one per request: under ASGI each
request runs in an async context of its own, and Django keeps a cache object per context."""

from __future__ import annotations

import asyncio

import redis
from asgiref.sync import sync_to_async
from django.core.cache import caches

from tests.conftest import redis_url


def _connections_received() -> int:
    return int(redis.Redis.from_url(redis_url()).info("stats")["total_connections_received"])


def test_requests_in_their_own_contexts_share_one_redis_connection(settings) -> None:  # type: ignore[no-untyped-def]
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
    before = _connections_received()
    asyncio.run(serve(20))
    assert len(backends) > 1  # Django did build a cache object per context ...
    assert _connections_received() - before == 1  # ... and they shared the client (+1: the count's own)


def test_cache_calls_share_one_client_object(settings) -> None:  # type: ignore[no-untyped-def]
    settings.CACHES = {"default": {"BACKEND": "console.cache.SharedRedisCache", "LOCATION": redis_url()}}
    client = caches["default"]._cache
    assert client.get_client() is client.get_client(write=True)  # not a new redis.Redis per call
    caches["default"].set("goodput-test-cache", "x", timeout=10)
    assert caches["default"].get("goodput-test-cache") == "x"
