"""Websocket limits: sockets per user across every web process, topics per socket, and a web
process that still stops at once on SIGTERM with sockets open (the slot bookkeeping adds no task)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from console import socket_slots, sockets
from tests.conftest import redis_url
from tests.stack import Stack

pytestmark = pytest.mark.django_db(transaction=True)


def _cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _open(base_url: str, cookie: str) -> ClientConnection:
    host = base_url.removeprefix("http://")
    return connect(
        f"ws://{host}/ws/live/",
        additional_headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}", "Origin": base_url},
        open_timeout=10,
    )


def _subscribed(ws: ClientConnection, topics: list[str]) -> dict[str, Any]:
    ws.send(json.dumps({"action": "subscribe", "topics": topics}))
    return json.loads(ws.recv(timeout=10))


def _close_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    return closed.value.rcvd.code if closed.value.rcvd else None


@pytest.fixture(autouse=True)
def _no_slots_left() -> Iterator[None]:
    import redis

    client = redis.Redis.from_url(redis_url())
    client.delete(*client.keys(f"{socket_slots.KEY_PREFIX}*") or ["-"])
    yield
    client.delete(*client.keys(f"{socket_slots.KEY_PREFIX}*") or ["-"])


@pytest.fixture
def servers(tmp_path) -> Iterator[list[Stack]]:  # type: ignore[no-untyped-def]
    """Two web processes on the same Redis, as a deployment runs them."""
    stacks = []
    try:
        for n in range(2):
            (tmp_path / str(n)).mkdir()
            stack = Stack(redis_url(), tmp_path / str(n))
            stack.start_server()
            stacks.append(stack)
        yield stacks
    finally:
        for stack in stacks:
            stack.stop()


def test_sigterm_stops_a_web_process_with_five_sockets_open_in_under_two_seconds(viewer_user, tmp_path) -> None:
    """The slot bookkeeping adds no task that shutdown waits for (an earlier per-socket renewal
    loop made every stop take the whole grace period). Typically the process is gone in about
    0.2 s, as before the caps; the 1 s grace period, as production sets one, bounds a rarer stall
    that predates them (channels-redis cancelling a receive on the way out; docs/reliability.md)."""
    from console.processes import uvicorn_command
    from tests.stack import free_port

    stack = Stack(redis_url(), tmp_path)
    port = free_port()
    stack.base_url = f"http://127.0.0.1:{port}"
    proc = stack._spawn("uvicorn", uvicorn_command(port, graceful_shutdown_s=1))
    stack._wait(lambda: requests.get(f"{stack.base_url}/healthz", timeout=1).ok, "uvicorn", proc)
    cookie = _cookie(viewer_user)
    try:
        with ExitStack() as opened:
            for _ in range(5):
                ws = opened.enter_context(_open(stack.base_url, cookie))
                assert _subscribed(ws, ["fleet"])["type"] == "subscribed"
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("still running 30 s after SIGTERM:\n" + (tmp_path / "uvicorn.log").read_text()[-3000:])
            elapsed = time.monotonic() - started
    finally:
        stack.stop()
    print(f"RESULT sigterm_exit_seconds={elapsed:.2f} sockets=5")
    assert elapsed < 2, f"{elapsed:.2f} s from SIGTERM to exit"


def test_a_user_past_the_socket_limit_is_refused_with_4429_across_web_processes_until_one_closes(
    viewer_user, servers
) -> None:
    assert settings.WS_MAX_PER_USER == 20
    cookie = _cookie(viewer_user)
    with ExitStack() as opened:
        held = []
        for n in range(20):  # ten on each web process
            ws = opened.enter_context(_open(servers[n % 2].base_url, cookie))
            assert _subscribed(ws, ["fleet"])["type"] == "subscribed"
            held.append(ws)
        assert socket_slots.held(viewer_user.pk) == 20
        for stack in servers:  # the 21st, on either process
            with _open(stack.base_url, cookie) as refused:
                assert _close_code(refused) == sockets.CLOSE_TOO_MANY_SOCKETS
                assert "At most 20 sockets" in (refused.close_reason or "")
        # Closing one frees its slot (at once, not when it would lapse) for the next socket.
        held.pop().close()
        deadline = time.monotonic() + 5
        while socket_slots.held(viewer_user.pk) > 19 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket_slots.held(viewer_user.pk) == 19
        with _open(servers[0].base_url, cookie) as again:
            assert _subscribed(again, ["fleet"])["type"] == "subscribed"


def test_more_topics_than_a_socket_may_follow_close_it_with_4413(viewer_user, servers) -> None:
    assert settings.WS_MAX_TOPICS == 50
    cookie = _cookie(viewer_user)
    topics = ["fleet", "incidents", "power"] + [f"site.{n}" for n in range(1, 48)]
    with _open(servers[0].base_url, cookie) as ws:
        assert len(_subscribed(ws, topics)["topics"]) == 50  # the limit itself is allowed
    with _open(servers[0].base_url, cookie) as ws:
        reply = _subscribed(ws, [*topics, "site.48"])
        assert reply == {"type": "error", "error": "At most 50 topics per connection."}
        assert _close_code(ws) == sockets.CLOSE_TOO_MANY_TOPICS
    # Both sockets gave their slots back.
    deadline = time.monotonic() + 5
    while socket_slots.held(viewer_user.pk) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert socket_slots.held(viewer_user.pk) == 0


def test_a_lapsed_slot_no_longer_counts(viewer_user) -> None:
    """A web process killed without closing its sockets: their slots lapse after the TTL."""
    from asgiref.sync import async_to_sync

    for n in range(settings.WS_MAX_PER_USER):
        assert async_to_sync(socket_slots.take)(viewer_user.pk, f"dead.{n}", 3)
    # The last slot taken lapses last: on a loaded machine the takes can span a second or more.
    lapses = time.monotonic() + 3
    assert not async_to_sync(socket_slots.take)(viewer_user.pk, "alive", 60)
    time.sleep(max(0, lapses - time.monotonic()) + 0.2)
    assert async_to_sync(socket_slots.take)(viewer_user.pk, "alive", 60)
    assert socket_slots.held(viewer_user.pk) == 1
