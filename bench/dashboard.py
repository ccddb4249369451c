"""Fleet overview API latency on a day of a 1,024-GPU fleet, against the same aggregate from raw samples.

Data (in the bench database; see bench/_common.py):

* inventory through the ORM: 3 sites, racks, 128 nodes, 1,024 GPUs (bench/_common.bench_fleet);
* raw samples for the last 24 h at one per GPU every 15 s (about 5.9 M rows), generated in pure
  Python (per-GPU training / diurnal inference load, power, temperature, clocks, rare XIDs and
  throttling) and written by binary COPY, an hour at a time;
* after each hour, its minutes are marked dirty and fleet.telemetry.rollups.update_rollups builds
  the per-GPU and group 1-minute rollups and the 1-hour rollups, exactly as the beat task does;
* the six days before: per-GPU 1-hour rollups synthesised in SQL, then grouped by the rollup
  module's own GROUP_SQL, so the 7d range has a week to read;
* each GPU's latest state (fleet_gpustate) from its newest sample, so the overview's GPU table and
  totals have 1,024 fresh rows.

A second run reuses the data when it is intact and at most 6 h old, topping it up to the present
(``--reload`` loads afresh). The ingest benchmark empties the sample table, so after it this one
loads again.

Timing: GET /api/v1/fleet/overview/?range=1h|24h|7d through Django's test client (the whole stack:
middleware, session auth of a Viewer, DRF, JSON rendering) ``--requests`` times each after two
warm-up requests; then fleet.telemetry.read.figures.site_series_from_raw(seconds=86400), the 24 h
series computed from raw samples, three times. A breakdown of the overview's parts is printed.

Ends with RESULT p95_ms_1h=... p95_ms_24h=... p95_ms_7d=... raw_24h_ms=... speedup_24h=... where
raw_24h_ms is the median raw aggregate and speedup_24h = raw_24h_ms / p95_ms_24h.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import BENCH_DATABASE_URL, bench_fleet, ensure_inventory, log, percentile, setup_django, viewer_client

INTERVAL = timedelta(seconds=15)
RAW_HOURS = 24
WEEK_DAYS = 7
MAX_AGE_FOR_REUSE = timedelta(hours=6)
RANGES = ("1h", "24h", "7d")
REASON_SW_POWER_CAP, REASON_HW_SLOWDOWN, REASON_HW_THERMAL = 0x4, 0x8, 0x40


# --- synthetic samples ---------------------------------------------------------------------------


class SampleGenerator:
    """Rows for fleet_gpusample, tick by tick, cheap enough for millions: per-GPU constants are
    computed once, randomness comes from a precomputed table of Gaussian noise."""

    def __init__(self, fleet: dict[str, list[Any]], gpu_ids: dict[str, int], seed: int = 11) -> None:
        rng = random.Random(seed)
        self.noise = [rng.gauss(0, 1) for _ in range(8191)]
        self.gpus = []
        for gpus in fleet.values():
            for g in gpus:
                m = g.model
                fb_used = m.hbm_mib * (0.92 if g.workload == "training" else rng.uniform(0.3, 0.8))
                self.gpus.append(
                    {
                        "id": gpu_ids[g.uuid],
                        "training": g.workload == "training",
                        "offset_h": g.utc_offset_h,
                        "idle_w": m.idle_w,
                        "span_w": m.tdp_w - m.idle_w,
                        "tdp_w": m.tdp_w,
                        "sm_max": m.sm_clock_max,
                        "mem_clock": float(m.mem_clock),
                        "slowdown": m.slowdown_temp,
                        "fb_used": float(round(fb_used)),
                        "fb_free": float(round(m.hbm_mib - fb_used)),
                        "energy": rng.randrange(10**9, 5 * 10**11),
                        "salt": rng.randrange(8191),
                        # A GPU with a recurring fault window: XID 79 or thermal throttling.
                        "fault": rng.choice(["xid79", "thermal"]) if rng.random() < 0.01 else None,
                    }
                )

    def rows(self, ts: datetime, tick: int) -> list[tuple[Any, ...]]:
        noise, n = self.noise, len(self.noise)
        hour = ts.hour + ts.minute / 60
        seconds = INTERVAL.total_seconds()
        out = []
        for g in self.gpus:
            r = noise[(g["salt"] + tick * 31) % n]
            if g["training"]:
                util = 97 + 2.5 * r
                if r < -2.0:  # a checkpoint or data-loader stall
                    util = 15.0
            else:
                local = (hour + g["offset_h"]) % 24
                util = 100 * (0.5 + 0.45 * math.sin(2 * math.pi * (local - 9) / 24)) + 6 * r
            util = 0.0 if util < 0 else 100.0 if util > 100 else util
            load = util / 100
            power = g["idle_w"] + g["span_w"] * load * (0.915 + 0.03 * r)
            temp = 32 + 48 * load + r
            sm_clock = g["sm_max"] * (0.95 if load > 0.2 else 0.5)
            reasons = REASON_SW_POWER_CAP if load > 0.95 and power > g["tdp_w"] * 0.97 else 0
            xid = 0
            if g["fault"] and (tick + g["salt"]) % 960 < 16:  # 4 min in every 4 h
                if g["fault"] == "xid79":
                    xid, util, power, sm_clock = 79, 0.0, g["idle_w"] * 0.6, 0.0
                else:
                    temp, sm_clock, power = g["slowdown"] + 2, g["sm_max"] * 0.5, power * 0.8
                    reasons = REASON_HW_THERMAL | REASON_HW_SLOWDOWN
            g["energy"] += int(power * seconds * 1000)
            out.append(
                (
                    g["id"],
                    ts,
                    round(util, 1),
                    round(util * 0.6, 1),
                    g["fb_used"],
                    g["fb_free"],
                    round(temp, 1),
                    round(temp + 6, 1),
                    round(power, 1),
                    float(round(sm_clock)),
                    g["mem_clock"],
                    g["energy"],
                    xid,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    reasons,
                    round(load * 0.45, 3) if g["training"] else round(load * 0.2, 3),
                    round(load * 0.9, 3),
                    round(load * 0.95, 3),  # gr_engine_active
                    round(load * 0.5, 3),  # dram_active
                    None,  # thermal_violation_us: this fleet exports the clocks-event bitmask
                    None,  # power_violation_us
                )
            )
        return out


# --- loading -------------------------------------------------------------------------------


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def align(moment: datetime) -> datetime:
    """Down to a multiple of the sample interval (so runs share one time grid)."""
    step = int(INTERVAL.total_seconds())
    return datetime.fromtimestamp(int(moment.timestamp()) // step * step, UTC)


def wipe(gpu_ids: list[int]) -> None:
    """Empty the telemetry tables; drop inventory other benchmark runs (other --gpus) left behind."""
    from fleet.models import Gpu, Node

    Gpu.objects.exclude(id__in=gpu_ids).delete()
    Node.objects.filter(gpus__isnull=True).delete()
    sql(
        "TRUNCATE fleet_gpusample, fleet_gpustate, fleet_gpurollup_1m, fleet_gpurollup_1h, "
        "fleet_grouprollup_1m, fleet_grouprollup_1h, fleet_rollupdirty, fleet_ingestbatch"
    )


def load_raw(gen: SampleGenerator, start: datetime, end: datetime) -> int:
    """COPY samples for ticks in [start, end) an hour at a time, rolling each hour up as it lands."""
    import psycopg

    from fleet.telemetry import partitions, rollups
    from fleet.telemetry.copyrows import SAMPLE_COLUMNS, SAMPLE_TYPES

    partitions.forget_known_partitions()
    partitions.ensure_partitions(partitions.SAMPLES, start, end)
    copy_sql = f"COPY fleet_gpusample ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    rows = 0
    tick = int(start.timestamp() // INTERVAL.total_seconds())
    started = time.perf_counter()
    with psycopg.connect(BENCH_DATABASE_URL) as conn:
        conn.execute("SET synchronous_commit = off")
        chunk_start = start
        while chunk_start < end:
            chunk_end = min(end, chunk_start.replace(minute=0, second=0) + timedelta(hours=1))
            with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
                copy.set_types(SAMPLE_TYPES)
                ts = chunk_start
                while ts < chunk_end:
                    for row in gen.rows(ts, tick):
                        copy.write_row(row)
                    rows += len(gen.gpus)
                    ts += INTERVAL
                    tick += 1
            conn.commit()
            minutes = []
            minute = chunk_start.replace(second=0)
            while minute < chunk_end:
                minutes.append(minute)
                minute += timedelta(minutes=1)
            sql(
                "INSERT INTO fleet_rollupdirty (resolution, bucket, dirtied_at) "
                "SELECT '1m', b, now() FROM unnest(%s::timestamptz[]) AS b ON CONFLICT DO NOTHING",
                [minutes],
            )
            # `now` a few minutes ahead: the hours just marked count as settled and roll at once.
            done = rollups.update_rollups(now=datetime.now(UTC) + timedelta(minutes=5))
            elapsed = time.perf_counter() - started
            log(
                f"  {chunk_start:%Y-%m-%d %H:%M}–{chunk_end:%H:%M}: {rows:,} samples so far "
                f"({rows / elapsed:,.0f}/s with rollups; {done['minutes']} minutes, {done['hours']} hours rolled)"
            )
            chunk_start = chunk_end
    return rows


def synthesise_hours(gpu_ids: list[int], start: datetime, end: datetime) -> int:
    """Per-GPU 1-hour rollups for the hours in [start, end), then their group rollups."""
    from fleet.telemetry import partitions, rollups

    hours = []
    hour = start
    while hour < end:
        hours.append(hour)
        hour += timedelta(hours=1)
    if not hours:
        return 0
    for table in (partitions.GPU_ROLLUP_1H, partitions.GROUP_ROLLUP_1H):
        partitions.ensure_partitions(table, hours[0], hours[-1])
    sql(
        f"""
        INSERT INTO fleet_gpurollup_1h (gpu_id, bucket, {rollups.GPU_COLUMNS})
        SELECT g, h, 240, u, least(100, u + 4), 32 + 0.48 * u, 34 + 0.48 * u,
               100 + 5 * u, 120 + 5.5 * u, (100 + 5 * u) * 3600, 0, 0, (u > 95)::int * 12
        FROM unnest(%(gpus)s::bigint[]) AS g, unnest(%(hours)s::timestamptz[]) AS h,
             LATERAL (SELECT greatest(0, least(100, 60 + 35 * sin(extract(epoch FROM h) / 13751.0 + g)
                                                   + 5 * random())) AS u) AS x
        ON CONFLICT (gpu_id, bucket) DO NOTHING
        """,
        {"gpus": gpu_ids, "hours": hours},
    )
    sql(rollups.GROUP_SQL.format(res="1h"), {"first": hours[0], "last": hours[-1], "buckets": hours})
    return len(hours)


def refresh_states(gpu_ids: list[int], newest: datetime) -> None:
    """Each GPU's latest state from its newest sample (what the ingest writer keeps up to date)."""
    from fleet.telemetry.fields import METRIC_NAMES

    columns = ", ".join(("gpu_id", "ts", *METRIC_NAMES))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in ("ts", *METRIC_NAMES, "updated_at"))
    sql(
        f"""
        INSERT INTO fleet_gpustate ({columns}, updated_at)
        SELECT DISTINCT ON (gpu_id) {columns}, now() FROM fleet_gpusample
        WHERE ts >= %(since)s AND gpu_id = ANY(%(gpus)s)
        ORDER BY gpu_id, ts DESC
        ON CONFLICT (gpu_id) DO UPDATE SET {updates}
        """,
        {"since": newest - timedelta(minutes=2), "gpus": gpu_ids},
    )


def intact_until(gpu_ids: list[int], now: datetime) -> datetime | None:
    """The newest sample time when the loaded data covers the last 24 h (and 7 days of rollups)
    as this program loads it; None when it must be loaded again."""
    newest = sql("SELECT max(bucket) FROM fleet_grouprollup_1m WHERE scope = 'fleet' AND scope_id = 0")[0][0]
    if newest is None or newest < now - MAX_AGE_FOR_REUSE:
        return None
    since = now - timedelta(hours=RAW_HOURS)
    (count, first, last) = sql(
        "SELECT count(*), min(ts), max(ts) FROM fleet_gpusample WHERE ts >= %s AND gpu_id = ANY(%s)", [since, gpu_ids]
    )[0]
    if not count or first > since + INTERVAL or last < newest:
        return None
    expected = len(gpu_ids) * ((last - first) / INTERVAL + 1)
    states = sql("SELECT count(*) FROM fleet_gpustate WHERE gpu_id = ANY(%s)", [gpu_ids])[0][0]
    if sql("SELECT count(*) FROM fleet_gpu")[0][0] != len(gpu_ids):
        return None  # other GPUs in the inventory would change what the overview reads
    minutes = sql(
        "SELECT count(*) FROM fleet_grouprollup_1m WHERE scope = 'fleet' AND scope_id = 0 AND bucket >= %s", [since]
    )[0][0]
    hours = sql(
        "SELECT count(*) FROM fleet_grouprollup_1h WHERE scope = 'fleet' AND scope_id = 0 AND bucket >= %s",
        [now - timedelta(days=WEEK_DAYS)],
    )[0][0]
    if abs(count - expected) > 0.001 * expected or states != len(gpu_ids) or minutes < 1400 or hours < 160:
        return None
    return last


def prepare(fleet: dict[str, list[Any]], gpu_ids: dict[str, int], *, reload: bool) -> dict[str, float]:
    ids = sorted(gpu_ids.values())
    gen = SampleGenerator(fleet, gpu_ids)
    stats: dict[str, float] = {}
    now = datetime.now(UTC)
    newest = None if reload else intact_until(ids, now)
    started = time.perf_counter()
    if newest is None:
        log(f"loading {RAW_HOURS} h of raw samples for {len(ids)} GPUs at {INTERVAL.seconds} s (about a minute)…")
        wipe(ids)
        first = align(now) - timedelta(hours=RAW_HOURS) + INTERVAL
        stats["raw_rows_loaded"] = load_raw(gen, first, align(now) + INTERVAL)
        week_start = (first - timedelta(days=WEEK_DAYS - 1)).replace(minute=0, second=0)
        hours = synthesise_hours(ids, week_start, first.replace(minute=0, second=0))
        log(f"synthesised {hours} hours of 1 h rollups before the raw day ({len(ids) * hours:,} GPU-hours)")
        newest = align(now)
    else:
        log(f"reusing the loaded data (newest sample {newest:%H:%M:%S}; --reload to load afresh)")
    # Top up to the present (the load itself took minutes; a reuse may be hours later).
    while align(datetime.now(UTC)) > newest:
        target = align(datetime.now(UTC))
        log(f"topping up {newest:%H:%M:%S} → {target:%H:%M:%S}")
        stats["raw_rows_topped_up"] = stats.get("raw_rows_topped_up", 0) + load_raw(
            gen, newest + INTERVAL, target + INTERVAL
        )
        newest = target
    refresh_states(ids, newest)
    sql("ANALYZE fleet_gpusample, fleet_gpustate, fleet_grouprollup_1m, fleet_grouprollup_1h")
    stats["prepare_s"] = time.perf_counter() - started
    return stats


# --- timing ----------------------------------------------------------------------------------


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return (time.perf_counter() - started) * 1000, result


def time_overview(client: Any, range_key: str, requests: int) -> tuple[list[float], dict[str, Any]]:
    url = f"/api/v1/fleet/overview/?range={range_key}"
    for _ in range(2):
        client.get(url)
    times, body = [], {}
    for _ in range(requests):
        ms, response = timed(client.get, url)
        if response.status_code != 200:
            raise SystemExit(f"GET {url}: HTTP {response.status_code} {response.content[:300]!r}")
        times.append(ms)
        body = response.json()
    return times, body


def describe(body: dict[str, Any]) -> str:
    sites = body["series"]["sites"]
    points = [len(s["ts"]) for s in sites.values()]
    return (
        f"{len(body['gpus'])} GPU rows, {body['totals']['reporting']}/{body['totals']['gpus']} reporting, "
        f"{len(sites)} site series of {min(points, default=0)}-{max(points, default=0)} points "
        f"({body['series']['resolution']}), {len(json.dumps(body)) / 1024:.0f} KiB"
    )


def breakdown(requests: int) -> None:
    """Median ms of each part of the overview, called directly."""
    from fleet.telemetry.read import figures, fleet_summary, gpu_list

    parts = {
        "fleet_totals": lambda: figures.fleet_totals(),
        "site_rows (with health)": lambda: fleet_summary.site_rows(),
        "worst_gpus (50)": lambda: gpu_list.worst_gpus(),
        "table_page (50 rows)": lambda: gpu_list.table_page(gpu_list.TableQuery()),
        "site_series 1h (1m rollups)": lambda: figures.site_series(range_key="1h"),
        "site_series 24h (1m rollups)": lambda: figures.site_series(range_key="24h"),
        "site_series 7d (1h rollups)": lambda: figures.site_series(range_key="7d"),
    }
    log("overview parts, called directly (median ms):")
    for label, fn in parts.items():
        fn()
        log(f"    {statistics.median(timed(fn)[0] for _ in range(max(5, requests // 3))):8.1f}  {label}")
    snapshot = fleet_summary.overview_snapshot(range_key="24h")
    from rest_framework.renderers import JSONRenderer

    ms = statistics.median(timed(JSONRenderer().render, snapshot)[0] for _ in range(5))
    log(f"    {ms:8.1f}  JSON rendering of the 24h snapshot (DRF JSONRenderer)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reload", action="store_true", help="load the data afresh even if it is there")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per range (default 30)")
    parser.add_argument("--raw-runs", type=int, default=3, help="timed runs of the raw 24 h aggregate (default 3)")
    args = parser.parse_args()
    if args.requests < 20:
        parser.error("--requests must be at least 20")

    setup_django()
    sites, fleet = bench_fleet(1024)
    _, gpu_ids = ensure_inventory(sites, fleet)
    stats = prepare(fleet, gpu_ids, reload=args.reload)
    from fleet.telemetry.read import figures

    (samples,) = sql("SELECT count(*) FROM fleet_gpusample WHERE ts >= now() - interval '24 hours'")[0]
    log(f"data ready in {stats['prepare_s']:.0f} s: {samples:,} raw samples in the last 24 h")

    client = viewer_client()
    p95 = {}
    for range_key in RANGES:
        times, body = time_overview(client, range_key, args.requests)
        p95[range_key] = percentile(times, 95)
        log(
            f"overview range={range_key}: p50 {percentile(times, 50):.1f} ms, p95 {p95[range_key]:.1f} ms, "
            f"max {max(times):.1f} ms over {len(times)} requests; {describe(body)}"
        )
    breakdown(args.requests)

    log(f"raw 24 h aggregate (site_series_from_raw(seconds=86400)), {args.raw_runs} runs after one warm-up…")
    figures.site_series_from_raw(seconds=86400)
    raw_times = []
    for _ in range(args.raw_runs):
        ms, raw = timed(figures.site_series_from_raw, seconds=86400)
        raw_times.append(ms)
    raw_ms = statistics.median(raw_times)
    points = [len(s["ts"]) for s in raw["sites"].values()]
    log(
        f"raw 24 h: median {raw_ms:.0f} ms ({', '.join(f'{t:.0f}' for t in raw_times)}); "
        f"{len(points)} sites × {max(points)} points"
    )
    print(
        f"RESULT p95_ms_1h={p95['1h']:.1f} p95_ms_24h={p95['24h']:.1f} p95_ms_7d={p95['7d']:.1f} "
        f"raw_24h_ms={raw_ms:.0f} speedup_24h={raw_ms / p95['24h']:.1f} raw_samples_24h={samples}"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
