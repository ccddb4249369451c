"""A stopping web process hands its websockets to the others (a rolling restart).

On SIGTERM (or Ctrl-C) uvicorn would stop listening and cut every socket at once; each page's
client then reconnects, and a whole process's herd lands on the remaining processes in the same
second, where its handshakes and snapshots queue (docs/reliability.md: 22 s at 100 sockets).
Instead, before uvicorn starts its own shutdown:

1. the process says it is draining: ``/readyz`` answers 503, so a load balancer stops sending it
   new connections, and a handshake that still arrives is accepted and closed at once with
   ``CLOSE_SERVICE_RESTART``, so the page tries elsewhere;
2. its open sockets are closed with ``CLOSE_SERVICE_RESTART`` (1012, RFC 6455 "service restart"),
   ``WS_DRAIN_PER_SECOND`` a second (spread evenly over at most ``WS_DRAIN_SECONDS``): the page
   (static/js/live.js) reconnects within a second, without its "paused" banner, and the herd
   reaches the other processes at a pace they can take in: each reconnect costs the process that
   takes it a handshake, a session check and the page's snapshot, and a whole herd at once kept
   pages waiting 9-22 s in the soak. A process with a few sockets closes them at once;
3. uvicorn's own handler runs: it stops listening, waits for requests in flight (at most
   ``SHUTDOWN_GRACE_SECONDS``) and exits. A second signal skips the drain.

Only the process's own sockets are closed here (a registry of this process's consumers), never
through the channel layer, which every process shares.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from django.conf import settings

logger = logging.getLogger(__name__)

CLOSE_SERVICE_RESTART = 1012  # RFC 6455 registry: "service restart"; the page reconnects at once
DRAINED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Closable(Protocol):
    async def close(self, code: int | None = None, reason: str | None = None) -> None: ...


_sockets: weakref.WeakSet[Any] = weakref.WeakSet()
_draining = threading.Event()
_installed = False
_tasks: set[asyncio.Task[None]] = set()  # the drain in progress, kept referenced


def add(consumer: Closable) -> None:
    """An accepted socket of this process: closed first, and gently, when the process stops."""
    _sockets.add(consumer)


def discard(consumer: Closable) -> None:
    _sockets.discard(consumer)


def is_draining() -> bool:
    return _draining.is_set()


def open_sockets() -> int:
    return len(_sockets)


def drain_delays(count: int, *, per_second: float, at_most: float) -> list[float]:
    """When each of ``count`` sockets is closed: ``per_second`` a second, the first at once, the
    whole drain within ``at_most`` seconds (faster than ``per_second`` if it must)."""
    if count <= 1:
        return [0.0] * count
    step = min(1 / per_second, at_most / (count - 1))
    return [step * i for i in range(count)]


async def close_all(*, per_second: float, at_most: float) -> int:
    """Close every socket of this process with CLOSE_SERVICE_RESTART, spread as ``drain_delays`` says."""
    _draining.set()
    sockets = list(_sockets)
    delays = drain_delays(len(sockets), per_second=per_second, at_most=at_most)
    started = asyncio.get_running_loop().time()

    async def close_one(consumer: Closable, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await consumer.close(code=CLOSE_SERVICE_RESTART, reason="service restart")
        except Exception:  # already gone: uvicorn's shutdown deals with whatever is left
            logger.debug("a draining socket could not be closed", exc_info=True)

    await asyncio.gather(*(close_one(c, d) for c, d in zip(sockets, delays, strict=True)))
    logger.warning(
        "drained %d websockets in %.1f s before stopping", len(sockets), asyncio.get_running_loop().time() - started
    )
    return len(sockets)


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Put the drain in front of the server's SIGTERM/SIGINT handlers (once, from the serving loop).

    uvicorn installs its handlers with ``signal.signal`` before it serves; the first request finds
    them and chains them behind the drain. Only the main thread may set signal handlers: a server
    that runs its loop elsewhere (a test's in-process server) keeps its own behaviour.
    """
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    for sig in DRAINED_SIGNALS:
        previous = signal.getsignal(sig)
        if callable(previous):
            signal.signal(sig, _handler(loop, previous))


def _handler(
    loop: asyncio.AbstractEventLoop, previous: Callable[[int, FrameType | None], Any]
) -> Callable[[int, FrameType | None], None]:
    def handle(sig: int, frame: FrameType | None) -> None:
        if _draining.is_set() or not loop.is_running():
            previous(sig, frame)  # a second signal, or nothing to drain from: stop now
            return
        _draining.set()

        async def drain_then_stop() -> None:
            at_most = float(settings.WS_DRAIN_SECONDS)
            try:
                await asyncio.wait_for(
                    close_all(per_second=float(settings.WS_DRAIN_PER_SECOND), at_most=at_most), timeout=at_most + 2
                )
            except Exception:  # late or failed: uvicorn's own shutdown closes what is left
                logger.warning("the websocket drain did not finish; stopping anyway", exc_info=True)
            finally:
                previous(sig, frame)

        def start() -> None:
            task = loop.create_task(drain_then_stop())
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)

        loop.call_soon_threadsafe(start)

    return handle
