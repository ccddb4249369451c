from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class Receiver:
    """A local HTTP server standing in for a webhook, Slack or PagerDuty: records every POST and
    answers from a script of status codes (then 200)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[int] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "json": json.loads(body or b"null")})
                    status = receiver.script.pop(0) if receiver.script else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:  # type: ignore[no-untyped-def]
    # The stand-in chat service listens on loopback, which outbound requests may not reach
    # unless the allow-list opens it.
    settings.OUTBOUND_ALLOWED_NETWORKS = ["0.0.0.0/0", "::/0", "127.0.0.0/8"]
    server = Receiver()
    yield server
    server.server.shutdown()
    server.server.server_close()
