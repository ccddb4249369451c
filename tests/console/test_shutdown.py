"""SIGTERM stops the web server within its grace period, even with a live websocket open.

On SIGTERM uvicorn closes websockets and then waits for requests in flight and their tasks; one
that never finishes (here an upload whose body stops arriving) would keep the process running
until the orchestrator's SIGKILL. Both ways the console launches uvicorn are tried: the
documented production command and the demo command's server config.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import redis_url
from tests.stack import ROOT, free_port, stack_env

GRACE_SECONDS = 2
MARGIN_SECONDS = 5

# docs/production.md's production command, on a test port (one process: --workers adds a supervisor that
# forwards the signal to each worker, which then behaves the same).
PRODUCTION = [
    sys.executable, "-m", "uvicorn", "goodput.asgi:application", "--host", "127.0.0.1", "--port", "{port}",
    "--timeout-graceful-shutdown", "{grace}", "--no-proxy-headers",
]  # fmt: skip
# The demo command's server: its config, built by the command's own code.
DEMO = [
    sys.executable,
    "-c",
    "import sys, django, uvicorn; django.setup(); "
    "from goodput.management.commands.demo import server_config; "
    "uvicorn.Server(server_config('127.0.0.1', int(sys.argv[1]))).run()",
    "{port}",
]


@pytest.fixture
def session_cookie(transactional_db: None, viewer_user) -> str:  # type: ignore[no-untyped-def]
    """A viewer's session, committed so the server process sees it."""
    client = Client()
    client.force_login(viewer_user)
    return client.cookies["sessionid"].value


def _start(command: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [a.format(port=port, grace=GRACE_SECONDS) for a in command]
    env = {**stack_env(redis_url()), "GOODPUT_SHUTDOWN_GRACE_SECONDS": str(GRACE_SECONDS)}
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if requests.get(f"http://{base}/healthz", timeout=1).ok:
                return proc, base
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"uvicorn did not start:\n{log.read_text()}")


def _half_sent_upload(base: str) -> socket.socket:
    """A request whose body never finishes arriving: an upload on a stalled link."""
    host, port = base.split(":")
    upload = socket.create_connection((host, int(port)), timeout=10)
    upload.sendall(
        b"POST /api/v1/ingest/prometheus HTTP/1.1\r\nHost: " + base.encode() + b"\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n# HELP "
    )
    return upload


@pytest.mark.parametrize("command", [PRODUCTION, DEMO], ids=["production", "demo"])
def test_sigterm_stops_the_server_within_the_grace_period_with_a_websocket_open(
    session_cookie, tmp_path, command
) -> None:
    server_log = tmp_path / "uvicorn.log"
    proc, base = _start(command, server_log)
    try:
        with (
            _half_sent_upload(base),  # first: by the websocket's answer below, the server is reading it
            connect(
                f"ws://{base}/ws/live/",
                additional_headers={"Cookie": f"sessionid={session_cookie}", "Origin": f"http://{base}"},
                open_timeout=10,
            ) as ws,
        ):
            ws.send(json.dumps({"action": "subscribe", "topics": ["fleet"]}))
            assert json.loads(ws.recv(timeout=10))["type"] == "subscribed"  # the socket is live
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_SECONDS + MARGIN_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.fail(f"running {GRACE_SECONDS + MARGIN_SECONDS} s after SIGTERM:\n{server_log.read_text()}")
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=5)  # the server closed the websocket on its way out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The upload held the server until the grace period ran out, and no longer.
    assert "timeout graceful shutdown exceeded" in server_log.read_text()
