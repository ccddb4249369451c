"""Shared pieces of the benchmarks: the bench database and Redis, the simulated fleet and its
inventory, the DRF baseline serializer, and subprocesses that are stopped however the program ends.

The benchmarks run the console in production mode against their own PostgreSQL database and Redis
database, never the ones the test suite or the demo use:

* ``BENCH_DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/bench``; created if missing)
* ``BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/11``; the ingest benchmark flushes it)
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench")
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of a production-mode console on the bench database and Redis."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=BENCH_DATABASE_URL,
        REDIS_URL=BENCH_REDIS_URL,
        SECRET_KEY=os.environ.get("BENCH_SECRET_KEY", "bench-only-secret-key"),
        ALLOWED_HOSTS="127.0.0.1,localhost,testserver",
        DJANGO_SETTINGS_MODULE="console.settings",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def ensure_database(url: str = BENCH_DATABASE_URL) -> None:
    """Create the bench database if it does not exist (through the server's maintenance database)."""
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=5).close()
        return
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    log(f"created database {name}")


def setup_django(**extra_env: str) -> None:
    """Point this process at the bench database and Redis (production mode), set Django up, migrate."""
    os.environ.update(bench_env(**extra_env))
    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# --- the simulated fleet ---------------------------------------------------------------------


def bench_sites(gpus: int) -> tuple[Any, ...]:
    """Three sites of 1,024 GPUs together (384 + 384 + 256), scaled up for larger fleets."""
    from fleet.telemetry.simulator import A100, H100, H200, L40S, NodeGroup, SiteSpec

    k = max(1, math.ceil(gpus / 1024))
    return (
        SiteSpec(
            "ams-1",
            "eu-west",
            1,
            520 * k,
            (
                NodeGroup("ams1-h100", H100, 40 * k, 8, "training", "DGX H100"),
                NodeGroup("ams1-l40s", L40S, 8 * k, 8, "inference", "L40S 8-GPU"),
            ),
        ),
        SiteSpec(
            "iad-2",
            "us-east",
            -5,
            480 * k,
            (
                NodeGroup("iad2-h200", H200, 32 * k, 8, "training", "HGX H200"),
                NodeGroup("iad2-a100", A100, 16 * k, 8, "inference", "DGX A100"),
            ),
        ),
        SiteSpec("sin-1", "ap-southeast", 8, 160 * k, (NodeGroup("sin1-l40s", L40S, 32 * k, 8, "inference", "L40S"),)),
    )


def bench_fleet(gpus: int) -> tuple[tuple[Any, ...], dict[str, list[Any]]]:
    """(site specs, site name -> simulated GPUs), the same for every run with the same ``gpus``."""
    from fleet.telemetry.simulator import build_fleet

    sites = bench_sites(gpus)
    return sites, build_fleet(sites, gpu_limit=gpus, seed=7)


def ensure_inventory(sites: Iterable[Any], fleet: dict[str, list[Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """Sites, racks (4 nodes each), nodes and GPUs through the ORM; returns (site ids, GPU ids by UUID)."""
    from fleet.models import Gpu, Node, Rack, Site

    site_ids: dict[str, int] = {}
    for spec in sites:
        site, _ = Site.objects.get_or_create(
            name=spec.name, defaults={"region": spec.region, "contracted_power_kw": spec.contracted_power_kw}
        )
        site_ids[spec.name] = site.id
    nodes: dict[str, tuple[int, Any]] = {}  # hostname -> (site id, first GPU)
    for site_name, gpus in fleet.items():
        for gpu in gpus:
            nodes.setdefault(gpu.hostname, (site_ids[site_name], gpu))
    racks: dict[tuple[int, str], int] = {}
    for number, (hostname, (site_id, _)) in enumerate(sorted(nodes.items())):
        racks.setdefault((site_id, f"{hostname.rsplit('-', 1)[0]}-r{number // 4:02d}"), site_id)
    Rack.objects.bulk_create([Rack(site_id=s, name=n) for (s, n) in racks], ignore_conflicts=True)
    rack_ids = {(r.site_id, r.name): r.id for r in Rack.objects.all()}
    Node.objects.bulk_create(
        [
            Node(
                site_id=site_id,
                hostname=hostname,
                rack_id=rack_ids[(site_id, f"{hostname.rsplit('-', 1)[0]}-r{number // 4:02d}")],
                instance_type="bench",
            )
            for number, (hostname, (site_id, _)) in enumerate(sorted(nodes.items()))
        ],
        ignore_conflicts=True,
    )
    node_ids = dict(Node.objects.filter(hostname__in=list(nodes)).values_list("hostname", "id"))
    Gpu.objects.bulk_create(
        [
            Gpu(
                node_id=node_ids[g.hostname],
                uuid=g.uuid,
                index=g.index,
                model=g.model.name,
                hbm_gib=round(g.model.hbm_mib / 1024),
            )
            for gpus in fleet.values()
            for g in gpus
        ],
        ignore_conflicts=True,
    )
    uuids = [g.uuid for gpus in fleet.values() for g in gpus]
    gpu_ids = dict(Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "id"))
    return site_ids, gpu_ids


def drf_serializer() -> type:
    """The DRF equivalent of the ingest schema (same fields, same bounds): the naive baseline."""
    from rest_framework import serializers

    from fleet.telemetry.fields import GPU_SAMPLE_FIELDS

    fields: dict[str, serializers.Field] = {
        "gpu_uuid": serializers.RegexField(r"^(GPU|MIG)-[0-9A-Za-z-]{6,60}$"),
        "hostname": serializers.CharField(max_length=253),
        "ts": serializers.DateTimeField(),
        "gpu_index": serializers.IntegerField(min_value=0, max_value=1023, required=False, allow_null=True),
        "model": serializers.CharField(max_length=64, required=False, allow_null=True),
    }
    for f in GPU_SAMPLE_FIELDS:
        kind = serializers.FloatField if f.kind is float else serializers.IntegerField
        fields[f.name] = kind(min_value=f.minimum, max_value=f.maximum, required=False, allow_null=True)
    sample = type("SampleSerializer", (serializers.Serializer,), fields)
    return type("BatchSerializer", (serializers.Serializer,), {"samples": sample(many=True)})


# --- statistics ------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p95 of 20 values is the 19th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- subprocesses ------------------------------------------------------------------------------


class Processes:
    """Child processes (uvicorn, a Celery worker) with their output in log files, stopped on exit,
    on Ctrl-C and on SIGTERM: SIGTERM first (a warm shutdown), SIGKILL to the whole tree after 10 s."""

    def __init__(self) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="goodput-bench-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        atexit.register(self.stop)
        signal.signal(signal.SIGTERM, _raise_system_exit)

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log_file = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        # A new session: Ctrl-C reaches this program only, which then stops the children in order.
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def discard_logs(self) -> None:
        """After a successful run: the logs only matter when something failed."""
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def log_text(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def wait_until(self, name: str, check: Callable[[], bool], timeout: float = 60) -> None:
        proc, deadline = self.procs[name], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_text(name)[-3000:]}")
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not start within {timeout} s; see {self.log_dir / name}.log")

    def tree(self, name: str) -> list[Any]:
        """The psutil processes of a child and all its descendants (empty once it has exited)."""
        import psutil

        try:
            parent = psutil.Process(self.procs[name].pid)
            return [parent, *parent.children(recursive=True)]
        except (psutil.NoSuchProcess, KeyError):
            return []

    def stop(self) -> None:
        import psutil

        trees = {name: self.tree(name) for name in self.procs}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for members in trees.values():
            for member in members:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
        self.procs.clear()


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def viewer_client() -> Any:
    """Django's test client signed in as a Viewer (the benches time the read APIs through the whole
    request path: middleware, session, DRF)."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from console.roles import VIEWER

    user, _ = User.objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get(name=VIEWER))
    client = Client()
    client.force_login(user)
    return client


def timed_get(client: Any, url: str) -> tuple[float, Any]:
    """One GET through ``client``: (milliseconds, response); anything but a 200 ends the bench."""
    started = time.perf_counter()
    response = client.get(url)
    ms = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise SystemExit(f"GET {url}: HTTP {response.status_code} {response.content[:300]!r}")
    return ms, response
