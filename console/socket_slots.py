"""How many live sockets one user may hold, counted across every web process.

One Redis sorted set per user (``goodput:ws:slots:<user id>``) holds a member per open socket
(its channel name, unique to the socket) scored with the time the slot lapses:

1. ``take`` before the handshake is accepted: drop lapsed members, then add this one if fewer
   than ``WS_MAX_PER_USER`` remain, in one Lua script so two processes cannot both take the last.
2. ``refresh`` from the consumer's existing session check (``LiveConsumer._watch_session``): no
   task of its own, so a web process stops on SIGTERM as fast with sockets open as without.
3. ``release`` on disconnect. A process killed without closing its sockets leaves its slots to
   lapse after ``ttl`` (a few session checks): a crash frees them late, but it frees them.

Without Redis (embedded mode: one web process) the same bookkeeping lives in this process.
"""

from __future__ import annotations

import threading
import time
from functools import cache

import redis
from asgiref.sync import sync_to_async
from django.conf import settings

KEY_PREFIX = "goodput:ws:slots:"

# KEYS[1]: the user's set; ARGV: now, lapses at, member, limit, key TTL in whole seconds.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

_local: dict[int, dict[str, float]] = {}
_local_lock = threading.Lock()


def key(user_id: int) -> str:
    return f"{KEY_PREFIX}{int(user_id)}"


@cache
def _client(url: str) -> redis.Redis:
    # Short timeouts: a disconnect during shutdown must not wait on a Redis that is gone.
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def _take(user_id: int, member: str, ttl: float) -> bool:
    now = time.time()
    limit = settings.WS_MAX_PER_USER
    if settings.REDIS_URL:
        client = _client(settings.REDIS_URL)
        taken = client.eval(_TAKE, 1, key(user_id), now, now + ttl, member, limit, int(ttl) + 1)
        return bool(taken)
    with _local_lock:
        held = {m: lapses for m, lapses in _local.get(user_id, {}).items() if lapses > now}
        if member not in held and len(held) >= limit:
            _local[user_id] = held
            return False
        held[member] = now + ttl
        _local[user_id] = held
        return True


def _refresh(user_id: int, member: str, ttl: float) -> None:
    lapses = time.time() + ttl
    if settings.REDIS_URL:
        pipe = _client(settings.REDIS_URL).pipeline(transaction=False)
        pipe.zadd(key(user_id), {member: lapses})
        pipe.expire(key(user_id), int(ttl) + 1)
        pipe.execute()
        return
    with _local_lock:
        _local.setdefault(user_id, {})[member] = lapses


def _release(user_id: int, member: str) -> None:
    if settings.REDIS_URL:
        _client(settings.REDIS_URL).zrem(key(user_id), member)
        return
    with _local_lock:
        _local.get(user_id, {}).pop(member, None)


def held(user_id: int) -> int:
    """How many unlapsed slots the user holds (for tests and diagnostics)."""
    now = time.time()
    if settings.REDIS_URL:
        return int(_client(settings.REDIS_URL).zcount(key(user_id), f"({now}", "+inf"))
    with _local_lock:
        return sum(1 for lapses in _local.get(user_id, {}).values() if lapses > now)


def forget_local() -> None:
    """Drop the in-process slots (tests; embedded mode only keeps them here)."""
    with _local_lock:
        _local.clear()


# Off the event loop, and off the thread the ORM calls share (thread_sensitive=False): a burst of
# disconnects at shutdown must not queue behind database work.
take = sync_to_async(_take, thread_sensitive=False)
refresh = sync_to_async(_refresh, thread_sensitive=False)
release = sync_to_async(_release, thread_sensitive=False)
