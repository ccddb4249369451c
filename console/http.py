"""HTTP requests through Django's synchronous handler, one thread hop each.

Every view and middleware of the console is synchronous. Django's ASGI handler runs such a stack
by hopping between the event loop and a thread several times a request (in to the middleware
chain, back out to its async core, in again for each ``process_view`` hook and for the view, plus
the request signals), on a new thread for every request. Those hops cost about 2.5 ms of CPU a
request (``bench/ingest.py``: the web's CPU per 1,000-sample batch fell from 7.9 to 5.4 ms),
twice what validating the batch costs.

Here the event loop reads the body (``limits.RequestBodyLimit`` has bounded it; held in memory
up to ``FILE_UPLOAD_MAX_MEMORY_SIZE``, spooled to a temporary file past it), one pool thread
runs Django's WSGI handler (the same middleware, views and signals, all synchronous) and closes
the response, which returns that thread's database connection to the pool, and the loop sends the
answer. A streaming response (an audit CSV, a compliance pack) is sent from the thread chunk by
chunk as it is produced. Websockets stay with Channels.

At most ``WEB_THREADS`` requests of a process run at once; the rest wait their turn on the loop,
where they cost nothing. Keep it at or under ``DATABASE_POOL_MAX``: a thread without a connection
would wait for one.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from io import BytesIO
from tempfile import SpooledTemporaryFile
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

Message = dict[str, Any]


class SyncDjango:
    """The ASGI application for HTTP: Django's WSGI handler on a pool of ``threads`` threads."""

    def __init__(self, handler: WSGIHandler, *, threads: int) -> None:
        self.handler = handler
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="http")

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            raise ValueError(f"SyncDjango serves HTTP, not {scope['type']}")
        chunks, length = [], 0
        spooled: SpooledTemporaryFile[bytes] | None = None
        with ExitStack() as stack:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client went away, or RequestBodyLimit refused the body (413 sent)
                chunk = message.get("body", b"")
                length += len(chunk)
                if spooled is not None:
                    spooled.write(chunk)
                elif length > settings.FILE_UPLOAD_MAX_MEMORY_SIZE:  # a large upload: on to disk
                    spooled = stack.enter_context(SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE))
                    spooled.writelines([*chunks, chunk])
                    chunks = []
                else:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            # In memory, one join and no other copy: BytesIO shares the bytes, and Django's read
            # of the whole body gets that same object back.
            body = BytesIO(b"".join(chunks)) if spooled is None else spooled
            body.seek(0)
            loop = asyncio.get_running_loop()
            run = contextvars.copy_context().run
            reply = await loop.run_in_executor(self.executor, run, self._respond, scope, body, length, send, loop)
        if reply is not None:  # a whole response: sent from here, without another hop
            start, content = reply
            await send(start)
            await send({"type": "http.response.body", "body": content})

    def _respond(
        self, scope: dict[str, Any], body: Any, length: int, send: Callable, loop: asyncio.AbstractEventLoop
    ) -> tuple[Message, bytes] | None:
        """In a pool thread: run Django; return the start message and body, or, for a streaming
        response, send it from here and return None."""
        started: list[Message] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            started[:] = [
                {
                    "type": "http.response.start",
                    "status": int(status.split(" ", 1)[0]),
                    "headers": [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers],
                }
            ]

        response = self.handler(environ(scope, body, length), start_response)
        try:
            if not response.streaming:
                return started[0], b"".join(response)

            def send_now(message: Message) -> None:
                asyncio.run_coroutine_threadsafe(send(message), loop).result()

            send_now(started[0])
            for chunk in response:
                if chunk:
                    send_now({"type": "http.response.body", "body": chunk, "more_body": True})
            send_now({"type": "http.response.body"})
            return None
        finally:
            response.close()  # request_finished: this thread's connections go back to the pool


def environ(scope: dict[str, Any], body: Any, length: int) -> dict[str, Any]:
    """The WSGI environ of an ASGI HTTP request whose body has been read into ``body``.

    CONTENT_LENGTH is the body's real length: a chunked request has no header, and Django's WSGI
    request reads no more than it says."""
    script_name = scope.get("root_path", "")
    path = scope["path"]
    if script_name and path.startswith(script_name):
        path = path[len(script_name) :]
    server = scope.get("server") or ("localhost", 80)
    env: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name.encode().decode("latin-1"),
        "PATH_INFO": path.encode().decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] if server[1] is not None else 80),
        "CONTENT_LENGTH": str(length),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    client = scope.get("client")
    if client:
        env["REMOTE_ADDR"], env["REMOTE_PORT"] = client[0], str(client[1])
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        if name == "CONTENT_LENGTH":
            continue  # the body's real length, above
        key = name if name == "CONTENT_TYPE" else f"HTTP_{name}"
        # A repeated header is joined as Django's ASGI request joins it.
        if key == "HTTP_COOKIE":
            value = value.rstrip("; ")
            if key in env:
                value = f"{env[key]}; {value}"
        elif key in env:
            value = f"{env[key]},{value}"
        env[key] = value
    return env
