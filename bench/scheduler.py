"""The capacity plan API with the scheduler's queue figures, for 50 Kueue ClusterQueues over 7 days.

On the bench's own database (``bench_scheduler`` unless BENCH_DATABASE_URL says otherwise):

* seed: 5 pools (one a site), 50 ClusterQueues (10 a pool, the pool's cohort, each mapped to its
  team), each with 7 days of 1-minute rollups (fleet_schedulerrollup_1m) in the writer's own row
  convention (fleet.telemetry.series: counters carry ``increase``, every row min/max/last),
  inserted in SQL an hour at a time: pending workloads (active, inadmissible), admitted active
  workloads, resource usage and nominal quota of ``nvidia.com/gpu`` and ``cpu``, evicted workloads
  (two reasons), preempted workloads, admitted workloads and Kueue's admission wait histogram
  (its 17 buckets, _count and _sum): 30 series a queue, about 15.1 M rows. Kept between runs when
  intact and at most ``--max-age`` old (topped up to the present minute; ``--reload`` loads
  afresh), then vacuumed and analysed as autovacuum would leave it. Each pool also holds a few
  reservations active now.
* api: GET /api/v1/capacity/plan (12 months, with its ``queues`` part: pending now, p50/p95
  admission wait over 1 h and 24 h, evictions and preemptions per team over 24 h, GPUs allocated
  against reserved) through Django's test client with a Viewer's session (middleware, auth, DRF,
  JSON), ``--requests`` timed after 2 warm-ups (which sum the day's settled hours, read-through,
  as a page's first read of the hour does; the table is then analysed): p50 and p95. The queue part alone
  (fleet.scheduler.read.pool_queues), quota drift (fleet.scheduler.drift.quota_drift, which the
  capacity page's panel reads too) and the plan without the queues are timed too, on stderr.

Prints progress on stderr and ends with
RESULT capacity_api_p50_ms=... capacity_api_p95_ms=... queues=50 days=7 target_p95_ms=150 met|missed
(``--quick``: 1 day, 5 requests, a smoke run.)
"""

from __future__ import annotations

import os

# The bench's own database unless told otherwise, chosen before _common reads it.
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_scheduler")

import argparse
import json
import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import BENCH_DATABASE_URL, log, percentile, setup_django, timed_get, viewer_client

API_PATH = "/api/v1/capacity/plan"
SITES = tuple(f"bench-sched-{c}" for c in "abcde")
QUEUES_PER_POOL = 10
TARGET_P95_MS = 150
H100 = "NVIDIA H100 80GB HBM3"
# Kueue's admission wait buckets (pkg/metrics: 1, then 2.5 doubling, 16 bounds) and +Inf.
BOUNDS = [1.0, 2.5, *(2.5 * 2**k for k in range(1, 15)), math.inf]
PC = 'priority_class="bench-standard"'
GPU = 'flavor="h100-reserved",resource="nvidia.com/gpu"'
CPU = 'flavor="h100-reserved",resource="cpu"'


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else f"{bound:g}"


# (quantity, series text, counter?, bound: the bucket's upper bound for a histogram bucket, else 0)
SERIES: list[tuple[str, str, bool, float]] = [
    ("pending_workloads", 'status="active"', False, 0),
    ("pending_workloads", 'status="inadmissible"', False, 0),
    ("admitted_active_workloads", "", False, 0),
    ("resource_usage", GPU, False, 0),
    ("resource_usage", CPU, False, 0),
    ("nominal_quota", GPU, False, 0),
    ("nominal_quota", CPU, False, 0),
    ("evicted_workloads", f'{PC},reason="Preempted",underlying_cause=""', True, 0),
    ("evicted_workloads", f'{PC},reason="PodsReadyTimeout",underlying_cause="WaitForStart"', True, 0),
    ("preempted_workloads", 'reason="InCohortReclamation"', True, 0),
    ("admitted_workloads", PC, True, 0),
    *(("admission_wait_bucket", f'le="{_le(b)}",{PC}', True, b if b != math.inf else 1e18) for b in BOUNDS),
    ("admission_wait_count", PC, True, 0),
    ("admission_wait_sum", PC, True, 0),
]

# One hour of every queue's series. ``n`` admissions a minute (0 to 3); a bucket's increase is the
# admissions whose wait is within its bound, waits spread exponentially around a mean of 60 s to
# 15 min by queue; an eviction every 97 minutes or so, a preemption every 89; gauges wander.
SEED_SQL = """
INSERT INTO fleet_schedulerrollup_1m (queue_id, series, quantity, bucket, samples, increase, min, max, last)
SELECT q, s.series, s.quantity, b, 4,
       CASE WHEN NOT s.counter THEN NULL
            WHEN s.quantity = 'admission_wait_bucket' THEN floor(n * (1 - exp(-least(s.bound / mean, 700))))
            WHEN s.quantity IN ('admitted_workloads', 'admission_wait_count') THEN n
            WHEN s.quantity = 'admission_wait_sum' THEN n * mean
            WHEN s.quantity = 'evicted_workloads' THEN (h %% 97 = 0)::int
            ELSE (h %% 89 = 0)::int END,
       v, v, v
FROM unnest(%(ids)s::int8[]) AS q
CROSS JOIN generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '1 minute', interval '1 minute') AS b
CROSS JOIN unnest(%(series)s::text[], %(quantities)s::text[], %(counters)s::bool[], %(bounds)s::float8[])
    AS s(series, quantity, counter, bound)
CROSS JOIN LATERAL (SELECT q * 7919 + (extract(epoch FROM b)::bigint / 60) AS h) AS hh
CROSS JOIN LATERAL (SELECT (h %% 4)::float8 AS n, 60.0 + (q %% 16) * 56 AS mean) AS nn
CROSS JOIN LATERAL (
    SELECT CASE WHEN s.counter THEN (extract(epoch FROM b) - 1.7e9) / 60
                WHEN s.quantity = 'pending_workloads' THEN (h %% 7)::float8
                WHEN s.quantity = 'nominal_quota' THEN 32
                WHEN s.quantity = 'resource_usage' THEN (h %% 40)::float8
                ELSE (h %% 9)::float8 END AS v
) AS vv
"""


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def inventory() -> tuple[list[int], list[int]]:
    """5 pools, 50 ClusterQueues mapped to them and their teams, a few reservations active now;
    returns (pool ids, queue ids)."""
    from fleet.capacity.models import Pool, Reservation, ReservationState, Team
    from fleet.choices import PriorityTier, QueueScheduler
    from fleet.inventory.models import Site
    from fleet.scheduler.models import SchedulerQueue

    pools = []
    for k, name in enumerate(SITES):
        site, _ = Site.objects.get_or_create(name=name, defaults={"region": "bench"})
        pool, _ = Pool.objects.get_or_create(site=site, gpu_model=H100, defaults={"name": "h100"})
        pools.append(pool)
        for i in range(QUEUES_PER_POOL):
            team, _ = Team.objects.get_or_create(name=f"bench-team-{k * QUEUES_PER_POOL + i:02d}")
            SchedulerQueue.objects.update_or_create(
                site=site,
                scheduler=QueueScheduler.KUEUE,
                name=f"cq-{team.name}",
                defaults={"cohort": f"{name}-h100", "pool": pool, "team": team},
            )
            if i < 4 and not Reservation.objects.filter(pool=pool, team=team).exists():
                now = datetime.now(UTC)
                Reservation.objects.create(
                    pool=pool,
                    team=team,
                    gpus=16,
                    start=now - timedelta(days=30),
                    end=now + timedelta(days=365),
                    tier=PriorityTier.PREEMPTIBLE if i == 3 else PriorityTier.RESERVED,
                    state=ReservationState.ACTIVE,
                )
    ids = sorted(
        SchedulerQueue.objects.filter(site__name__in=SITES, name__startswith="cq-").values_list("id", flat=True)
    )
    return [p.pk for p in pools], ids


def prepare(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """The inventory and ``--days`` of rollups: kept when intact and recent enough, topped up to the
    present minute; loaded afresh otherwise."""
    from fleet.telemetry import partitions

    pool_ids, ids = inventory()
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    span = timedelta(days=args.days)
    (newest, oldest, rows) = sql(
        "SELECT max(bucket), min(bucket), count(*) FROM fleet_schedulerrollup_1m WHERE queue_id = %s", [ids[-1]]
    )[0]
    minutes = 0 if newest is None else (newest - oldest) / timedelta(minutes=1) + 1
    intact = newest is not None and oldest <= now - span and rows >= len(SERIES) * minutes
    if args.reload or not intact or now - newest > args.max_age:
        log(f"seed: loading {args.days} days of 1-minute rollups for {len(ids)} queues ({len(SERIES)} series each)…")
        # The bench's own database: the table holds these queues' rows only. Emptied rather than
        # deleted from, so the seed lies in time order as ingest writes it (a block range index
        # over deleted and rewritten rows reads far more than the minutes asked for).
        sql("TRUNCATE fleet_schedulerrollup_1m, fleet_schedulercounterhour")
        start = now - span
    else:
        start = newest + timedelta(minutes=1)
        log(f"seed: reusing the rollups up to {newest:%Y-%m-%d %H:%M}; topping up to {now:%H:%M}")
    partitions.ensure_partitions(partitions.SCHEDULER_ROLLUP_1M, start, now + timedelta(hours=1))
    params = {
        "ids": ids,
        "series": [s[1] for s in SERIES],
        "quantities": [s[0] for s in SERIES],
        "counters": [s[2] for s in SERIES],
        "bounds": [float(s[3]) for s in SERIES],
    }
    started = time.perf_counter()
    moment, hours = start, 0
    while moment < now + timedelta(minutes=1):
        step = min(timedelta(hours=1), now + timedelta(minutes=1) - moment)
        sql(SEED_SQL, {**params, "start": moment, "end": moment + step})
        moment += step
        hours += 1
        if hours % 24 == 0:
            log(f"seed: rollups up to {moment:%Y-%m-%d %H:%M} ({time.perf_counter() - started:.0f} s)")
    # As autovacuum leaves the table: analysed, and the minute's block ranges summarised (the
    # index's autosummarize does it as writing moves on; a bulk seed outruns it).
    started = time.perf_counter()
    sql("VACUUM (ANALYZE) fleet_schedulerrollup_1m")
    log(f"seed: vacuumed and analysed in {time.perf_counter() - started:.0f} s")
    (total,) = sql(
        "SELECT count(*) FROM fleet_schedulerrollup_1m WHERE queue_id = ANY(%s) AND bucket > %s", [ids, now - span]
    )[0]
    log(f"seed: {len(ids)} queues in {len(pool_ids)} pools, {total:,} rollup rows over {args.days} days")
    return pool_ids, ids


def time_get(client: Any, requests: int) -> tuple[list[float], dict[str, Any]]:
    """``requests`` timed GETs of the plan API after 2 warm-ups."""

    def get() -> tuple[float, Any]:
        return timed_get(client, API_PATH)

    get()
    get()
    # The warm-ups summed the day's settled hours (fleet.scheduler.read.counter_windows) into a
    # table that was empty: its statistics as autovacuum leaves them after such a fill.
    sql("ANALYZE fleet_schedulercounterhour")
    times, body = [], {}
    for _ in range(requests):
        ms, response = get()
        times.append(ms)
        body = response.json()
    return times, body


def time_call(fn: Any, repeats: int) -> list[float]:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return times


def describe(body: dict[str, Any]) -> str:
    queues = [q for pool in body["queues"] for q in pool["queues"]]
    waited = sum(1 for q in queues if q["wait_24h"])
    evicted = sum(t["evicted"] for pool in body["queues"] for t in pool["teams"])
    return (
        f"{len(body['pools'])} pools, {len(queues)} queues ({waited} with a 24 h wait), {evicted:.0f} evictions "
        f"in 24 h, {len(json.dumps(body)) / 1024:.0f} KiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 day, 5 requests (no target)")
    parser.add_argument("--days", type=int, default=7, help="days of rollups (default 7)")
    parser.add_argument("--requests", type=int, default=20, help="timed requests (default 20)")
    parser.add_argument("--reload", action="store_true", help="load the rollups afresh")
    parser.add_argument(
        "--max-age", type=lambda v: timedelta(hours=float(v)), default=timedelta(hours=6), help="hours (default 6)"
    )
    args = parser.parse_args()
    if args.quick:
        args.days, args.requests = 1, 5

    setup_django()
    log(f"database {BENCH_DATABASE_URL}")
    pool_ids, ids = prepare(args)
    if len(ids) != len(SITES) * QUEUES_PER_POOL:
        raise RuntimeError(f"{len(ids)} queues; {len(SITES) * QUEUES_PER_POOL} expected")

    from console.runtime import settle_heap
    from fleet.capacity import api as capacity_api
    from fleet.scheduler.drift import quota_drift
    from fleet.scheduler.read import pool_queues

    client = viewer_client()
    settle_heap()  # as the web process does once it is ready (goodput/asgi.py)
    times, body = time_get(client, args.requests)
    p50, p95 = percentile(times, 50), percentile(times, 95)
    log(f"api {API_PATH}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(times):.1f} ms over {len(times)}")
    log(f"api: {describe(body)}")
    if sum(len(pool["queues"]) for pool in body["queues"]) < len(ids):
        raise RuntimeError("the API shows fewer queues than were seeded")

    part = time_call(lambda: pool_queues(pool_ids), args.requests)
    log(f"the queues part alone (pool_queues): p50 {percentile(part, 50):.1f} ms, p95 {percentile(part, 95):.1f} ms")
    drifts = time_call(quota_drift, args.requests)
    log(f"quota drift (the capacity panel): p50 {percentile(drifts, 50):.1f} ms, p95 {percentile(drifts, 95):.1f} ms")
    parts = dict(capacity_api._capacity_parts)
    capacity_api._capacity_parts.clear()
    try:
        bare, _ = time_get(client, args.requests)
    finally:
        capacity_api._capacity_parts.update(parts)
    log(f"the plan without the queues: p50 {percentile(bare, 50):.1f} ms, p95 {percentile(bare, 95):.1f} ms")

    verdict = "met" if p95 <= TARGET_P95_MS else "missed"
    print(
        f"RESULT capacity_api_p50_ms={p50:.1f} capacity_api_p95_ms={p95:.1f} queues={len(ids)} days={args.days} "
        f"target_p95_ms={TARGET_P95_MS} {verdict}"
    )


if __name__ == "__main__":
    main()
