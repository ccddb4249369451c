"""HTTP through Django's synchronous handler (console.http): the ASGI request Django sees, a body
sent in pieces without a length, streamed answers, and more requests than threads."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.wsgi import get_wsgi_application

from console.http import SyncDjango, environ
from fleet.models import GpuSample
from tests.conftest import make_sample


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]], **extra: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("10.1.2.3", 40000),
        "server": ("127.0.0.1", 8000),
        **extra,
    }


def _call(app: SyncDjango, scope: dict[str, Any], pieces: list[bytes]) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """Send the body in ``pieces``; return the status, headers, body and number of body messages."""

    async def run() -> tuple[int, dict[bytes, bytes], bytes, int]:
        talk = ApplicationCommunicator(app, scope)
        for n, piece in enumerate(pieces):
            await talk.send_input({"type": "http.request", "body": piece, "more_body": n < len(pieces) - 1})
        start = await talk.receive_output(30)
        body, messages = b"", 0
        while True:
            message = await talk.receive_output(30)
            body += message.get("body", b"")
            messages += 1
            if not message.get("more_body"):
                break
        await talk.wait(5)
        return start["status"], dict(start["headers"]), body, messages

    return asyncio.run(run())


def test_the_environ_is_the_request_django_s_asgi_handler_would_build() -> None:
    scope = _scope(
        "POST",
        "/console/api/v1/x",
        [
            (b"content-type", b"application/json"),
            (b"content-length", b"999"),  # a lie: the body read is what counts
            (b"x-forwarded-for", b"1.1.1.1"),
            (b"x-forwarded-for", b"2.2.2.2"),
            (b"cookie", b"a=1; "),
            (b"cookie", b"b=2"),
        ],
        root_path="/console",
        query_string=b"site=1&q=%C3%A9",
    )
    env = environ(scope, io.BytesIO(b"{}"), 2)
    assert env["SCRIPT_NAME"] == "/console" and env["PATH_INFO"] == "/api/v1/x"
    assert env["QUERY_STRING"] == "site=1&q=%C3%A9"
    assert env["CONTENT_LENGTH"] == "2" and env["CONTENT_TYPE"] == "application/json"
    assert env["HTTP_X_FORWARDED_FOR"] == "1.1.1.1,2.2.2.2"
    assert env["HTTP_COOKIE"] == "a=1; b=2"
    assert env["REMOTE_ADDR"] == "10.1.2.3" and env["SERVER_PORT"] == "8000"
    assert env["wsgi.url_scheme"] == "http"


@pytest.mark.django_db(transaction=True)
def test_a_body_sent_in_pieces_without_a_length_is_read_whole(token_a: str) -> None:
    app = SyncDjango(get_wsgi_application(), threads=2)
    body = json.dumps({"samples": [make_sample(gpu_index=i) for i in range(8)]}).encode()
    pieces = [body[:100], body[100:1000], body[1000:]]  # chunked: no Content-Length header
    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {token_a}".encode())]
    status, _, answer, _ = _call(app, _scope("POST", "/api/v1/ingest/gpu-samples", headers), pieces)
    assert status == 202, answer
    assert json.loads(answer)["accepted"] == 8
    assert GpuSample.objects.count() == 8


@pytest.mark.django_db(transaction=True)
def test_a_body_past_the_memory_limit_is_spooled_and_still_read_whole(token_a: str, settings) -> None:  # type: ignore[no-untyped-def]
    """Bodies up to FILE_UPLOAD_MAX_MEMORY_SIZE are joined in memory; a larger one goes to a
    temporary file on the way, and Django reads the same bytes either way."""
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1500
    app = SyncDjango(get_wsgi_application(), threads=2)
    body = json.dumps({"samples": [make_sample(gpu_index=i) for i in range(8)]}).encode()
    assert len(body) > 2 * settings.FILE_UPLOAD_MAX_MEMORY_SIZE
    pieces = [body[:1000], body[1000:1400], body[1400:2000], body[2000:]]  # crosses the limit mid-way
    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {token_a}".encode())]
    status, _, answer, _ = _call(app, _scope("POST", "/api/v1/ingest/gpu-samples", headers), pieces)
    assert status == 202, answer
    assert json.loads(answer)["accepted"] == 8
    assert sorted(GpuSample.objects.values_list("gpu__index", flat=True)) == list(range(8))


@pytest.mark.django_db(transaction=True)
def test_the_answer_carries_django_s_headers_and_a_refusal_names_its_field(token_a: str) -> None:
    app = SyncDjango(get_wsgi_application(), threads=2)
    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {token_a}".encode())]
    bad = json.dumps({"samples": [make_sample(gpu_util=250)]}).encode()
    status, response_headers, answer, _ = _call(app, _scope("POST", "/api/v1/ingest/gpu-samples", headers), [bad])
    assert status == 400
    assert "gpu_util" in json.loads(answer)["field"]
    assert response_headers[b"x-content-type-options"] == b"nosniff"  # the middleware ran
    status, _, _, _ = _call(app, _scope("GET", "/fleet/", []), [b""])
    assert status == 302  # no session: to the login page, as before


@pytest.mark.django_db(transaction=True)
def test_more_requests_than_threads_all_get_answers() -> None:
    app = SyncDjango(get_wsgi_application(), threads=1)

    async def run() -> list[int]:
        async def one() -> int:
            talk = ApplicationCommunicator(app, _scope("GET", "/healthz", []))
            await talk.send_input({"type": "http.request", "body": b""})
            start = await talk.receive_output(30)
            await talk.receive_output(30)
            return start["status"]

        return await asyncio.gather(*(one() for _ in range(6)))

    assert asyncio.run(run()) == [200] * 6


def test_more_web_threads_than_pooled_connections_is_a_warning(settings) -> None:  # type: ignore[no-untyped-def]
    from console.checks import web_threads_within_the_pool

    pool = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
    settings.WEB_THREADS = pool
    assert web_threads_within_the_pool() == []
    settings.WEB_THREADS = pool + 1
    (warning,) = web_threads_within_the_pool()
    assert warning.id == "goodput.W103" and "DATABASE_POOL_MAX" in warning.msg
