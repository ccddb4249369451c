"""GPU-sample ingest throughput: the real HTTP -> Celery -> PostgreSQL path against its limit and a
naive baseline, in one run, on the same pre-generated rows.

Workload: a simulated fleet (default 1,024 GPUs on three sites, fleet.telemetry.simulator's H100/H200/A100/
L40S behaviour, a sample a second per GPU) cut into per-site batches of ``--batch-size`` samples.
The batches are serialised once, cut at each timestamp; each use joins them with timestamps one
cycle later, so every batch is new data, and it goes with a unique Idempotency-Key.

Phases (fleet_gpusample and the other ingest tables are truncated before each):

* ``raw_copy``: binary COPY of the batches' rows straight into fleet_gpusample from one psycopg 3
  connection, one COPY and one commit per ``--fold`` batches (as the writer folds them; per
  batch, the figure is lower): the limit of the storage path.
* ``naive``: per batch, a DRF serializer validating the JSON, then ORM ``bulk_create`` of GpuSample
  rows in a transaction (in-process): what a plain Django implementation would do.
* ``e2e``: the real path in production mode: uvicorn and a Celery worker as subprocesses on the
  bench database and Redis, agent tokens issued per site, client threads POSTing the batches over
  keep-alive HTTP for ``--duration`` seconds. samples/s = committed rows (count(*) of
  fleet_gpusample, less the count before) / (first POST -> last commit, seen by polling the batch
  table once the queue has drained). The Celery worker's resident memory (the whole process tree)
  is sampled throughout. CPU time per 1,000 samples is read from /proc for the web and worker
  process trees, the whole PostgreSQL server (its backends come and go), Redis, this client, and
  the rest of the machine (other users of a shared machine show up there).
* ``breakdown`` (skip with ``--no-breakdown``): the same batches through each stage of the path,
  in-process and one at a time, timed: view validation, site scope check, a whole request through
  Django, Celery publish, worker decode, and each step of store_gpu_samples.

``--profile DIR`` also records the web and worker processes with py-spy during e2e
(``pip install py-spy``) and prints where their time goes.

Prints progress on stderr and ends with
RESULT e2e=<samples/s> raw_copy=<samples/s> naive=<samples/s> e2e_pct_of_raw=... e2e_vs_naive=...
worker_rss_mb_max=...
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import (
    BENCH_DATABASE_URL,
    BENCH_REDIS_URL,
    Processes,
    bench_env,
    bench_fleet,
    drf_serializer,
    ensure_inventory,
    free_port,
    log,
    percentile,
    setup_django,
)

from console.processes import healthy, uvicorn_command

INGEST_PATH = "/api/v1/ingest/gpu-samples"
PLACEHOLDER = "@@{:07d}@@"  # a tick's timestamp in a batch template
PLACEHOLDER_RE = re.compile(rb"@@(\d{7})@@")


# --- the workload ----------------------------------------------------------------------------


@dataclass
class Batch:
    site: str
    segments: list[bytes]  # the JSON body cut at each sample's timestamp
    slots: list[int]  # the pool tick whose timestamp goes between segments i and i + 1
    rows: list[tuple[int, int, tuple[Any, ...]]]  # (gpu id, tick, metric values) for the raw COPY
    samples: int


@dataclass
class Workload:
    """A pool of batches covering ``ticks`` seconds of the whole fleet, replayed in cycles, each
    cycle ``ticks`` seconds later than the one before."""

    batches: list[Batch]
    ticks: int
    base: datetime
    interval: timedelta
    _ts_cache: dict[int, tuple[list[datetime], list[bytes]]] = field(default_factory=dict)

    def _timestamps(self, cycle: int) -> tuple[list[datetime], list[bytes]]:
        cached = self._ts_cache.get(cycle)
        if cached is None:
            moments = [self.base + (cycle * self.ticks + t) * self.interval for t in range(self.ticks)]
            cached = (moments, [m.isoformat().encode() for m in moments])
            self._ts_cache = {cycle: cached}  # threads share it; only the current cycle is kept
        return cached

    def batch(self, n: int) -> tuple[Batch, int]:
        return self.batches[n % len(self.batches)], n // len(self.batches)

    def body(self, n: int) -> bytes:
        batch, cycle = self.batch(n)
        stamps = self._timestamps(cycle)[1]
        parts = [batch.segments[0]]
        for tick, segment in zip(batch.slots, batch.segments[1:], strict=True):
            parts += (stamps[tick], segment)
        return b"".join(parts)

    def copy_rows(self, n: int) -> list[tuple[Any, ...]]:
        batch, cycle = self.batch(n)
        moments = self._timestamps(cycle)[0]
        return [(gpu_id, moments[tick], *values) for gpu_id, tick, values in batch.rows]

    def last_ts(self, n: int) -> datetime:
        return self.base + ((n // len(self.batches) + 1) * self.ticks) * self.interval


def build_workload(fleet: dict[str, list[Any]], gpu_ids: dict[str, int], *, batch_size: int, ticks: int) -> Workload:
    from fleet.ingest.batches import parse_gpu_batch
    from fleet.telemetry.fields import METRIC_NAMES
    from fleet.telemetry.simulator import FleetSimulator

    interval = timedelta(seconds=1)
    # Two days back: all timestamps stay in the past (ingest refuses the future) for half an hour
    # of ingest at 100k samples/s, and inside the 7-day window ingest accepts.
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    sim = FleetSimulator(fleet, fault_rate_per_gpu_hour=5, interval=interval.total_seconds(), seed=7)
    streams: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for tick in range(ticks):
        for site, samples in sim.batches(base + tick * interval).items():
            for sample in samples:
                sample["ts"] = PLACEHOLDER.format(tick)
                streams[site].append((tick, sample))
    per_site: list[list[Batch]] = []
    for site, stream in streams.items():
        site_batches = []
        for start in range(0, len(stream), batch_size):
            chunk = stream[start : start + batch_size]
            template = json.dumps({"samples": [s for _, s in chunk]}, separators=(",", ":")).encode()
            pieces = re.split(PLACEHOLDER_RE, template)
            segments, slots = pieces[0::2], [int(t) for t in pieces[1::2]]
            # The COPY rows hold the values exactly as the ingest path decodes them.
            first_cycle = Workload([Batch(site, segments, slots, [], len(chunk))], ticks, base, interval)
            decoded = parse_gpu_batch(first_cycle.body(0)).samples
            rows = [
                (gpu_ids[s.gpu_uuid], t, tuple(getattr(s, name) for name in METRIC_NAMES))
                for (t, _), s in zip(chunk, decoded, strict=True)
            ]
            site_batches.append(Batch(site, segments, slots, rows, len(chunk)))
        per_site.append(site_batches)
    # Sites take turns, as agents of several sites would.
    batches = [b for group in itertools.zip_longest(*per_site) for b in group if b is not None]
    return Workload(batches, ticks, base, interval)


# --- database helpers --------------------------------------------------------------------------


def reset_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE fleet_gpusample, fleet_gpustate, fleet_ingestbatch, fleet_rollupdirty")


def ensure_partitions_for(workload: Workload) -> None:
    from fleet.telemetry import partitions

    partitions.forget_known_partitions()
    partitions.ensure_partitions(partitions.SAMPLES, workload.base, datetime.now(UTC) + timedelta(days=1))


def sample_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fleet_gpusample")
        return int(cursor.fetchone()[0])


def fold_sizes() -> tuple[int, float]:
    """The writers' transactions and the mean batches in each: a fold's batches share the
    received_at its transaction's now() gave them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), avg(n) FROM (SELECT count(*) AS n FROM fleet_ingestbatch GROUP BY received_at) f"
        )
        folds, mean = cursor.fetchone()
    return int(folds), float(mean or 0)


def stored_by_batches() -> int:
    """Samples of every committed batch (the batch row commits with its samples)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(samples), 0) FROM fleet_ingestbatch")
        return int(cursor.fetchone()[0])


# --- phase: raw COPY -----------------------------------------------------------------------------


def run_raw_copy(workload: Workload, seconds: float, fold: int) -> float:
    import psycopg

    from fleet.telemetry.copyrows import SAMPLE_COLUMNS, SAMPLE_TYPES

    reset_tables()
    ensure_partitions_for(workload)
    sql = f"COPY fleet_gpusample ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    rows = 0
    groups = raw_copy_processes()
    meter = CpuMeter(groups)
    with psycopg.connect(BENCH_DATABASE_URL) as conn:
        started = time.perf_counter()
        for copies in itertools.count(1):
            with conn.cursor() as cursor, cursor.copy(sql) as copy:
                copy.set_types(SAMPLE_TYPES)
                for n in range((copies - 1) * fold, copies * fold):
                    for row in workload.copy_rows(n):
                        copy.write_row(row)
                    rows += workload.batch(n)[0].samples
            conn.commit()
            if time.perf_counter() - started >= seconds:
                break
        elapsed = time.perf_counter() - started
    cpu = meter.stop(groups)
    assert sample_count() == rows
    rate = rows / elapsed
    per_k = 1000 * 1000 / rows
    log(
        f"raw_copy: {rows:,} rows in {elapsed:.1f} s = {rate:,.0f} samples/s ({copies} COPYs of {fold} batches); "
        f"CPU ms per 1,000 "
        f"samples: postgres (server) {cpu['postgres'] * per_k:.1f}, client {cpu['client'] * per_k:.1f}"
    )
    return rate


# --- phase: naive DRF + ORM ------------------------------------------------------------------------


def run_naive(workload: Workload, seconds: float) -> float:
    from django.db import transaction

    from fleet.models import Gpu, GpuSample
    from fleet.telemetry.fields import METRIC_NAMES

    reset_tables()
    ensure_partitions_for(workload)
    serializer_class = drf_serializer()
    rows = 0
    started = time.perf_counter()
    for n in itertools.count():
        serializer = serializer_class(data=json.loads(workload.body(n)))
        serializer.is_valid(raise_exception=True)
        samples = serializer.validated_data["samples"]
        ids = dict(Gpu.objects.filter(uuid__in={s["gpu_uuid"] for s in samples}).values_list("uuid", "id"))
        with transaction.atomic():
            GpuSample.objects.bulk_create(
                [
                    GpuSample(gpu_id=ids[s["gpu_uuid"]], ts=s["ts"], **{m: s.get(m) for m in METRIC_NAMES})
                    for s in samples
                ]
            )
        rows += len(samples)
        if time.perf_counter() - started >= seconds:
            break
    elapsed = time.perf_counter() - started
    assert sample_count() == rows
    rate = rows / elapsed
    log(f"naive: {rows:,} rows in {elapsed:.1f} s = {rate:,.0f} samples/s ({n + 1} batches)")
    return rate


# --- phase: end to end -----------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds per component between two snapshots, from /proc via psutil.

    A group is a list of processes, or ("server", postmaster) for PostgreSQL: its backends come and
    go (a connection per request or task), so it counts the live children plus the postmaster's
    counter of reaped children, i.e. the whole server, other databases included.
    """

    def __init__(self, groups: dict[str, Any]) -> None:
        import psutil

        self.start = {name: self._seconds(procs) for name, procs in groups.items()}
        self.machine = psutil.cpu_times()
        self.started = time.perf_counter()

    @staticmethod
    def _seconds(procs: Any) -> dict[int, float]:
        import psutil

        out = {}
        if isinstance(procs, tuple):  # ("server", postmaster)
            postmaster = procs[1]
            with contextlib.suppress(psutil.Error):
                t = postmaster.cpu_times()
                out[-1] = t.children_user + t.children_system
                procs = [postmaster, *postmaster.children()]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
        return out

    def stop(self, groups: dict[str, Any]) -> dict[str, float]:
        """Seconds of CPU per group (processes that appeared meanwhile count from zero), plus
        ``machine_busy`` (every process of the machine)."""
        import psutil

        used = {}
        for name, procs in groups.items():
            now, before = self._seconds(procs), self.start.get(name, {})
            used[name] = sum(v - before.get(pid, 0.0) for pid, v in now.items())
        machine = psutil.cpu_times()
        idle = (machine.idle + machine.iowait) - (self.machine.idle + self.machine.iowait)
        total = sum(machine) - sum(self.machine)
        wall = time.perf_counter() - self.started
        used["machine_busy"] = (total - idle) / total * psutil.cpu_count() * wall if total else 0.0
        return used


def postgres_server() -> tuple[str, Any]:
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return ("server", psutil.Process(cursor.fetchone()[0]).parent())


def raw_copy_processes() -> dict[str, Any]:
    import psutil

    return {"postgres": postgres_server(), "client": [psutil.Process()]}


def component_processes(procs: Processes) -> dict[str, Any]:
    import psutil

    redis_servers = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("redis-server")]
    return {
        "web": procs.tree("web"),
        "worker": procs.tree("worker"),
        "postgres": postgres_server(),
        "redis": redis_servers,
        "client": [psutil.Process()],
    }


class RssSampler(threading.Thread):
    """Max resident memory of a process tree (sum over its processes), sampled every 0.2 s."""

    def __init__(self, procs: Processes, name: str) -> None:
        super().__init__(daemon=True)
        self.procs, self.name_ = procs, name
        self.max_total = self.max_single = 0
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.done.wait(0.2):
            rss = []
            for p in self.procs.tree(self.name_):
                with contextlib.suppress(psutil.Error):
                    rss.append(p.memory_info().rss)
            if rss:
                self.max_total, self.max_single = max(self.max_total, sum(rss)), max(self.max_single, max(rss))


@dataclass
class ClientStats:
    accepted: int = 0
    batches: int = 0
    rejected_429: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def post_batches(
    port: int, workload: Workload, tokens: dict[str, str], numbers: Any, stop_at: float, stats: ClientStats, run: str
) -> None:
    """One client: keep-alive POSTs of the next batch until ``stop_at``; on 429 retry the same
    batch after 0.2 s (faster than Retry-After: the benchmark wants the queue never to run dry)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for n in numbers:
            if time.monotonic() >= stop_at or stats.errors:
                break
            batch, body = workload.batch(n)[0], workload.body(n)
            headers = {
                "Authorization": f"Bearer {tokens[batch.site]}",
                "Content-Type": "application/json",
                "Idempotency-Key": f"{run}-{n}",
            }
            while time.monotonic() < stop_at:
                sent = time.perf_counter()
                conn.request("POST", INGEST_PATH, body, headers)
                response = conn.getresponse()
                text = response.read()
                if response.status == 202:
                    with stats.lock:
                        stats.accepted += batch.samples
                        stats.batches += 1
                        stats.latencies.append(time.perf_counter() - sent)
                    break
                if response.status == 429:
                    with stats.lock:
                        stats.rejected_429 += 1
                    time.sleep(0.2)
                    continue
                with stats.lock:
                    stats.errors.append(f"HTTP {response.status}: {text[:300]!r}")
                return
    except (OSError, http.client.HTTPException) as exc:
        with stats.lock:
            stats.errors.append(f"{exc.__class__.__name__}: {exc}")
    finally:
        conn.close()


def wait_for_stored(target: int, *, timeout: float) -> float:
    """Poll until the committed batches hold ``target`` samples; return the time that was first seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stored_by_batches() >= target:
            return time.perf_counter()
        time.sleep(0.05)
    raise RuntimeError(f"only {stored_by_batches():,} of {target:,} samples stored after {timeout:.0f} s")


def start_stack(procs: Processes, args: argparse.Namespace, port: int) -> None:
    env = bench_env(
        GOODPUT_INGEST_QUEUE_BOUND=str(args.queue_bound),
        GOODPUT_INGEST_FOLD_BATCHES=str(args.fold),
        GOODPUT_INGEST_DRAINERS=str(args.drainers),
    )
    procs.spawn(
        "worker",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            f"--pool={args.celery_pool}",
            f"--concurrency={args.celery_concurrency}",
            "--loglevel=WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        env,
    )
    procs.spawn(
        "web",
        uvicorn_command(port, workers=args.web_workers, access_log=False),
        env,
    )

    procs.wait_until("worker", lambda: "[goodput:worker]" in procs.log_text("worker"))
    procs.wait_until("web", lambda: healthy(port))
    if args.web_workers > 1:  # the supervisor answers before every worker process has started
        procs.wait_until("web", lambda: len(procs.tree("web")) >= args.web_workers + 1)


def run_e2e(workload: Workload, args: argparse.Namespace, site_ids: dict[str, int], procs: Processes) -> dict[str, Any]:
    import redis

    from console.models import AgentToken
    from fleet.models import Site

    reset_tables()
    ensure_partitions_for(workload)
    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()
    run = f"bench-{secrets.token_hex(4)}"
    tokens = {name: AgentToken.issue(site=Site.objects.get(pk=pk), name=run)[1] for name, pk in site_ids.items()}
    port = free_port()
    log(
        f"e2e: starting uvicorn (--workers {args.web_workers}) and a Celery worker "
        f"(--pool={args.celery_pool} -c {args.celery_concurrency}); logs in {procs.log_dir}"
    )
    start_stack(procs, args, port)

    # Warm-up: one batch per site (token lookup, GPU directory, partitions, connections).
    warm = ClientStats()
    post_batches(port, workload, tokens, iter(range(len(site_ids))), time.monotonic() + 30, warm, run)
    if warm.errors:
        raise RuntimeError(f"warm-up failed: {warm.errors[0]}")
    wait_for_stored(warm.accepted, timeout=60)
    numbers = itertools.count(len(site_ids))
    start_rows = sample_count()

    rss = RssSampler(procs, "worker")
    rss.start()
    profilers = start_profilers(procs, args) if args.profile else []
    meter = CpuMeter(component_processes(procs))
    stats = ClientStats()
    log(f"e2e: {args.clients} client(s) POSTing {args.batch_size}-sample batches for {args.duration:.0f} s…")
    first_post = time.perf_counter()
    stop_at = time.monotonic() + args.duration
    clients = [
        threading.Thread(target=post_batches, args=(port, workload, tokens, numbers, stop_at, stats, run), daemon=True)
        for _ in range(args.clients)
    ]
    for t in clients:
        t.start()
    while any(t.is_alive() for t in clients):
        time.sleep(0.5)
        if stats.errors:
            break
    for t in clients:
        t.join()
    if stats.errors:
        raise RuntimeError(f"e2e client failed: {stats.errors[0]}")
    posted = time.perf_counter()
    log(f"e2e: {stats.batches} batches accepted ({stats.rejected_429} answered 429); waiting for the queue…")
    last_commit = wait_for_stored(warm.accepted + stats.accepted, timeout=300)
    cpu = meter.stop(component_processes(procs))
    rss.done.set()
    rss.join()
    for p in profilers:
        p.wait(timeout=30)
    rows = sample_count() - start_rows
    folds, fold_mean = fold_sizes()
    if workload.last_ts(next(numbers)) > datetime.now(UTC):
        raise RuntimeError("the run outran the workload's timestamps: lower --duration")
    elapsed = last_commit - first_post
    result = {
        "rate": rows / elapsed,
        "rows": rows,
        "elapsed": elapsed,
        "accept_rate": stats.accepted / (posted - first_post),
        "drain_s": last_commit - posted,
        "rejected_429": stats.rejected_429,
        "latency_p50_ms": percentile(stats.latencies, 50) * 1000,
        "latency_p95_ms": percentile(stats.latencies, 95) * 1000,
        "worker_rss_mb_max": rss.max_total / 2**20,
        "worker_rss_single_mb_max": rss.max_single / 2**20,
        "cpu": cpu,
    }
    procs.stop()
    log(f"e2e: written in {folds:,} transactions of {fold_mean:.1f} batches on average (at most --fold {args.fold})")
    log(
        f"e2e: {rows:,} rows committed in {elapsed:.1f} s = {result['rate']:,.0f} samples/s "
        f"(accepted at {result['accept_rate']:,.0f}/s, drain {result['drain_s']:.1f} s, POST p50 "
        f"{result['latency_p50_ms']:.0f} ms p95 {result['latency_p95_ms']:.0f} ms)"
    )
    log(
        f"e2e: worker RSS max {result['worker_rss_mb_max']:.0f} MiB for the tree, "
        f"{result['worker_rss_single_mb_max']:.0f} MiB for one process"
    )
    per_k = 1000 / rows  # CPU ms per 1,000 samples
    names = ("web", "worker", "postgres", "redis", "client")
    parts = [f"{name}{' (server)' if name == 'postgres' else ''} {cpu[name] * 1000 * per_k:.1f}" for name in names]
    other = cpu["machine_busy"] - sum(cpu[n] for n in names)
    log(
        f"e2e: CPU ms per 1,000 samples: {', '.join(parts)}, rest of machine {other * 1000 * per_k:.1f} "
        f"(machine busy {cpu['machine_busy'] / elapsed:.2f} of {os.cpu_count()} cores)"
    )
    if args.profile:
        summarise_profiles(Path(args.profile))
    return result


# --- optional py-spy profile of the e2e processes ---------------------------------------------------

# (label, function name suffix, path fragment) of the frames whose inclusive share is reported.
MARKERS = (
    ("ASGI: a thread per request (ThreadSensitiveContext)", "ThreadSensitiveContext.__aexit__", "asgiref/sync.py"),
    ("ASGI: read the body", "ASGIHandler.read_body", "django/core/handlers/asgi.py"),
    ("token auth", "AgentTokenAuthentication.authenticate", "console/authentication.py"),
    ("new PostgreSQL connection", "BaseDatabaseWrapper.connect", "django/db/backends/base/base.py"),
    ("new Redis connection", ".connect", "redis/connection.py"),
    ("parse_gpu_batch (validation)", "parse_gpu_batch", "fleet/ingest/batches.py"),
    ("check_site_scope", "check_site_scope", "fleet/ingest/batches.py"),
    ("queue_depth", "queue_depth", "console/queues.py"),
    ("format_registered (COPY rows)", "format_registered", "fleet/telemetry/copyrows.py"),
    ("encode_rows (MessagePack, GPUs to register)", "encode_rows", "fleet/ingest/batches.py"),
    ("enqueue (XADD and drainer slot)", "enqueue", "fleet/ingest/stream.py"),
    ("counters.increment", "increment", "console/counters.py"),
    ("DRF response render", "JSONRenderer.render", "rest_framework/renderers.py"),
    ("task drain_gpu_ingest (all of it)", "drain_gpu_ingest", "fleet/tasks.py"),
    ("stream reads and acknowledgements", "", "redis/commands/core.py"),
    ("decode (the row index)", "decode", "fleet/telemetry/copyrows.py"),
    ("decode_rows (MessagePack)", "decode_rows", "fleet/ingest/batches.py"),
    ("ensure_partitions", "ensure_partitions", "fleet/telemetry/partitions.py"),
    ("_claim_batches", "_claim_batches", "fleet/telemetry/store.py"),
    ("_own_rows", "_own_rows", "fleet/telemetry/store.py"),
    ("_format_samples (GPUs to register)", "_format_samples", "fleet/telemetry/store.py"),
    ("_copy_samples (COPY)", "_copy_samples", "fleet/telemetry/store.py"),
    ("_upsert_latest_state", "_upsert_latest_state", "fleet/telemetry/store.py"),
    ("mark_dirty_minutes", "mark_dirty_minutes", "fleet/telemetry/store.py"),
    ("transaction commit (Atomic.__exit__)", "Atomic.__exit__", "django/db/transaction.py"),
    ("live push request (on commit)", "request_push", "console/live.py"),
    ("live push task (push_topic)", "push_topic", "console/live.py"),
    ("Celery's Django fixup closing connections", "DjangoWorkerFixup._close_database", "celery/fixups/django.py"),
)


def start_profilers(procs: Processes, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    started = []
    for name in ("web", "worker"):
        pid = procs.procs[name].pid
        command = [spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--gil", "--format", "raw"]
        command += ["--rate", "50", "--duration", str(int(args.duration)), "--output", str(out / f"{name}.txt")]
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return started


def summarise_profiles(directory: Path) -> None:
    """Print, per process tree, the share of py-spy samples inside each marked function (inclusive)
    and the functions with the most samples of their own."""
    for name in ("web", "worker"):
        path = directory / f"{name}.txt"
        if not path.exists():
            log(f"profile: no {path} (is py-spy installed? pip install py-spy)")
            continue
        total, inclusive, self_time = 0, Counter(), Counter()
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            frames = [f.rsplit(" (", 1) for f in stack.split(";")[1:]]  # [function, "path:line)"]
            weight = int(count)
            total += weight
            hit = {
                label
                for label, func, where in MARKERS
                for frame in frames
                if len(frame) == 2 and frame[0].endswith(func) and where in frame[1]
            }
            for label in hit:
                inclusive[label] += weight
            if frames and len(frames[-1]) == 2:
                self_time[f"{frames[-1][0]} ({frames[-1][1].split(':')[0]})"] += weight
        if not total:
            continue
        log(f"profile {name}: {total} samples (all threads and processes); inclusive share:")
        for label in dict.fromkeys(label for label, _, _ in MARKERS):
            if inclusive[label]:
                log(f"    {100 * inclusive[label] / total:5.1f}%  {label}")
        log(f"profile {name}: top self time:")
        for frame, weight in self_time.most_common(15):
            log(f"    {100 * weight / total:5.1f}%  {frame}")


# --- phase: per-stage breakdown, in-process --------------------------------------------------------


class StageTimer:
    """Wraps module functions so each call adds its wall time to a named total."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.patches: list[tuple[Any, str, Any]] = []

    def wrap(self, module: Any, attr: str, label: str) -> None:
        original = getattr(module, attr)

        def timed(*a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                self.totals[label] += time.perf_counter() - started

        self.patches.append((module, attr, original))
        setattr(module, attr, timed)

    def time(self, label: str, fn: Any, *a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            self.totals[label] += time.perf_counter() - started

    def restore(self) -> None:
        for module, attr, original in reversed(self.patches):
            setattr(module, attr, original)


def run_breakdown(workload: Workload, site_ids: dict[str, int], seconds: float, fold: int) -> None:
    """Each stage of the path in-process, one request at a time, timed (ms per batch): the web
    side batch by batch, then the writer's side on folds of ``fold`` queued batches."""
    import redis
    from django.conf import settings
    from django.test import Client

    from console import live
    from console.models import AgentToken
    from fleet.ingest import batches as ingest
    from fleet.ingest import stream as ingest_stream
    from fleet.models import Site
    from fleet.telemetry import copyrows, partitions
    from fleet.telemetry import store as telemetry

    reset_tables()
    ensure_partitions_for(workload)
    broker = redis.Redis.from_url(BENCH_REDIS_URL)
    broker.flushdb()
    tokens = {
        name: AgentToken.issue(site=Site.objects.get(pk=pk), name="breakdown")[1] for name, pk in site_ids.items()
    }
    client = Client()
    timer = StageTimer()
    for attr in (
        "_claim_batches",
        "_own_rows",
        "_format_samples",
        "_copy_samples",
        "_upsert_latest_state",
        "mark_dirty_minutes",
    ):
        timer.wrap(telemetry, attr, f"writer: store: {attr.lstrip('_')}")
    timer.wrap(partitions, "ensure_partitions", "writer: store: ensure_partitions")
    timer.wrap(live, "request_push", "writer: store: on-commit live push request")
    timer.wrap(copyrows, "decode", "writer: decode the row index")
    timer.wrap(ingest_stream, "store_gpu_batches", "writer: store_gpu_batches (total)")
    batches = samples = queued = 0
    settings.INGEST_FOLD_BATCHES = fold
    started = time.perf_counter()
    try:
        for n in itertools.count():  # the tables were emptied; keys are breakdown-<n>
            batch, body = workload.batch(n)[0], workload.body(n)
            site_id = site_ids[batch.site]
            parsed = timer.time("web: parse_gpu_batch (msgspec validation)", ingest.parse_gpu_batch, body)
            scope = timer.time("web: check_site_scope", ingest.check_site_scope, parsed, site_id=site_id)
            timer.time("web: format COPY rows", copyrows.format_registered, scope.samples, scope.gpus)
            # The whole request through Django (WSGI test client: middleware, token auth, DRF, the
            # view, and the XADD that queues it for the writers).
            response = timer.time(
                "web: whole request (Django test client)",
                client.post,
                INGEST_PATH,
                data=body,
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {tokens[batch.site]}",
                HTTP_IDEMPOTENCY_KEY=f"breakdown-{n}",
            )
            assert response.status_code == 202, response.content[:300]
            batches += 1
            samples += batch.samples
            queued += batch.samples
            if batches % fold == 0:  # the writer's side: one fold of the queued batches
                broker.delete("celery", *ingest_stream.slot_keys())  # this process drains, not a worker
                stored = timer.time("writer: drain (total)", ingest_stream.drain, consumer="breakdown")
                assert stored == queued, (stored, queued)
                queued = 0
            if time.perf_counter() - started >= seconds and batches % fold == 0:
                break
    finally:
        timer.restore()
        broker.flushdb()
    totals = timer.totals
    totals["writer: store: transaction and the rest"] = totals["writer: store_gpu_batches (total)"] - sum(
        v for k, v in totals.items() if k.startswith("writer: store: ")
    )
    log(
        f"breakdown: {batches} batches of ~{samples // batches} samples, in-process; the writer drains "
        f"folds of {fold} (ms per batch):"
    )
    order = [k for k in totals if k.startswith("web")]
    order += ["writer: drain (total)", "writer: decode the row index", "writer: store_gpu_batches (total)"]
    order += sorted((k for k in totals if k.startswith("writer: store: ")), key=lambda k: -totals[k])
    for label in order:
        ms = totals[label] / batches * 1000
        rate = f"{samples / totals[label]:>10,.0f} samples/s" if "store: " not in label else ""
        indent = "    " if "store: " in label else ""
        log(f"    {ms:7.2f}  {indent}{label:<62} {rate}")


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=25, help="seconds of POSTing in e2e (default 25)")
    parser.add_argument("--phase-seconds", type=float, default=8, help="seconds of raw_copy and of naive (default 8)")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=60, help="seconds of fleet data in the batch pool (default 60)")
    parser.add_argument("--web-workers", type=int, default=1, help="uvicorn --workers (default 1)")
    parser.add_argument("--celery-concurrency", type=int, default=2, help="Celery worker --concurrency (default 2)")
    parser.add_argument("--celery-pool", default="threads", help="Celery worker --pool (default threads)")
    parser.add_argument("--drainers", type=int, default=1, help="GOODPUT_INGEST_DRAINERS: writers at once (default 1)")
    parser.add_argument("--clients", type=int, default=4, help="client threads POSTing (default 4)")
    parser.add_argument(
        "--queue-bound", type=int, default=100, help="GOODPUT_INGEST_QUEUE_BOUND for e2e (default 100; ~1 MB a batch)"
    )
    parser.add_argument(
        "--fold", type=int, default=32, help="GOODPUT_INGEST_FOLD_BATCHES: batches a writer folds (default 32)"
    )
    parser.add_argument("--no-breakdown", action="store_true", help="skip the in-process per-stage breakdown")
    parser.add_argument("--profile", metavar="DIR", help="record web and worker with py-spy into DIR during e2e")
    parser.add_argument(
        "--only", choices=("raw_copy", "naive", "e2e", "breakdown"), help="run one phase (no RESULT line)"
    )
    args = parser.parse_args()

    setup_django()
    from console.models import AgentToken

    sites, fleet = bench_fleet(args.gpus)
    site_ids, gpu_ids = ensure_inventory(sites, fleet)
    log(f"fleet: {len(gpu_ids)} GPUs on {len(site_ids)} sites; database {BENCH_DATABASE_URL}, Redis {BENCH_REDIS_URL}")
    started = time.perf_counter()
    workload = build_workload(fleet, gpu_ids, batch_size=args.batch_size, ticks=args.ticks)
    pool = sum(b.samples for b in workload.batches)
    mean_bytes = sum(len(workload.body(n)) for n in range(len(workload.batches))) / len(workload.batches)
    log(
        f"workload: {len(workload.batches)} batches, {pool:,} samples ({args.ticks} s of the fleet), "
        f"~{mean_bytes / 1024:.0f} KiB of JSON a batch, built in {time.perf_counter() - started:.1f} s"
    )
    procs = Processes()
    results: dict[str, Any] = {}
    try:
        if args.only in (None, "raw_copy"):
            results["raw_copy"] = run_raw_copy(workload, args.phase_seconds, args.fold)
        if args.only in (None, "naive"):
            results["naive"] = run_naive(workload, args.phase_seconds)
        if args.only in (None, "e2e"):
            results["e2e"] = run_e2e(workload, args, site_ids, procs)
        if args.only == "breakdown" or (args.only is None and not args.no_breakdown):
            run_breakdown(workload, site_ids, seconds=5, fold=args.fold)
    finally:
        procs.stop()
        reset_tables()
        AgentToken.objects.filter(name__startswith="bench-").delete()
    procs.discard_logs()
    if args.only:
        return
    e2e = results["e2e"]
    print(
        f"RESULT e2e={e2e['rate']:.0f} raw_copy={results['raw_copy']:.0f} naive={results['naive']:.0f} "
        f"e2e_pct_of_raw={100 * e2e['rate'] / results['raw_copy']:.1f} "
        f"e2e_vs_naive={e2e['rate'] / results['naive']:.1f} "
        f"worker_rss_mb_max={e2e['worker_rss_mb_max']:.0f} "
        f"e2e_accept_rate={e2e['accept_rate']:.0f} post_p95_ms={e2e['latency_p95_ms']:.0f}"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
