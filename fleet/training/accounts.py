"""Materialised goodput accounts: each job's accounting (fleet.training.goodput), bucketed by hour
into JobAccount rows, so pages over days read a few thousand rows rather than every step.

``refresh_job_accounts`` runs every 15 s (fleet.tasks.refresh_training_accounts). It recomputes a
job from its whole event history rather than from a settled point, because nothing before ``now``
is settled for good: a restore from an older checkpoint, or a failure of a job that never
checkpointed, reclassifies hours accounted long ago (productive becomes lost). The pass is linear
(one indexed read of seven columns, a sweep in whole microseconds, an upsert of only the hours
that changed): about 0.1 s for 20,000 events, some 1 s for 300,000.

Which jobs: those with events since their last refresh (``accounts_dirty_at``), and those holding
GPUs, whose open allocation grows without events; a holding job with no new events is recomputed
at most once a minute (the time of its last refresh is kept in the cache).

Bounded work: a run takes the candidates oldest-refreshed first (never refreshed first) and stops
starting new jobs once REFRESH_BUDGET_S (5 s) have passed, so a run lasts at most the budget plus
one job's refresh, and the jobs it did not reach are the oldest, first in the next run. The lag
this implies: a job's hourly rows are at most one run interval (15 s) behind while all the due
jobs fit in the budget; beyond that, about ceil(work of all due jobs / 5 s) runs x 15 s.

A job whose refresh raises is logged with its id and skipped, the others go on; it is backed off
(1 min, doubling per consecutive failure, at most 1 h) rather than retried every run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from fleet.training.goodput import CATEGORIES, Account, from_us, raw_spans, to_us
from fleet.training.models import HOLDING_STATES, Job

HOUR_US = 3600 * 1_000_000
HOLDING_REFRESH_S = 60
REFRESH_BUDGET_S = 5.0
BACKOFF_MIN_S = 60
BACKOFF_MAX_S = 3600
_CACHE_KEY = "goodput:accounts:refreshed:{}"
_FAILED_KEY = "goodput:accounts:failed:{}"  # (consecutive failures, retry not before: epoch s)
# Refresh times are kept long enough to order the jobs (oldest first) across many runs.
_REFRESHED_TTL_S = 7 * 24 * 3600

log = logging.getLogger(__name__)
# A namespace for the per-job advisory lock, so two workers never refresh one job at once.
_LOCK_NAMESPACE = 0x6770  # "gp"

_VALUE_COLUMNS = [f"{c}_s" for c in CATEGORIES]
_ROW_COLUMNS = ["allocated_s", *_VALUE_COLUMNS, "steps", "tokens"]

# A job's events, only what the accounting reads; ts as whole microseconds since the epoch, so no
# datetime is built per row (extract(epoch) is numeric, exact to the microsecond).
_EVENTS_SQL = """
    SELECT kind, (extract(epoch FROM ts) * 1000000)::bigint, step, step_time_s, data_wait_s,
           duration_s, '', tokens
      FROM fleet_jobevent
     WHERE job_id = %s
     ORDER BY ts, seq
"""


_ROWS_SQL = """
    SELECT kind, (extract(epoch FROM ts) * 1000000)::bigint, step, step_time_s, data_wait_s,
           duration_s, '', tokens
      FROM fleet_jobevent
     WHERE job_id = %s AND ts > %s AND ts <= %s
     ORDER BY ts, seq
"""


def job_rows(job_id: int, *, after: datetime | None = None, until: datetime) -> list[Any]:
    """A job's events with after < ts <= until (all of them up to ``until`` without ``after``) as
    the sweep's tuples (goodput.Row; no reasons), in stored order: one range scan of the (job, ts,
    seq) index. The detectors price a fault's episode from these."""
    with connection.cursor() as cursor:
        cursor.execute(_ROWS_SQL, [job_id, after or from_us(0), until])
        return cursor.fetchall()


def refresh_job_accounts(
    job_ids: Iterable[int] | None = None,
    *,
    now: datetime | None = None,
    budget_s: float | None = REFRESH_BUDGET_S,
) -> int:
    """Recompute the hourly accounts of jobs that changed or still hold GPUs; return how many.

    Jobs go oldest-refreshed first; once budget_s seconds have passed no further job is started
    (at least one always is; None: no budget). With job_ids, refresh exactly those jobs, all of
    them (no budget; a backed-off job is tried anyway). Each job is refreshed in its own short
    transaction; one that raises is logged with its id, backed off and skipped.
    """
    now = now or timezone.now()
    started = time.monotonic()
    jobs = Job.objects.all()
    if job_ids is not None:
        jobs = jobs.filter(pk__in=list(job_ids))
    else:
        jobs = jobs.filter(Q(accounts_dirty_at__isnull=False) | Q(state__in=HOLDING_STATES))
    # accounts_dirty_at is read before the events, so a batch stored in between keeps the job dirty.
    candidates = list(jobs.values_list("pk", "gang_size", "accounts_dirty_at"))
    last = cache.get_many([_CACHE_KEY.format(row[0]) for row in candidates])
    failed = cache.get_many([_FAILED_KEY.format(row[0]) for row in candidates])
    if job_ids is None:
        candidates = _skip_recent(candidates, now, last)
        candidates = [
            row for row in candidates if failed.get(_FAILED_KEY.format(row[0]), (0, 0.0))[1] <= now.timestamp()
        ]
    candidates.sort(key=lambda row: (last.get(_CACHE_KEY.format(row[0]), float("-inf")), row[0]))
    refreshed = 0
    done: list[int] = []
    for job_id, gang_size, dirty_at in candidates:
        if done and budget_s is not None and job_ids is None and time.monotonic() - started >= budget_s:
            break
        done.append(job_id)
        try:
            ok = refresh_job(job_id, gang_size=gang_size, dirty_at=dirty_at, now=now)
        except Exception:
            # One job's bad data must not stop the others; back it off so it is not retried hot.
            count = failed.get(_FAILED_KEY.format(job_id), (0, 0.0))[0] + 1
            delay = min(BACKOFF_MIN_S * 2 ** (count - 1), BACKOFF_MAX_S)
            log.exception(
                "goodput accounts: refreshing job %s failed (%s in a row; next try in %s s)", job_id, count, delay
            )
            cache.set(_FAILED_KEY.format(job_id), (count, now.timestamp() + delay), timeout=BACKOFF_MAX_S * 2)
            continue
        if _FAILED_KEY.format(job_id) in failed:
            cache.delete(_FAILED_KEY.format(job_id))
        if ok:
            refreshed += 1
    if done:
        # Failed jobs count as refreshed for the order too, so they do not stay first in line.
        cache.set_many({_CACHE_KEY.format(job_id): now.timestamp() for job_id in done}, timeout=_REFRESHED_TTL_S)
    return refreshed


def _skip_recent(
    candidates: list[tuple[int, int, Any]], now: datetime, seen: dict[str, Any]
) -> list[tuple[int, int, Any]]:
    """Leave out clean holding jobs refreshed less than a minute ago."""
    horizon = now.timestamp() - HOLDING_REFRESH_S
    return [
        row for row in candidates if row[2] is not None or seen.get(_CACHE_KEY.format(row[0]), float("-inf")) <= horizon
    ]


def last_hours_window(now: datetime, hours: int) -> tuple[datetime, datetime]:
    """[start, end) of the last ``hours`` whole hours, the current (partial) hour included:
    start = floor_hour(now) - (hours - 1) h, end = floor_hour(now) + 1 h. Passed to accounts_between
    or accounts_by_hour it selects exactly ``hours`` hourly rows."""
    floor = now.replace(minute=0, second=0, microsecond=0)
    return floor - timedelta(hours=hours - 1), floor + timedelta(hours=1)


def refresh_job(job_id: int, *, gang_size: int, dirty_at: datetime | None, now: datetime) -> bool:
    """Recompute one job's hourly rows, write the hours that changed, and clear its dirty mark.

    Returns False when another worker holds the job (it is refreshing it now).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, job_id])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(_EVENTS_SQL, [job_id])
        rows = cursor.fetchall()
        wanted = hourly_rows(rows, gang_size=gang_size, now_us=to_us(now))
        cursor.execute(
            f"SELECT hour, {', '.join(_ROW_COLUMNS)} FROM fleet_jobaccount WHERE job_id = %s",
            [job_id],
        )
        stored = {to_us(row[0]): tuple(row[1:]) for row in cursor.fetchall()}
        gone = [from_us(hour) for hour in stored.keys() - wanted.keys()]
        changed = [(hour, values) for hour, values in wanted.items() if stored.get(hour) != values]
        if gone:
            cursor.execute("DELETE FROM fleet_jobaccount WHERE job_id = %s AND hour = ANY(%s)", [job_id, gone])
        if changed:
            columns = ", ".join(_ROW_COLUMNS)
            updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _ROW_COLUMNS)
            placeholders = ", ".join(["%s"] * (len(_ROW_COLUMNS) + 2))
            cursor.executemany(
                f"INSERT INTO fleet_jobaccount (job_id, hour, {columns}) VALUES ({placeholders}) "
                f"ON CONFLICT (job_id, hour) DO UPDATE SET {updates}",
                [(job_id, from_us(hour), *values) for hour, values in changed],
            )
        if dirty_at is not None:
            # Conditional: events stored since dirty_at was read set a newer value, which stays.
            cursor.execute(
                "UPDATE fleet_job SET accounts_dirty_at = NULL WHERE id = %s AND accounts_dirty_at = %s",
                [job_id, dirty_at],
            )
    return True


def hourly_rows(rows: list[Any], *, gang_size: int, now_us: int) -> dict[int, tuple[Any, ...]]:
    """JobAccount values per hour (microseconds since the epoch) from the sweep's rows:
    (allocated_s, <category>_s..., steps, tokens), allocated_s being the sum of the categories."""
    micros: dict[int, dict[str, int]] = {}
    bucket: dict[str, int] = {}
    bucket_end = -1
    for a, b, category in raw_spans(rows, now_us=now_us, merged=False):
        # Pieces come in time order: most fall inside the hour of the piece before them.
        while a < b:
            if a >= bucket_end or a < bucket_end - HOUR_US:
                hour = a - a % HOUR_US
                bucket = micros.get(hour) or micros.setdefault(hour, dict.fromkeys(CATEGORIES, 0))
                bucket_end = hour + HOUR_US
            cut = b if b <= bucket_end else bucket_end
            bucket[category] += cut - a
            a = cut
    steps: dict[int, list[int]] = {}
    for row in rows:
        if row[0] == "step":
            hour = row[1] - row[1] % HOUR_US
            counts = steps.setdefault(hour, [0, 0])
            counts[0] += 1
            counts[1] += row[7] or 0
    out: dict[int, tuple[Any, ...]] = {}
    for hour in micros.keys() | steps.keys():
        bucket = micros.get(hour) or dict.fromkeys(CATEGORIES, 0)
        values = [bucket[c] * gang_size / 1_000_000 for c in CATEGORIES]
        step_count, tokens = steps.get(hour, (0, 0))
        out[hour] = (sum(values), *values, step_count, tokens)
    return out


# --- reading ----------------------------------------------------------------------------------

_GROUPS = {None: "NULL", "job": "a.job_id", "team": "j.team", "site": "j.site_id", "cluster": "j.site_id, j.cluster"}


def accounts_between(start: datetime, end: datetime, *, group_by: str | None = None) -> dict[Any, Account]:
    """GPU-seconds per category over [start, end), summed per group, in one aggregate query.

    Hour-granular: an hour counts when it starts in [start, end) (no rounding: an unaligned start
    leaves out the hour it falls in). "The last N hours" is last_hours_window(now, N): N hours.
    group_by: None (one key, None, always present), "job" (job id), "team" (name), "site" (site id), "cluster"
    ((site id, cluster name)). Groups with no hours in the window are absent.
    """
    if group_by not in _GROUPS:
        raise ValueError(f"group_by must be one of {sorted(k for k in _GROUPS if k)} or None, not {group_by!r}")
    key_sql = _GROUPS[group_by]
    sums = ", ".join(f"SUM(a.{c})" for c in [*_VALUE_COLUMNS, "steps", "tokens"])
    group = f"GROUP BY {key_sql}" if group_by else ""
    sql = (
        f"SELECT {key_sql}, {sums} FROM fleet_jobaccount a JOIN fleet_job j ON j.id = a.job_id "
        f"WHERE a.hour >= %s AND a.hour < %s {group}"
    )
    width = 2 if group_by == "cluster" else 1
    out: dict[Any, Account] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [start, end])
        for row in cursor.fetchall():
            key = tuple(row[:width]) if width == 2 else row[0]
            values = row[width:]
            if values[0] is None:  # no rows at all: the ungrouped query still answers one row of NULLs
                break
            n = len(CATEGORIES)
            out[key] = Account.of(
                dict(zip(CATEGORIES, values[:n], strict=True)),
                steps=int(values[n] or 0),
                tokens=int(values[n + 1] or 0),
            )
    if group_by is None:
        out.setdefault(None, Account())
    return out


def accounts_by_hour(
    start: datetime,
    end: datetime,
    *,
    job_id: int | None = None,
    site_id: int | None = None,
    cluster: str | None = None,
    team: str | None = None,
) -> dict[datetime, Account]:
    """Accounts per hour over [start, end) for a job, a site (and cluster) or a team, or all jobs:
    the series of the stacked badput chart, in one aggregate query. Hours that start in [start, end),
    as accounts_between."""
    where = ["a.hour >= %s", "a.hour < %s"]
    params: list[Any] = [start, end]
    for column, value in (("a.job_id", job_id), ("j.site_id", site_id), ("j.cluster", cluster), ("j.team", team)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    sums = ", ".join(f"SUM(a.{c})" for c in [*_VALUE_COLUMNS, "steps", "tokens"])
    sql = (
        f"SELECT a.hour, {sums} FROM fleet_jobaccount a JOIN fleet_job j ON j.id = a.job_id "
        f"WHERE {' AND '.join(where)} GROUP BY a.hour ORDER BY a.hour"
    )
    n = len(CATEGORIES)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {
            row[0]: Account.of(
                dict(zip(CATEGORIES, row[1 : n + 1], strict=True)),
                steps=int(row[n + 1] or 0),
                tokens=int(row[n + 2] or 0),
            )
            for row in cursor.fetchall()
        }
