"""Per-minute and per-hour serving rollups per endpoint, kept current from a queue of dirty
buckets (fleet_servingrollupdirty), the way fleet.telemetry.rollups keeps the GPU rollups.

The serving writer marks each endpoint's minutes its points fall in (and, for a late batch, the
minute after, whose first increase starts from them). ``update_serving_rollups`` (a beat task,
every few seconds) claims them and recomputes each claimed minute from the raw cumulative series:

* counters and histogram parts: the per-series increase between consecutive samples, a decrease
  being a restart (``serving_metrics.counter_increase``, as Prometheus ``increase()``), credited to
  the minute of the later sample, in the quantity's unit;
* histogram buckets: summed over the label sets of a quantity per bound, then stored per bucket
  (non-cumulative, zero buckets left out), so a 30-day sum is a few rows per minute;
* gauges: each series' mean and maximum over the minute, summed over series (a mean for the
  KV-cache usage, a fraction);
* a quantity exposed under both its current and an older name counts once, under the current one;
* ``span_seconds``: the seconds the minute's increases cover, from the spacing of the endpoint's
  scrapes (each distinct scrape time of its counters and histograms, back to the one before it),
  so a rate is an increase over the time it took, whatever the scrape interval;
* Triton's failures per reason (``failures:REJECTED``, ...), beside requests_failed and
  requests_aborted.

Hours are the sums (means, maxima) of their minutes, recomputed once their minutes settle. Reads
(fleet.serving.slo) add hours and minutes; nothing on a page scans raw scrapes.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from fleet.serving import metrics as sm
from fleet.telemetry import partitions

logger = logging.getLogger(__name__)

LOOKBACK = timedelta(minutes=10)  # the previous sample of a series is looked for this far back
HOUR_SETTLE = timedelta(seconds=60)
MAX_MINUTES_PER_RUN = 5_000  # endpoint-minutes claimed in one transaction
MAX_RUN = 240  # minutes of one endpoint read from raw with one query
LOCK_KEY = 0x5E_12_1E_0  # advisory lock: one serving rollup run at a time across workers
# Gauges averaged (not summed) over the series of an endpoint: fractions, not counts.
MEAN_GAUGES = frozenset({"kv_cache_usage"})
SPAN = sm.SPAN_QUANTITY


def _minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def _hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def mark_dirty(endpoint_minutes: Iterable[tuple[int, datetime]], *, now: datetime | None = None) -> None:
    """Queue (endpoint, minute) pairs for the rollup, in the caller's transaction. A minute that is
    already over (a late batch) also queues the next one, up to the current minute: its first
    increase starts from here."""
    current = _minute(now or timezone.now())
    wanted: set[tuple[int, datetime]] = set()
    for endpoint_id, ts in endpoint_minutes:
        minute = _minute(ts)
        wanted.add((endpoint_id, minute))
        if minute + timedelta(minutes=1) <= current:
            wanted.add((endpoint_id, minute + timedelta(minutes=1)))
    if wanted:
        _mark("1m", sorted(wanted))


def _mark(resolution: str, pairs: list[tuple[int, datetime]]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_servingrollupdirty (endpoint_id, resolution, bucket, dirtied_at) "
            "SELECT e, %s, b, now() FROM unnest(%s::int8[], %s::timestamptz[]) AS t(e, b) "
            "ON CONFLICT (endpoint_id, resolution, bucket) DO NOTHING",
            [resolution, [e for e, _ in pairs], [b for _, b in pairs]],
        )


def _claim(resolution: str, *, limit: int, settled_before: datetime | None = None) -> list[tuple[int, datetime]]:
    """Take up to ``limit`` dirty buckets of one resolution off the queue, oldest first."""
    condition = "AND dirtied_at < %(settled)s" if settled_before else ""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM fleet_servingrollupdirty WHERE (endpoint_id, resolution, bucket) IN ("
            "  SELECT endpoint_id, resolution, bucket FROM fleet_servingrollupdirty"
            f"  WHERE resolution = %(res)s {condition} ORDER BY bucket LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
            ") RETURNING endpoint_id, bucket",
            {"res": resolution, "settled": settled_before, "limit": limit},
        )
        return sorted(cursor.fetchall(), key=lambda row: (row[0], row[1]))


@functools.lru_cache(maxsize=4096)
def _classify(metric: str, series: str) -> tuple[str, str, float, int, float] | None:
    """(quantity, kind, unit scale, legacy rank, le) of a stored series, or None when unused.
    ``kind`` is gauge, counter, bucket, sum or count."""
    found = sm._lookup(metric)
    if found is None:
        return None
    labels = sm.parse_series(series)
    spec, part = sm._refine(found[0], labels), found[1]
    if spec.kind != "histogram":
        return spec.quantity, spec.kind, spec.unit_scale, spec.legacy, 0.0
    if part == "bucket":
        bound = sm.bucket_bound(labels["le"]) if "le" in labels else None
        if bound is None:
            return None
        # The unit scale applies to the bound (Triton's milliseconds become seconds), never to the
        # bucket's count: a count of requests is a count in any unit.
        return spec.quantity, "bucket", 1.0, spec.legacy, bound * spec.unit_scale
    assert part is not None
    return spec.quantity, part, spec.unit_scale if part == "sum" else 1.0, spec.legacy, 0.0


@functools.lru_cache(maxsize=4096)
def _failure_reason(metric: str, series: str) -> str | None:
    return sm.failure_reason_quantity(metric, sm.parse_series(series))


HISTOGRAM_PARTS = frozenset({"bucket", "count", "sum"})
_LE_RE = re.compile(r'(?:^|,)le="(?:[^"\\]|\\.)*"')


@functools.lru_cache(maxsize=4096)
def _group(metric: str, series: str) -> tuple[str, str]:
    """The histogram a bucket, count or sum series belongs to: its base name and its labels but le."""
    base = metric
    for suffix in ("_bucket", "_count", "_sum"):
        if metric.endswith(suffix):
            base = metric.removesuffix(suffix)
            break
    return base, _LE_RE.sub("", series).lstrip(",")


def _histogram_resets(rows: list[tuple[str, str, datetime, float]]) -> dict[tuple[str, str], set[datetime]]:
    """The times each histogram restarted: any of its buckets or its count went down there (as
    ``serving_metrics.histogram_reset`` judges one scrape against the previous)."""
    resets: dict[tuple[str, str], set[datetime]] = defaultdict(set)
    previous_key, previous_value = None, None
    for metric, series, ts, value in rows:
        if not sm.readable(value):
            continue
        key = (metric, series)
        if key != previous_key:
            previous_key, previous_value = key, None
            info = _classify(metric, series)
            watched = info is not None and info[1] in ("bucket", "count")
        if watched and previous_value is not None and value < previous_value:
            resets[_group(metric, series)].add(ts)
        previous_value = value
    return resets


def _runs(minutes: list[datetime], gap: timedelta = LOOKBACK) -> list[list[datetime]]:
    """Split sorted minutes into runs read with one range query each (at most MAX_RUN minutes, so
    a backfill never holds days of raw rows in memory at once)."""
    runs: list[list[datetime]] = []
    for m in minutes:
        if runs and m - runs[-1][-1] <= gap and len(runs[-1]) < MAX_RUN:
            runs[-1].append(m)
        else:
            runs.append([m])
    return runs


def minute_rows(endpoint_id: int, minutes: list[datetime]) -> list[tuple[datetime, str, float, float]]:
    """The rollup rows (bucket, quantity, le, value) of these minutes of one endpoint, from raw."""
    out: list[tuple[datetime, str, float, float]] = []
    for run in _runs(minutes):
        out.extend(_run_rows(endpoint_id, run))
    return out


def _run_rows(endpoint_id: int, run: list[datetime]) -> list[tuple[datetime, str, float, float]]:
    wanted = set(run)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT metric, series, ts, value FROM fleet_servingsample "
            "WHERE endpoint_id = %s AND ts >= %s AND ts < %s ORDER BY metric, series, ts",
            [endpoint_id, run[0] - LOOKBACK, run[-1] + timedelta(minutes=1)],
        )
        rows = cursor.fetchall()
    # Per series: increases (counters, histogram parts) or values (gauges) by minute.
    legacy_seen: dict[tuple[datetime, str], set[int]] = defaultdict(set)  # per minute: a run may span an upgrade
    resets = _histogram_resets(rows)
    group: tuple[str, str] | None = None
    sums: dict[tuple[datetime, str, int, float], float] = defaultdict(float)
    gauge_stats: dict[tuple[datetime, str, int], list[float]] = {}  # minute, quantity, rank -> [sum means, sum max, n]
    previous_key: tuple[str, str] | None = None
    previous_value: float | None = None
    series_values: list[float] = []
    series_minute: datetime | None = None
    info: tuple[str, str, float, int, float] | None = None
    reason: str | None = None
    scrape_times: set[datetime] = set()  # of the series that have increases (not gauges)

    def flush_gauge() -> None:
        if info is None or series_minute is None or not series_values:
            return
        stats = gauge_stats.setdefault((series_minute, info[0], info[3]), [0.0, 0.0, 0.0])
        stats[0] += sum(series_values) / len(series_values) * info[2]
        stats[1] += max(series_values) * info[2]
        stats[2] += 1

    for metric, series, ts, value in rows:
        if not sm.readable(value):
            continue  # stored before the door refused such values: never added into a sum
        key = (metric, series)
        if key != previous_key:
            if info is not None and info[1] == "gauge":
                flush_gauge()
            previous_key, previous_value, series_values, series_minute = key, None, [], None
            info = _classify(metric, series)
            group = _group(metric, series) if info is not None and info[1] in HISTOGRAM_PARTS else None
            reason = _failure_reason(metric, series) if info is not None and info[1] == "counter" else None
        if info is None:
            continue
        minute = _minute(ts)
        quantity, kind, scale, rank, le = info
        if minute in wanted:
            legacy_seen[(minute, quantity)].add(rank)
        if kind != "gauge":
            scrape_times.add(ts)
        if kind == "gauge":
            if minute not in wanted:
                continue
            if minute != series_minute:
                flush_gauge()
                series_values, series_minute = [], minute
            series_values.append(value)
            continue
        if group is not None and previous_value is not None and ts in resets.get(group, ()):
            # The histogram restarted here: every part counts from zero, even one that grew.
            increase = value
        else:
            increase = sm.counter_increase(previous_value, value)
        previous_value = value
        # Bucket increases are kept even when zero: a bucket's bound is its neighbour's lower edge.
        if minute in wanted and (increase or kind == "bucket"):
            name = quantity if kind in ("counter", "bucket") else f"{quantity}:{kind}"
            sums[(minute, name, rank, le)] += increase * scale
            if reason is not None:
                sums[(minute, reason, 0, 0.0)] += increase
    if info is not None and info[1] == "gauge":
        flush_gauge()
    # The time each minute's increases cover: every scrape time in it, back to the scrape before
    # (the first scrape read has none: its increases are zero too).
    spans: dict[datetime, float] = defaultdict(float)
    for earlier, later in itertools.pairwise(sorted(scrape_times)):
        if _minute(later) in wanted:
            spans[_minute(later)] += (later - earlier).total_seconds()

    def current_rank(minute: datetime, quantity: str) -> int:
        return min(legacy_seen.get((minute, quantity.split(":", 1)[0]), {0}))

    out: list[tuple[datetime, str, float, float]] = []
    # Histogram buckets: cumulative per bound -> per bucket.
    cumulative: dict[tuple[datetime, str], dict[float, float]] = defaultdict(dict)
    for (minute, name, rank, le), value in sums.items():
        if rank != current_rank(minute, name):
            continue
        if _is_bucket(name):
            cumulative[(minute, name)][le] = value
        else:
            out.append((minute, name, 0.0, value))
    for (minute, name), per_le in cumulative.items():
        below, buckets = 0.0, []
        for le in sorted(per_le):
            buckets.append((le, per_le[le] - below))
            below = per_le[le]
        # Zero buckets are left out, except the one just below a counted bucket: it keeps that
        # bucket's lower bound, which interpolation needs.
        for i, (le, in_bucket) in enumerate(buckets):
            if in_bucket or (i + 1 < len(buckets) and buckets[i + 1][1]):
                out.append((minute, name, le, in_bucket))
    out.extend((minute, SPAN, 0.0, seconds) for minute, seconds in spans.items())
    for (minute, quantity, rank), (mean_sum, max_sum, n) in gauge_stats.items():
        if rank != current_rank(minute, quantity):
            continue
        if quantity in MEAN_GAUGES:
            mean_sum, max_sum = mean_sum / n, max_sum / n
        out.append((minute, quantity, 0.0, mean_sum))
        out.append((minute, f"{quantity}:max", 0.0, max_sum))
    return out


def _is_bucket(name: str) -> bool:
    return name in sm.HISTOGRAM_QUANTITIES


HOURS_SQL = """
INSERT INTO fleet_servingrollup_1h (endpoint_id, bucket, quantity, le, value)
SELECT endpoint_id, date_trunc('hour', bucket), quantity, le,
       CASE WHEN quantity LIKE '%%:max' THEN max(value)
            WHEN quantity = ANY(%(gauges)s) THEN avg(value)
            ELSE sum(value) END
FROM fleet_servingrollup_1m
WHERE endpoint_id = %(endpoint)s AND bucket >= %(first)s AND bucket < %(last)s + interval '1 hour'
  AND date_trunc('hour', bucket) = ANY(%(hours)s)
GROUP BY endpoint_id, date_trunc('hour', bucket), quantity, le
"""


def update_serving_rollups(
    *, now: datetime | None = None, limit: int = MAX_MINUTES_PER_RUN, settle: bool = True
) -> dict[str, object]:
    """Recompute claimed dirty minutes from raw, then settled dirty hours from minutes.

    Returns the counts done and the endpoints whose minutes changed (for live pushes). One
    transaction: if it fails the claims roll back and the buckets stay queued.
    """
    now = now or timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
            if not cursor.fetchone()[0]:
                return {"minutes": 0, "hours": 0, "endpoints": []}
        minutes = _within_retention(_claim("1m", limit=limit), partitions.SERVING_ROLLUP_1M, now)
        by_endpoint: dict[int, list[datetime]] = defaultdict(list)
        for endpoint_id, minute in minutes:
            by_endpoint[endpoint_id].append(minute)
        if by_endpoint:
            partitions.ensure_partitions_for(partitions.SERVING_ROLLUP_1M, [m for _, m in minutes])
            _write_minutes(by_endpoint)
            _mark("1h", sorted({(e, _hour(m)) for e, m in minutes}))
        hours = _within_retention(
            _claim("1h", limit=limit, settled_before=now - HOUR_SETTLE if settle else None),
            partitions.SERVING_ROLLUP_1H,
            now,
        )
        if hours:
            partitions.ensure_partitions_for(partitions.SERVING_ROLLUP_1H, [h for _, h in hours])
            _write_hours(hours)
    return {"minutes": len(minutes), "hours": len(hours), "endpoints": sorted(by_endpoint)}


def _write_minutes(by_endpoint: dict[int, list[datetime]]) -> None:
    with connection.cursor() as cursor:
        raw = cursor.cursor
        for endpoint_id, endpoint_minutes in by_endpoint.items():
            endpoint_minutes.sort()
            raw.execute(
                "DELETE FROM fleet_servingrollup_1m WHERE endpoint_id = %s AND bucket = ANY(%s)",
                [endpoint_id, endpoint_minutes],
            )
            rows = minute_rows(endpoint_id, endpoint_minutes)
            if not rows:
                continue
            with raw.copy(
                "COPY fleet_servingrollup_1m (endpoint_id, bucket, quantity, le, value) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["int8", "timestamptz", "text", "float8", "float8"])
                for bucket, quantity, le, value in rows:
                    copy.write_row((endpoint_id, bucket, quantity, le, value))


def _write_hours(hours: list[tuple[int, datetime]]) -> None:
    by_endpoint: dict[int, list[datetime]] = defaultdict(list)
    for endpoint_id, hour in hours:
        by_endpoint[endpoint_id].append(hour)
    gauges = list(sm.GAUGE_QUANTITIES)
    with connection.cursor() as cursor:
        for endpoint_id, endpoint_hours in by_endpoint.items():
            endpoint_hours.sort()
            cursor.execute(
                "DELETE FROM fleet_servingrollup_1h WHERE endpoint_id = %s AND bucket = ANY(%s)",
                [endpoint_id, endpoint_hours],
            )
            cursor.execute(
                HOURS_SQL,
                {
                    "endpoint": endpoint_id,
                    "first": endpoint_hours[0],
                    "last": endpoint_hours[-1],
                    "hours": endpoint_hours,
                    "gauges": gauges,
                },
            )


def _within_retention(
    pairs: list[tuple[int, datetime]], table: partitions.PartitionedTable, now: datetime
) -> list[tuple[int, datetime]]:
    """Buckets inside the table's retention and not in the future; the rest are dropped (logged)."""
    oldest, newest = now - table.retention, now + timedelta(days=1)
    kept = [(e, b) for e, b in pairs if oldest <= b <= newest]
    if len(kept) < len(pairs):
        logger.warning(
            "serving rollups: skipped %d bucket(s) outside retention or in the future", len(pairs) - len(kept)
        )
    return kept


def rollup_lag_seconds(*, now: datetime | None = None) -> float:
    """Age of the oldest serving minute waiting to be rolled up (0 when none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(bucket) FROM fleet_servingrollupdirty WHERE resolution = '1m'")
        oldest = cursor.fetchone()[0]
    if oldest is None:
        return 0.0
    return max(0.0, ((now or timezone.now()) - oldest).total_seconds() - 60)


def roll_everything(*, now: datetime | None = None) -> dict[str, int]:
    """Drain the whole queue now (tests, the simulator's backfill, benchmarks): every dirty minute,
    then every dirty hour, settled or not."""
    done = {"minutes": 0, "hours": 0}
    while True:
        result = update_serving_rollups(now=now)
        done["minutes"] += int(result["minutes"])  # type: ignore[call-overload]
        done["hours"] += int(result["hours"])  # type: ignore[call-overload]
        if not result["minutes"]:
            break
    while True:
        result = update_serving_rollups(now=now, settle=False)
        done["hours"] += int(result["hours"])  # type: ignore[call-overload]
        if not result["hours"]:
            return done
