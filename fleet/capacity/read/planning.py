"""The capacity plan: per pool and in total, per month, supply (fleet.capacity.read.supply)
against the peak of reserved demand by tier, the months in conflict and the GPUs the site's power
leaves dark."""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db.models import BigIntegerField, F, Func
from django.utils import timezone

from fleet.capacity.models import Pool, Reservation
from fleet.capacity.read.supply import SupplyCurve, day_start, pool_figures, supply_curves
from fleet.choices import PriorityTier

# The plan reads instants as integer microseconds since the epoch.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _epoch_us(t: datetime) -> int:
    return (t - _EPOCH) // _MICROSECOND


def _epoch_us_of(field_name: str) -> Func:
    """A timestamptz column read as integer epoch microseconds (exact: EXTRACT is numeric).

    The plan reads thousands of reservation windows; psycopg's timestamptz loader, wrapped by
    Django's time-zone loader, costs about 5 µs a value, most of the plan's time, where an
    integer costs a fraction of that. The sweeps only order and compare instants."""
    return Func(
        F(field_name),
        template="(EXTRACT(EPOCH FROM %(expressions)s) * 1000000)::bigint",
        output_field=BigIntegerField(),
    )


PLAN_TIERS = [t.value for t in PriorityTier]
_FIRM = [PLAN_TIERS.index(PriorityTier.RESERVED), PLAN_TIERS.index(PriorityTier.ON_DEMAND)]
_SUPPLY = -1  # a supply step's place in a sweep event, where a reservation's has its tier's index
PlanWindow = tuple[int, int, int, int]  # tier (index in PLAN_TIERS), GPUs, start, end (epoch µs)


def _month_starts(first: date, months: int) -> list[date]:
    out, y, m = [], first.year, first.month
    for _ in range(months + 1):
        out.append(date(y, m, 1))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def _month_sweep(
    windows: list[PlanWindow], steps: list[tuple[int, int]], bounds: list[int], since: int
) -> tuple[list[list[int]], list[bool]]:
    """Per month [bounds[m], bounds[m+1]): each tier's peak of concurrent GPUs (indexed as
    PLAN_TIERS), and whether non-preemptible demand exceeds energised supply at some moment of
    the month from ``since`` on.

    One sweep over the reservations' boundaries and the supply steps: once every change at an
    instant is settled, the state holds until the next instant; that stretch raises the peaks of
    the months it meets, and marks them in conflict when firm demand exceeds supply."""
    events = [(s, k, g) for k, g, s, _ in windows] + [(e, k, -g) for k, g, _, e in windows]
    events += [(t, _SUPPLY, energised) for t, energised in steps]
    events.sort()
    months, n = len(bounds) - 1, len(events)
    peaks = [[0] * months for _ in PLAN_TIERS]
    conflict = [False] * months
    level = [0] * len(PLAN_TIERS)
    supply = steps[0][1] if steps else 0
    i = 0
    while i < n:
        t = events[i][0]
        while i < n and events[i][0] == t:
            _, k, value = events[i]
            if k == _SUPPLY:
                supply = value
            else:
                level[k] += value
            i += 1
        hi = events[i][0] if i < n else bounds[-1]  # after the last change every level is 0
        over_from = max(t, since) if sum(level[k] for k in _FIRM) > supply else hi
        m = max(0, bisect.bisect_right(bounds, t) - 1)
        while m < months and bounds[m] < hi:  # the months [t, hi) meets
            for k, gpus in enumerate(level):
                if gpus > peaks[k][m]:
                    peaks[k][m] = gpus
            if over_from < hi and bounds[m + 1] > over_from:
                conflict[m] = True
            m += 1
    return peaks, conflict


def plan(*, months: int = 12, start: date | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Per pool and in total, per month from ``start`` (default: this month):

    - installed and energised on the month's first day (supply only grows as orders and power
      land, so it is the month's least), healthy for the current month only (it is today's);
    - reserved demand by tier: the peak of concurrent approved and active GPUs over the month;
    - conflict: at some moment of the month, non-preemptible demand exceeds energised supply;
    - curtailed: on the month's first day, the pool's GPUs (installed or landed) that the site's
      power leaves dark, and ``curtailed_why``, the site's power rule in figures (None when none
      are; power_budget.SitePower.why).

    Totals add the pools' figures (peaks are per pool, so the total's peak is their sum's bound);
    a total's ``curtailed_why`` is None (each pool's says why).
    """
    now = now or timezone.now()
    today = timezone.localdate(now, UTC)
    first = (start or today).replace(day=1)
    month_days = _month_starts(first, months)
    pools = list(Pool.objects.select_related("site").order_by("site__name", "name"))
    figures = pool_figures(pools, now=now)
    curves = supply_curves(pools, today=today, figures=figures)
    windows = _committed_windows(day_start(month_days[0]), day_start(month_days[-1]))
    total = [_empty_month(d) for d in month_days[:-1]]
    out_pools = []
    for p in pools:
        rows = _pool_months(p.pk, curves[p.pk], windows[p.pk], month_days, today=today, healthy=figures[p.pk].healthy)
        for tot, row in zip(total, rows, strict=True):
            _add_month(tot, row)
        out_pools.append({"id": p.pk, "name": p.name, "site": p.site.name, "gpu_model": p.gpu_model, "months": rows})
    return {"start": first.isoformat(), "months": months, "pools": out_pools, "total": total}


def _committed_windows(first: datetime, last: datetime) -> dict[int, list[PlanWindow]]:
    """Each pool's approved and active reservations meeting [first, last), as sweep windows."""
    tier_index = {t: k for k, t in enumerate(PLAN_TIERS)}
    by_pool: dict[int, list[PlanWindow]] = defaultdict(list)
    for pool_id, tier, gpus, s, e in (
        Reservation.objects.committed()
        .filter(start__lt=last, end__gt=first)
        .values_list("pool_id", "tier", "gpus", _epoch_us_of("start"), _epoch_us_of("end"))
    ):
        by_pool[pool_id].append((tier_index[tier], gpus, s, e))
    return by_pool


def _empty_month(d: date) -> dict[str, Any]:
    return {
        "month": d.strftime("%Y-%m"),
        "installed": 0,
        "energised": 0,
        "healthy": None,
        "reserved": dict.fromkeys(PLAN_TIERS, 0),
        "conflict": False,
        "curtailed": 0,
        "curtailed_why": None,
    }


def _pool_months(
    pool_id: int, curve: SupplyCurve, windows: list[PlanWindow], month_days: list[date], *, today: date, healthy: int
) -> list[dict[str, Any]]:
    """One pool's month rows (see plan); ``healthy`` is today's, shown for the current month only."""
    bounds = [_epoch_us(day_start(d)) for d in month_days]
    steps = [(_epoch_us(t), e) for t, e in curve.steps()]
    peaks, conflicts = _month_sweep(windows, steps, bounds, max(bounds[0], _epoch_us(day_start(today))))
    current = today.replace(day=1)
    rows = []
    for i, d in enumerate(month_days[:-1]):
        installed, energised = curve.at(max(d, today))
        row = _empty_month(d)
        row.update(installed=installed, energised=energised)
        row["reserved"] = {t: peaks[k][i] for k, t in enumerate(PLAN_TIERS)}
        if d == current:
            row["healthy"] = healthy
        row["conflict"] = conflicts[i]
        power = curve.power_at(max(d, today))
        if power is not None:
            row.update(curtailed=power.curtailed(pool_id), curtailed_why=power.why(pool_id))
        rows.append(row)
    return rows


def _add_month(total: dict[str, Any], row: dict[str, Any]) -> None:
    """Add a pool's month row to the month's total (healthy stays None until a pool has one)."""
    total["installed"] += row["installed"]
    total["energised"] += row["energised"]
    if row["healthy"] is not None:
        total["healthy"] = (total["healthy"] or 0) + row["healthy"]
    for t in PLAN_TIERS:
        total["reserved"][t] += row["reserved"][t]
    total["conflict"] = total["conflict"] or row["conflict"]
    total["curtailed"] += row["curtailed"]
