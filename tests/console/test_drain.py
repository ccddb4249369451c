"""A web process that gets SIGTERM hands its websockets on before it stops (console.drain).

Its pages must hear "service restart" (1012, which static/js/live.js answers by reconnecting
within a second, without a banner), GOODPUT_WS_DRAIN_PER_SECOND a second rather than all in one
instant; meanwhile the process says it is not ready and turns new sockets away the same way.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from console.drain import CLOSE_SERVICE_RESTART, drain_delays
from console.processes import uvicorn_command
from tests.conftest import redis_url
from tests.stack import ROOT, free_port, stack_env

PER_SECOND = 2
SOCKETS = 5
DRAIN_SECONDS = (SOCKETS - 1) / PER_SECOND
GRACE_SECONDS = 2


def test_the_closes_are_paced_the_first_at_once_and_all_within_the_limit() -> None:
    assert drain_delays(0, per_second=10, at_most=10) == []
    assert drain_delays(1, per_second=10, at_most=10) == [0.0]
    assert drain_delays(4, per_second=2, at_most=10) == [0.0, 0.5, 1.0, 1.5]
    # Too many for the pace within the limit: faster, evenly, ending at the limit.
    assert drain_delays(5, per_second=1, at_most=2) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert drain_delays(3, per_second=1, at_most=0) == [0.0, 0.0, 0.0]


@pytest.fixture
def session_cookie(transactional_db: None, viewer_user) -> str:  # type: ignore[no-untyped-def]
    """A viewer's session, committed so the server process sees it."""
    client = Client()
    client.force_login(viewer_user)
    return client.cookies["sessionid"].value


def _start(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **stack_env(redis_url()),
        "GOODPUT_SHUTDOWN_GRACE_SECONDS": str(GRACE_SECONDS),
        "GOODPUT_WS_DRAIN_PER_SECOND": str(PER_SECOND),
        "GOODPUT_WS_DRAIN_SECONDS": "10",
    }
    with log.open("wb") as out:
        command = uvicorn_command(port, graceful_shutdown_s=GRACE_SECONDS)
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
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


def _socket(base: str, cookie: str) -> ClientConnection:
    return connect(
        f"ws://{base}/ws/live/",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": f"http://{base}"},
        open_timeout=10,
    )


def _subscribed(ws: ClientConnection) -> ClientConnection:
    ws.send(json.dumps({"action": "subscribe", "topics": ["fleet"]}))
    assert json.loads(ws.recv(timeout=10))["type"] == "subscribed"
    return ws


def _await_close(ws: ClientConnection, closes: dict[int, tuple[float, int | None]], key: int) -> None:
    try:
        while True:
            ws.recv(timeout=DRAIN_SECONDS + GRACE_SECONDS + 5)
    except ConnectionClosed:
        closes[key] = (time.monotonic(), ws.close_code)
    except TimeoutError:
        closes[key] = (time.monotonic(), None)


def test_sigterm_moves_every_socket_with_service_restart_spread_over_the_drain(session_cookie, tmp_path) -> None:
    log = tmp_path / "uvicorn.log"
    proc, base = _start(log)
    closes: dict[int, tuple[float, int | None]] = {}
    try:
        with contextlib.ExitStack() as opened:
            # Pages already left (closed by the browser) are not this process's to move.
            for _ in range(2):
                with _socket(base, session_cookie) as gone:
                    _subscribed(gone)
            sockets = [_subscribed(opened.enter_context(_socket(base, session_cookie))) for _ in range(SOCKETS)]
            readers = [threading.Thread(target=_await_close, args=(ws, closes, n)) for n, ws in enumerate(sockets)]
            assert requests.get(f"http://{base}/readyz", timeout=5).status_code == 200
            for reader in readers:
                reader.start()
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)

            # --- while it drains: not ready, and a new socket is turned away with the same code ---
            time.sleep(0.3)
            ready = requests.get(f"http://{base}/readyz", timeout=5)
            assert ready.status_code == 503, ready.text
            assert "draining" in ready.json()["checks"]
            with _socket(base, session_cookie) as late, pytest.raises(ConnectionClosed):
                late.recv(timeout=5)
            assert late.close_code == CLOSE_SERVICE_RESTART

            for reader in readers:
                reader.join(timeout=DRAIN_SECONDS + GRACE_SECONDS + 10)
        proc.wait(timeout=DRAIN_SECONDS + GRACE_SECONDS + 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    codes = [code for _, code in closes.values()]
    assert codes == [CLOSE_SERVICE_RESTART] * SOCKETS, (codes, log.read_text())
    times = sorted(moment for moment, _ in closes.values())
    # Spread over the window (the first at once), not all in one instant.
    assert times[0] - signalled < 1.0
    assert times[-1] - times[0] >= DRAIN_SECONDS * 0.7, times
    assert f"drained {SOCKETS} websockets" in log.read_text()
