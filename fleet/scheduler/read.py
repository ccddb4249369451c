"""Reads of the scheduler series, and the scheduler's side of the capacity page (its queue panel,
the plan API's ``queues`` part, the ``scheduler`` live topic). Admission wait percentiles come from Kueue's
``kueue_admission_wait_time_seconds`` histogram: the buckets' increases over the window, resets
counted as Prometheus ``increase()`` counts them, then ``histogram_quantile`` as Prometheus computes
it (fleet.telemetry.histograms, the one implementation the serving room uses too)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from fleet.capacity.models import Pool, Reservation, Team
from fleet.choices import TEAM_ONLY_KINDS
from fleet.scheduler import drift
from fleet.scheduler.models import SchedulerQueue, SchedulerRollup1m
from fleet.scheduler.store import TOPIC
from fleet.telemetry.histograms import EMPTY_HISTOGRAM, Histogram, bucket_bound, histogram_quantile, parse_series

WAIT_BUCKET = "admission_wait_bucket"
# The windows the capacity page reads admission waits over.
WAIT_WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24)}


@dataclass(frozen=True)
class AdmissionWait:
    """A ClusterQueue's admission wait over a window: p50 and p95 in seconds (None without
    admissions), and the admissions the histogram counted."""

    p50: float | None
    p95: float | None
    admissions: float


def wait_histogram(increases: Iterable[tuple[str, float]]) -> Histogram:
    """One histogram from (series text, bucket increase) pairs: each ``le`` series of one label
    set (a priority class) is a cumulative bucket; label sets are added bucket by bucket, as
    ``sum by (le)`` adds them before ``histogram_quantile``."""
    per_set: dict[str, dict[float, float]] = {}
    for series, increase in increases:
        labels = parse_series(series)
        bound = bucket_bound(labels.pop("le", ""))
        if bound is None:
            continue  # the door refuses these; kept out rather than guessed at
        rest = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        buckets = per_set.setdefault(rest, {})
        buckets[bound] = buckets.get(bound, 0.0) + increase
    merged = EMPTY_HISTOGRAM
    for buckets in per_set.values():
        merged = merged + Histogram.from_buckets(buckets)
    return merged


def admission_wait(histogram: Histogram) -> AdmissionWait:
    """p50 and p95 of one window's histogram."""
    admissions = histogram.total if histogram.bounds and histogram.bounds[-1] == math.inf else 0.0
    return AdmissionWait(histogram_quantile(0.5, histogram), histogram_quantile(0.95, histogram), admissions)


def admission_waits(
    queue_ids: Iterable[int], *, window: timedelta, now: datetime | None = None
) -> Mapping[int, AdmissionWait]:
    """p50/p95 admission wait per ClusterQueue over the ``window`` of whole minutes ending with the
    current one (the 1-minute rollups' increases added up: the exact sum of the increases between
    consecutive scrapes, with no extrapolation to the window's edges). Queues without admissions
    in the window are left out."""
    end = (now or timezone.now()).replace(second=0, microsecond=0)
    start = end - window + timedelta(minutes=1)
    rows = (
        SchedulerRollup1m.objects.filter(
            queue_id__in=list(queue_ids), quantity=WAIT_BUCKET, bucket__gte=start, bucket__lte=end
        )
        .values("queue_id", "series")
        .annotate(increase=Sum("increase"))
        .order_by()
    )
    per_queue: dict[int, list[tuple[str, float]]] = {}
    for row in rows:
        per_queue.setdefault(row["queue_id"], []).append((row["series"], row["increase"] or 0.0))
    waits = {queue_id: admission_wait(wait_histogram(pairs)) for queue_id, pairs in per_queue.items()}
    return {queue_id: wait for queue_id, wait in waits.items() if wait.admissions > 0}


# --- the capacity page's queue figures --------------------------------------------------------------

GPU_RESOURCE = 'resource="nvidia.com/gpu"'
# A gauge is read from its newest minute within this many minutes; an older one is the scheduler
# gone quiet, shown as unknown rather than as a stale figure.
GAUGE_FRESH = timedelta(minutes=10)
# The gauges the panel reads, and for each the series it keeps (None: every series of it).
_GAUGES: dict[str, tuple[str, ...] | None] = {
    "pending_workloads": ('status="active"', 'status="inadmissible"'),
    "admitted_active_workloads": ("",),  # Kueue, read for a team's LocalQueues
    "jobs": ('state="pending"', 'state="running"'),  # Slurm, per partition or account
    "resource_usage": None,  # the GPU series are picked below: the flavor is part of the text
    "gpus": ('state="alloc"',),  # Slurm, the cluster's own series
    "nodes": ('state="drain"', 'state="down"'),  # Slurm, the cluster's own series
}
_EVENT_COUNTERS = ("evicted_workloads", "preempted_workloads")


def _latest_gauges(queue_ids: list[int], now: datetime) -> dict[int, dict[tuple[str, str], float]]:
    """queue id -> (quantity, series) -> the newest minute's last value within GAUGE_FRESH: one
    statement, DISTINCT ON over the rollup's primary key (queue, series, quantity, bucket)."""
    end = now.replace(second=0, microsecond=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT ON (queue_id, series, quantity) queue_id, series, quantity, last"
            " FROM fleet_schedulerrollup_1m"
            " WHERE queue_id = ANY(%s) AND quantity = ANY(%s) AND bucket > %s AND bucket <= %s"
            " ORDER BY queue_id, series, quantity, bucket DESC",
            [queue_ids, list(_GAUGES), end - GAUGE_FRESH, end],
        )
        out: dict[int, dict[tuple[str, str], float]] = {}
        for queue_id, series, quantity, last in cursor.fetchall():
            kept = _GAUGES[quantity]
            if (kept is None and GPU_RESOURCE in series) or (kept is not None and series in kept):
                out.setdefault(queue_id, {})[(quantity, series)] = last
        return out


# A clock hour is summed into SchedulerCounterHour once it has been over this long: a scrape that
# lands later than this in a summed hour makes the writer drop the hour, to be summed again.
HOUR_SETTLES = timedelta(minutes=5)
# The counters the capacity page reads over a day, by hour.
HOURLY_COUNTERS = (WAIT_BUCKET, *_EVENT_COUNTERS)
# Summed hours kept: the longest window read, and a day to spare.
HOURS_KEPT = timedelta(hours=48)


@dataclass(frozen=True)
class CounterWindows:
    """Counter increases per queue, quantity and series over two windows ending with the current
    minute: ``last_hour``, the last 60 whole minutes, and ``hours``, the clock hours asked for (the
    current hour so far and the whole ones before it, as the training overview's "24h" reads)."""

    last_hour: dict[int, dict[tuple[str, str], float]]
    hours: dict[int, dict[tuple[str, str], float]]


def counter_windows(
    queue_ids: list[int], *, quantities: Iterable[str] = HOURLY_COUNTERS, hours: int = 24, now: datetime | None = None
) -> CounterWindows:
    """The increases of these counters over the last hour and the last ``hours`` clock hours, resets
    counted as Prometheus ``increase()`` counts them (the 1-minute rollups' increases added up).

    1. Sum the settled hours of the window not summed yet into SchedulerCounterHour (none, once
       the page has been read in the hour; one statement an hour otherwise).
    2. Add up the summed hours: about 23 rows a series for a day.
    3. Add up the minutes after the last summed hour and the last 60 minutes in one pass over the
       1-minute rollups (at most 65 minutes of them).
    """
    quantities = list(quantities)
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0)
    current = end.replace(minute=0)
    first_hour = current - timedelta(hours=hours - 1)
    last_summed = current - timedelta(hours=1 if now - current >= HOUR_SETTLES else 2)
    summed = [first_hour + timedelta(hours=k) for k in range(int((last_summed - first_hour) / timedelta(hours=1)) + 1)]
    tail_from = max(first_hour, last_summed + timedelta(hours=1))
    last_hour_from = end - timedelta(minutes=59)
    out = CounterWindows({}, {})
    if not queue_ids:
        return out
    with connection.cursor() as cursor:
        if summed:
            _sum_hours(cursor, queue_ids, quantities, summed)
            cursor.execute(
                "SELECT queue_id, quantity, series, sum(increase) FROM fleet_schedulercounterhour"
                " WHERE queue_id = ANY(%s) AND hour >= %s AND hour <= %s AND quantity = ANY(%s)"
                " GROUP BY queue_id, quantity, series",
                [queue_ids, summed[0], summed[-1], quantities],
            )
            for queue_id, quantity, series, increase in cursor.fetchall():
                out.hours.setdefault(queue_id, {})[(quantity, series)] = increase
        cursor.execute(
            "SELECT queue_id, quantity, series,"
            " sum(increase) FILTER (WHERE bucket >= %s), sum(increase) FILTER (WHERE bucket >= %s)"
            " FROM fleet_schedulerrollup_1m"
            " WHERE queue_id = ANY(%s) AND quantity = ANY(%s) AND bucket >= %s AND bucket <= %s"
            " GROUP BY queue_id, quantity, series",
            [last_hour_from, tail_from, queue_ids, quantities, min(last_hour_from, tail_from), end],
        )
        for queue_id, quantity, series, last_hour, tail in cursor.fetchall():
            if last_hour is not None:
                out.last_hour.setdefault(queue_id, {})[(quantity, series)] = last_hour
            if tail is not None:
                per_queue = out.hours.setdefault(queue_id, {})
                per_queue[(quantity, series)] = per_queue.get((quantity, series), 0.0) + tail
    return out


def _sum_hours(cursor: Any, queue_ids: list[int], quantities: list[str], hours: list[datetime]) -> None:
    """Sum each (queue, hour) not summed yet from the 1-minute rollups, with its marker row."""
    cursor.execute(
        "SELECT queue_id, hour FROM fleet_schedulercounterhour"
        " WHERE queue_id = ANY(%s) AND hour >= %s AND hour <= %s AND quantity = ''",
        [queue_ids, hours[0], hours[-1]],
    )
    done = set(cursor.fetchall())
    # Hours missing the same queues are summed in one statement (a first read: all 23 of them).
    missing: dict[tuple[int, ...], list[datetime]] = {}
    for hour in hours:
        queues = tuple(q for q in queue_ids if (q, hour) not in done)
        if queues:
            missing.setdefault(queues, []).append(hour)
    if not missing:
        return
    with transaction.atomic():
        for queues, at in missing.items():
            cursor.execute(
                "INSERT INTO fleet_schedulercounterhour (queue_id, hour, quantity, series, increase)"
                " SELECT queue_id, date_trunc('hour', bucket, 'UTC'), quantity, series, coalesce(sum(increase), 0)"
                " FROM fleet_schedulerrollup_1m"
                " WHERE queue_id = ANY(%s) AND quantity = ANY(%s) AND bucket >= %s AND bucket < %s"
                " AND date_trunc('hour', bucket, 'UTC') = ANY(%s)"
                " GROUP BY queue_id, date_trunc('hour', bucket, 'UTC'), quantity, series"
                " UNION ALL SELECT q, h, '', '', 0"
                " FROM unnest(%s::int8[]) AS q CROSS JOIN unnest(%s::timestamptz[]) AS h"
                " ON CONFLICT (queue_id, hour, quantity, series) DO UPDATE SET increase = EXCLUDED.increase",
                [list(queues), quantities, at[0], at[-1] + timedelta(hours=1), at, list(queues), at],
            )
        cursor.execute(
            "DELETE FROM fleet_schedulercounterhour WHERE queue_id = ANY(%s) AND hour < %s",
            [queue_ids, hours[-1] - HOURS_KEPT],
        )


def _events(increases: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
    """counter -> reason -> increase, of a queue's evictions and preemptions."""
    out: dict[str, dict[str, float]] = {}
    for (quantity, series), increase in increases.items():
        if quantity in _EVENT_COUNTERS:
            reason = parse_series(series).get("reason", "")
            per_reason = out.setdefault(quantity, {})
            per_reason[reason] = per_reason.get(reason, 0.0) + (increase or 0.0)
    return out


def _window_wait(increases: Mapping[tuple[str, str], float]) -> dict[str, float | None] | None:
    """A queue's admission wait from its bucket increases over a window; None without admissions."""
    wait = admission_wait(
        wait_histogram((series, v or 0.0) for (q, series), v in increases.items() if q == WAIT_BUCKET)
    )
    return _wait(wait) if wait.admissions > 0 else None


def _wait(wait: AdmissionWait | None) -> dict[str, float | None] | None:
    if wait is None:
        return None
    return {"p50": wait.p50, "p95": wait.p95, "admissions": wait.admissions}


def pool_queues(
    pool_ids: Iterable[int] | None = None, *, hours: int = 24, now: datetime | None = None
) -> dict[int, dict[str, Any]]:
    """Per capacity pool (those asked, or every pool with a mapped queue), the scheduler's side of
    it, for the capacity page and its API:

    - ``queues``: each mapped queue with its pending workloads now (Kueue's active and inadmissible;
      a Slurm partition's pending jobs as active), p50/p95 admission wait over the last hour and
      over ``hours`` clock hours (``counter_windows``; the histogram read as ``admission_waits``
      reads it), its evictions and the preemptions it caused over those hours, and the GPUs it
      holds (Kueue's resource usage of ``nvidia.com/gpu`` over its flavors);
    - ``teams``: evictions (the evicted queue's team) and preemptions (the preempting queue's team)
      over those hours, with the reasons;
    - ``gpus_allocated`` (the scheduler's, summed over the pool's queues, Slurm's allocated GPUs
      included; None when no queue reports one) against ``gpus_reserved`` (the console's approved
      and active reservations holding the pool now, every tier);
    - ``nodes_drained`` / ``nodes_down`` (Slurm's, None without a Slurm cluster mapped to the pool).

    Six statements whatever the number of queues (seven in an hour's first read): the queues, the
    newest gauges, the counters' summed hours and recent minutes, and the reservations."""
    now = now or timezone.now()
    pool_ids = None if pool_ids is None else list(pool_ids)
    queues = SchedulerQueue.objects.filter(pool__isnull=False).select_related("team").order_by("pool_id", "name")
    if pool_ids is not None:
        queues = queues.filter(pool_id__in=list(pool_ids))
    queues = list(queues)
    out: dict[int, dict[str, Any]] = {
        pk: _empty_pool(pk, hours) for pk in (pool_ids if pool_ids is not None else {q.pool_id for q in queues})
    }
    if not out:
        return out
    ids = [q.pk for q in queues]
    gauges = _latest_gauges(ids, now) if ids else {}
    windows = counter_windows(ids, hours=hours, now=now)
    for pool_id, gpus in (
        Reservation.objects.committed()
        .filter(pool_id__in=list(out), start__lte=now, end__gt=now)
        .values("pool_id")
        .annotate(gpus=Sum("gpus"))
        .values_list("pool_id", "gpus")
        .order_by()
    ):
        out[pool_id]["gpus_reserved"] = gpus or 0
    for queue in queues:
        pool = out[queue.pool_id]
        latest = gauges.get(queue.pk, {})
        day = windows.hours.get(queue.pk, {})
        counters = _events(day)
        usage = [v for (quantity, _), v in latest.items() if quantity in ("resource_usage", "gpus")]
        evicted, preempted = counters.get("evicted_workloads", {}), counters.get("preempted_workloads", {})
        row = {
            "id": queue.pk,
            "name": queue.name or "(cluster)",
            "scheduler": queue.scheduler,
            "cohort": queue.cohort,
            "team": queue.team.name if queue.team else None,
            "pending": latest.get(("pending_workloads", 'status="active"'), latest.get(("jobs", 'state="pending"'))),
            "inadmissible": latest.get(("pending_workloads", 'status="inadmissible"')),
            "wait_1h": _window_wait(windows.last_hour.get(queue.pk, {})),
            "wait_24h": _window_wait(day),
            "evicted": sum(evicted.values()),
            "preempted": sum(preempted.values()),
            "gpus_allocated": sum(usage) if usage else None,
        }
        pool["queues"].append(row)
        if usage:
            pool["gpus_allocated"] = (pool["gpus_allocated"] or 0) + sum(usage)
        for state, key in (('state="drain"', "nodes_drained"), ('state="down"', "nodes_down")):
            if (value := latest.get(("nodes", state))) is not None:
                pool[key] = (pool[key] or 0) + value
        for pending_key in ("pending", "inadmissible"):
            pool[pending_key] += row[pending_key] or 0
        if evicted or preempted:
            team = pool["teams"].setdefault(row["team"] or row["name"], _no_events())
            for key, per_reason in (("evicted", evicted), ("preempted", preempted)):
                team[key] += sum(per_reason.values())
                for reason, n in per_reason.items():
                    team[f"{key}_reasons"][reason] = team[f"{key}_reasons"].get(reason, 0.0) + n
    for pool in out.values():
        pool["teams"] = [{"team": name, **figures} for name, figures in sorted(pool["teams"].items())]
    return out


def _no_events() -> dict[str, Any]:
    return {"evicted": 0.0, "preempted": 0.0, "evicted_reasons": {}, "preempted_reasons": {}}


def _empty_pool(pool_id: int, hours: int) -> dict[str, Any]:
    return {
        "pool": pool_id,
        "queues": [],
        "teams": {},
        "pending": 0.0,
        "inadmissible": 0.0,
        "gpus_allocated": None,
        "gpus_reserved": 0,
        "nodes_drained": None,
        "nodes_down": None,
        "window_hours": hours,
    }


def team_queues(team_id: object, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """The team's Kueue LocalQueues and Slurm accounts (mapped to the team, never to a pool), each
    with its newest figures as the capacity panel reads them (``_latest_gauges``): ``pending`` and
    ``inadmissible`` workloads now (an account's pending jobs as pending), and ``admitted``, the
    admitted active workloads now (an account's running jobs). None where the scheduler has not
    reported within GAUGE_FRESH (an account's series vanish at zero: the exporter prints only
    counts above zero, so a quiet account reads as unknown rather than as 0). Two statements."""
    queues = list(
        SchedulerQueue.objects.filter(team_id=team_id, kind__in=TEAM_ONLY_KINDS)
        .select_related("site")
        .order_by("site__name", "scheduler", "name")
    )
    gauges = _latest_gauges([q.pk for q in queues], now or timezone.now()) if queues else {}
    rows = []
    for queue in queues:
        latest = gauges.get(queue.pk, {})
        pending = latest.get(("pending_workloads", 'status="active"'), latest.get(("jobs", 'state="pending"')))
        rows.append(
            {
                "id": queue.pk,
                "site": queue.site.name,
                "scheduler": queue.get_scheduler_display(),
                "kind": queue.get_kind_display(),
                "name": queue.name,
                "pending": pending,
                "inadmissible": latest.get(("pending_workloads", 'status="inadmissible"')),
                "admitted": latest.get(("admitted_active_workloads", ""), latest.get(("jobs", 'state="running"'))),
            }
        )
    return rows


# --- the capacity page's queue panel, the plan API's queues part and the scheduler topic --------
# Capacity sits below the scheduler and cannot import it, so each is handed to capacity's hooks
# (fleet.capacity.read.tables.register_pool_section, fleet.capacity.api.register_capacity_part) from
# fleet/scheduler/plugins.py.


def duration(seconds: float | None) -> str:
    """An admission wait as a person reads it: 42 s, 3.5 min, 2.1 h; a dash without one (the same
    rule as static/js/scheduler_queues.js, which redraws the figures live)."""
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def queues_part(pool_ids: list[int]) -> list[dict[str, Any]]:
    """The plan API's ``queues``: one entry per pool of the plan, in the plan's order."""
    figures = pool_queues(pool_ids)
    return [figures[pk] for pk in pool_ids]


def quota_waits_part(pool_ids: list[int]) -> list[dict[str, Any]]:
    """The plan API's ``quota_waits``: each team's wait beside its quota on the plan's pools
    (quota_waits), the snapshot the pages' quota cells are redrawn from after a reconnect."""
    return quota_waits(pool_queues(pool_ids))


def _with_wait_text(queues: list[dict[str, Any]]) -> None:
    """Each queue's 1 h and 24 h waits as the panel prints them: p50 / p95."""
    for q in queues:
        for key in ("wait_1h", "wait_24h"):
            w = q[key] or {}
            q[f"{key}_text"] = f"{duration(w.get('p50'))} / {duration(w.get('p95'))}"


def pool_section(pools: list[Pool]) -> dict[str, Any]:
    """The panel's context: the pools with a mapped queue, each with its figures, its waits as text
    and its queues whose quota drifts from the console's; and ``quota_notes``, each team's queue
    wait to set beside its quota in capacity's quota table (fleet.capacity.read.tables.pool_sections)."""
    figures = pool_queues([p.pk for p in pools])
    drifts = _drifts_by_pool(pools)
    rows = []
    for pool in pools:
        f = figures[pool.pk]
        if not f["queues"]:
            continue
        _with_wait_text(f["queues"])
        over = f["gpus_allocated"] is not None and f["gpus_allocated"] > f["gpus_reserved"]
        rows.append({"pool": pool, "figures": f, "over_reserved": over, "drifts": drifts.get(pool.pk, [])})
    return {
        "pool_queue_rows": rows,
        "unmapped": not rows,
        "topic": TOPIC,
        "quota_notes": quota_notes(figures),
    }


# How each of the console's quota fields reads in the panel's drift lines.
DRIFT_FIELDS = {
    "nominal_gpus": "nominal",
    "borrowing_limit_gpus": "borrowing limit",
    "lending_limit_gpus": "lending limit",
}


def _limit(value: Any) -> str:
    """A quota figure as the drift line prints it."""
    return "no limit" if value is None else f"{drift.number(value)}"


def _drifts_by_pool(pools: list[Pool]) -> dict[int, list[dict[str, Any]]]:
    """pool id -> its queues whose quota drifts, each with the fields that differ (the scheduler's
    value against the console's). quota_drift's three statements, whatever the number of queues:
    the same reading the queues page and its import act on."""
    shown = {p.pk for p in pools}
    out: dict[int, list[dict[str, Any]]] = {}
    for d in drift.quota_drift():
        if not d.drifted or d.queue.pool_id not in shown:
            continue
        fields = [
            {"field": DRIFT_FIELDS[name], "scheduler": _limit(theirs), "console": _limit(ours)}
            for name, (theirs, ours) in d.differences.items()
        ]
        out.setdefault(d.queue.pool_id, []).append(
            {
                "queue": d.queue.name,
                "team": d.queue.team.name if d.queue.team else None,
                "status": d.status,
                "fields": fields,
            }
        )
    return out


def quota_notes(figures: dict[int, dict[str, Any]]) -> dict[tuple[int, str], dict[str, str]]:
    """(pool id, team) -> the team's p95 admission wait over the last hour on that pool, as text,
    with a title naming the queue and its 24 h figure. A team with several queues on a pool shows
    its longest wait: the one it feels."""
    notes: dict[tuple[int, str], dict[str, str]] = {}
    worst: dict[tuple[int, str], float] = {}
    for pool_id, f in figures.items():
        for q in f["queues"]:
            if not q["team"]:
                continue
            key = (pool_id, q["team"])
            p95 = (q["wait_1h"] or {}).get("p95")
            if key in notes and (p95 is None or p95 <= worst.get(key, -1.0)):
                continue
            day = (q["wait_24h"] or {}).get("p95")
            notes[key] = {
                "text": duration(p95),
                "title": f"{q['name']}: p95 admission wait {duration(p95)} over 1 h, {duration(day)} over 24 h; "
                f"{q['pending'] or 0:.0f} pending",
            }
            if p95 is not None:
                worst[key] = p95
    return notes


def quota_waits(figures: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """quota_notes as a list a push carries: {"pool", "team", "text", "title"}, the text each
    page's quota cell (``data-value="queue_wait"``) shows."""
    return [{"pool": pk, "team": team, **note} for (pk, team), note in sorted(quota_notes(figures).items())]


def team_section(team: Team, pools: list[Pool]) -> dict[str, Any]:
    """The team page's queue figures: for each pool the team holds a quota on or has a queue
    mapped to, the team's queues with the capacity panel's figures (pool_queues, the same
    statements), ``quota_notes``, the wait beside each of its quotas, computed as the
    capacity page's quota table computes it (one number, one definition), and
    ``team_local_queues``, its Kueue LocalQueues and Slurm accounts with pending and admitted now."""
    mapped = SchedulerQueue.objects.filter(team=team, pool__isnull=False).values_list("pool_id", flat=True)
    pool_ids = sorted({p.pk for p in pools} | set(mapped))
    figures = pool_queues(pool_ids)
    named = Pool.objects.select_related("site").in_bulk(pool_ids)
    rows = []
    for pk in sorted(pool_ids, key=lambda pk: str(named[pk])):
        queues = [q for q in figures[pk]["queues"] if q["team"] == team.name]
        if queues:
            _with_wait_text(queues)
            rows.append({"pool": named[pk], "queues": queues})
    return {
        "team": team,
        "team_queue_rows": rows,
        "team_local_queues": team_queues(team.pk),
        "topic": TOPIC,
        "quota_notes": quota_notes(figures),
    }


def build_scheduler_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``scheduler`` topic's push: the queue figures of the pools whose figures changed since
    the last push (all of them on the first); the page redraws pool by pool."""
    figures = pool_queues()
    before = watermark or {}
    changed = [f for pk, f in sorted(figures.items()) if before.get(pk) != f]
    if not changed:
        return None, watermark
    waits = quota_waits({f["pool"]: f for f in changed})  # the quota cells of the pools that changed
    return {"type": "scheduler.delta", "topic": topic, "pools": changed, "quota_waits": waits}, figures
