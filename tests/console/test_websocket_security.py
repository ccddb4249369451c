"""The live websocket holds to the rules of an HTTP request for as long as it stays open.

Findings of a security probe, one section each: a socket outlived its session; an Origin on
another port of the same host (or, issue 37, of another scheme) was accepted; a frame that was
not a JSON object killed the socket; a database outage answered the handshake with a 500.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from importlib import import_module
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import ApplicationCommunicator, WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from console import roles, sockets
from goodput.asgi import application
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)

HOST = b"127.0.0.1:8000"
ORIGIN = b"http://127.0.0.1:8000"
CLOSED_SIGNED_OUT = {"type": "websocket.close", "code": 4401}


def _signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _cookie(client: Client) -> bytes:
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def _socket(
    client: Client | None, *, origin: bytes | None = ORIGIN, host: bytes | None = HOST
) -> WebsocketCommunicator:
    headers = []
    if host is not None:
        headers.append((b"host", host))
    if origin is not None:
        headers.append((b"origin", origin))
    if client is not None:
        headers.append((b"cookie", _cookie(client)))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


async def _open(client: Client) -> WebsocketCommunicator:
    ws = _socket(client)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to({"action": "subscribe", "topics": ["fleet"]})
    assert (await ws.receive_json_from())["type"] == "subscribed"
    return ws


async def _still_open(ws: WebsocketCommunicator) -> bool:
    await ws.send_json_to({"action": "subscribe", "topics": ["incidents"]})
    return (await ws.receive_json_from(timeout=2))["type"] == "subscribed"


# --- A. a socket ends with its session --------------------------------------------------------


def test_logout_closes_the_sockets_of_that_session(viewer_user: User) -> None:
    client = _signed_in(viewer_user)

    async def scenario() -> dict[str, Any]:
        ws = await _open(client)
        await sync_to_async(client.post)("/accounts/logout/")
        closed = await ws.receive_output(timeout=2)
        await ws.disconnect()
        return closed

    assert async_to_sync(scenario)() == CLOSED_SIGNED_OUT


def test_logout_in_another_browser_leaves_this_one_open(viewer_user: User) -> None:
    here, elsewhere = _signed_in(viewer_user), _signed_in(viewer_user)

    async def scenario() -> bool:
        ws = await _open(here)
        await sync_to_async(elsewhere.post)("/accounts/logout/")
        await asyncio.sleep(0.2)
        still_open = await _still_open(ws)
        await ws.disconnect()
        return still_open

    assert async_to_sync(scenario)() is True


def test_a_password_change_closes_every_socket_of_the_user(viewer_user: User, operator_user: User) -> None:
    first, second, colleague = _signed_in(viewer_user), _signed_in(viewer_user), _signed_in(operator_user)

    def change_password() -> None:
        viewer_user.set_password(PASSWORD + "-new")
        viewer_user.save()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], bool]:
        sockets_of_user = [await _open(first), await _open(second)]
        colleague_ws = await _open(colleague)
        await sync_to_async(change_password)()
        closed = [await ws.receive_output(timeout=2) for ws in sockets_of_user]
        colleague_open = await _still_open(colleague_ws)
        for ws in [*sockets_of_user, colleague_ws]:
            await ws.disconnect()
        return closed[0], closed[1], colleague_open

    first_closed, second_closed, colleague_open = async_to_sync(scenario)()
    assert first_closed == second_closed == CLOSED_SIGNED_OUT
    assert colleague_open is True


def test_saving_the_user_without_a_new_password_leaves_the_socket_open(viewer_user: User) -> None:
    client = _signed_in(viewer_user)

    def rename() -> None:
        viewer_user.first_name = "Vera"
        viewer_user.save()

    async def scenario() -> bool:
        ws = await _open(client)
        await sync_to_async(rename)()
        await asyncio.sleep(0.2)
        still_open = await _still_open(ws)
        await ws.disconnect()
        return still_open

    assert async_to_sync(scenario)() is True


def _expire(client: Client, user: User) -> None:
    Session.objects.filter(session_key=client.session.session_key).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )


def _delete(client: Client, user: User) -> None:
    Session.objects.filter(session_key=client.session.session_key).delete()


def _change_password_without_signals(client: Client, user: User) -> None:
    User.objects.filter(pk=user.pk).update(password="pbkdf2_sha256$1$salt$changed-by-sql")


def _deactivate(client: Client, user: User) -> None:
    User.objects.filter(pk=user.pk).update(is_active=False)


@pytest.mark.parametrize("end_session", [_expire, _delete, _change_password_without_signals, _deactivate])
def test_the_periodic_recheck_closes_a_socket_whose_session_ended_unannounced(
    monkeypatch: pytest.MonkeyPatch, viewer_user: User, end_session: Any
) -> None:
    monkeypatch.setattr(sockets, "SESSION_RECHECK_SECONDS", 0.1)
    client = _signed_in(viewer_user)

    async def scenario() -> dict[str, Any]:
        ws = await _open(client)
        await sync_to_async(end_session)(client, viewer_user)
        closed = await ws.receive_output(timeout=2)
        await ws.disconnect()
        return closed

    assert async_to_sync(scenario)() == CLOSED_SIGNED_OUT


def test_the_periodic_recheck_closes_a_socket_whose_user_lost_the_role(
    monkeypatch: pytest.MonkeyPatch, viewer_user: User
) -> None:
    monkeypatch.setattr(sockets, "SESSION_RECHECK_SECONDS", 0.1)
    client = _signed_in(viewer_user)

    async def scenario() -> dict[str, Any]:
        ws = await _open(client)
        await sync_to_async(viewer_user.groups.remove)(await Group.objects.aget(name=roles.VIEWER))
        closed = await ws.receive_output(timeout=2)
        await ws.disconnect()
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": 4403}


def test_the_periodic_recheck_leaves_a_live_session_open(monkeypatch: pytest.MonkeyPatch, viewer_user: User) -> None:
    monkeypatch.setattr(sockets, "SESSION_RECHECK_SECONDS", 0.05)
    client = _signed_in(viewer_user)

    async def scenario() -> bool:
        ws = await _open(client)
        await asyncio.sleep(0.5)  # several rechecks
        still_open = await _still_open(ws)
        await ws.disconnect()
        return still_open

    assert async_to_sync(scenario)() is True


def test_the_recheck_interval_is_at_most_a_minute() -> None:
    assert 0 < sockets.SESSION_RECHECK_SECONDS <= 60


# --- B. the Origin must be the scheme, host and port the socket connects to -------------------


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "connected"),
    [
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000", "ws", True),
        (b"https://localhost", b"localhost", "wss", True),
        (b"https://localhost", b"localhost:443", "wss", True),
        (b"http://127.0.0.1:9999", b"127.0.0.1:8000", "ws", False),  # another port of the same host
        (b"http://127.0.0.1", b"127.0.0.1:8000", "ws", False),
        (b"http://localhost:8000", b"127.0.0.1:8000", "ws", False),  # another name for the same machine
        (b"https://localhost", b"localhost:80", "ws", False),
        (b"http://evil.example", b"evil.example", "ws", False),  # DNS rebinding: not an allowed host
        (b"null", b"127.0.0.1:8000", "ws", False),
        (b"http://127.0.0.1:notaport", b"127.0.0.1:8000", "ws", False),
        (None, b"127.0.0.1:8000", "ws", False),
        (b"http://127.0.0.1", None, "ws", True),  # no Host header (in-process clients): an allowed host, default port
        (b"http://127.0.0.1:9999", None, "ws", False),
        # Issue 37, item 10: the scheme counts too. A plain-http page on the console's host and
        # port (anyone on the path can write into it) may not open a socket to the https console.
        (b"http://localhost:443", b"localhost:443", "wss", False),
        (b"http://localhost", b"localhost", "wss", False),
        (b"https://localhost:8000", b"localhost:8000", "ws", False),
        (b"https://localhost:8000", b"localhost:8000", "wss", True),
    ],
)
def test_the_origin_must_be_the_scheme_host_and_port_connected_to(
    viewer_user: User, origin: bytes | None, host: bytes | None, scheme: str, connected: bool
) -> None:
    client = _signed_in(viewer_user)

    async def scenario() -> bool:
        ws = _socket(client, origin=origin, host=host)
        ws.scope["scheme"] = scheme  # read when the application starts, at connect()
        accepted, _ = await ws.connect()
        await ws.disconnect()
        return accepted

    assert async_to_sync(scenario)() is connected


# --- C. a malformed frame gets an error reply, and the socket stays open ----------------------


@pytest.mark.parametrize(
    ("frame", "error_mentions"),
    [
        ({"bytes_data": b"\x00\x01binary"}, "binary"),
        ({"text_data": "not json"}, "JSON"),
        ({"text_data": "[" * 100_000}, "JSON"),  # nested too deep for the decoder
        ({"text_data": '["subscribe", "fleet"]'}, "object"),
        ({"text_data": "42"}, "object"),
        ({"text_data": '{"topics": ["fleet"]}'}, "action"),
        ({"text_data": '{"action": "dance"}'}, "dance"),
        ({"text_data": '{"action": ["subscribe"]}'}, "action"),
    ],
)
def test_a_malformed_frame_gets_an_error_and_the_socket_stays_open(
    viewer_user: User, frame: dict[str, Any], error_mentions: str
) -> None:
    client = _signed_in(viewer_user)

    async def scenario() -> tuple[dict[str, Any], bool]:
        ws = await _open(client)
        await ws.send_to(**frame)
        reply = await ws.receive_json_from()
        still_open = await _still_open(ws)
        await ws.disconnect()
        return reply, still_open

    reply, still_open = async_to_sync(scenario)()
    assert reply["type"] == "error"
    assert error_mentions.lower() in reply["error"].lower()
    assert still_open is True


# --- D. a database outage answers the handshake with 503 --------------------------------------


def _take_the_database_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session reads (a socket's first database query) fail from now on, as with PostgreSQL down."""

    def load(self: Any) -> dict[str, Any]:
        raise OperationalError("connection refused")

    monkeypatch.setattr(import_module(settings.SESSION_ENGINE).SessionStore, "load", load)


def _handshake(client: Client, **scope: Any) -> ApplicationCommunicator:
    headers = [(b"host", HOST), (b"origin", ORIGIN), (b"cookie", _cookie(client))]
    return ApplicationCommunicator(
        application, {"type": "websocket", "path": "/ws/live/", "query_string": b"", "headers": headers, **scope}
    )


def test_a_database_outage_answers_the_handshake_with_503_and_retry_after(
    monkeypatch: pytest.MonkeyPatch, viewer_user: User
) -> None:
    client = _signed_in(viewer_user)
    _take_the_database_down(monkeypatch)

    async def scenario() -> list[dict[str, Any]]:
        ws = _handshake(client, extensions={"websocket.http.response": {}})
        await ws.send_input({"type": "websocket.connect"})
        messages = [await ws.receive_output(), await ws.receive_output()]
        await ws.send_input({"type": "websocket.disconnect", "code": 1006})
        await ws.wait()
        return messages

    start, body = async_to_sync(scenario)()
    assert start["type"] == "websocket.http.response.start"
    assert start["status"] == 503
    assert (b"retry-after", b"5") in start["headers"]
    assert body["type"] == "websocket.http.response.body"
    assert b"database is unavailable" in body["body"]


def test_a_database_outage_refuses_the_handshake_where_the_server_cannot_send_a_response(
    monkeypatch: pytest.MonkeyPatch, viewer_user: User
) -> None:
    client = _signed_in(viewer_user)
    _take_the_database_down(monkeypatch)

    async def scenario() -> dict[str, Any]:
        ws = _handshake(client)
        await ws.send_input({"type": "websocket.connect"})
        refused = await ws.receive_output()
        await ws.send_input({"type": "websocket.disconnect", "code": 1006})
        await ws.wait()
        return refused

    assert async_to_sync(scenario)()["type"] == "websocket.close"


def test_a_database_outage_during_a_recheck_closes_the_socket_to_retry_later(
    monkeypatch: pytest.MonkeyPatch, viewer_user: User
) -> None:
    monkeypatch.setattr(sockets, "SESSION_RECHECK_SECONDS", 0.1)
    client = _signed_in(viewer_user)

    async def scenario() -> dict[str, Any]:
        ws = await _open(client)
        _take_the_database_down(monkeypatch)
        closed = await ws.receive_output(timeout=2)
        await ws.disconnect()
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": 1013}
