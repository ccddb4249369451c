"""What the hour rollups say per pool and UTC day, for the cost figures: idle energised GPU-hours
(under the power page's IDLE_UTIL_PCT mean utilisation, no job holding the GPU that hour), busy
GPU-hours (own or rent's utilisation) and the GPUs' summed mean power (an owned price's energy).

The whole days that have settled are kept in the cache, so a page over 90 days or a year reads
today's hours and the days it has not seen (see ``gpu_days``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.core.cache import cache
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from fleet.capacity.models import Pool
from fleet.choices import QueueScheduler
from fleet.power.read import IDLE_UTIL_PCT
from fleet.scheduler.models import SchedulerQueue, SchedulerRollup1m
from fleet.scheduler.read import GPU_RESOURCE

DAY = timedelta(days=1)


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def pool_keys() -> dict[tuple[int, str], int]:
    """(site id, GPU model) -> the pool that counts them."""
    return {(site, model): pk for pk, site, model in Pool.objects.values_list("pk", "site_id", "gpu_model")}


@dataclass
class DayFigures:
    """A pool's GPU-hours of one UTC day from the hour rollups: idle (under IDLE_UTIL_PCT, no job
    holding the GPU that hour), busy (at or over it), and the summed mean power of its GPU-hours."""

    idle: int = 0
    busy: int = 0
    power_sum: float = 0.0
    power_n: int = 0


# Aggregated per GPU and day first, then mapped to pools in Python: the rollups are read once in
# bucket order (a sequential read of the window's partitions), never a GPU at a time. The hours a
# job held a GPU come from the same accounts the training pages read (a job with allocated time
# that hour, through its GPUs): a hash anti-join.
_ROLLUP_DAYS_SQL = """
    WITH held AS (
        SELECT DISTINCT jg.gpu_id, a.hour
          FROM fleet_jobaccount a JOIN fleet_job_gpus jg ON jg.job_id = a.job_id
         WHERE a.hour >= %s AND a.hour < %s AND a.allocated_s > 0
    ), per_gpu AS (
        SELECT r.gpu_id, date_trunc('day', r.bucket AT TIME ZONE 'UTC') AS day,
               count(*) FILTER (WHERE r.util_mean < %s AND h.gpu_id IS NULL) AS idle,
               count(*) FILTER (WHERE r.util_mean >= %s) AS busy,
               coalesce(sum(r.power_mean), 0) AS power_sum, count(r.power_mean) AS power_n
          FROM fleet_gpurollup_1h r LEFT JOIN held h ON h.gpu_id = r.gpu_id AND h.hour = r.bucket
         WHERE r.bucket >= %s AND r.bucket < %s
         GROUP BY 1, 2
    )
    SELECT n.site_id, g.model, p.day, sum(p.idle), sum(p.busy), sum(p.power_sum), sum(p.power_n)
      FROM per_gpu p JOIN fleet_gpu g ON g.id = p.gpu_id AND g.parent_id IS NULL JOIN fleet_node n ON n.id = g.node_id
     GROUP BY 1, 2, 3
"""


# A UTC day's rollup figures are kept (in the cache) once the day is settled: SETTLE after its end
# its hour rollups and the accounts of the jobs on its GPUs no longer change but for late data,
# which shows once the kept figures expire (DAY_CACHE_S). A page over 90 days then reads today's
# hours only, as the scheduler's queue figures read a day's settled hours once.
SETTLE = timedelta(hours=2)
DAY_CACHE_S = 6 * 3600
_DAY_KEY = "cost:pool-day:{}"

# (site id, GPU model): a pool's key. Idle and busy GPU-hours, summed mean power, its count.
GpuDay = tuple[int, str, int, int, float, int]


def _read_gpu_days(start: datetime, end: datetime) -> dict[datetime, list[GpuDay]]:
    out: dict[datetime, list[GpuDay]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(_ROLLUP_DAYS_SQL, [start, end, IDLE_UTIL_PCT, IDLE_UTIL_PCT, start, end])
        for site_id, model, day, idle, busy, power_sum, power_n in cursor.fetchall():
            out[day.replace(tzinfo=UTC)].append((site_id, model, int(idle), int(busy), float(power_sum), int(power_n)))
    return out


def gpu_days(start: datetime, end: datetime, *, now: datetime | None = None) -> dict[datetime, list[GpuDay]]:
    """Per UTC day of [start, end), each site's and GPU model's idle and busy hours and summed power: settled whole
    days from the cache where kept, the rest read in one query per stretch of days not kept."""
    settled_before = (now or timezone.now()) - SETTLE
    day = midnight(start.date())
    whole: list[datetime] = []
    while day < end:
        if day >= start and day + DAY <= min(end, settled_before):
            whole.append(day)
        day += DAY
    kept = cache.get_many([_DAY_KEY.format(d.date().isoformat()) for d in whole])
    out: dict[datetime, list[GpuDay]] = {}
    for d in whole:
        rows = kept.get(_DAY_KEY.format(d.date().isoformat()))
        if rows is not None:
            out[d] = [tuple(r) for r in rows]  # type: ignore[misc]
    # Stretches to read: [start, end) less the kept days, as few contiguous ranges as they make.
    stretches: list[list[datetime]] = []
    cursor_at = start
    for d in sorted(out):
        if d > cursor_at:
            stretches.append([cursor_at, d])
        cursor_at = max(cursor_at, d + DAY)
    if cursor_at < end:
        stretches.append([cursor_at, end])
    fresh: dict[str, list[GpuDay]] = {}
    for a, b in stretches:
        read = _read_gpu_days(a, b)
        out.update(read)
        for d in whole:
            if a <= d and d + DAY <= b:
                fresh[_DAY_KEY.format(d.date().isoformat())] = read.get(d, [])
    if fresh:
        cache.set_many(fresh, timeout=DAY_CACHE_S)
    return out


def rollup_days(start: datetime, end: datetime) -> dict[tuple[int, datetime], DayFigures]:
    """(pool id, UTC day) -> its DayFigures over [start, end): an hour under IDLE_UTIL_PCT mean
    utilisation is idle, the power page's rule (a reporting GPU is energised)."""
    keys = pool_keys()
    out: dict[tuple[int, datetime], DayFigures] = {}
    for day, rows in gpu_days(start, end).items():
        for site_id, model, idle, busy, power_sum, power_n in rows:
            pool = keys.get((site_id, model))
            if pool is None:
                continue
            f = out.setdefault((pool, day), DayFigures())
            f.idle += idle
            f.busy += busy
            f.power_sum += power_sum
            f.power_n += power_n
    return out


def scheduler_gpu_hours(keys: set[tuple[str, int]], start: datetime, end: datetime) -> dict[tuple[str, int], Decimal]:
    """(team, pool) -> the GPU-hours Kueue admitted on the team's ClusterQueues mapped to the pool
    in [start, end): each minute's last ``resource_usage`` of ``nvidia.com/gpu`` / 60. Empty where
    no such queue reports (the scheduler is optional)."""
    if not keys:
        return {}
    queues = {
        pk: (team, pool)
        for pk, pool, team in SchedulerQueue.objects.filter(
            scheduler=QueueScheduler.KUEUE,
            pool_id__in={pool for _, pool in keys},
            team__name__in={team for team, _ in keys},
        ).values_list("pk", "pool_id", "team__name")
        if (team, pool) in keys
    }
    if not queues:
        return {}
    rows = (
        SchedulerRollup1m.objects.filter(
            queue_id__in=queues,
            quantity="resource_usage",
            series__contains=GPU_RESOURCE,
            bucket__gte=start,
            bucket__lt=end,
        )
        .values("queue_id")
        .annotate(total=Sum("last"))
        .order_by()
    )
    out: dict[tuple[str, int], Decimal] = defaultdict(Decimal)
    for row in rows:
        out[queues[row["queue_id"]]] += Decimal(str(row["total"] or 0)) / 60
    return dict(out)
