"""The outermost door: a request body past its route's limit is refused before anything reads it.

Django's ASGI handler reads the whole body (spooling it to a temporary file past
FILE_UPLOAD_MAX_MEMORY_SIZE) before any middleware runs, so authentication and CSRF come too late
to stop a large anonymous upload. This wrapper sits outside Django:

1. A ``Content-Length`` over the limit gets 413 at once; not a byte of the body is read (and a
   client that sent ``Expect: 100-continue`` is never told to send it).
2. A body without one (chunked) is counted as it arrives; past the limit the wrapper answers 413,
   tells the application the client has gone, and stops reading.

Both answers close the connection, so the rest of the body is never read as a next request.
Limits are per route (settings.REQUEST_BODY_LIMITS, else REQUEST_MAX_BYTES).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from django.conf import settings

Scope = dict[str, Any]


@cache
def _compiled(limits: tuple[tuple[str, int], ...]) -> tuple[tuple[re.Pattern[str], int], ...]:
    return tuple((re.compile(pattern), limit) for pattern, limit in limits)


def limit_for(path: str) -> int:
    """The most bytes a request body to ``path`` may have."""
    for pattern, limit in _compiled(tuple(map(tuple, settings.REQUEST_BODY_LIMITS))):
        if pattern.search(path):
            return limit
    return int(settings.REQUEST_MAX_BYTES)


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _too_large(limit: int, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    body = json.dumps(
        {
            "error": f"Request body too large: the limit for {path} is {limit} bytes ({limit / 1048576:g} MiB).",
            "limit_bytes": limit,
        }
    ).encode()
    start = {
        "type": "http.response.start",
        "status": 413,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


class RequestBodyLimit:
    """ASGI middleware: 413 for a body over its route's limit, before the application reads it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = limit_for(path)
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            for message in _too_large(limit, path):
                await send(message)
            return

        received = 0
        refused = False
        response_started = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not response_started:
                        for reply in _too_large(limit, path):
                            await send(reply)
                    # The application sees a client that went away (Django drops the request).
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal response_started
            if refused:
                return  # the 413 has been sent; nothing else goes out on this request
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        await self.app(scope, counted_receive, guarded_send)
