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
    units: seconds, tokens), counter increases (with ``span_seconds``, the time they cover), and
    Triton's failures by reason."""

    histograms: dict[str, sm.Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    failures: dict[str, float] = field(default_factory=dict)

    def histogram(self, quantity: str) -> sm.Histogram:
        return self.histograms.get(quantity, sm.EMPTY_HISTOGRAM)


# --- requests, tokens and time per request: one definition for every page -----------------------

OUTCOMES = ("requests_ok", "requests_failed", "requests_aborted")
DURATIONS = {"request": "e2e_seconds", "queue": "queue_seconds", "compute": "compute_seconds"}
# The quantities ``activity`` reads (for window_totals' ``quantities``).
ACTIVITY_QUANTITIES = [
    *OUTCOMES,
    *DURATIONS.values(),
    "generation_tokens",
    "prompt_tokens",
    "generation_tokens_hist",
    "prompt_tokens_hist",
    "e2e",
    sm.SPAN_QUANTITY,
]


def activity(totals: Totals) -> dict[str, float | None]:
    """The sums a window's rates and means per request are made of, each from the framework's own
    series:

    * ``requests``: finished requests, from the outcome counters (vLLM request_success, Triton
      success + failure, TGI success + failure), or where there are none the end-to-end latency
      histogram's count;
    * ``successes``: successful requests (the divisor of Triton's durations);
    * ``generated_tokens`` and ``prompt_tokens``: vLLM's token counters, or where there are none the
      sum of the per-request token histograms (TGI's tgi_request_generated_tokens and
      tgi_request_input_length);
    * ``span_seconds``: the time the scrapes' increases cover;
    * ``request_seconds``, ``queue_seconds``, ``compute_seconds``: Triton's cumulative durations (None
      for frameworks without them).

    Sums add: the sums of two windows are the sums of their union (``add_activity``)."""
    c = totals.counters
    outcomes = [c[k] for k in OUTCOMES if k in c]

    def tokens(counter: str, histogram: str) -> float:
        if counter in c:
            return c[counter]
        return totals.histograms[histogram].sum if histogram in totals.histograms else 0.0

    return {
        "requests": sum(outcomes) if outcomes else totals.histogram("e2e").total,
        "successes": c.get("requests_ok", 0.0),
        "generated_tokens": tokens("generation_tokens", "generation_tokens_hist"),
        "prompt_tokens": tokens("prompt_tokens", "prompt_tokens_hist"),
        "span_seconds": c.get(sm.SPAN_QUANTITY, 0.0),
        **{f"{name}_seconds": c.get(counter) for name, counter in DURATIONS.items()},
    }


def add_activity(a: Mapping[str, float | None], b: Mapping[str, float | None]) -> dict[str, float | None]:
    """The activity of two windows together (None, no such series, counts as nothing)."""
    out: dict[str, float | None] = {}
    for key in {*a, *b}:
        x, y = a.get(key), b.get(key)
        out[key] = None if x is None and y is None else (x or 0.0) + (y or 0.0)
    return out


def activity_figures(act: Mapping[str, float | None]) -> dict[str, Any]:
    """Rates and means from activity sums: requests and tokens per second over the seconds the
    scrapes cover, and Triton's mean request, queue and compute time per successful request (ms)."""
    span = act.get("span_seconds") or 0.0
    out: dict[str, Any] = {
        "requests": _round(act.get("requests"), 3),
        "rps": _round(sm.rate(act.get("requests") or 0.0, span), 4),
        "tokens_per_s": _round(sm.rate(act.get("generated_tokens") or 0.0, span), 3),
        "prompt_tokens_per_s": _round(sm.rate(act.get("prompt_tokens") or 0.0, span), 3),
    }
    for name in DURATIONS:
        seconds = act.get(f"{name}_seconds")
        out[f"{name}_mean_ms"] = None if seconds is None else _ms(sm.mean_latency(seconds, act.get("successes") or 0.0))
    return out


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
        elif quantity.startswith(sm.FAILURE_PREFIX):
            totals.failures[quantity.removeprefix(sm.FAILURE_PREFIX)] = value
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
    return sm.finite(None if seconds is None else round(seconds * 1000, 3))


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


def first_data(endpoint_id: int, since: datetime, end: datetime) -> datetime | None:
    """The start of the endpoint's first rolled-up minute in [since, end), or of its first hour
    where the minutes of the start of the range have expired. One query (two index probes)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT bucket FROM fleet_servingrollup_1m WHERE endpoint_id = %s AND bucket >= %s "
            "AND bucket < %s ORDER BY bucket LIMIT 1), (SELECT bucket FROM fleet_servingrollup_1h "
            "WHERE endpoint_id = %s AND bucket >= %s AND bucket < %s ORDER BY bucket LIMIT 1)",
            [endpoint_id, since, end, endpoint_id, _floor(since, HOUR), end],
        )
        minute, hour = cursor.fetchone()
    if hour is not None and (minute is None or hour < _floor(minute, HOUR)):
        return max(hour, since)
    return minute


def coverage(first: datetime | None, end: datetime, period: timedelta) -> dict[str, Any]:
    """What a window's figures cover: data since ``first`` (None: no data), the seconds from it
    to the end of the read, and whether that is the whole period (a "30-day budget" over three
    hours of data says so)."""
    start = _floor(end - period, MINUTE)
    if first is None:
        return {"since": None, "seconds": 0, "period_days": period.days, "complete": False}
    first = max(first, start)
    return {
        "since": first.isoformat(),
        "seconds": int((end - first).total_seconds()),
        "period_days": period.days,
        "complete": first <= start,
    }


def rules_covered(covered: timedelta) -> list[sm.BurnRule]:
    """The burn-rate rules that count with this much data: a rule counts once the endpoint's data
    spans its short window. Before that both of its windows hold the same few minutes, and "1x
    over 3 days" after ninety seconds would be a ticket on any blip. (An endpoint failing outright
    from its first request still pages after 5 minutes.) The SLO pages and the burn-rate detector
    both take the alerts of slo_status, so they fire on the same data."""
    return [rule for rule in sm.BURN_RULES if rule.short_window <= covered]


def slo_status(endpoint: Any, *, now: datetime | None = None) -> dict[str, Any]:
    """Each SLO over the endpoint's period and the burn-rate windows: SLI, budget left, burn rate
    per window, and the multi-window alerts firing (only the rules its data covers,
    ``rules_covered``); ``coverage``: the data the period's figures rest on. Three queries."""
    period = timedelta(days=endpoint.slo_window_days)
    windows = {window_name(w): w for w in sm.BURN_WINDOWS}
    windows["period"] = period
    end = read_end(now)
    totals = window_totals(endpoint.pk, windows, now=now, quantities=SLO_QUANTITIES)
    covers = coverage(first_data(endpoint.pk, _floor(end - period, MINUTE), end), end, period)
    rules = rules_covered(timedelta(seconds=covers["seconds"]))
    per_window = {name: slis(endpoint, t) for name, t in totals.items()}
    goals = targets(endpoint)
    thresholds = {"ttft": endpoint.ttft_threshold_ms, "itl": endpoint.itl_threshold_ms, "availability": None}
    out: dict[str, Any] = {}
    for slo, target in goals.items():
        whole = per_window["period"][slo]
        error = whole.error_ratio
        ratios = {windows[name]: per_window[name][slo].error_ratio for name in windows if name != "period"}
        alerts = sm.burn_alerts(ratios, target, rules=rules, period=period)
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
    out["coverage"] = covers
    return out


def first_breach(endpoint: Any, slo: str, rule: sm.BurnRule, *, now: datetime | None = None) -> datetime | None:
    """When a burn-rate alert's breach began: the first minute of its short window whose own error
    ratio is over the rule's threshold (factor x (1 - target)), by the same SLI as slo_status.
    Never before the endpoint's first data (a minute without data breaches nothing). None when no
    single minute breaches (the window's sum can, by interpolation). One query."""
    end = read_end(now)
    start = _floor(end - rule.short_window, MINUTE)
    threshold = rule.factor * (1.0 - targets(endpoint)[slo])
    names = [*SLO_QUANTITIES, *(f"{q}:{part}" for q in SLO_QUANTITIES for part in ("count", "sum"))]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT bucket, quantity, le, value FROM fleet_servingrollup_1m "
            "WHERE endpoint_id = %s AND bucket >= %s AND bucket < %s AND quantity = ANY(%s) ORDER BY bucket",
            [endpoint.pk, start, end, names],
        )
        rows = cursor.fetchall()
    by_minute: dict[datetime, dict[tuple[str, float], float]] = defaultdict(dict)
    for bucket, quantity, le, value in rows:
        by_minute[bucket][(quantity, le)] = value
    for minute in sorted(by_minute):
        error = slis(endpoint, _totals(by_minute[minute]))[slo].error_ratio
        if error is not None and error > threshold:
            return minute
    return None


def range_figures(endpoint_id: int, span: timedelta, *, now: datetime | None = None) -> dict[str, Any]:
    """An endpoint's activity over a range ending now (activity_figures: requests, rates, Triton's
    mean times per successful request) and Triton's failures by reason. Two queries."""
    names = [*ACTIVITY_QUANTITIES, *sm.FAILURE_QUANTITIES]
    totals = window_totals(endpoint_id, {"range": span}, now=now, quantities=names)["range"]
    act = activity(totals)
    return {
        **activity_figures(act),
        "successes": _round(act["successes"], 3),
        "failures_by_reason": {reason: _round(n, 3) for reason, n in sorted(totals.failures.items())},
    }


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
    request and token rates (per second over the seconds the step's scrapes cover), Triton's mean
    request, queue and compute time per successful request (ms), errors, queue depth, running
    requests, KV-cache usage (mean and max, 0-1), preemptions, prompt length percentiles. Each
    point keeps its ``activity`` sums (added up for the "now" figures). The step still filling at
    ``now`` is marked ``partial``: its percentiles hold only the scrapes so far."""
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
        point["error_ratio"] = _round(c.get("requests_failed", 0.0) / finished, 6) if finished > 0 else None
        # Requests and tokens per second over the time the step's scrapes cover, and Triton's
        # mean times per successful request: activity_figures, as the "now" and range figures.
        point["activity"] = act = activity(totals)
        point.update(activity_figures(act))
        point["preemptions"] = _round(c.get("preemptions", 0.0), 3)
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
            point[gauge] = None if mean is None else _round(mean[0] / mean[2], 4)
            point[f"{gauge}_max"] = None if peak is None else _round(peak[1], 4)
        out.append(point)
    return out


def _round(value: float | None, digits: int = 1) -> float | None:
    return sm.finite(None if value is None else round(value, digits))


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
        "requests": {k: q.counters.get(k, 0.0) for k in OUTCOMES},
        "failures_by_reason": {k.removeprefix(sm.FAILURE_PREFIX): v for k, v in sorted(q.failures.items())},
        "gauges": {k: round(v, 4) for k, v in q.gauges.items()},
    }
