"""Training goodput: job-event ingest over HTTP for 200 running jobs, and the /training/ API on 7
days of those jobs, each against a baseline measured in the same run.

Data and phases (in the bench database and Redis; see bench/_common.py):

* ``ingest``: 200 jobs are registered over HTTP with an agent token (POST /api/v1/training/jobs/),
  each sends allocated and started, then ``--clients`` threads POST pre-built batches of
  ``--batch`` step events (ids, times a second apart, step time, data wait, tokens, node) to
  /api/v1/training/jobs/<id>/events over keep-alive HTTP against uvicorn in production mode
  (``--web-workers`` processes). A thread owns a share of the jobs and posts each job's next batch
  in turn, so ``--clients`` jobs are in flight at once and each job's batches stay in order (the
  console refuses events older than a job's last). events_per_s = step events stored (count(*)
  of fleet_jobevent) / (first POST -> last answer; the write is synchronous, so the last answer
  is the last commit).
* ``raw_copy`` (baseline): the same rows, batch by batch, by binary COPY straight into
  fleet_jobevent from one psycopg connection, a commit per batch: no HTTP, no validation, no job
  update.
* ``overview``: the events are emptied and the 200 jobs get 7 days of history written through
  fleet.training.events.store_job_events (a step event every 30-60 s, a blocking checkpoint
  every 30-60 min, failures with a restart and a restore from the last checkpoint, a few
  preemptions, completions and a data-starved job), fleet.training.accounts.
  refresh_job_accounts(budget_s=None) builds the hourly accounts, then GET /api/v1/training/overview?range=7d
  is timed ``--requests`` times through Django's test client as a signed-in Viewer (the whole
  stack: middleware, session, DRF, JSON), after two warm-ups; baseline: GET /api/v1/fleet/sites/
  timed the same way. ``--profile`` (or a p95 over 150 ms) prints where the overview's time goes
  (cProfile of one overview_snapshot call).

Ends with RESULT events_per_s=... goodput_p95_ms=... plus the baselines as extra k=v pairs.
Targets: events_per_s >= 20,000, goodput_p95_ms <= 150.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import io
import json
import pstats
import random
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import (
    BENCH_DATABASE_URL,
    BENCH_REDIS_URL,
    Processes,
    bench_env,
    free_port,
    log,
    percentile,
    setup_django,
    viewer_client,
)

from console.processes import healthy, uvicorn_command

SITE = "bench-training"
EVENTS_PATH = "/api/v1/training/jobs/{}/events"
GANG_SIZES = (8, 16, 32, 64, 64, 128, 256, 512, 1024)
TEAMS = ("foundation", "multimodal", "code", "speech", "alignment")
TARGET_EVENTS_PER_S = 20_000
TARGET_P95_MS = 150.0


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def bench_site() -> Any:
    from fleet.models import Site

    site, _ = Site.objects.get_or_create(name=SITE, defaults={"region": "eu-west", "contracted_power_kw": 5000})
    return site


def wipe_jobs(site: Any) -> None:
    """Empty the event and account tables, and drop the jobs an earlier run left behind."""
    from fleet.models import Job

    sql("TRUNCATE fleet_jobevent, fleet_jobaccount")
    Job.objects.filter(site=site).delete()


# --- phase: ingest over HTTP -------------------------------------------------------------------


def start_web(procs: Processes, port: int, workers: int) -> None:
    procs.spawn(
        "web",
        uvicorn_command(port, workers=workers, access_log=False),
        bench_env(),
    )

    procs.wait_until("web", lambda: healthy(port))
    if workers > 1:  # the supervisor answers before every worker process has started
        procs.wait_until("web", lambda: len(procs.tree("web")) >= workers + 1)


def request(conn: http.client.HTTPConnection, path: str, body: bytes, token: str) -> tuple[int, bytes]:
    conn.request("POST", path, body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def register_jobs(port: int, token: str, count: int, rng: random.Random) -> list[tuple[int, int]]:
    """Register ``count`` jobs over HTTP; returns (job id, gang size) in order."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    jobs = []
    started = time.perf_counter()
    for n in range(count):
        gang = rng.choice(GANG_SIZES)
        body = {
            "name": f"bench-job-{n:03d}",
            "team": TEAMS[n % len(TEAMS)],
            "framework": "pytorch",
            "gang_size": gang,
            "scheduler": "kueue",
            "scheduler_id": f"bench/job-{n:03d}",
            "checkpoint_interval_s": rng.choice((1800, 2700, 3600)),
            "cluster": f"cluster-{n % 3}",
        }
        status, text = request(conn, "/api/v1/training/jobs/", json.dumps(body).encode(), token)
        if status not in (200, 201):
            raise RuntimeError(f"registering job {n}: HTTP {status} {text[:300]!r}")
        jobs.append((json.loads(text)["id"], gang))
    conn.close()
    log(f"registered {count} jobs over HTTP in {time.perf_counter() - started:.1f} s")
    return jobs


def iso(ts: datetime) -> str:
    return ts.isoformat()


@dataclass
class IngestWorkload:
    """Per job: a start batch (allocated, started) and ``batches`` batches of ``size`` steps,
    one step a second, the last one at least a minute in the past."""

    jobs: list[tuple[int, int]]
    batches: int
    size: int
    run: str
    base: datetime = field(init=False)

    def __post_init__(self) -> None:
        span = timedelta(seconds=self.batches * self.size + 600)
        self.base = datetime.now(UTC).replace(microsecond=0) - span

    def start_events(self, job: int) -> list[dict[str, Any]]:
        return [
            {"id": f"{self.run}-{job}-a", "ts": iso(self.base), "kind": "allocated"},
            {"id": f"{self.run}-{job}-s", "ts": iso(self.base + timedelta(seconds=30)), "kind": "started"},
        ]

    def step_rows(self, job: int, batch: int) -> list[tuple[Any, ...]]:
        """(event id, ts, step, tokens, step_time_s, data_wait_s, node) of one batch."""
        rng = random.Random(job * 100_003 + batch)
        first = batch * self.size + 1
        rows = []
        for step in range(first, first + self.size):
            ts = self.base + timedelta(seconds=60 + step)
            rows.append(
                (
                    f"{self.run}-{job}-{step}",
                    ts,
                    step,
                    4_194_304,
                    round(rng.uniform(0.9, 1.0), 4),
                    round(rng.uniform(0.0, 0.05), 4),
                    f"node-{job % 50:03d}",
                )
            )
        return rows

    def body(self, job: int, batch: int) -> bytes:
        events = [
            {
                "id": eid,
                "ts": iso(ts),
                "kind": "step",
                "step": step,
                "tokens": tokens,
                "step_time_s": st,
                "data_wait_s": dw,
                "node": node,
            }
            for eid, ts, step, tokens, st, dw, node in self.step_rows(job, batch)
        ]
        return json.dumps({"events": events}, separators=(",", ":")).encode()


@dataclass
class ClientStats:
    steps: int = 0
    requests: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    last_answer: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def post_share(port: int, token: str, share: list[tuple[int, list[bytes]]], size: int, stats: ClientStats) -> None:
    """One client: round after round, the next batch of each of its jobs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        rounds = max(len(bodies) for _, bodies in share)
        for r in range(rounds):
            for job_id, bodies in share:
                if r >= len(bodies) or stats.errors:
                    continue
                sent = time.perf_counter()
                status, text = request(conn, EVENTS_PATH.format(job_id), bodies[r], token)
                answered = time.perf_counter()
                if status != 200:
                    with stats.lock:
                        stats.errors.append(f"job {job_id} batch {r}: HTTP {status} {text[:300]!r}")
                    return
                with stats.lock:
                    stats.steps += size
                    stats.requests += 1
                    stats.latencies.append(answered - sent)
                    stats.last_answer = max(stats.last_answer, answered)
    except (OSError, http.client.HTTPException) as exc:
        with stats.lock:
            stats.errors.append(f"{exc.__class__.__name__}: {exc}")
    finally:
        conn.close()


def run_ingest(args: argparse.Namespace, site: Any, procs: Processes) -> tuple[dict[str, Any], IngestWorkload]:
    import redis

    from console.models import AgentToken

    wipe_jobs(site)
    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()
    run = f"b{secrets.token_hex(3)}"
    token = AgentToken.issue(site=site, name=f"bench-training-{run}")[1]
    port = free_port()
    log(f"ingest: starting uvicorn (--workers {args.web_workers}); logs in {procs.log_dir}")
    start_web(procs, port, args.web_workers)
    jobs = register_jobs(port, token, args.jobs, random.Random(5))
    workload = IngestWorkload(jobs, args.batches_per_job, args.batch, run)

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for job_id, _ in jobs:  # untimed: allocated + started (also warms each worker's caches)
        status, text = request(
            conn, EVENTS_PATH.format(job_id), json.dumps({"events": workload.start_events(job_id)}).encode(), token
        )
        if status != 200:
            raise RuntimeError(f"start events of job {job_id}: HTTP {status} {text[:300]!r}")
    conn.close()

    log(f"ingest: building {len(jobs) * args.batches_per_job:,} bodies of {args.batch} step events…")
    bodies = {job_id: [workload.body(job_id, b) for b in range(args.batches_per_job)] for job_id, _ in jobs}
    megabytes = sum(len(b) for bs in bodies.values() for b in bs) / 2**20
    shares: list[list[tuple[int, list[bytes]]]] = [[] for _ in range(args.clients)]
    for n, (job_id, _) in enumerate(jobs):
        shares[n % args.clients].append((job_id, bodies[job_id]))

    before = sql("SELECT count(*) FROM fleet_jobevent WHERE kind = 'step'")[0][0]
    stats = ClientStats()
    threads = [
        threading.Thread(target=post_share, args=(port, token, share, args.batch, stats), daemon=True)
        for share in shares
    ]
    log(f"ingest: {args.clients} clients POSTing {megabytes:.0f} MiB of step events for {len(jobs)} jobs…")
    first_post = time.perf_counter()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        elapsed = time.perf_counter() - first_post
        log(f"  {stats.steps:,} step events answered in {elapsed:.0f} s ({stats.steps / elapsed:,.0f}/s)")
    if stats.errors:
        raise RuntimeError(f"ingest client failed: {stats.errors[0]}")
    elapsed = stats.last_answer - first_post
    stored = sql("SELECT count(*) FROM fleet_jobevent WHERE kind = 'step'")[0][0] - before
    expected = len(jobs) * args.batches_per_job * args.batch
    if stored != expected:
        raise RuntimeError(f"{stored:,} step events stored, {expected:,} sent")
    procs.stop()
    result = {
        "events_per_s": stored / elapsed,
        "stored": stored,
        "elapsed": elapsed,
        "p50_ms": percentile(stats.latencies, 50) * 1000,
        "p95_ms": percentile(stats.latencies, 95) * 1000,
    }
    log(
        f"ingest: {stored:,} step events stored in {elapsed:.1f} s = {result['events_per_s']:,.0f}/s "
        f"({stats.requests} requests of {args.batch}; "
        f"POST p50 {result['p50_ms']:.0f} ms, p95 {result['p95_ms']:.0f} ms)"
    )
    return result, workload


def run_raw_copy(workload: IngestWorkload) -> float:
    """The same step rows, batch by batch, COPYed straight into fleet_jobevent (a commit each)."""
    import psycopg

    from fleet.training.events import _COLUMNS, _TYPES

    sql("DELETE FROM fleet_jobevent WHERE kind = 'step'")
    copy_sql = f"COPY fleet_jobevent ({', '.join(_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    rows = 0
    busy = 0.0  # time in COPY and commit only: building the rows is not the database's work
    with psycopg.connect(BENCH_DATABASE_URL) as conn:
        for job_id, _ in workload.jobs:
            for batch in range(workload.batches):
                seq0 = 2 + batch * workload.size
                data = [
                    (job_id, eid, seq0 + i, ts, "step", step, tokens, st, dw, None, None, "", node)
                    for i, (eid, ts, step, tokens, st, dw, node) in enumerate(workload.step_rows(job_id, batch))
                ]
                started = time.perf_counter()
                with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
                    copy.set_types(_TYPES)
                    for row in data:
                        copy.write_row(row)
                conn.commit()
                busy += time.perf_counter() - started
                rows += len(data)
    stored = sql("SELECT count(*) FROM fleet_jobevent WHERE kind = 'step'")[0][0]
    assert stored == rows, (stored, rows)
    rate = rows / busy
    log(f"raw_copy: {rows:,} step rows in {busy:.1f} s = {rate:,.0f}/s (one COPY and commit per batch)")
    return rate


# --- phase: 7 days of history, then the overview API ----------------------------------------------


class HistoryWriter:
    """Seven days of one job's events, realistic enough for the accounts: steps every 30-60 s,
    blocking checkpoints, failures with a restart and restore, a few preemptions, completions."""

    def __init__(self, job_index: int, gang: int, checkpoint_s: int, now: datetime, days: int) -> None:
        self.rng = random.Random(job_index)
        self.n = job_index
        self.gang = gang
        self.checkpoint_s = checkpoint_s
        self.now = now
        self.days = days
        self.events: list[Any] = []
        self.seq = 0

    def add(self, kind: str, ts: datetime, **fields: Any) -> None:
        from fleet.training.events import JobEventIn

        self.seq += 1
        self.events.append(JobEventIn(id=f"h{self.n}-{self.seq}", ts=ts, kind=kind, **fields))

    def build(self) -> list[Any]:
        rng = self.rng
        t = self.now - timedelta(days=self.days) + timedelta(seconds=rng.uniform(0, 12 * 3600))
        # 15 % of the jobs end during the last three days; the rest are running now.
        end = self.now - timedelta(seconds=rng.uniform(1, 60))
        completes = rng.random() < 0.15
        if completes:
            end = self.now - timedelta(seconds=rng.uniform(3600, 3 * 86400))
        interval = rng.uniform(30, 60)
        stall = self.n % 37 == 5  # a data-starved job or two
        preemptible = self.n % 20 == 3
        # Failures grow with gang size: a per-GPU MTBF of ~5 years at a 1,024 gang is ~43 h.
        job_mtbf_s = 5 * 365 * 86400 / max(8, self.gang)
        step = 0
        saved = 0
        self.add("allocated", t)
        t += timedelta(seconds=rng.uniform(60, 300))
        self.add("started", t)
        t += timedelta(seconds=rng.uniform(120, 600))  # initialisation before the first step
        next_checkpoint = t + timedelta(seconds=self.checkpoint_s)
        while t < end:
            step_time = interval * rng.uniform(0.95, 1.05)
            t += timedelta(seconds=step_time)
            if t >= end:
                break
            step += 1
            wait = step_time * (rng.uniform(0.3, 0.6) if stall else rng.uniform(0.0, 0.04))
            self.add(
                "step",
                t,
                step=step,
                tokens=int(step_time * 1_000 * self.gang),
                step_time_s=round(step_time, 3),
                data_wait_s=round(wait, 3),
                node=f"node-{self.n % 50:03d}",
            )
            if t >= next_checkpoint:
                duration = rng.uniform(30, 120)
                t += timedelta(seconds=duration)
                self.add("checkpoint_saved", t, step=step, duration_s=round(duration, 2), bytes=self.gang * 2**30)
                saved = step
                next_checkpoint = t + timedelta(seconds=self.checkpoint_s)
            if rng.random() < step_time / job_mtbf_s:
                t += timedelta(seconds=rng.uniform(1, 10))
                self.add("failed", t, reason=rng.choice(("NCCL watchdog timeout", "XID 79", "CUDA OOM")))
                t += timedelta(seconds=rng.uniform(180, 600))  # the GPUs stay held while it restarts
                self.add("started", t)
                load = rng.uniform(60, 180)
                t += timedelta(seconds=load)
                self.add("restored", t, step=saved, duration_s=round(load, 1))
                step = saved
                next_checkpoint = t + timedelta(seconds=self.checkpoint_s)
            elif preemptible and rng.random() < step_time / (2 * 86400):
                t += timedelta(seconds=5)
                self.add("preempted", t, reason="reclaimed by a reserved workload")
                t += timedelta(seconds=rng.uniform(1800, 5400))
                self.add("resumed", t)
                t += timedelta(seconds=60)
                self.add("started", t)
                t += timedelta(seconds=90)
                self.add("restored", t, step=saved, duration_s=90.0)
                step = saved
                next_checkpoint = t + timedelta(seconds=self.checkpoint_s)
        if completes:
            self.add("completed", t, step=step)
            self.add("released", t + timedelta(seconds=30))
        return self.events


def write_history(site: Any, days: int) -> int:
    """Reset the jobs and write ``days`` of history for each through store_job_events."""
    from django.db import transaction

    from fleet.choices import JobState
    from fleet.models import Job
    from fleet.training.events import store_job_events

    sql("TRUNCATE fleet_jobevent, fleet_jobaccount")
    Job.objects.filter(site=site).update(
        state=JobState.PENDING,
        first_allocated_at=None,
        allocated_since=None,
        progress_since=None,
        ended_at=None,
        last_event_at=None,
        last_step=None,
        last_step_at=None,
        last_step_time_s=None,
        last_checkpoint_at=None,
        last_checkpoint_step=None,
        failures=0,
        events_seen=0,
        accounts_dirty_at=None,
    )
    jobs = list(
        Job.objects.filter(site=site).order_by("scheduler_id").values_list("pk", "gang_size", "checkpoint_interval_s")
    )
    now = datetime.now(UTC)
    total = 0
    started = time.perf_counter()
    for n, (pk, gang, checkpoint_s) in enumerate(jobs):
        events = HistoryWriter(n, gang, checkpoint_s or 1800, now, days).build()
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=pk)
            for offset in range(0, len(events), 10_000):
                store_job_events(job, events[offset : offset + 10_000])
        total += len(events)
        if (n + 1) % 20 == 0 or n + 1 == len(jobs):
            elapsed = time.perf_counter() - started
            log(f"  history: {n + 1}/{len(jobs)} jobs, {total:,} events ({total / elapsed:,.0f}/s)")
    sql("ANALYZE fleet_jobevent, fleet_job")
    return total


def time_get(client: Any, url: str, requests: int) -> tuple[list[float], Any]:
    for _ in range(2):
        client.get(url)
    times, body = [], None
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"GET {url}: HTTP {response.status_code} {response.content[:300]!r}")
        body = response
    return times, body


def profile_overview() -> None:
    from fleet.training import read as training_read

    profiler = cProfile.Profile()
    profiler.enable()
    training_read.overview_snapshot(range_key="7d")
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(r"fleet/|django/db/backends", 18)
    log("overview_snapshot(range_key='7d'), cumulative time by function:\n" + out.getvalue())


def run_overview(args: argparse.Namespace, site: Any) -> dict[str, Any]:
    from fleet.training.accounts import refresh_job_accounts

    events = sql(
        "SELECT count(*) FROM fleet_jobevent e JOIN fleet_job j ON j.id = e.job_id WHERE j.site_id = %s", [site.pk]
    )[0][0]
    refresh_s = 0.0
    if args.reuse_history and events:
        log(f"overview: reusing the {events:,} events of the last run's history (no --reuse-history to write afresh)")
    else:
        log(f"overview: writing {args.days} days of history for {args.jobs} jobs through store_job_events…")
        started = time.perf_counter()
        events = write_history(site, args.days)
        log(f"overview: {events:,} events written in {time.perf_counter() - started:.0f} s; refreshing the accounts…")
        started = time.perf_counter()
        refreshed = refresh_job_accounts(budget_s=None)  # every job, not the periodic 5 s budget
        refresh_s = time.perf_counter() - started
        log(f"overview: refresh_job_accounts() -> {refreshed} in {refresh_s:.1f} s")
    accounts = sql("SELECT count(*) FROM fleet_jobaccount")[0][0]
    log(f"overview: {accounts:,} hourly account rows")
    sql("ANALYZE fleet_jobaccount")

    client = viewer_client()
    times, response = time_get(client, "/api/v1/training/overview?range=7d", args.requests)
    p95 = percentile(times, 95)
    log(
        f"overview range=7d: p50 {percentile(times, 50):.1f} ms, p95 {p95:.1f} ms, max {max(times):.1f} ms "
        f"over {len(times)} requests; {len(response.content) / 1024:.0f} KiB"
    )
    base_times, _ = time_get(client, "/api/v1/fleet/sites/", args.requests)
    base_p95 = percentile(base_times, 95)
    log(f"baseline /api/v1/fleet/sites/: p50 {percentile(base_times, 50):.1f} ms, p95 {base_p95:.1f} ms")
    if args.profile or p95 > TARGET_P95_MS:
        profile_overview()
    return {"p95": p95, "base_p95": base_p95, "events": events, "refresh_s": refresh_s, "accounts": accounts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="running jobs (default 200)")
    parser.add_argument("--batch", type=int, default=500, help="step events per request (default 500)")
    parser.add_argument("--batches-per-job", type=int, default=5, help="timed requests per job (default 5)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients (default 8)")
    parser.add_argument("--web-workers", type=int, default=2, help="uvicorn worker processes (default 2)")
    parser.add_argument("--days", type=int, default=7, help="days of history for the overview (default 7)")
    parser.add_argument("--requests", type=int, default=40, help="timed overview requests (default 40)")
    parser.add_argument("--skip-ingest", action="store_true", help="only the overview phase (jobs must exist)")
    parser.add_argument(
        "--reuse-history", action="store_true", help="with --skip-ingest: time the overview on the last run's history"
    )
    parser.add_argument("--profile", action="store_true", help="profile the overview whatever its p95")
    args = parser.parse_args()
    if args.requests < 20:
        parser.error("--requests must be at least 20")

    setup_django()
    site = bench_site()
    procs = Processes()
    result = {"events_per_s": 0.0, "raw": 0.0}
    if not args.skip_ingest:
        ingest, workload = run_ingest(args, site, procs)
        raw = run_raw_copy(workload)
        result = {"events_per_s": ingest["events_per_s"], "raw": raw, "post_p95_ms": ingest["p95_ms"]}
    overview = run_overview(args, site)
    import redis

    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()  # the live pushes no worker consumed
    procs.discard_logs()
    events_per_s, p95 = result["events_per_s"], overview["p95"]
    ingest_verdict = (
        "not measured (--skip-ingest)"
        if args.skip_ingest
        else f"{'meets' if events_per_s >= TARGET_EVENTS_PER_S else 'misses'} the {TARGET_EVENTS_PER_S:,}/s target"
    )
    verdict = (
        f"events_per_s {ingest_verdict}; p95 {'meets' if p95 <= TARGET_P95_MS else 'misses'} "
        f"the {TARGET_P95_MS:.0f} ms target"
    )
    log(verdict)
    raw = result["raw"]
    print(
        f"RESULT events_per_s={events_per_s:.0f} goodput_p95_ms={p95:.1f} raw_copy_events_per_s={raw:.0f} "
        f"http_pct_of_raw={100 * events_per_s / raw if raw else 0:.0f} post_p95_ms={result.get('post_p95_ms', 0):.0f} "
        f"sites_api_p95_ms={overview['base_p95']:.1f} history_events={overview['events']} "
        f"refresh_accounts_s={overview['refresh_s']:.1f}"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
