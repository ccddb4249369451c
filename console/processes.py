"""How the console's web process is started outside ``make demo``: the uvicorn command line the
production command docs/production.md gives, and the readiness check on ``/healthz``. The benchmarks, the
soak and the test stack start their web processes with these, so all of them run the console the
way a deployment does."""

from __future__ import annotations

import http.client
import sys

ASGI_APP = "goodput.asgi:application"


def uvicorn_command(
    port: int,
    *,
    workers: int | None = None,
    access_log: bool = True,
    graceful_shutdown_s: int | None = None,
    ws_ping_interval_s: int | None = None,
) -> list[str]:
    """The argv of one uvicorn web process on 127.0.0.1:``port`` (lifespan off: the console has no
    start-up hooks; warnings only in its log; forwarded headers left to the app)."""
    command = [sys.executable, "-m", "uvicorn", ASGI_APP, "--host", "127.0.0.1", "--port", str(port)]
    if workers is not None:
        command += ["--workers", str(workers)]
    # --no-proxy-headers: uvicorn would otherwise take X-Forwarded-For from any loopback peer; the
    # app applies it itself, from GOODPUT_TRUSTED_PROXIES only (goodput.asgi).
    command += ["--lifespan", "off", "--log-level", "warning", "--no-proxy-headers"]
    if not access_log:
        command.append("--no-access-log")
    if ws_ping_interval_s is not None:
        command += ["--ws-ping-interval", str(ws_ping_interval_s)]
    if graceful_shutdown_s is not None:
        command += ["--timeout-graceful-shutdown", str(graceful_shutdown_s)]
    return command


def healthy(port: int, *, timeout: float = 2) -> bool:
    """Whether the web process on ``port`` answers ``/healthz`` with 200 (False while it starts)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()
