"""The real process stack for end-to-end tests: a Celery worker and a uvicorn server as
subprocesses, on the test database and Redis, in production mode."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import redis
import requests
from django.db import connection

from console.processes import healthy, uvicorn_command
from tests.parallel import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_database_url() -> str:
    s = connection.settings_dict
    host = s["HOST"] or "127.0.0.1"
    if host.startswith("/"):
        host = quote(host, safe="")  # a unix-socket directory (the embedded PostgreSQL)
    port = f":{s['PORT']}" if s.get("PORT") else ""
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgres://{quote(s['USER'])}{password}@{host}{port}/{s['NAME']}"


def stack_env(redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        REDIS_URL=redis_url,
        SECRET_KEY=env.get("SECRET_KEY") or "test-only-secret-key",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_SETTINGS_MODULE="console.settings",
        PYTHONUNBUFFERED="1",
        GOODPUT_LIVE_MIN_INTERVAL_MS="500",
        GOODPUT_FLEET_SUMMARY_SECONDS="0",  # a test reads what it just wrote
        GOODPUT_SERVING_SUMMARY_SECONDS="0",
        # The stack's workers keep heads of the test database's chain, never in the checkout's var/.
        GOODPUT_AUDIT_HEADS_DIR=str(Path(tempfile.gettempdir()) / f"goodput-stack-heads-{os.getpid()}"),
    )
    return env


class TcpProxy:
    """A TCP proxy on loopback that can be cut and restored: a database "outage" for the processes
    that reach PostgreSQL through it, while the test process keeps its own direct connection."""

    def __init__(self, target_host: str, target_port: int) -> None:
        # A unix-socket directory (the embedded PostgreSQL) or a TCP host.
        self.target: str | tuple[str, int] = (
            f"{target_host}/.s.PGSQL.{target_port}" if target_host.startswith("/") else (target_host, target_port)
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            try:
                if isinstance(self.target, str):
                    upstream = socket.socket(socket.AF_UNIX)
                    upstream.connect(self.target)
                else:
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)  # the 5 s was for connecting: an idle link stays up
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Refuse new connections and sever the open ones."""
        self.up.clear()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.conns.clear()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def proxied_database_url(proxy: TcpProxy) -> str:
    """The test database, reached through the proxy."""
    s = connection.settings_dict
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgres://{quote(s['USER'])}{password}@127.0.0.1:{proxy.port}/{s['NAME']}"


def database_address() -> tuple[str, int]:
    s = connection.settings_dict
    return s["HOST"] or "127.0.0.1", int(s.get("PORT") or 5432)


class Stack:
    def __init__(self, redis_url: str, log_dir: Path, **env_overrides: str) -> None:
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.env_overrides = env_overrides
        self.procs: list[subprocess.Popen[bytes]] = []
        self.base_url = ""

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        env = {**stack_env(self.redis_url), **self.env_overrides}
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_worker(self, *, pool: str = "solo", name: str = "worker") -> subprocess.Popen[bytes]:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            f"--pool={pool}",
            "--concurrency=1",
            "--loglevel=INFO",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            f"--hostname={name}@%h",
        ]
        proc = self._spawn(name, args)
        self._wait(lambda: self._worker_ready(name), f"the Celery worker {name}", proc)
        return proc

    def start_server(self) -> subprocess.Popen[bytes]:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        proc = self._spawn(
            "uvicorn",
            uvicorn_command(port),
        )
        self._wait(lambda: healthy(port, timeout=1), "uvicorn", proc)
        return proc

    def _worker_ready(self, name: str = "worker") -> bool:
        return b"ready." in (self.log_dir / f"{name}.log").read_bytes()

    def _wait(self, check, what: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; see {self.log_dir}")
            try:
                if check():
                    return
            except (requests.RequestException, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{what} did not start within {timeout} s; see {self.log_dir}")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()

    def flush_redis(self) -> None:
        redis.Redis.from_url(self.redis_url).flushdb()
