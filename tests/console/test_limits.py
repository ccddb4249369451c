"""The outermost door (console.limits): a body past its route's limit gets 413 before anything
reads it: no authentication, no CSRF check, nothing spooled. Tried on a real uvicorn server."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from console import limits
from tests.conftest import redis_url
from tests.stack import Stack

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_blocker) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    # The test database is created by the first db fixture; this server only needs it to start.
    stack = Stack(redis_url(), tmp_path_factory.mktemp("limits"))
    with django_db_blocker.unblock():
        stack.start_server()
    yield stack
    stack.stop()


def _address(stack: Stack) -> tuple[str, int]:
    host, port = stack.base_url.removeprefix("http://").split(":")
    return host, int(port)


def _response(conn: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response: status, headers, body (by Content-Length)."""
    conn.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    while len(body) < int(headers.get("content-length", 0)):
        body += conn.recv(65536)
    return int(lines[0].split()[1]), headers, body


def _closed_by_server(conn: socket.socket) -> bool:
    try:
        return conn.recv(65536) == b""
    except ConnectionResetError:
        return True


def _post_headers(path: str, stack: Stack, extra: str) -> bytes:
    host = stack.base_url.removeprefix("http://")
    return f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n{extra}\r\n".encode()


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("/healthz", MiB),
        ("/accounts/login/", MiB),
        ("/api/v1/ingest/gpu-samples", 5 * MiB),
        ("/api/v1/ingest/prometheus", 5 * MiB),
        ("/api/v1/ingest/prometheus/remote-write", 5 * MiB),
        ("/api/v1/compliance/datasets/1/domains/", 20 * MiB),
        ("/compliance/datasets/1/", 20 * MiB),
    ],
)
def test_an_oversize_content_length_gets_413_naming_the_limit_before_a_byte_is_sent(server, path, limit) -> None:
    with socket.create_connection(_address(server)) as conn:
        # Anonymous, no CSRF token, and not one byte of the 500 MB body: the answer comes anyway.
        conn.sendall(_post_headers(path, server, "Content-Length: 500000000\r\n"))
        status, headers, body = _response(conn)
        assert status == 413
        assert headers["connection"] == "close"
        answer = json.loads(body)
        assert answer["limit_bytes"] == limit
        assert f"the limit for {path} is {limit} bytes" in answer["error"]
        assert _closed_by_server(conn)  # the rest would never be read


def test_a_client_that_asks_before_sending_is_never_told_to_send(server) -> None:
    with socket.create_connection(_address(server)) as conn:
        conn.sendall(_post_headers("/healthz", server, "Content-Length: 2000000\r\nExpect: 100-continue\r\n"))
        status, _, _ = _response(conn)
        assert status == 413  # not "100 Continue"


def test_a_body_within_its_route_limit_reaches_the_application(server) -> None:
    """2 MiB is over the default but within ingest's 5 MiB: the ingest view answers (401, no token)."""
    with socket.create_connection(_address(server)) as conn:
        conn.sendall(_post_headers("/api/v1/ingest/gpu-samples", server, f"Content-Length: {2 * MiB}\r\n"))
        conn.sendall(b"x" * (2 * MiB))
        status, _, _ = _response(conn)
        assert status == 401


def test_a_chunked_body_is_cut_off_past_the_limit_without_waiting_for_the_rest(server, tmp_path) -> None:
    """Sent without Content-Length, 64 KiB at a time, and never finished: past 1 MiB the door
    answers 413 and closes. Before it, Django read (and spooled) to the end of the body first,
    so this request would have hung with the body in a temporary file."""
    sent = 0
    stop = threading.Event()

    def stream(conn: socket.socket) -> None:
        nonlocal sent
        chunk = b"%x\r\n" % (64 * 1024) + b"x" * (64 * 1024) + b"\r\n"
        try:
            while not stop.is_set() and sent < 8 * MiB:
                conn.sendall(chunk)
                sent += 64 * 1024
        except OSError:  # the server closed the connection: what this test expects
            pass

    with socket.create_connection(_address(server)) as conn:
        conn.sendall(_post_headers("/healthz", server, "Transfer-Encoding: chunked\r\n"))
        sender = threading.Thread(target=stream, args=(conn,), daemon=True)
        sender.start()
        started = time.monotonic()
        status, _, body = _response(conn)
        stop.set()
        assert status == 413 and json.loads(body)["limit_bytes"] == MiB
        assert time.monotonic() - started < 5
        assert _closed_by_server(conn)
        sender.join(timeout=10)
    # The sender got no further than the limit plus what loopback's socket buffers hold; the
    # full 8 MiB it would have sent to a server that read everything never went out.
    assert MiB < sent < 8 * MiB


def _call(path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    """Run the door around an application that reads the whole body; the messages sent and how
    many chunks the application was handed."""
    sent: list[dict[str, Any]] = []
    handed = 0
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal handed
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            handed += 1
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    scope = {"type": "http", "path": path, "headers": headers}
    async_to_sync(limits.RequestBodyLimit(app))(scope, receive, send)
    return sent, handed


def test_limits_come_from_settings_per_route(settings) -> None:
    settings.REQUEST_MAX_BYTES = 2048
    settings.REQUEST_BODY_LIMITS = [(r"^/api/v1/ingest/", 4096)]
    assert limits.limit_for("/healthz") == 2048
    assert limits.limit_for("/api/v1/ingest/prometheus") == 4096
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # Django's own cap is set from the same figures
    sent, handed = _call("/healthz", [], [b"x" * 1024, b"x" * 1024, b"x" * 1024, b"x"])
    assert sent[0]["status"] == 413 and handed == 2  # the third chunk crossed the line
    assert len(sent) == 2  # the 413 and its body; the application sent nothing after
    sent, handed = _call("/api/v1/ingest/prometheus", [], [b"x" * 1024, b"x" * 1024, b"x" * 1024])
    assert sent[0]["status"] == 200 and handed == 3
    sent, handed = _call("/healthz", [(b"content-length", b"2049")], [b"x" * 2049])
    assert sent[0]["status"] == 413 and handed == 0


def test_django_never_refuses_a_body_the_door_lets_through() -> None:
    from django.conf import settings

    largest = max([settings.REQUEST_MAX_BYTES, *(limit for _, limit in settings.REQUEST_BODY_LIMITS)])
    assert largest <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert dict(settings.REQUEST_BODY_LIMITS)[r"^/api/v1/ingest/"] == settings.INGEST_MAX_BYTES
