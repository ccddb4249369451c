"""1-minute and 1-hour rollups per GPU and per node, rack, site and fleet, kept current from a
queue of dirty buckets (fleet_rollupdirty).

Ingest marks the minutes its samples fall in; ``update_rollups`` (a beat task, every few
seconds) claims them, recomputes each claimed minute from the raw samples (so late samples are
folded in by recomputing, never by adding), then the group rollups from the per-GPU ones, and
marks the hours. Hours are recomputed from the minutes at most once a minute each.
Dashboards read these tables, never raw samples over long ranges.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from fleet.telemetry import partitions

logger = logging.getLogger(__name__)

# Clock-event bits that mean "slowed by a power or thermal limit": SW power cap, HW slowdown,
# SW thermal, HW thermal, HW power brake.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
HOUR_SETTLE = timedelta(seconds=60)
LOCK_KEY = 0x60_0D_9C_7  # advisory lock: one rollup run at a time across workers

GPU_COLUMNS = (
    "samples, util_mean, util_max, temp_mean, temp_max, power_mean, power_max, energy_j, "
    "xid_max, error_samples, throttled_samples"
)
GROUP_COLUMNS = (
    "gpus, util_mean, util_max, temp_mean, temp_max, power_mean, power_sum, energy_j, error_gpus, throttled_gpus"
)


def _excluded(columns: str) -> str:
    return ", ".join(f"{c.strip()} = EXCLUDED.{c.strip()}" for c in columns.split(","))


GPU_MINUTES_SQL = f"""
WITH m AS (
    SELECT gpu_id, date_trunc('minute', ts) AS bucket, count(*) AS n,
           avg(gpu_util) AS util_mean, max(gpu_util) AS util_max, avg(gpu_temp_c) AS temp_mean,
           max(gpu_temp_c) AS temp_max, avg(power_w) AS power_mean, max(power_w) AS power_max,
           max(xid) AS xid_max, count(*) FILTER (WHERE xid > 0 OR ecc_dbe_total > 0) AS errors,
           count(*) FILTER (WHERE throttle_reasons & {THROTTLE_MASK} > 0) AS bit_throttled,
           count(throttle_reasons) AS with_bits,
           min(thermal_violation_us) AS tv_min, max(thermal_violation_us) AS tv_max,
           min(power_violation_us) AS pv_min, max(power_violation_us) AS pv_max
    FROM fleet_gpusample
    WHERE ts >= %(first)s AND ts < %(last)s + interval '1 minute'
      AND date_trunc('minute', ts) = ANY(%(buckets)s)
    GROUP BY gpu_id, date_trunc('minute', ts)
)
INSERT INTO fleet_gpurollup_1m (gpu_id, bucket, {GPU_COLUMNS})
SELECT m.gpu_id, m.bucket, m.n, m.util_mean, m.util_max, m.temp_mean, m.temp_max, m.power_mean,
       m.power_max, m.power_mean * 60, m.xid_max, m.errors,
       -- No bitmask exported (older dcgm-exporter set-ups): a violation counter that rose since
       -- the previous sample, in this minute or from the last one before it, means throttled.
       CASE WHEN m.with_bits = 0
                 AND (m.tv_max > coalesce(prev.tv, m.tv_min) OR m.pv_max > coalesce(prev.pv, m.pv_min))
            THEN m.n ELSE m.bit_throttled END
FROM m
LEFT JOIN LATERAL (
    -- Only for GPUs without the bitmask that export a counter: one index probe each.
    SELECT p.thermal_violation_us AS tv, p.power_violation_us AS pv
    FROM fleet_gpusample p
    WHERE m.with_bits = 0 AND (m.tv_max IS NOT NULL OR m.pv_max IS NOT NULL)
      AND p.gpu_id = m.gpu_id AND p.ts < m.bucket AND p.ts >= m.bucket - interval '5 minutes'
    ORDER BY p.ts DESC LIMIT 1
) prev ON true
ON CONFLICT (gpu_id, bucket) DO UPDATE SET {_excluded(GPU_COLUMNS)}
"""

GPU_HOURS_SQL = f"""
INSERT INTO fleet_gpurollup_1h (gpu_id, bucket, {GPU_COLUMNS})
SELECT gpu_id, date_trunc('hour', bucket) AS hour, sum(samples),
       sum(util_mean * samples) / nullif(sum(samples) FILTER (WHERE util_mean IS NOT NULL), 0), max(util_max),
       sum(temp_mean * samples) / nullif(sum(samples) FILTER (WHERE temp_mean IS NOT NULL), 0), max(temp_max),
       sum(power_mean * samples) / nullif(sum(samples) FILTER (WHERE power_mean IS NOT NULL), 0), max(power_max),
       sum(energy_j), max(xid_max), sum(error_samples), sum(throttled_samples)
FROM fleet_gpurollup_1m
WHERE bucket >= %(first)s AND bucket < %(last)s + interval '1 hour'
  AND date_trunc('hour', bucket) = ANY(%(buckets)s)
GROUP BY gpu_id, date_trunc('hour', bucket)
ON CONFLICT (gpu_id, bucket) DO UPDATE SET {_excluded(GPU_COLUMNS)}
"""

# One pass groups the per-GPU rows by node, rack, site and the whole fleet (GROUPING SETS).
GROUP_SQL = f"""
INSERT INTO fleet_grouprollup_{{res}} (scope, scope_id, bucket, {GROUP_COLUMNS})
SELECT CASE WHEN grouping(n.id) = 0 THEN 'node' WHEN grouping(n.rack_id) = 0 THEN 'rack'
            WHEN grouping(n.site_id) = 0 THEN 'site' ELSE 'fleet' END,
       coalesce(n.id, n.rack_id, n.site_id, 0), r.bucket, count(*),
       avg(r.util_mean), max(r.util_max), avg(r.temp_mean), max(r.temp_max), avg(r.power_mean),
       sum(r.power_mean), sum(r.energy_j),
       count(*) FILTER (WHERE r.error_samples > 0), count(*) FILTER (WHERE r.throttled_samples > 0)
FROM fleet_gpurollup_{{res}} r
JOIN fleet_gpu g ON g.id = r.gpu_id AND g.parent_id IS NULL  -- a MIG instance is part of its GPU
JOIN fleet_node n ON n.id = g.node_id
WHERE r.bucket >= %(first)s AND r.bucket <= %(last)s AND r.bucket = ANY(%(buckets)s)
GROUP BY r.bucket, GROUPING SETS ((n.id), (n.rack_id), (n.site_id), ())
HAVING NOT (grouping(n.rack_id) = 0 AND n.rack_id IS NULL)
ON CONFLICT (scope, scope_id, bucket) DO UPDATE SET {_excluded(GROUP_COLUMNS)}
"""


def _claim(resolution: str, *, settled_before: datetime | None = None) -> list[datetime]:
    """Take the dirty buckets of one resolution off the queue (in the caller's transaction)."""
    condition = "AND dirtied_at < %s" if settled_before else ""
    params: list[object] = [resolution] + ([settled_before] if settled_before else [])
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM fleet_rollupdirty WHERE resolution = %s {condition} RETURNING bucket", params)
        return sorted(row[0] for row in cursor.fetchall())


def _mark(resolution: str, buckets: list[datetime]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_rollupdirty (resolution, bucket, dirtied_at) "
            "SELECT %s, b, now() FROM unnest(%s::timestamptz[]) AS b ON CONFLICT (resolution, bucket) DO NOTHING",
            [resolution, buckets],
        )


def _within_retention(
    buckets: list[datetime], table: partitions.PartitionedTable, now: datetime, resolution: str
) -> list[datetime]:
    """The buckets worth rolling: within the rollup table's retention and not in the future.

    A bucket outside (a sample from 1970 or 2100 that got past a door) would only make partitions
    that retention drops again, one per day in between, inside this transaction. It is dropped
    from the queue and logged instead.
    """
    oldest, newest = now - table.retention, now + timedelta(days=1)
    kept = [b for b in buckets if oldest <= b <= newest]
    if len(kept) < len(buckets):
        outside = sorted(set(buckets) - set(kept))
        logger.warning(
            "rollups: skipped %d %s bucket(s) outside retention or in the future (%s .. %s)",
            len(outside),
            resolution,
            outside[0].isoformat(),
            outside[-1].isoformat(),
        )
    return kept


def _roll(
    buckets: list[datetime],
    *,
    gpu_sql: str,
    resolution: str,
    table_gpu: partitions.PartitionedTable,
    table_group: partitions.PartitionedTable,
) -> None:
    # Only the partitions of the buckets' own days or months, never every one in between.
    partitions.ensure_partitions_for(table_gpu, buckets)
    partitions.ensure_partitions_for(table_group, buckets)
    params = {"first": buckets[0], "last": buckets[-1], "buckets": buckets}
    with connection.cursor() as cursor:
        cursor.execute(gpu_sql, params)
        cursor.execute(GROUP_SQL.format(res=resolution), params)


def update_rollups(*, now: datetime | None = None) -> dict[str, int]:
    """Recompute every dirty minute, then every settled dirty hour. Returns the counts done.

    1. Claim dirty minutes and roll them (per GPU, then per node/rack/site/fleet) in one
       transaction: if it fails, the claim rolls back and the minutes stay queued.
    2. Mark their hours dirty; roll the hours that have not been dirtied for a minute.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
            if not cursor.fetchone()[0]:
                return {"minutes": 0, "hours": 0}  # another worker is rolling up right now
        now = now or timezone.now()
        minutes = _within_retention(_claim("1m"), partitions.GPU_ROLLUP_1M, now, "1m")
        if minutes:
            _roll(
                minutes,
                gpu_sql=GPU_MINUTES_SQL,
                resolution="1m",
                table_gpu=partitions.GPU_ROLLUP_1M,
                table_group=partitions.GROUP_ROLLUP_1M,
            )
            _mark("1h", sorted({m.replace(minute=0) for m in minutes}))
        settled = now - HOUR_SETTLE
        hours = _within_retention(_claim("1h", settled_before=settled), partitions.GPU_ROLLUP_1H, now, "1h")
        if hours:
            _roll(
                hours,
                gpu_sql=GPU_HOURS_SQL,
                resolution="1h",
                table_gpu=partitions.GPU_ROLLUP_1H,
                table_group=partitions.GROUP_ROLLUP_1H,
            )
    if minutes or hours:
        logger.debug("rolled up %d minute(s) and %d hour(s)", len(minutes), len(hours))
    return {"minutes": len(minutes), "hours": len(hours)}


def rollup_lag_seconds(*, now: datetime | None = None) -> float:
    """Age of the oldest minute waiting to be rolled up (0 when none): the rollups' freshness."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(bucket) FROM fleet_rollupdirty WHERE resolution = '1m'")
        oldest = cursor.fetchone()[0]
    if oldest is None:
        return 0.0
    return max(0.0, ((now or timezone.now()) - oldest).total_seconds() - 60)
