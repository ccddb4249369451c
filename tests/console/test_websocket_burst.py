"""A burst of sockets that exhausts the channel layer's Redis connection pool (issue 37, item 10).

Each page subscribes to its topics in one message, joined together (one Redis round trip each,
at once). A burst of pages, after a deploy or a network blip, asks a web process's channels-redis
pool (redis-py's, 100 connections) for thousands at once: the consumers died with
MaxConnectionsError, a traceback each in the server's log and a 1006 at the page, and their
slots stayed counted until they lapsed (2.5 minutes), so the user was refused with 4429 on
reconnecting. Now each such socket is closed with 1013 "try again later" and one warning line,
and every socket gives its slot back however it ended. Real uvicorn, real Redis.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from console import socket_slots, sockets
from tests.conftest import redis_url
from tests.stack import Stack

pytestmark = pytest.mark.django_db(transaction=True)

SOCKETS = 60
TOPICS = ["fleet", "incidents", "power"] + [f"site.{n}" for n in range(1, 48)]  # a socket's most: 50


@pytest.fixture(autouse=True)
def _no_slots_left() -> Iterator[None]:
    client = redis.Redis.from_url(redis_url())
    client.delete(*client.keys(f"{socket_slots.KEY_PREFIX}*") or ["-"])
    yield
    client.delete(*client.keys(f"{socket_slots.KEY_PREFIX}*") or ["-"])


@pytest.fixture
def server(tmp_path) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    stack = Stack(redis_url(), tmp_path, GOODPUT_WS_MAX_PER_USER=str(SOCKETS))  # every socket gets a slot
    try:
        stack.start_server()
        yield stack
    finally:
        stack.stop()


def _cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def _page(base_url: str, cookie: str, opened: asyncio.Barrier) -> tuple[str, int | None, str]:
    """One page: open the socket and, once every page has, subscribe to 50 topics; what it heard,
    and how it was closed."""
    host = base_url.removeprefix("http://")
    headers = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}", "Origin": base_url}
    async with connect(f"ws://{host}/ws/live/", additional_headers=headers, open_timeout=60) as ws:
        await opened.wait()  # the burst: every page subscribes at the same moment
        try:
            await ws.send(json.dumps({"action": "subscribe", "topics": TOPICS}))
            heard = json.loads(await asyncio.wait_for(ws.recv(), 60))["type"]
        except ConnectionClosed as closed:
            return "closed", closed.rcvd.code if closed.rcvd else None, closed.rcvd.reason if closed.rcvd else ""
    return heard, None, ""


def _burst(base_url: str, cookie: str) -> list[tuple[str, int | None, str]]:
    async def burst() -> list[tuple[str, int | None, str]]:
        opened = asyncio.Barrier(SOCKETS)
        return list(await asyncio.gather(*(_page(base_url, cookie, opened) for _ in range(SOCKETS))))

    return asyncio.run(burst())


def _slots_after_close(user: User) -> int:
    deadline = time.monotonic() + 10
    while socket_slots.held(user.pk) and time.monotonic() < deadline:
        time.sleep(0.1)
    return socket_slots.held(user.pk)


def test_a_burst_that_exhausts_the_redis_pool_closes_newcomers_with_1013_and_gives_every_slot_back(
    viewer_user: User, server: Stack, tmp_path
) -> None:
    pages = _burst(server.base_url, _cookie(viewer_user))
    outcomes = Counter((heard, code) for heard, code, _ in pages)
    log = (tmp_path / "uvicorn.log").read_text()
    busy = outcomes[("closed", sockets.CLOSE_TRY_AGAIN_LATER)]
    print(f"RESULT sockets={SOCKETS} subscribed={outcomes[('subscribed', None)]} closed_1013={busy}")
    # The burst exhausted the pool (a 50-topic subscribe each, 3,000 group_adds at once) ...
    assert busy, (outcomes, log[-3000:])
    # ... and every page either followed its topics or was told to try again later: no 1006/1011.
    assert set(outcomes) <= {("subscribed", None), ("closed", sockets.CLOSE_TRY_AGAIN_LATER)}, outcomes
    assert {reason for heard, _, reason in pages if heard == "closed"} == {sockets.TRY_AGAIN_REASON}
    # One warning line a refused socket, naming the code and the cause; no traceback.
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    warned = [line for line in log.splitlines() if "websocket closed with 1013" in line]
    assert len(warned) == busy and all("MaxConnectionsError" in line for line in warned), warned[:3]
    # Every socket gave its slot back once closed, the refused ones included: the user can
    # open the next socket at once, not 2.5 minutes later.
    assert _slots_after_close(viewer_user) == 0


def test_a_socket_cut_off_or_closed_by_the_server_gives_its_slot_back(viewer_user: User, server: Stack) -> None:
    """The other ways a socket ends: the client vanishes without a close frame (a killed browser,
    a cut network), and the server closes it (4413)."""
    cookie = _cookie(viewer_user)
    host = server.base_url.removeprefix("http://")
    headers = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}", "Origin": server.base_url}

    async def vanish() -> None:
        ws = await connect(f"ws://{host}/ws/live/", additional_headers=headers, open_timeout=30)
        await ws.send(json.dumps({"action": "subscribe", "topics": ["fleet"]}))
        assert json.loads(await ws.recv())["type"] == "subscribed"
        assert socket_slots.held(viewer_user.pk) == 1
        ws.transport.abort()  # no close frame: the TCP connection is simply cut

    asyncio.run(vanish())
    assert _slots_after_close(viewer_user) == 0

    async def too_many_topics() -> int | None:
        async with connect(f"ws://{host}/ws/live/", additional_headers=headers, open_timeout=30) as ws:
            await ws.send(json.dumps({"action": "subscribe", "topics": [*TOPICS, "site.48"]}))
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None

    assert asyncio.run(too_many_topics()) == sockets.CLOSE_TOO_MANY_TOPICS
    assert _slots_after_close(viewer_user) == 0
