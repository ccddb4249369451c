"""Serving reads every serving page, API and detector shares: window totals from the rollups,
latency percentiles, SLIs, error budgets and burn rates, chart series, and the figures since each
server last started (the writer is fleet.serving.store).

Reads add per-hour rollups for whole hours and per-minute rollups for the edges and the last
hour or two (whose hours may not be rolled yet); they never scan raw scrapes, except the latest
scrape of one endpoint for the "since the server started" figures.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from fleet.serving import metrics as sm

PERIOD = timedelta(days=30)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
QUANTILES = (0.5, 0.9, 0.99)
SINCE_START_SPREAD = timedelta(seconds=60)  # replicas scraped apart still make one "latest scrape"
LATENCIES = ("ttft", "itl", "e2e")
# What the SLO read needs: the latency histograms and the request outcomes.
SLO_QUANTITIES = [*LATENCIES, "requests_ok", "requests_failed", "requests_aborted"]


@dataclass
class Totals:
    """What an endpoint served over a window: histograms of the window's observations (quantity
    units: seconds, tokens) and counter increases."""

    histograms: dict[str, sm.Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    def histogram(self, quantity: str) -> sm.Histogram:
        return self.histograms.get(quantity, sm.EMPTY_HISTOGRAM)


def read_end(now: datetime | None = None) -> datetime:
    """The end of every read window: the end of the current minute (its rollup is kept current)."""
    return _floor(now or timezone.now(), MINUTE) + MINUTE


def _floor(ts: datetime, step: timedelta) -> datetime:
    if step == HOUR:
        return ts.replace(minute=0, second=0, microsecond=0)
    return ts.replace(second=0, microsecond=0)


def _ceil_hour(ts: datetime) -> datetime:
    floor = _floor(ts, HOUR)
    return floor if floor == ts else floor + HOUR


def _plan(windows: Mapping[str, timedelta], end: datetime) -> dict[str, tuple[list[tuple], list[tuple]]]:
    """Each window's minute ranges and hour ranges. The last full hour and the current one are read
    from minutes: their hour rows may not be rolled yet."""
    cutover = _floor(end - MINUTE, HOUR) - HOUR
    plan: dict[str, tuple[list[tuple], list[tuple]]] = {}
    for name, length in windows.items():
        start = _floor(end - length, MINUTE)
        if start >= cutover or _ceil_hour(start) >= cutover:
            plan[name] = ([(start, end)], [])
        else:
            plan[name] = ([(start, _ceil_hour(start)), (cutover, end)], [(_ceil_hour(start), cutover)])
    return plan


def _sum_ranges(
    table: str, endpoint_id: int, ranges: dict[str, list[tuple]], quantities: list[str] | None
) -> dict[str, dict[tuple[str, float], float]]:
    """sum(value) per (quantity, le) for each named set of [start, end) ranges, in one query; of
    the rows of these quantities (with their :count and :sum) when given, else of every summed one."""
    named = [(name, r) for name, r in ranges.items() if r]
    if not named:
        return {name: {} for name in ranges}
    column_params: list[Any] = []
    where_params: list[Any] = []
    columns, where = [], []
    for _, rs in named:
        conds = []
        for start, stop in rs:
            conds.append("(bucket >= %s AND bucket < %s)")
            column_params.extend([start, stop])
            where.append("(bucket >= %s AND bucket < %s)")
            where_params.extend([start, stop])
        columns.append(f"sum(value) FILTER (WHERE {' OR '.join(conds)})")
    if quantities:
        which = "quantity = ANY(%s)"
        where_params.append([*quantities, *(f"{q}:{part}" for q in quantities for part in ("count", "sum"))])
    else:  # everything that adds up over time: not the gauges
        which = "quantity <> ALL(%s)"
        where_params.append([*sm.GAUGE_QUANTITIES, *(f"{g}:max" for g in sm.GAUGE_QUANTITIES)])
    sql = (
        f"SELECT quantity, le, {', '.join(columns)} FROM {table} "
        f"WHERE endpoint_id = %s AND ({' OR '.join(where)}) AND {which} GROUP BY quantity, le"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*column_params, endpoint_id, *where_params])
        rows = cursor.fetchall()
    out: dict[str, dict[tuple[str, float], float]] = {name: {} for name in ranges}
    for quantity, le, *sums in rows:
        for (name, _), value in zip(named, sums, strict=True):
            if value is not None:
                out[name][(quantity, le)] = value
    return out


def _totals(sums: Mapping[tuple[str, float], float]) -> Totals:
    """Totals from summed rollup rows (per-bucket histogram counts, counts, sums, counters)."""
    per_bucket: dict[str, dict[float, float]] = defaultdict(dict)
    totals = Totals()
    extras: dict[str, dict[str, float]] = defaultdict(dict)
    for (quantity, le), value in sums.items():
        if quantity in sm.HISTOGRAM_QUANTITIES:
            per_bucket[quantity][le] = value
        elif ":" in quantity:
            base, part = quantity.split(":", 1)
            extras[base][part] = value
        elif quantity not in sm.GAUGE_QUANTITIES:
            totals.counters[quantity] = value
    for quantity, buckets in per_bucket.items():
        part = extras.get(quantity, {})
        totals.histograms[quantity] = sm.Histogram.from_bucket_counts(
            buckets, count=part.get("count"), sum_=part.get("sum", 0.0)
        )
    return totals


def window_totals(
    endpoint_id: int,
    windows: Mapping[str, timedelta],
    *,
    now: datetime | None = None,
    quantities: list[str] | None = None,
) -> dict[str, Totals]:
    """What the endpoint served over each window ending now (only ``quantities`` when given):
    two queries whatever the windows."""
    end = read_end(now)
    plan = _plan(windows, end)
    minutes = _sum_ranges("fleet_servingrollup_1m", endpoint_id, {n: p[0] for n, p in plan.items()}, quantities)
    hours = _sum_ranges("fleet_servingrollup_1h", endpoint_id, {n: p[1] for n, p in plan.items()}, quantities)
    out = {}
    for name in windows:
        merged = dict(minutes[name])
        for key, value in hours[name].items():
            merged[key] = merged.get(key, 0.0) + value
        out[name] = _totals(merged)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def latency_figures(totals: Totals) -> dict[str, Any]:
    """p50 / p90 / p99 (ms) of TTFT, ITL and end-to-end latency, and their observation counts."""
    out: dict[str, Any] = {}
    for quantity in LATENCIES:
        h = totals.histogram(quantity)
        out[quantity] = {f"p{round(q * 100)}": _ms(sm.histogram_quantile(q, h)) for q in QUANTILES}
        out[quantity]["count"] = h.total
    return out


def _sli_block(sli: sm.Sli, target: float) -> dict[str, Any]:
    error = sli.error_ratio
    return {
        "good": round(sli.good, 3),
        "total": round(sli.total, 3),
        "sli": None if sli.ratio is None else round(sli.ratio, 6),
        "burn_rate": None if error is None else round(sm.burn_rate(error, target), 3),
        "interpolated": sli.interpolated,
    }


def slis(endpoint: Any, totals: Totals) -> dict[str, sm.Sli]:
    """The endpoint's three SLIs over one window's totals."""
    return {
        "ttft": sm.latency_sli(totals.histogram("ttft"), endpoint.ttft_threshold_ms / 1000),
        "itl": sm.latency_sli(totals.histogram("itl"), endpoint.itl_threshold_ms / 1000),
        "availability": sm.availability_sli(
            totals.counters.get("requests_ok", 0.0), totals.counters.get("requests_failed", 0.0)
        ),
    }


def targets(endpoint: Any) -> dict[str, float]:
    """The SLO targets as fractions (the model keeps percentages)."""
    return {
        "ttft": endpoint.ttft_target_pct / 100,
        "itl": endpoint.itl_target_pct / 100,
        "availability": endpoint.availability_target_pct / 100,
    }


def window_name(length: timedelta) -> str:
    seconds = int(length.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def slo_status(endpoint: Any, *, now: datetime | None = None) -> dict[str, Any]:
    """Each SLO over the endpoint's period and the burn-rate windows: SLI, budget left, burn rate
    per window, and the multi-window alerts firing. Two queries."""
    period = timedelta(days=endpoint.slo_window_days)
    windows = {window_name(w): w for w in sm.BURN_WINDOWS}
    windows["period"] = period
    totals = window_totals(endpoint.pk, windows, now=now, quantities=SLO_QUANTITIES)
    per_window = {name: slis(endpoint, t) for name, t in totals.items()}
    goals = targets(endpoint)
    thresholds = {"ttft": endpoint.ttft_threshold_ms, "itl": endpoint.itl_threshold_ms, "availability": None}
    out: dict[str, Any] = {}
    for slo, target in goals.items():
        whole = per_window["period"][slo]
        error = whole.error_ratio
        ratios = {windows[name]: per_window[name][slo].error_ratio for name in windows if name != "period"}
        alerts = sm.burn_alerts(ratios, target, period=period)
        out[slo] = {
            "target_pct": round(target * 100, 4),
            "threshold_ms": thresholds[slo],
            "period_days": endpoint.slo_window_days,
            **_sli_block(whole, target),
            "budget_left": None if error is None else round(sm.budget_left(error, target), 4),
            "windows": {name: _sli_block(per_window[name][slo], target) for name in windows if name != "period"},
            "alerts": [
                {
                    "rule": a.rule.name,
                    "severity": a.rule.severity,
                    "factor": a.rule.factor,
                    "long_window": window_name(a.rule.long_window),
                    "short_window": window_name(a.rule.short_window),
                    "long_burn": round(a.long_burn, 3),
                    "short_burn": round(a.short_burn, 3),
                    "budget_spent": round(a.budget_spent, 4),
                }
                for a in alerts
            ],
        }
    out["latency"] = {name: latency_figures(t) for name, t in totals.items()}
    return out


def chart_step(start: datetime, end: datetime) -> timedelta:
    """One point a minute up to six hours, then wider, at most ~360 points; hours past 3 days."""
    span = end - start
    if span > timedelta(days=3):
        return max(HOUR, HOUR * math.ceil(span / HOUR / 360))
    return max(MINUTE, MINUTE * math.ceil(span / MINUTE / 360))


def timeseries(
    endpoint_id: int,
    start: datetime,
    end: datetime,
    *,
    step: timedelta | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Chart points from the rollups, one per step in [start, end): latency percentiles (ms),
    request and token rates (per second), errors, queue depth, running requests, KV-cache usage
    (mean and max, 0-1), preemptions, mean prompt length. The step still filling at ``now`` is
    marked ``partial``: its rates are over the whole step, so they read low until it ends (the
    increases credited so far cover only part of it), and "now" figures leave it out."""
    now = now or timezone.now()
    step = step or chart_step(start, end)
    table = "fleet_servingrollup_1h" if step >= HOUR else "fleet_servingrollup_1m"
    base = HOUR if step >= HOUR else MINUTE
    start = _floor(start, base)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT date_bin(%s, bucket, %s) AS t, quantity, le, sum(value), max(value), count(*) "
            f"FROM {table} WHERE endpoint_id = %s AND bucket >= %s AND bucket < %s "
            "GROUP BY 1, 2, 3 ORDER BY 1",
            [step, start, endpoint_id, start, end],
        )
        rows = cursor.fetchall()
    by_t: dict[datetime, dict[tuple[str, float], tuple[float, float, int]]] = defaultdict(dict)
    for t, quantity, le, total, biggest, n in rows:
        by_t[t][(quantity, le)] = (total, biggest, n)
    out = []
    seconds = step.total_seconds()
    for t in sorted(by_t):
        cells = by_t[t]
        totals = _totals({k: v[0] for k, v in cells.items()})
        c = totals.counters
        point: dict[str, Any] = {"t": t.isoformat(), "partial": t + step > now}
        for quantity in LATENCIES:
            h = totals.histogram(quantity)
            point[f"{quantity}_p50"] = _ms(sm.histogram_quantile(0.5, h))
            point[f"{quantity}_p99"] = _ms(sm.histogram_quantile(0.99, h))
        finished = c.get("requests_ok", 0.0) + c.get("requests_failed", 0.0)
        point["rps"] = round((finished + c.get("requests_aborted", 0.0)) / seconds, 4)
        point["error_ratio"] = round(c.get("requests_failed", 0.0) / finished, 6) if finished else None
        point["tokens_per_s"] = round(c.get("generation_tokens", 0.0) / seconds, 3)
        point["prompt_tokens_per_s"] = round(c.get("prompt_tokens", 0.0) / seconds, 3)
        point["preemptions"] = round(c.get("preemptions", 0.0), 3)
        # Triton's cumulative durations: mean milliseconds per request over the step.
        requests = finished + c.get("requests_aborted", 0.0)
        for name, counter in (
            ("e2e_mean_ms", "e2e_seconds"),
            ("queue_mean_ms", "queue_seconds"),
            ("compute_mean_ms", "compute_seconds"),
        ):
            point[name] = _ms(sm.mean_latency(c[counter], requests)) if counter in c else None
        point["queue_time_p99"] = _ms(sm.histogram_quantile(0.99, totals.histogram("queue_time")))
        generation = totals.histogram("generation_tokens_hist")
        point["generation_p50"] = _round(sm.histogram_quantile(0.5, generation))
        prompt = totals.histogram("prompt_tokens_hist")
        point["prompt_p50"] = _round(sm.histogram_quantile(0.5, prompt))
        point["prompt_p90"] = _round(sm.histogram_quantile(0.9, prompt))
        for gauge in sm.GAUGE_QUANTITIES:
            mean = cells.get((gauge, 0.0))
            peak = cells.get((f"{gauge}:max", 0.0))
            # A step of several minutes: the mean of the minutes' means (minutes with no scrape
            # are not counted as zero).
            point[gauge] = None if mean is None else round(mean[0] / mean[2], 4)
            point[f"{gauge}_max"] = None if peak is None else round(peak[1], 4)
        out.append(point)
    return out


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def since_start(endpoint_id: int, *, now: datetime | None = None) -> dict[str, Any] | None:
    """Figures since each server last started, from the latest scrape's cumulative series (the
    latest value of each series seen within a minute of the newest, looking back at most ten
    minutes); None with no recent scrape."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT ON (metric, series) metric, series, value, ts FROM fleet_servingsample "
            "WHERE endpoint_id = %s AND ts >= %s AND ts <= %s ORDER BY metric, series, ts DESC",
            [endpoint_id, now - timedelta(minutes=10), now + MINUTE],
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    # The latest scrape: series seen within a minute of the newest one (a replica that left, or
    # a series relabelled, minutes ago is not part of it).
    newest = max(r[3] for r in rows)
    rows = [r for r in rows if r[3] >= newest - SINCE_START_SPREAD]
    q = sm.scrape_quantities((m, s, v) for m, s, v, _ in rows)
    totals = Totals(histograms=q.histograms, counters=q.counters)
    return {
        "as_of": max(r[3] for r in rows).isoformat(),
        **latency_figures(totals),
        "requests": {k: q.counters.get(k, 0.0) for k in ("requests_ok", "requests_failed", "requests_aborted")},
        "gauges": {k: round(v, 4) for k, v in q.gauges.items()},
    }
