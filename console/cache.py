"""The shared cache's backend: Django's Redis cache, with one client per process.

Django keeps a cache object per async context, and under ASGI every request runs in a context of
its own, so the stock backend built a new client, connection pool and TCP connection to Redis for
each request (and left the old ones to the garbage collector); it also built a new ``redis.Redis``
object for every cache call. Here every cache object of a process shares one client for the same
servers and options, and that client one ``redis.Redis`` per server; both are thread-safe, and
redis-py's pool starts afresh in a forked child.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple[tuple[str, ...], str], RedisCacheClient] = {}
_lock = threading.Lock()


class _Client(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._redis: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)
        client = self._redis.get(index)
        if client is None:
            with _lock:
                if index not in self._pools:
                    self._pools[index] = self._pool_class.from_url(self._servers[index], **self._pool_options)
                client = self._redis.setdefault(index, self._client(connection_pool=self._pools[index]))
        return client


class SharedRedisCache(RedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _Client

    @cached_property
    def _cache(self) -> Any:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client
