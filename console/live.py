"""The live-update hub: topic groups, coalesced pushes, and the broadcast helper.

Writers call ``request_push(topic)`` after commit. At most one push per topic per
LIVE_MIN_INTERVAL_MS (or the topic's own, longer interval) goes out; requests in between fold
into the next push. A push is built by the topic's registered builder from the database (what
changed since the previous push), so folding requests together loses nothing, and channel layers
that drop a message are covered by the page fetching a fresh snapshot over HTTP when it
reconnects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.db import connections

logger = logging.getLogger(__name__)

# Topics clients may subscribe to. Group names are built from these by code, never from raw input.
TOPIC_PATTERN = re.compile(
    r"^(fleet|incidents|power|fabric|storage|training|serving|scheduler|cost|(site|job|endpoint|gpu|node)\.\d{1,12}"
    # A page of the fleet's GPU table: the digest of its query, made by the server (fleet.telemetry.read.fleet_summary).
    r"|fleetview\.[0-9a-f]{16})$"
)
MESSAGE_TYPE = "live.message"

# A builder takes (topic, watermark of the previous push) and returns (payload, new watermark).
TopicBuilder = Callable[[str, Any], tuple[dict[str, Any] | None, Any]]
_builders: dict[str, TopicBuilder] = {}
_intervals: dict[str, Callable[[], float]] = {}  # prefix -> its own least seconds between pushes
_watchers: dict[str, Callable[[str], None]] = {}

# The ASGI server's event loop, when this process serves websockets. The in-memory channel
# layer (embedded mode) lives on that loop, so pushes made from worker threads are handed to it.
_loop: asyncio.AbstractEventLoop | None = None


def bind_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _loop
    _loop = loop


def _server_loop() -> asyncio.AbstractEventLoop | None:
    return _loop if _loop is not None and _loop.is_running() else None


def register_topic_builder(
    prefix: str, builder: TopicBuilder, *, min_interval: Callable[[], float] | None = None
) -> None:
    """Apps register how to build a push for their topics (``fleet``, ``site`` for ``site.<id>``...).
    ``min_interval`` (seconds, read at each request) spaces a costly topic's pushes wider than
    LIVE_MIN_INTERVAL_MS."""
    _builders[prefix] = builder
    if min_interval is not None:
        _intervals[prefix] = min_interval


def register_topic_watcher(prefix: str, watcher: Callable[[str], None]) -> None:
    """Apps whose topics are pushed only while watched (``gpu.<id>``...) say how to renew a watch."""
    _watchers[prefix] = watcher


def has_watcher(topic: str) -> bool:
    """Whether the topic is pushed only while watched (``gpu.<id>``...), so a socket renews it."""
    return topic.split(".", 1)[0] in _watchers


def renew_watches(topics: Iterable[str]) -> None:
    """Renew the watch of each of these topics that has a watcher (the others are always pushed)."""
    for topic in topics:
        watcher = _watchers.get(topic.split(".", 1)[0])
        if watcher is not None:
            watcher(topic)


# A watch lasts a little longer than the live socket's renewal period (it renews the watches of
# its gpu./node. topics every SESSION_RECHECK_SECONDS, 60 s), so one late renewal drops nothing.
WATCH_SECONDS = 90


def watch_topic(topic: str) -> None:
    """Note that a page follows ``topic``, so ingest requests its pushes for the next WATCH_SECONDS.

    Per-GPU and per-node topics are many and mostly unwatched: ingest asks for a push only for
    the ones a page is on. Only the page renews a watch: fetching the snapshot, subscribing, and
    the socket's periodic renewal while it stays subscribed (console.consumers). A push must not
    renew it, or a topic would be pushed for as long as its GPU reports, long after the page closed.
    """
    cache.set_many({f"live:watch:{topic}": 1, "live:watch:any": 1}, timeout=WATCH_SECONDS)


def anything_watched() -> bool:
    """Whether any page watches any topic (the common case, nobody on a GPU page: one read)."""
    return bool(cache.get("live:watch:any"))


def watched(topics: list[str]) -> list[str]:
    """Those of these topics a page is watching (see ``watch_topic``)."""
    if not topics or not cache.get("live:watch:any"):
        return []
    found = cache.get_many([f"live:watch:{t}" for t in topics])
    return sorted(key.removeprefix("live:watch:") for key in found)


def is_valid_topic(topic: str) -> bool:
    return bool(TOPIC_PATTERN.match(topic))


def group_name(topic: str) -> str:
    if not is_valid_topic(topic):
        raise ValueError(f"not a live topic: {topic!r}")
    return f"live.{topic}"


def broadcast(topic: str, payload: dict[str, Any]) -> None:
    """Send one message to every websocket subscribed to ``topic``, encoded once here: with 100
    sockets on a web process, encoding the same 125 KiB push per socket cost more CPU than
    everything else the push does (measured by bench/soak.py's live load)."""
    text = json.dumps(payload, separators=(",", ":"))
    send_to_group(group_name(topic), {"type": MESSAGE_TYPE, "text": text})


def send_to_group(group: str, message: dict[str, Any]) -> None:
    """Hand one channel-layer message to a group, from any thread (see ``bind_event_loop``)."""
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _server_loop()
    if loop is None:
        async_to_sync(layer.group_send)(group, message)
        return
    send = layer.group_send(group, message)
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop:
        loop.create_task(send)
    else:
        asyncio.run_coroutine_threadsafe(send, loop).result(timeout=10)


def _interval(topic: str) -> float:
    own = _intervals.get(topic.split(".", 1)[0])
    return max(settings.LIVE_MIN_INTERVAL_MS / 1000, own() if own is not None else 0.0)


def request_push(*topics: str) -> None:
    """Schedule a push for each topic, coalesced to at most one per interval."""
    for topic in topics:
        # The pending marker makes one scheduled push absorb every request until it runs.
        interval = _interval(topic)
        if not cache.add(f"live:pending:{topic}", 1, timeout=max(5, int(interval * 5))):
            continue
        last = cache.get(f"live:last:{topic}") or 0.0
        delay = max(0.0, last + interval - time.time())
        if settings.EAGER_TASKS:
            # Eager Celery ignores countdown, so the server's own loop keeps the at-most-once a
            # second promise in embedded mode. A process without a server loop (a command, a
            # test) has no websocket clients of its own and pushes at once.
            loop = _server_loop()
            if loop is None:
                push_topic(topic)
            else:
                loop.call_soon_threadsafe(loop.call_later, delay, _push_from_loop, topic)
        else:
            from console.tasks import push_live_topic

            try:
                push_live_topic.apply_async(args=[topic], countdown=delay)
            except Exception:  # the data is committed; a missed push is healed by the next one
                cache.delete(f"live:pending:{topic}")
                logger.warning("could not schedule a live push for %s", topic, exc_info=True)


def _push_from_loop(topic: str) -> None:
    # The push reads the database: run it in a worker thread, never on the event loop.
    assert _loop is not None
    _loop.run_in_executor(None, _push_in_thread, topic)


def _push_in_thread(topic: str) -> None:
    try:
        push_topic(topic)
    finally:
        connections.close_all()  # this executor thread's connections only (they are thread-local)


def push_topic(topic: str) -> dict[str, Any] | None:
    """Build the topic's delta from the database and broadcast it."""
    cache.delete(f"live:pending:{topic}")
    cache.set(f"live:last:{topic}", time.time(), timeout=3600)
    builder = _builders.get(topic.split(".", 1)[0])
    if builder is None:
        return None
    watermark_key = f"live:watermark:{topic}"
    payload, watermark = builder(topic, cache.get(watermark_key))
    cache.set(watermark_key, watermark, timeout=3600)
    if payload is not None:
        broadcast(topic, payload)
        # Measured from the send as well as the start, so a slow build cannot squeeze two sends together.
        cache.set(f"live:last:{topic}", time.time(), timeout=3600)
    return payload
