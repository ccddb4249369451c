"""Read models for the serving pages: the SLO overview, one endpoint's snapshot over a range, the
overview tile, their live pushes, and the one state change the pages make (an endpoint's SLOs).

Everything is read from the serving rollups through fleet.serving.slo (``slo_status``,
``timeseries``, ``window_totals``), never from raw scrapes, except the latest scrape for the
"since the server started" figures. The snapshot (HTTP) and the live deltas (websocket) are built
by the same functions, so a page that reconnects and re-reads its snapshot lands where the deltas
would have taken it.

Queries: the overview costs four per endpoint (slo_status's three, one for the last hour's minute
points); an endpoint's page about eleven whatever its range.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from console import figures
from console.ranges import Window
from fleet.serving import metrics as sm
from fleet.serving import slo as serving
from fleet.serving.models import Endpoint, EndpointChange, EndpointChangeKind, EndpointEval

MINUTE = timedelta(minutes=1)
# An endpoint's page: each range ends now; serving.chart_step picks the point spacing (a minute
# up to 6 h, a few minutes for 24 h, hours past 3 days).
RANGES = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
DEFAULT_RANGE = "6h"
OVERVIEW_SPAN = timedelta(hours=1)  # the overview's charts: the last hour, a point a minute
NOW_SPAN = timedelta(minutes=5)  # "now" figures: the last five minutes
PROMPT_BASELINE = timedelta(days=7)  # the prompt-length distribution is compared with the 7 days before the range
MARKER_LIMIT = 500
GAP_STEPS = 3  # more than this many steps between two points: drawn as a gap, not a slope

SLOS = ("ttft", "itl", "availability")
SLO_LABELS = {"ttft": "Time to first token", "itl": "Inter-token latency", "availability": "Availability"}
SLO_SHORT = {"ttft": "TTFT", "itl": "ITL", "availability": "Availability"}
BURN_WINDOW_NAMES = tuple(serving.window_name(w) for w in sm.BURN_WINDOWS)  # 5m, 30m, 1h, 6h, 3d
# The per-point columns the pages draw (serving.timeseries' names).
SERIES_KEYS = (
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "e2e_p50",
    "e2e_p99",
    "rps",
    "error_ratio",
    "tokens_per_s",
    "prompt_tokens_per_s",
    "preemptions",
    "prompt_p50",
    "prompt_p90",
    "waiting",
    "waiting_max",
    "running",
    "running_max",
    "kv_cache_usage",
    "kv_cache_usage_max",
    "request_mean_ms",
    "queue_mean_ms",
    "compute_mean_ms",
)
# Fields the endpoint page's form sets (fleet.serving.views.EndpointSettingsForm), audited by name.
SETTINGS_FIELDS = (
    "model_name",
    "version",
    "framework",
    "region",
    "replicas",
    "ttft_threshold_ms",
    "ttft_target_pct",
    "itl_threshold_ms",
    "itl_target_pct",
    "availability_target_pct",
    "slo_window_days",
)


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


def _minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


# --- the pieces both pages draw ------------------------------------------------------------------


def endpoint_info(endpoint: Endpoint) -> dict[str, Any]:
    """What an endpoint is and what SREs set on it."""
    return {
        "id": endpoint.pk,
        "name": endpoint.name,
        "site": endpoint.site.name,
        "framework": endpoint.framework,
        "framework_label": endpoint.get_framework_display(),
        "model": endpoint.model_name,
        "version": endpoint.version,
        "region": endpoint.region,
        "replicas": endpoint.replicas,
        "slo_window_days": endpoint.slo_window_days,
        "url": f"/serving/endpoints/{endpoint.pk}/",
    }


def slo_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """serving.slo_status as the pages' table: one row per SLO with its budget left, the burn rate
    per window (5m ... 3d), the windows of the alerts firing (to highlight), and whether any SLI
    was interpolated between bucket bounds (the page says so)."""
    rows = []
    for key in SLOS:
        s = status[key]
        windows = s["windows"]
        alerting = sorted({w for a in s["alerts"] for w in (a["long_window"], a["short_window"])})
        rows.append(
            {
                "slo": key,
                "label": SLO_LABELS[key],
                "short": SLO_SHORT[key],
                "target_pct": s["target_pct"],
                "threshold_ms": s["threshold_ms"],
                "period_days": s["period_days"],
                "sli": s["sli"],
                "good": s["good"],
                "total": s["total"],
                "budget_left": s["budget_left"],
                "burn": {w: windows[w]["burn_rate"] for w in BURN_WINDOW_NAMES},
                "alerting_windows": alerting,
                "alerts": s["alerts"],
                "interpolated": bool(s["interpolated"] or any(windows[w]["interpolated"] for w in BURN_WINDOW_NAMES)),
            }
        )
    return rows


def verdict(rows: list[dict[str, Any]]) -> str:
    """``missing``: an SLO has spent more than its budget over its period or a burn-rate alert
    fires; ``meeting``: every SLO with traffic is within budget; ``no_data``: no SLO has traffic."""
    if any(r["alerts"] or (r["budget_left"] is not None and r["budget_left"] < 0) for r in rows):
        return "missing"
    return "no_data" if all(r["sli"] is None for r in rows) else "meeting"


def _alerts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"slo": r["slo"], "label": r["label"], **a} for r in rows for a in r["alerts"]]


def columns(points: list[dict[str, Any]], step: timedelta) -> dict[str, list[Any]]:
    """serving.timeseries' points as chart columns (``t`` and SERIES_KEYS); a stretch of more than
    GAP_STEPS steps without a point gets a null point, so the chart draws a gap, not a slope."""
    out: dict[str, list[Any]] = {"t": [], **{k: [] for k in SERIES_KEYS}}
    previous: datetime | None = None
    for p in points:
        t = datetime.fromisoformat(p["t"])
        if previous is not None and t - previous > GAP_STEPS * step:
            out["t"].append((previous + step).isoformat())
            for k in SERIES_KEYS:
                out[k].append(None)
        previous = t
        out["t"].append(p["t"])
        for k in SERIES_KEYS:
            out[k].append(p.get(k))
    return out


def _latest(values: list[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def now_figures(status: dict[str, Any], points: list[dict[str, Any]], *, now: datetime) -> dict[str, Any]:
    """The last five minutes: TTFT and ITL p50 / p99 (from the 5m window's histograms); requests,
    request and token rates and Triton's mean times per successful request, from the same
    minutes' activity sums the chart points show (serving.activity_figures over their sum, the
    minute still filling included: a rate is over the seconds its scrapes cover); and the latest
    queue depth, running requests and KV-cache usage."""
    five = status["latency"][serving.window_name(NOW_SPAN)]
    since = (_minute(now) - NOW_SPAN + MINUTE).isoformat()
    recent = [p for p in points if p["t"] >= since]
    act: dict[str, float | None] = {}
    for p in recent:
        act = serving.add_activity(act, p["activity"])
    activity = serving.activity_figures(act)
    return {
        "ttft_p50": five["ttft"]["p50"],
        "ttft_p99": five["ttft"]["p99"],
        "itl_p50": five["itl"]["p50"],
        "itl_p99": five["itl"]["p99"],
        "requests_5m": activity["requests"] or 0.0,
        "rps": activity["rps"],
        "tokens_per_s": activity["tokens_per_s"],
        "request_mean_ms": activity["request_mean_ms"],
        "queue_mean_ms": activity["queue_mean_ms"],
        "compute_mean_ms": activity["compute_mean_ms"],
        "waiting": _latest([p["waiting"] for p in recent]),
        "running": _latest([p["running"] for p in recent]),
        "kv_cache_usage": _latest([p["kv_cache_usage"] for p in recent]),
        "kv_cache_usage_max": max((p["kv_cache_usage_max"] or 0 for p in recent), default=None),
        "preemptions_5m": round(sum(p["preemptions"] or 0 for p in recent), 3) if recent else None,
    }


def endpoint_summary(endpoint: Endpoint, *, now: datetime, points: list[dict[str, Any]]) -> dict[str, Any]:
    """An endpoint's SLO table, verdict, alerts, "now" figures and the data the SLO period's figures
    cover (slo_status: three queries)."""
    status = serving.slo_status(endpoint, now=now)
    rows = slo_rows(status)
    return {
        "slos": rows,
        "verdict": verdict(rows),
        "alerts": _alerts(rows),
        "now": now_figures(status, points, now=now),
        "worst_budget_left": min((r["budget_left"] for r in rows if r["budget_left"] is not None), default=None),
        "coverage": status["coverage"],
    }


def _endpoints() -> list[Endpoint]:
    return list(Endpoint.objects.select_related("site").order_by("site__name", "name"))


# --- the overview --------------------------------------------------------------------------------


def current_overview() -> dict[str, Any]:
    """overview_snapshot as every reader shares it: computed at most once every
    SERVING_SUMMARY_SECONDS for all web processes (console.figures.fresh). It costs a few queries
    and a chart's arithmetic an endpoint (125 endpoints: 2.4 s a read under bench/scale.py's
    load), where a cached read is a lookup. The serving topic is pushed at most as often (register)."""
    return figures.fresh("serving.overview", overview_snapshot, seconds=settings.SERVING_SUMMARY_SECONDS)


def overview_snapshot(*, now: datetime | None = None) -> dict[str, Any]:
    """Everything /serving/ draws: per endpoint its identity and SLOs, the last five minutes'
    figures, the SLO table with the burn rates and the alerts firing, and the last hour's
    per-minute points."""
    now = now or timezone.now()
    end = serving.read_end(now)
    start = end - OVERVIEW_SPAN
    cards = []
    for endpoint in _endpoints():
        points = serving.timeseries(endpoint.pk, start, end, step=MINUTE, now=now)
        cards.append(
            {
                **endpoint_info(endpoint),
                **endpoint_summary(endpoint, now=now, points=points),
                "series": columns(points, MINUTE),
            }
        )
    return {
        "ts": now.isoformat(),
        "since": start.isoformat(),
        "until": end.isoformat(),
        "burn_windows": list(BURN_WINDOW_NAMES),
        "endpoints": cards,
        "totals": _totals(cards),
    }


def _totals(cards: list[dict[str, Any]]) -> dict[str, Any]:
    budgets = [c["worst_budget_left"] for c in cards if c["worst_budget_left"] is not None]
    return {
        "endpoints": len(cards),
        "meeting": sum(1 for c in cards if c["verdict"] == "meeting"),
        "missing": sum(1 for c in cards if c["verdict"] == "missing"),
        "no_data": sum(1 for c in cards if c["verdict"] == "no_data"),
        "alerts": sum(len(c["alerts"]) for c in cards),
        "pages": sum(1 for c in cards for a in c["alerts"] if a["severity"] == "page"),
        "worst_budget_left": min(budgets) if budgets else None,
    }


def overview_tile(request: HttpRequest | None = None) -> dict[str, Any]:
    """The overview page's serving section (tile_figures), shared as current_overview is."""
    return figures.fresh("serving.tile", tile_figures, seconds=settings.SERVING_SUMMARY_SECONDS)


def tile_figures() -> dict[str, Any]:
    """Endpoints meeting and missing their SLOs, the worst error budget left and the alerts firing
    (three queries per endpoint)."""
    now = timezone.now()
    rows = []
    for endpoint in _endpoints():
        status = serving.slo_status(endpoint, now=now)
        slos = slo_rows(status)
        budgets = [r["budget_left"] for r in slos if r["budget_left"] is not None]
        rows.append(
            {
                "name": endpoint.name,
                "url": f"/serving/endpoints/{endpoint.pk}/",
                "verdict": verdict(slos),
                "alerts": _alerts(slos),
                "worst_budget_left": min(budgets) if budgets else None,
            }
        )
    worst = min(
        (r for r in rows if r["worst_budget_left"] is not None), key=lambda r: r["worst_budget_left"], default=None
    )
    alerts = sum(len(r["alerts"]) for r in rows)
    return {
        "endpoints": len(rows),
        "meeting": sum(1 for r in rows if r["verdict"] == "meeting"),
        "missing": [r for r in rows if r["verdict"] == "missing"],
        "no_data": sum(1 for r in rows if r["verdict"] == "no_data"),
        "alerts": alerts,
        "pages": sum(1 for r in rows for a in r["alerts"] if a["severity"] == "page"),
        "worst": worst,
        "worst_budget_pct": None if worst is None else round(worst["worst_budget_left"] * 100, 1),
    }


# --- one endpoint --------------------------------------------------------------------------------


def _change_row(c: EndpointChange) -> dict[str, Any]:
    return {
        "ts": c.ts.isoformat(),
        "kind": c.kind,
        "label": EndpointChangeKind(c.kind).label if c.kind in EndpointChangeKind.values else c.kind,
        "from_value": c.from_value,
        "to_value": c.to_value,
        "model_version": c.model_version,
        "ready_at": _iso(c.ready_at),
        "load_to_ready_s": round((c.ready_at - c.ts).total_seconds(), 1) if c.ready_at else None,
        "note": c.note,
    }


def _eval_row(e: EndpointEval) -> dict[str, Any]:
    return {
        "ts": e.ts.isoformat(),
        "suite": e.suite,
        "metric": e.metric,
        "score": e.score,
        "model_version": e.model_version,
        "higher_is_better": e.higher_is_better,
    }


def _bucket_counts(h: sm.Histogram) -> dict[float, float]:
    """{upper bound: observations in that bucket} of a cumulative histogram (count at its bounds)."""
    out, previous = {}, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        out[bound] = max(0.0, count - previous)
        previous = max(previous, count)
    return out


def _quantile(q: float, h: sm.Histogram) -> float | None:
    value = sm.histogram_quantile(q, h) if h.total > 0 else None
    return None if value is None else round(value, 1)


def prompt_lengths(endpoint_id: int, span: timedelta, *, now: datetime) -> dict[str, Any]:
    """The prompt-length distribution over the range (tokens, per bucket of prompt_tokens_hist)
    against the 7 days before it, with p50 / p90 of each. The baseline is the window of range +
    7 days less the range, bucket by bucket (two queries: window_totals)."""
    totals = serving.window_totals(
        endpoint_id, {"range": span, "wide": span + PROMPT_BASELINE}, now=now, quantities=["prompt_tokens_hist"]
    )
    in_range = _bucket_counts(totals["range"].histogram("prompt_tokens_hist"))
    wide = _bucket_counts(totals["wide"].histogram("prompt_tokens_hist"))
    bounds = sorted(set(in_range) | set(wide))
    baseline = {b: max(0.0, wide.get(b, 0.0) - in_range.get(b, 0.0)) for b in bounds}
    range_total, baseline_total = sum(in_range.values()), sum(baseline.values())
    # Trailing empty buckets (vLLM's go up to 128k tokens) would only stretch the chart.
    last = max((i for i, b in enumerate(bounds) if in_range.get(b) or baseline.get(b)), default=-1)
    bounds = bounds[: last + 1]
    range_h, baseline_h = sm.Histogram.from_bucket_counts(in_range), sm.Histogram.from_bucket_counts(baseline)
    p50, p90 = _quantile(0.5, range_h), _quantile(0.9, range_h)
    base50, base90 = _quantile(0.5, baseline_h), _quantile(0.9, baseline_h)
    return {
        "bounds": [None if math.isinf(b) else b for b in bounds],  # None: +Inf
        "counts": [round(in_range.get(b, 0.0), 3) for b in bounds],
        "share": [round(in_range.get(b, 0.0) / range_total, 4) if range_total else None for b in bounds],
        "baseline_share": [round(baseline[b] / baseline_total, 4) if baseline_total else None for b in bounds],
        "total": round(range_total, 3),
        "baseline_total": round(baseline_total, 3),
        "p50": p50,
        "p90": p90,
        "baseline_p50": base50,
        "baseline_p90": base90,
        "p50_ratio": sm.finite(round(p50 / base50, 3)) if p50 is not None and base50 else None,
        "p90_ratio": sm.finite(round(p90 / base90, 3)) if p90 is not None and base90 else None,
    }


def custom_minutes(window: Window) -> tuple[datetime, datetime]:
    """A custom window (from / to) on whole minutes, as the rollups are kept: from the minute
    holding its start to the end of the minute holding its end."""
    return window.start.replace(second=0, microsecond=0), serving.read_end(window.end - timedelta(microseconds=1))


def endpoint_snapshot(
    endpoint: Endpoint, range_key: str, *, now: datetime | None = None, window: Window | None = None
) -> dict[str, Any]:
    """Everything an endpoint's page draws over a range (RANGES): the chart series (a point per
    serving.chart_step), the SLO table, the "now" figures, the figures since the server started,
    the change events and evals in the range (chart markers), and the prompt-length distribution
    against its 7-day baseline. A custom ``window`` (from / to, on whole minutes: custom_minutes)
    moves the series, markers, prompt lengths and range figures; the SLO table and the "now"
    figures stay now's."""
    now = now or timezone.now()
    span = RANGES[range_key]
    end = live_end = serving.read_end(now)
    start = end - span
    custom: dict[str, Any] = {}
    range_now = now  # the range's figures (window_totals) end at read_end(range_now)
    if window is not None and window.custom:
        start, end = custom_minutes(window)
        span, range_now, custom = end - start, end - timedelta(microseconds=1), window.as_json()
    step = serving.chart_step(start, end)
    points = serving.timeseries(endpoint.pk, start, end, step=step, now=now)
    # The "now" figures need the last five minutes at a minute's resolution.
    recent = (
        points
        if step == MINUTE and not custom
        else serving.timeseries(endpoint.pk, live_end - NOW_SPAN - MINUTE, live_end, step=MINUTE, now=now)
    )
    changes = EndpointChange.objects.filter(endpoint=endpoint, ts__gte=start, ts__lt=end).order_by("ts", "pk")
    evals = EndpointEval.objects.filter(endpoint=endpoint, ts__gte=start, ts__lt=end).order_by("ts", "pk")
    return {
        "ts": now.isoformat(),
        "range": range_key,
        "ranges": list(RANGES),
        **custom,
        "since": start.isoformat(),
        "until": end.isoformat(),
        "step_seconds": int(step.total_seconds()),
        "burn_windows": list(BURN_WINDOW_NAMES),
        "endpoint": endpoint_info(endpoint),
        "targets": {
            "ttft_threshold_ms": endpoint.ttft_threshold_ms,
            "ttft_target_pct": endpoint.ttft_target_pct,
            "itl_threshold_ms": endpoint.itl_threshold_ms,
            "itl_target_pct": endpoint.itl_target_pct,
            "availability_target_pct": endpoint.availability_target_pct,
        },
        **endpoint_summary(endpoint, now=now, points=recent),
        "series": columns(points, step),
        "since_start": serving.since_start(endpoint.pk, now=now),
        "changes": [_change_row(c) for c in changes[:MARKER_LIMIT]],
        "evals": [_eval_row(e) for e in evals[:MARKER_LIMIT]],
        "prompt_lengths": prompt_lengths(endpoint.pk, span, now=range_now),
        "range_figures": serving.range_figures(endpoint.pk, span, now=range_now),
    }


# --- live pushes ---------------------------------------------------------------------------------


def _points_since(endpoint: Endpoint, since: datetime | None, *, now: datetime) -> tuple[list[dict[str, Any]], Any]:
    """The endpoint's minute points from ``since`` (the minute of its previous push, re-sent: it
    may have been filling then) and the last five minutes' (for the "now" figures)."""
    end = serving.read_end(now)
    first = end - NOW_SPAN - MINUTE
    if since is not None:
        first = min(first, since)
    points = serving.timeseries(endpoint.pk, first, end, step=MINUTE, now=now)
    return points, end


def _since(mark: str | None) -> datetime | None:
    """Re-send from the watermark's minute: it was still filling when it was sent."""
    return datetime.fromisoformat(mark) if mark else None


def endpoint_delta(endpoint: Endpoint, mark: str | None, *, now: datetime) -> dict[str, Any]:
    """One endpoint's push: its summary (SLO table, verdict, alerts, now figures) and its minute
    points from ``mark`` (the newest minute of its previous push, re-sent as it may have changed)
    on; without a mark, the last five minutes. ``newest``: the mark for the next push."""
    since = _since(mark)
    points, end = _points_since(endpoint, since, now=now)
    cutoff = (since or end - NOW_SPAN).isoformat()
    fresh = [p for p in points if p["t"] >= cutoff]
    return {
        "id": endpoint.pk,
        **endpoint_info(endpoint),
        **endpoint_summary(endpoint, now=now, points=points),
        "points": columns(fresh, MINUTE),
        "newest": max(fresh[-1]["t"], mark or "") if fresh else mark,
    }


def build_serving_delta(
    topic: str, watermark: Any, *, now: datetime | None = None
) -> tuple[dict[str, Any] | None, Any]:
    """The ``serving`` topic's push: per endpoint its changed minute points since the previous push
    and its small figures (budget left, burn table, now figures). Watermark: per endpoint id the
    newest minute sent."""
    now = now or timezone.now()
    previous = watermark if isinstance(watermark, dict) else {}
    endpoints, marks = [], {}
    for endpoint in _endpoints():
        delta = endpoint_delta(endpoint, previous.get(str(endpoint.pk)), now=now)
        endpoints.append(delta)
        marks[str(endpoint.pk)] = delta["newest"]
    payload = {"type": "serving.delta", "topic": topic, "ts": now.isoformat(), "endpoints": endpoints}
    return payload, marks


def build_endpoint_delta(
    topic: str, watermark: Any, *, now: datetime | None = None
) -> tuple[dict[str, Any] | None, Any]:
    """The ``endpoint.<id>`` topic's push: the endpoint's changed minute points since the previous
    push and its SLO figures. Watermark: the newest minute sent."""
    endpoint_id = int(topic.split(".", 1)[1])
    endpoint = Endpoint.objects.select_related("site").filter(pk=endpoint_id).first()
    if endpoint is None:
        return None, watermark
    now = now or timezone.now()
    delta = endpoint_delta(endpoint, watermark if isinstance(watermark, str) else None, now=now)
    payload = {"type": "endpoint.delta", "topic": topic, "ts": now.isoformat(), **delta}
    return payload, delta["newest"]


# --- the endpoint page's form ----------------------------------------------------------------------


def update_endpoint_settings(endpoint_id: int, *, actor: Any, values: dict[str, Any]) -> list[str]:
    """Set an endpoint's SLOs and what it serves (SETTINGS_FIELDS) and return the fields changed.

    1. The row is locked and the values validated by the model's validators (a target outside
       (0, 100) raises ValidationError naming the field; nothing is saved).
    2. Only the changed fields are written, with an entry in the admin's history naming each
       old and new value (the project's audit trail for people's changes, as for API tokens).
    3. After commit, the serving topics are pushed: open pages show the new SLO lines and budgets.
    """
    unknown = set(values) - set(SETTINGS_FIELDS)
    if unknown:
        raise ValueError(f"not an endpoint setting: {sorted(unknown)}")
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint_id)
        changed = []
        before = {}
        for name, value in values.items():
            if getattr(endpoint, name) != value:
                before[name] = getattr(endpoint, name)
                setattr(endpoint, name, value)
                changed.append(name)
        if not changed:
            return []
        endpoint.full_clean(validate_unique=False, validate_constraints=False)
        endpoint.save(update_fields=changed)
        message = "; ".join(f"{name}: {before[name]!r} -> {getattr(endpoint, name)!r}" for name in changed)
        LogEntry.objects.log_actions(  # type: ignore[attr-defined]
            user_id=actor.pk, queryset=[endpoint], action_flag=CHANGE, change_message=f"Changed {message}."
        )
        transaction.on_commit(lambda: _push_after_change(endpoint_id))
    return changed


def _push_after_change(endpoint_id: int) -> None:
    from console import live

    live.request_push("serving", f"endpoint.{endpoint_id}")
