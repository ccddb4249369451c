"""node_exporter ingest end to end against raw COPY, and the /fabric/ API at 1,000 nodes x 8
InfiniBand ports over 24 h.

Phases, in one run, on the bench's own database (``bench_fabric`` unless BENCH_DATABASE_URL says
otherwise) and Redis database (BENCH_REDIS_URL, flushed):

* ``gpu`` (skip with ``--no-gpu-share``): bench/ingest.py's own ``raw_copy`` and ``e2e`` phases,
  shortened (``--gpu-seconds``), so the GPU samples' share of raw COPY is measured on the same
  machine at the same moment as the node series' share: ``gpu_share`` = GPU e2e samples/s / GPU
  raw COPY samples/s, exactly ingest.py's ``e2e_pct_of_raw`` / 100.
* ``e2e``: node_exporter text as its collectors print it (tests/fixtures/node-exporter.prom: the
  infiniband, netdev/netclass, diskstats and filesystem series, plus series the console ignores
  and the loopback interface) for ``--hosts`` hosts: 8 InfiniBand ports (11 series each), eth0,
  lo, an NVMe disk, a dataset and a checkpoint mount; 105 stored samples a host a scrape. Several
  hosts go in one push (``--hosts-per-push``, a ``hostname`` label on every line, as a Prometheus
  relabelling or a federating agent sends them), every line with the scrape's timestamp (15 s
  apart). The pushes go over keep-alive HTTP to the real door, POST /api/v1/ingest/prometheus,
  with an agent token (uvicorn and a Celery worker as subprocesses, production mode: the
  door's parse, packed, goes on the push stream (fleet.ingest.push_queue), whose drainers,
  ``fleet.tasks.drain_prometheus_ingest``, store folds of pushes through fleet.telemetry.series:
  binary COPY, one statement a table for the fold, and the minutes written queued for the
  rollups, in one transaction). A skeleton seen before is read from its plan
  (fleet.ingest.plans), so the warm-up scrape also makes the plans. Client threads POST for
  ``--duration`` seconds after one warm-up scrape of every host (which registers the nodes,
  ports and mounts).
  samples/s = rows committed to fleet_portsample, fleet_mountsample and fleet_disksample / (first
  POST -> last commit, seen by polling the batch table once the queue has drained), as ingest.py
  measures GPU samples. Then the queued minutes are folded into the rollups and the fabric read
  model, as the beat task does every few seconds (``fold_s``: how long that took for the whole
  run's minutes, which the beat task spreads over the run).
* ``raw_copy``: binary COPY of as many rows as e2e stored, the same pushes' port rows (interface
  id, ts, quantity, value) straight into fleet_portsample from one psycopg 3 connection, one COPY
  and one commit per ``--fold`` pushes (ingest.py's baseline, per its writer's fold).
  ``share`` = e2e samples/s / raw COPY rows/s.
* ``api``: 1,000 nodes (4 sites, racks of 10) x 8 InfiniBand ports (``mlx5_<n>/1``, compute
  fabric, 50 GB/s) with 24 h of 1-minute port rollups (fleet_portrollup_1m) in the writer's own
  row convention, inserted in SQL an hour at a time: the quantities the page turns into its
  figures, ``state`` (active but for a few ports), ``link_downed`` (a flap now and then),
  ``symbol_errors`` (rare) and ``receive_bytes`` (throughput), 46 M rows. Kept between runs when
  intact and at most ``--max-age`` old (``--reload`` loads afresh). Then GET /api/v1/fabric/ with
  the default range (1h) and ``range=24h``, through Django's test client with a Viewer's session
  (middleware, auth, DRF, JSON), ``--requests`` timed each after 2 warm-ups: p50 and p95.

The ingest phases write their rows on a day of their own, three days back, and empty it
afterwards; their ports are deleted, so the API phase reads its 8,000 ports only.

Prints progress on stderr and ends with
RESULT node_samples_per_s=... copy_rows_per_s=... share=... gpu_share=... fold_s=... fabric_api_p50_ms_1h=...
fabric_api_p95_ms_1h=... fabric_api_p50_ms_24h=... fabric_api_p95_ms_24h=... nodes=1000 ports=8
target_p95_ms=150 api=met|missed ingest=met|missed met|missed (both)
"""

from __future__ import annotations

import os

# The bench's own database unless told otherwise, chosen before _common reads it.
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_fabric")

import argparse
import http.client
import itertools
import json
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from _common import (
    BENCH_DATABASE_URL,
    BENCH_REDIS_URL,
    Processes,
    free_port,
    log,
    percentile,
    setup_django,
    timed_get,
    viewer_client,
)

PUSH_PATH = "/api/v1/ingest/prometheus"
API_PATH = "/api/v1/fabric/"
SCRAPE = timedelta(seconds=15)
TS = b"@TS@"
INGEST_SITE = "bench-fabric-ingest"
API_SITES = ("bench-fab-a", "bench-fab-b", "bench-fab-c", "bench-fab-d")
NODES, PORTS, NODES_PER_RACK = 1000, 8, 10
RATE = 5e10  # NDR 400 Gb/s, in bytes per second as node_exporter reports it
API_QUANTITIES = ("state", "link_downed", "symbol_errors", "receive_bytes")
TARGET_P95_MS = 150
NODE_TABLES = ("fleet_portsample", "fleet_mountsample", "fleet_disksample")
ROLLUP_TABLES = ("fleet_portrollup_1m", "fleet_mountrollup_1m", "fleet_diskrollup_1m")

# --- the node_exporter workload -----------------------------------------------------------------

# (metric, type, series of one host: [(labels, value at scrape 0, increase a scrape)])
IB_PORTS = [(f"mlx5_{n}", "1") for n in range(8)]
MOUNTS = [
    ("10.0.4.20:/datasets", "nfs4", "/mnt/datasets", 1.2e14, 5.6e14),
    ("10.0.5.10@o2ib:/ckpt", "lustre", "/mnt/checkpoints", 8.8e12, 1.4e14),
]


def _families(host: int) -> list[tuple[str, str, list[tuple[str, float, float]]]]:
    """One host's exposition, family by family, as node_exporter prints it."""
    ib = [f'device="{d}",port="{p}"' for d, p in IB_PORTS]
    netdev = ['device="eth0"', 'device="lo"']
    k = 1 + host % 7
    fams: list[tuple[str, str, list[tuple[str, float, float]]]] = [
        ("node_cpu_seconds_total", "counter", [('cpu="0",mode="idle"', 10870.69, 15.0)]),
        ("node_disk_io_time_seconds_total", "counter", [('device="nvme0n1"', 11325.9, 3.0)]),
        ("node_disk_read_bytes_total", "counter", [('device="nvme0n1"', 5.1e11, 3e9)]),
        ("node_disk_reads_completed_total", "counter", [('device="nvme0n1"', 2.5e7, 9e4)]),
        ("node_disk_writes_completed_total", "counter", [('device="nvme0n1"', 2.8e7, 4e4)]),
        ("node_disk_written_bytes_total", "counter", [('device="nvme0n1"', 2.6e11, 1e9)]),
        (
            "node_filesystem_avail_bytes",
            "gauge",
            [(f'device="{d}",device_error="",fstype="{t}",mountpoint="{m}"', a, -1e8) for d, t, m, a, _ in MOUNTS],
        ),
        (
            "node_filesystem_size_bytes",
            "gauge",
            [(f'device="{d}",device_error="",fstype="{t}",mountpoint="{m}"', s, 0.0) for d, t, m, _, s in MOUNTS],
        ),
        ("node_infiniband_link_downed_total", "counter", [(lb, float(k), 0.0) for lb in ib]),
        ("node_infiniband_link_error_recovery_total", "counter", [(lb, 12.0, 0.0) for lb in ib]),
        ("node_infiniband_physical_state_id", "gauge", [(lb, 5.0, 0.0) for lb in ib]),
        ("node_infiniband_port_data_received_bytes_total", "counter", [(lb, 1.8e13, 2.4e11) for lb in ib]),
        ("node_infiniband_port_data_transmitted_bytes_total", "counter", [(lb, 1.5e13, 2.3e11) for lb in ib]),
        ("node_infiniband_port_discards_transmitted_total", "counter", [(lb, 5.0, 1.0) for lb in ib]),
        ("node_infiniband_port_errors_received_total", "counter", [(lb, 7.0, 0.0) for lb in ib]),
        ("node_infiniband_port_transmit_wait_total", "counter", [(lb, 1.29e7, 4e4) for lb in ib]),
        ("node_infiniband_rate_bytes_per_second", "gauge", [(lb, RATE, 0.0) for lb in ib]),
        ("node_infiniband_state_id", "gauge", [(lb, 4.0, 0.0) for lb in ib]),
        ("node_infiniband_symbol_error_total", "counter", [(lb, 0.0, 0.0) for lb in ib]),
        ("node_network_carrier_changes_total", "counter", [(lb, 2.0, 0.0) for lb in netdev]),
        ("node_network_receive_bytes_total", "counter", [(lb, 4.2e10, 1.5e6) for lb in netdev]),
        ("node_network_receive_drop_total", "counter", [(lb, 0.0, 0.0) for lb in netdev]),
        ("node_network_receive_errs_total", "counter", [(lb, 0.0, 0.0) for lb in netdev]),
        ("node_network_speed_bytes", "gauge", [(lb, 3.125e9, 0.0) for lb in netdev]),
        ("node_network_transmit_bytes_total", "counter", [(lb, 3.9e10, 1.2e6) for lb in netdev]),
        ("node_network_transmit_drop_total", "counter", [(lb, 0.0, 0.0) for lb in netdev]),
        ("node_network_transmit_errs_total", "counter", [(lb, 0.0, 0.0) for lb in netdev]),
    ]
    return fams


def hostname(n: int) -> str:
    return f"bench-ing-{n:04d}"


def push_template(hosts: range, scrape: int) -> bytes:
    """The exposition of these hosts at one scrape, every line stamped ``@TS@`` (milliseconds)."""
    per_host = {h: _families(h) for h in hosts}
    lines = []
    for index, (name, kind, _) in enumerate(per_host[hosts[0]]):
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        for h in hosts:
            for labels, start, step in per_host[h][index][2]:
                value = start + step * scrape
                lines.append(f'{name}{{hostname="{hostname(h)}",{labels}}} {value:.17g} @TS@')
    return ("\n".join(lines) + "\n").encode()


@dataclass
class NodeWorkload:
    """``groups`` pushes of ``hosts_per_push`` hosts make one scrape of every host; ``scrapes``
    scrapes are kept and replayed (counters then fall back: a reset, which the rollups count as
    Prometheus does), each use 15 s after the one before."""

    templates: list[bytes]  # scrape-major: templates[scrape * groups + group]
    groups: int
    scrapes: int
    base: datetime
    samples_per_push: list[int] = field(default_factory=list)

    def body(self, n: int) -> bytes:
        scrape, group = divmod(n, self.groups)
        ts = self.base + scrape * SCRAPE
        template = self.templates[(scrape % self.scrapes) * self.groups + group]
        return template.replace(TS, str(int(ts.timestamp() * 1000)).encode())

    def last_ts(self, pushes: int) -> datetime:
        return self.base + (pushes // self.groups + 1) * SCRAPE


def build_node_workload(hosts: int, hosts_per_push: int, scrapes: int, base: datetime) -> NodeWorkload:
    from fleet.ingest.prometheus import parse_exposition

    groups = [range(start, min(hosts, start + hosts_per_push)) for start in range(0, hosts, hosts_per_push)]
    templates = [push_template(g, s) for s in range(scrapes) for g in groups]
    workload = NodeWorkload(templates, len(groups), scrapes, base)
    now = datetime.now(UTC)
    workload.samples_per_push = [
        len(parse_exposition(workload.body(n).decode(), now=now).node) for n in range(len(groups))
    ]
    return workload


# --- database helpers ----------------------------------------------------------------------------


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def ingest_day(now: datetime) -> datetime:
    """The day the ingest phases write on: three days back, a day of their own."""
    return (now - timedelta(days=3)).replace(hour=1, minute=0, second=0, microsecond=0)


def empty_ingest_day(base: datetime) -> None:
    """Truncate the ingest day's partitions of the node tables (the API's days are untouched) and
    the batch table."""
    from fleet.telemetry import partitions

    names = []
    for table in (
        partitions.PORT_SAMPLES,
        partitions.PORT_ROLLUP_1M,
        partitions.MOUNT_SAMPLES,
        partitions.MOUNT_ROLLUP_1M,
        partitions.DISK_SAMPLES,
        partitions.DISK_ROLLUP_1M,
    ):
        existing = partitions.existing_partitions(table)
        names += [n for n in (table.partition_name(table.start_of(base)),) if n in existing]
    sql(f"TRUNCATE {', '.join([*names, 'fleet_ingestbatch', 'fleet_noderollupdirty'])}")


def ensure_ingest_partitions(base: datetime) -> None:
    from fleet.telemetry import partitions

    partitions.forget_known_partitions()
    for table in (
        partitions.PORT_SAMPLES,
        partitions.PORT_ROLLUP_1M,
        partitions.MOUNT_SAMPLES,
        partitions.MOUNT_ROLLUP_1M,
        partitions.DISK_SAMPLES,
        partitions.DISK_ROLLUP_1M,
    ):
        partitions.ensure_partitions(table, base, base + timedelta(hours=20))


def node_rows(base: datetime) -> int:
    total = 0
    for table in NODE_TABLES:
        total += sql(f"SELECT count(*) FROM {table} WHERE ts >= %s AND ts < %s", [base, base + timedelta(days=1)])[0][0]
    return int(total)


def stored_by_batches() -> int:
    return int(sql("SELECT coalesce(sum(samples), 0) FROM fleet_ingestbatch")[0][0])


def forget_ingest_inventory() -> None:
    """The ingest hosts' ports and mounts go: the /fabric/ API reads every port."""
    from fleet.inventory.models import NodeInterface, NodeMount

    NodeInterface.objects.filter(node__site__name=INGEST_SITE).delete()
    NodeMount.objects.filter(node__site__name=INGEST_SITE).delete()


# --- phase: GPU samples' share, measured by ingest.py's own phases --------------------------------


def run_gpu_share(args: argparse.Namespace, procs: Processes) -> float:
    import ingest as gpu
    from _common import bench_fleet, ensure_inventory

    sites, fleet = bench_fleet(1024)
    site_ids, gpu_ids = ensure_inventory(sites, fleet)
    workload = gpu.build_workload(fleet, gpu_ids, batch_size=1000, ticks=60)
    raw = gpu.run_raw_copy(workload, args.gpu_seconds, 32)
    options = SimpleNamespace(
        duration=args.gpu_seconds * 2,
        web_workers=1,
        celery_concurrency=args.celery_concurrency,
        celery_pool="threads",
        drainers=1,
        clients=args.clients,
        queue_bound=100,
        fold=32,
        batch_size=1000,
        profile=None,
    )
    e2e = gpu.run_e2e(workload, options, site_ids, procs)
    gpu.reset_tables()
    share = e2e["rate"] / raw
    log(f"gpu: e2e {e2e['rate']:,.0f} samples/s against raw COPY {raw:,.0f}/s: share {share:.3f}")
    return share


# --- phase: node_exporter end to end ------------------------------------------------------------


@dataclass
class Stats:
    pushes: int = 0
    samples: int = 0
    rejected_429: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def post_pushes(port: int, workload: NodeWorkload, token: str, numbers: Any, stop_at: float, stats: Stats) -> None:
    """One client: keep-alive POSTs of the next push until ``stop_at``; a 429 is retried after
    0.2 s (the queue must never run dry)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4"}
    try:
        for n in numbers:
            if time.monotonic() >= stop_at or stats.errors:
                break
            body = workload.body(n)
            while time.monotonic() < stop_at:
                sent = time.perf_counter()
                conn.request("POST", PUSH_PATH, body, headers)
                response = conn.getresponse()
                text = response.read()
                if response.status == 202:
                    with stats.lock:
                        stats.pushes += 1
                        stats.samples += json.loads(text)["node_samples"]
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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stored_by_batches() >= target:
            return time.perf_counter()
        time.sleep(0.05)
    raise RuntimeError(f"only {stored_by_batches():,} of {target:,} node samples stored after {timeout:.0f} s")


def start_stack(procs: Processes, args: argparse.Namespace, port: int) -> None:
    from _common import bench_env

    from console.processes import healthy, uvicorn_command

    env = bench_env(GOODPUT_INGEST_QUEUE_BOUND=str(args.queue_bound))
    worker = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool=threads"]
    worker += [f"--concurrency={args.celery_concurrency}", "--loglevel=WARNING"]
    worker += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
    procs.spawn("worker", worker, env)
    procs.spawn("web", uvicorn_command(port, workers=1, access_log=False), env)
    procs.wait_until("worker", lambda: "[goodput:worker]" in procs.log_text("worker"))
    procs.wait_until("web", lambda: healthy(port))


def run_node_e2e(workload: NodeWorkload, args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    import redis

    from console.models import AgentToken
    from fleet.inventory.models import Site

    empty_ingest_day(workload.base)
    ensure_ingest_partitions(workload.base)
    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()
    site, _ = Site.objects.get_or_create(name=INGEST_SITE, defaults={"region": "bench"})
    token = AgentToken.issue(site=site, name=f"bench-{secrets.token_hex(4)}")[1]
    port = free_port()
    log(
        f"e2e: starting uvicorn and a Celery worker (--pool=threads -c {args.celery_concurrency}); "
        f"logs in {procs.log_dir}"
    )
    start_stack(procs, args, port)

    # Warm-up: one scrape of every host (registers nodes, ports and mounts; connections, caches).
    warm = Stats()
    post_pushes(port, workload, token, iter(range(workload.groups)), time.monotonic() + 120, warm)
    if warm.errors:
        raise RuntimeError(f"warm-up failed: {warm.errors[0]}")
    wait_for_stored(warm.samples, timeout=180)
    start_rows = node_rows(workload.base)
    numbers = itertools.count(workload.groups)
    stats = Stats()
    from ingest import CpuMeter, component_processes

    meter = CpuMeter(component_processes(procs))
    log(f"e2e: {args.clients} client(s) pushing {args.hosts_per_push}-host scrapes for {args.duration:.0f} s…")
    first_post = time.perf_counter()
    stop_at = time.monotonic() + args.duration
    clients = [
        threading.Thread(target=post_pushes, args=(port, workload, token, numbers, stop_at, stats), daemon=True)
        for _ in range(args.clients)
    ]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    if stats.errors:
        raise RuntimeError(f"e2e client failed: {stats.errors[0]}")
    posted = time.perf_counter()
    log(f"e2e: {stats.pushes} pushes accepted ({stats.rejected_429} answered 429); waiting for the queue…")
    last_commit = wait_for_stored(warm.samples + stats.samples, timeout=600)
    cpu = meter.stop(component_processes(procs))
    procs.stop()
    pushes = next(numbers)
    if workload.last_ts(pushes) > workload.base + timedelta(hours=20):
        raise RuntimeError("the run outran its day: lower --duration")
    rows = node_rows(workload.base) - start_rows
    if rows != stats.samples:
        raise RuntimeError(f"{rows:,} rows stored for {stats.samples:,} samples accepted")
    fold_s, folded = fold_rollups(workload.base)
    elapsed = last_commit - first_post
    result = {
        "rate": rows / elapsed,
        "rows": rows,
        "pushes": stats.pushes,
        "accept_rate": stats.samples / (posted - first_post),
        "drain_s": last_commit - posted,
        "post_p95_ms": percentile(stats.latencies, 95) * 1000,
        "fold_s": fold_s,
    }
    log(
        f"e2e: {rows:,} node samples ({stats.pushes} pushes) committed in {elapsed:.1f} s = "
        f"{result['rate']:,.0f} samples/s (accepted at {result['accept_rate']:,.0f}/s, drain "
        f"{result['drain_s']:.1f} s, POST p95 {result['post_p95_ms']:.0f} ms); {folded} queued minute(s) "
        f"folded into the rollups in {fold_s:.1f} s"
    )
    per_k = 1000 * 1000 / rows
    parts = ", ".join(f"{name} {cpu[name] * per_k:.1f}" for name in ("web", "worker", "postgres", "redis", "client"))
    log(f"e2e: CPU ms per 1,000 node samples: {parts} (machine busy {cpu['machine_busy'] / elapsed:.2f} cores)")
    return result


def fold_rollups(base: datetime) -> tuple[float, int]:
    """Fold the run's queued minutes (the beat task's work) and check every stored minute has its
    port rollups; return (seconds, minutes folded)."""
    from fleet.tasks import update_node_rollups

    started = time.perf_counter()
    folded = sum(update_node_rollups().values())
    elapsed = time.perf_counter() - started
    span = [base, base + timedelta(days=1)]
    raw = sql("SELECT count(DISTINCT date_trunc('minute', ts)) FROM fleet_portsample WHERE ts >= %s AND ts < %s", span)
    rolled = sql("SELECT count(DISTINCT bucket) FROM fleet_portrollup_1m WHERE bucket >= %s AND bucket < %s", span)
    if raw[0][0] != rolled[0][0]:
        raise RuntimeError(f"{raw[0][0]} minutes of port samples but {rolled[0][0]} of port rollups")
    return elapsed, folded


# --- per-stage breakdown, in-process ---------------------------------------------------------------


def run_breakdown(workload: NodeWorkload, pushes: int) -> None:
    """Where a push's time goes, in this process, one push at a time: parsing the exposition (the
    door's work) and storing it (the worker's)."""
    from fleet.ingest.prometheus import parse_exposition, store_exposition
    from fleet.inventory.models import Site

    site_id = Site.objects.get(name=INGEST_SITE).pk
    start = workload.groups * 1000  # scrapes well after the e2e phase's, on the same day
    parse_s = store_s = 0.0
    samples = 0
    now = datetime.now(UTC)
    for n in range(start, start + pushes):
        text = workload.body(n).decode()
        t0 = time.perf_counter()
        exposition = parse_exposition(text, now=now)
        t1 = time.perf_counter()
        samples += store_exposition(exposition, site_id=site_id, batch_key=f"breakdown-{n}")
        t2 = time.perf_counter()
        parse_s, store_s = parse_s + t1 - t0, store_s + t2 - t1
    per = 1000 / pushes
    log(
        f"breakdown: {pushes} pushes of {samples // pushes} samples, ms a push: parse_exposition "
        f"{parse_s * per:.1f} (the door), store_exposition {store_s * per:.1f} "
        f"(the worker: COPY and 1-minute rollups of ports, mounts, disks); in-process limit "
        f"{samples / (parse_s + store_s):,.0f} samples/s on one core"
    )


# --- phase: raw COPY of the same number of rows ----------------------------------------------------


def port_rows(workload: NodeWorkload, pushes: int) -> list[list[tuple[int, str, float, int]]]:
    """Per push of the pool: its port rows as (interface id, quantity, value, scrape offset)."""
    from fleet.fabric.store import interface_name
    from fleet.ingest.prometheus import parse_exposition
    from fleet.inventory.models import NodeInterface

    ids = {
        (h, n): i
        for i, h, n in NodeInterface.objects.filter(node__site__name=INGEST_SITE).values_list(
            "id", "node__hostname", "name"
        )
    }
    now = datetime.now(UTC)
    out = []
    for n in range(min(pushes, len(workload.templates))):
        points = parse_exposition(workload.body(n).decode(), now=now).node
        out.append(
            [
                (ids[(p.hostname, interface_name(p))], p.quantity, p.value, 0)
                for p in points
                if p.source in ("infiniband", "netdev")
            ]
        )
    return out


def run_raw_copy(workload: NodeWorkload, rows: int, fold: int, repeats: int = 3) -> float:
    """The median of ``repeats`` COPYs of ``rows`` rows (each from an empty day)."""
    pool = port_rows(workload, len(workload.templates))
    rates = sorted(copy_once(workload, pool, rows, fold) for _ in range(repeats))
    rate = rates[len(rates) // 2]
    log(f"raw_copy: median {rate:,.0f} rows/s ({', '.join(f'{r:,.0f}' for r in rates)})")
    return rate


def copy_once(workload: NodeWorkload, pool: list[list[tuple[int, str, float, int]]], rows: int, fold: int) -> float:
    import psycopg

    empty_ingest_day(workload.base)
    sql_copy = "COPY fleet_portsample (interface_id, ts, quantity, value) FROM STDIN (FORMAT BINARY)"
    written, n = 0, 0
    with psycopg.connect(BENCH_DATABASE_URL) as conn:
        started = time.perf_counter()
        while written < rows:
            with conn.cursor() as cursor, cursor.copy(sql_copy) as copy:
                copy.set_types(["int8", "timestamptz", "text", "float8"])
                for _ in range(fold):
                    scrape = n // workload.groups
                    ts = workload.base + scrape * SCRAPE
                    for interface_id, quantity, value, _ in pool[n % len(pool)]:
                        if written >= rows:
                            break
                        copy.write_row((interface_id, ts, quantity, value))
                        written += 1
                    n += 1
                    if written >= rows:
                        break
            conn.commit()
        elapsed = time.perf_counter() - started
    rate = written / elapsed
    log(f"raw_copy: {written:,} rows into fleet_portsample in {elapsed:.1f} s = {rate:,.0f} rows/s")
    empty_ingest_day(workload.base)
    return rate


# --- phase: the /fabric/ API at 1,000 nodes x 8 ports ----------------------------------------------


def api_inventory(nodes: int) -> list[int]:
    """``nodes`` nodes (1,000) on four sites, racks of ten, 8 InfiniBand ports each; returns the
    port ids."""
    from fleet.choices import Fabric, InterfaceKind
    from fleet.inventory.models import Node, NodeInterface, Rack, Site

    per_site = nodes // len(API_SITES)
    for s, name in enumerate(API_SITES):
        site, _ = Site.objects.get_or_create(name=name, defaults={"region": "bench"})
        racks = [f"{name}-r{r:03d}" for r in range(-(-per_site // NODES_PER_RACK))]
        Rack.objects.bulk_create([Rack(site=site, name=r) for r in racks], ignore_conflicts=True)
        rack_ids = dict(Rack.objects.filter(site=site).values_list("name", "id"))
        Node.objects.bulk_create(
            [
                Node(
                    site=site,
                    hostname=f"bench-fab-{s * per_site + n:04d}",
                    rack_id=rack_ids[racks[n // NODES_PER_RACK]],
                    instance_type="bench",
                )
                for n in range(per_site)
            ],
            ignore_conflicts=True,
        )
    hostnames = [f"bench-fab-{n:04d}" for n in range(per_site * len(API_SITES))]
    node_ids = list(Node.objects.filter(hostname__in=hostnames).values_list("id", flat=True))
    NodeInterface.objects.bulk_create(
        [
            NodeInterface(
                node_id=node_id,
                name=f"mlx5_{p}/1",
                kind=InterfaceKind.IB,
                rate_bytes_per_second=RATE,
                fabric=Fabric.COMPUTE,
            )
            for node_id in node_ids
            for p in range(PORTS)
        ],
        ignore_conflicts=True,
    )
    return sorted(NodeInterface.objects.filter(node_id__in=node_ids).values_list("id", flat=True))


# One hour of every port's quantities in the rollup's own convention (fleet.telemetry.series):
# counters carry ``increase``, every row min/max/last; 4 raw samples a minute (15 s scrapes).
# About one port in 400 flaps once in a day; one in 50 counts symbol errors now and then; one in
# 1,000 is down.
SEED_SQL = """
INSERT INTO fleet_portrollup_1m (interface_id, quantity, bucket, samples, increase, min, max, last)
SELECT i, q, b, 4,
       CASE q WHEN 'state' THEN NULL
              WHEN 'link_downed' THEN (h %% 576000 = 7)::int
              WHEN 'symbol_errors' THEN CASE WHEN i %% 50 = 3 AND h %% 97 = 0 THEN 3 ELSE 0 END
              ELSE 1.2e11 + (h %% 1000) * 1e8 END,
       v, v, v
FROM unnest(%(ids)s::int8[]) AS i
CROSS JOIN generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '1 minute', interval '1 minute') AS b
CROSS JOIN unnest(%(quantities)s::text[]) AS q
CROSS JOIN LATERAL (SELECT i * 7919 + (extract(epoch FROM b)::bigint / 60) AS h) AS hh
CROSS JOIN LATERAL (
    SELECT CASE q WHEN 'state' THEN CASE WHEN i %% 1000 = 11 THEN 1 ELSE 4 END
                  WHEN 'receive_bytes' THEN 1.8e13 + (extract(epoch FROM b) - 1.7e9) * 2e9
                  ELSE (i %% 50)::float8 END AS v
) AS vv
"""


def seeded_span(ids: list[int]) -> tuple[datetime | None, int]:
    """(newest bucket, rows in the 24 h before it) of the API's ports."""
    newest = sql("SELECT max(bucket) FROM fleet_portrollup_1m WHERE interface_id = %s", [ids[-1]])[0][0]
    if newest is None:
        return None, 0
    (rows,) = sql(
        "SELECT count(*) FROM fleet_portrollup_1m WHERE interface_id = ANY(%s) AND bucket > %s",
        [ids[:: max(1, len(ids) // 80)], newest - timedelta(hours=24)],
    )[0]
    return newest, rows


def prepare_api(args: argparse.Namespace) -> list[int]:
    """Inventory and 24 h of rollups for the API's ports: kept when intact and recent enough,
    topped up to the present minute; loaded afresh otherwise."""
    from fleet.fabric.read import summaries
    from fleet.telemetry import partitions

    ids = api_inventory(args.nodes)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    newest, rows = seeded_span(ids)
    sampled = len(ids[:: max(1, len(ids) // 80)])
    intact = newest is not None and rows == sampled * 1440 * len(API_QUANTITIES)
    if args.reload or not intact or now - newest > args.max_age:
        log(f"api: loading 24 h of 1-minute rollups for {len(ids):,} ports ({len(API_QUANTITIES)} quantities)…")
        sql("DELETE FROM fleet_portrollup_1m WHERE interface_id = ANY(%s)", [ids])
        start = now - timedelta(hours=24)
    else:
        start = newest + timedelta(minutes=1)
        log(f"api: reusing the rollups up to {newest:%H:%M}; topping up to {now:%H:%M}")
    partitions.ensure_partitions(partitions.PORT_ROLLUP_1M, start, now + timedelta(hours=1))
    started = time.perf_counter()
    moment = start
    while moment < now + timedelta(minutes=1):
        step = min(timedelta(hours=1), now + timedelta(minutes=1) - moment)
        sql(
            SEED_SQL,
            {"ids": ids, "start": moment, "end": moment + step, "quantities": list(API_QUANTITIES)},
        )
        moment += step
        if step == timedelta(hours=1):
            log(f"api: rollups up to {moment:%H:%M} ({time.perf_counter() - started:.0f} s)")
    # The seed writes rollups without the port writer: the page's read model (per-fabric minutes,
    # the ports' status) is read from them as the demo's history and migration 0015 do.
    started = time.perf_counter()
    summaries.rebuild(start, now + timedelta(minutes=1))
    log(f"api: read model rebuilt from {start:%H:%M} in {time.perf_counter() - started:.1f} s")
    sql("ANALYZE fleet_portrollup_1m")
    sql("ANALYZE fleet_portstatus")
    (total,) = sql(
        "SELECT count(*) FROM fleet_portrollup_1m WHERE bucket >= %s AND bucket <= %s",
        [now - timedelta(hours=24), now],
    )[0]
    log(f"api: {len(ids):,} ports, {total:,} rollup rows in the last 24 h")
    return ids


def time_api(client: Any, query: str, requests: int, budget: float) -> tuple[list[float], dict[str, Any]]:
    """``requests`` timed GETs after warm-ups (two, or one when a request takes seconds), or fewer
    when ``budget`` seconds run out first (at least 3, or 1 when the warm-up alone took a quarter
    of the budget: a range that slow is far past any target)."""
    url = API_PATH + query

    def get() -> tuple[float, Any]:
        return timed_get(client, url)

    warm_ms = get()[0]
    if warm_ms < 2000:
        get()
    least = 1 if warm_ms > budget * 250 else 3
    times, body = [], {}
    deadline = time.monotonic() + budget
    while len(times) < requests and (len(times) < least or time.monotonic() < deadline):
        ms, response = get()
        times.append(ms)
        body = response.json()
    return times, body


def describe(body: dict[str, Any]) -> str:
    t = body["totals"]
    points = len(body["throughput"]["ts"])
    return (
        f"{t['ports']} ports ({t['up']} up, {t['flapping']} flapping, {t['degraded']} degraded), "
        f"{len(body['sites'])} sites, {len(body['flaps'])} flap events, {points} throughput points, "
        f"{len(json.dumps(body)) / 1024:.0f} KiB"
    )


def run_api(args: argparse.Namespace) -> dict[str, float]:
    ids = prepare_api(args)
    if len(ids) != args.nodes * PORTS:
        raise RuntimeError(f"{len(ids)} ports; {args.nodes * PORTS} expected")
    client = viewer_client()
    from console.runtime import settle_heap

    settle_heap()  # as the web process does once it is ready (goodput/asgi.py)
    out = {}
    for label, query in (("1h", ""), ("24h", "?range=24h")):
        times, body = time_api(client, query, args.requests, args.budget)
        out[f"p50_{label}"], out[f"p95_{label}"] = percentile(times, 50), percentile(times, 95)
        log(
            f"api {API_PATH}{query or ' (default 1h)'}: p50 {out[f'p50_{label}']:.1f} ms, p95 "
            f"{out[f'p95_{label}']:.1f} ms, max {max(times):.1f} ms over {len(times)}; {describe(body)}"
        )
        if body["totals"]["ports"] < args.nodes * PORTS:
            raise RuntimeError(f"the API shows {body['totals']['ports']} ports")
    return out


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: short phases, 5 requests (no target)")
    parser.add_argument("--hosts", type=int, default=256, help="node_exporter hosts in e2e (default 256)")
    parser.add_argument("--hosts-per-push", type=int, default=8, help="hosts in one push (default 8: 840 samples)")
    parser.add_argument("--scrapes", type=int, default=4, help="scrapes of every host in the pool (default 4)")
    parser.add_argument("--duration", type=float, default=25, help="seconds of pushing in e2e (default 25)")
    parser.add_argument("--clients", type=int, default=4, help="client threads pushing (default 4)")
    parser.add_argument("--celery-concurrency", type=int, default=2, help="Celery worker threads (default 2)")
    parser.add_argument("--queue-bound", type=int, default=100, help="GOODPUT_INGEST_QUEUE_BOUND (default 100)")
    parser.add_argument("--fold", type=int, default=32, help="pushes a raw COPY holds (default 32)")
    parser.add_argument("--gpu-seconds", type=float, default=8, help="seconds of GPU raw COPY; e2e twice (default 8)")
    parser.add_argument("--no-gpu-share", action="store_true", help="skip measuring the GPU samples' share")
    parser.add_argument("--nodes", type=int, default=NODES, help="nodes of 8 ports for the API (default 1,000)")
    parser.add_argument("--requests", type=int, default=20, help="timed /fabric/ requests a range (default 20)")
    parser.add_argument(
        "--budget",
        type=float,
        default=120,
        help="seconds of timed requests a range at most (default 120; see time_api)",
    )
    parser.add_argument("--reload", action="store_true", help="load the API's 24 h of rollups afresh")
    parser.add_argument(
        "--max-age", type=lambda v: timedelta(hours=float(v)), default=timedelta(hours=6), help="hours (default 6)"
    )
    parser.add_argument("--only", choices=("ingest", "api"), help="run one part (a RESULT line of its fields only)")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.duration, args.gpu_seconds, args.requests, args.nodes = 64, 6, 3, 5, 40

    setup_django()
    from console.models import AgentToken

    log(f"database {BENCH_DATABASE_URL}, Redis {BENCH_REDIS_URL}")
    procs = Processes()
    results: dict[str, Any] = {}
    base = ingest_day(datetime.now(UTC))
    try:
        if args.only in (None, "ingest"):
            if not args.no_gpu_share:
                results["gpu_share"] = run_gpu_share(args, procs)
            started = time.perf_counter()
            workload = build_node_workload(args.hosts, args.hosts_per_push, args.scrapes, base)
            log(
                f"workload: {args.hosts} hosts, {workload.groups} pushes a scrape of ~{workload.samples_per_push[0]} "
                f"stored samples (~{len(workload.templates[0]) / 1024:.0f} KiB), built in "
                f"{time.perf_counter() - started:.1f} s"
            )
            results["e2e"] = run_node_e2e(workload, args, procs)
            run_breakdown(workload, 16)
            results["copy"] = run_raw_copy(workload, results["e2e"]["rows"], args.fold)
            forget_ingest_inventory()
        if args.only in (None, "api"):
            results["api"] = run_api(args)
    finally:
        procs.stop()
        AgentToken.objects.filter(name__startswith="bench-").delete()
    procs.discard_logs()
    if args.only == "api":  # the API's figures alone (the ingest fields are not measured)
        api = results["api"]
        verdict = "met" if api["p95_24h"] <= TARGET_P95_MS and api["p95_1h"] <= TARGET_P95_MS else "missed"
        print(
            f"RESULT fabric_api_p50_ms_1h={api['p50_1h']:.1f} fabric_api_p95_ms_1h={api['p95_1h']:.1f} "
            f"fabric_api_p50_ms_24h={api['p50_24h']:.1f} fabric_api_p95_ms_24h={api['p95_24h']:.1f} "
            f"nodes={args.nodes} ports={PORTS} target_p95_ms={TARGET_P95_MS} {verdict}"
        )
    if args.only == "ingest":  # the ingest's figures alone (the API's are not measured)
        e2e, gpu_share = results["e2e"], results.get("gpu_share")
        share = e2e["rate"] / results["copy"]
        met = gpu_share is not None and share >= gpu_share
        print(
            f"RESULT node_samples_per_s={e2e['rate']:.0f} copy_rows_per_s={results['copy']:.0f} share={share:.3f} "
            f"gpu_share={'n/a' if gpu_share is None else f'{gpu_share:.3f}'} fold_s={e2e['fold_s']:.1f} "
            f"ingest={'met' if met else 'missed'}"
        )
    if args.only:
        return
    e2e, api = results["e2e"], results["api"]
    share = e2e["rate"] / results["copy"]
    gpu_share = results.get("gpu_share")
    log(f"share: node samples {share:.3f} of raw COPY" + (f", GPU samples {gpu_share:.3f}" if gpu_share else ""))
    api_met = api["p95_24h"] <= TARGET_P95_MS and api["p95_1h"] <= TARGET_P95_MS
    # The ingest target: node samples take as large a share of raw COPY as GPU samples do.
    ingest_met = gpu_share is not None and share >= gpu_share
    print(
        f"RESULT node_samples_per_s={e2e['rate']:.0f} copy_rows_per_s={results['copy']:.0f} share={share:.3f} "
        f"gpu_share={'n/a' if gpu_share is None else f'{gpu_share:.3f}'} fold_s={e2e['fold_s']:.1f} "
        f"fabric_api_p50_ms_1h={api['p50_1h']:.1f} fabric_api_p95_ms_1h={api['p95_1h']:.1f} "
        f"fabric_api_p50_ms_24h={api['p50_24h']:.1f} fabric_api_p95_ms_24h={api['p95_24h']:.1f} "
        f"nodes={args.nodes} ports={PORTS} target_p95_ms={TARGET_P95_MS} "
        f"api={'met' if api_met else 'missed'} ingest={'met' if ingest_met else 'missed'} "
        f"{'met' if api_met and ingest_met else 'missed'}"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
