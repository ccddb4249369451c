"""The pure arithmetic of serving SLOs: one name per quantity across exporters, counter and
histogram deltas with restarts, ``histogram_quantile``, SLIs, error budgets and burn-rate alerts.

No database here: everything takes plain numbers, or the (metric, series, value) triples that
``fleet.ServingSample`` rows hold, so rollups, detectors, pages and benchmarks share one
definition of each figure. The rules follow Prometheus (``rate()``/``increase()`` reset handling,
``histogram_quantile``) and the Google SRE Workbook ("Alerting on SLOs").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, NamedTuple

# The counter and histogram arithmetic lives in fleet.telemetry.histograms (the scheduler room
# reads Kueue's histograms with it); its names stay reachable here for the serving reads.
from fleet.telemetry.histograms import (  # noqa: F401
    EMPTY_HISTOGRAM,
    MAX_MAGNITUDE,
    Histogram,
    bucket_bound,
    counter_increase,
    counter_increases,
    finite,
    histogram_increase,
    histogram_increases,
    histogram_quantile,
    histogram_reset,
    monotonic,
    parse_le,
    parse_series,
    readable,
)

Kind = Literal["gauge", "counter", "histogram"]
HistogramPart = Literal["bucket", "sum", "count"]

# Histogram quantities (unit: seconds for latencies, tokens for lengths).
HISTOGRAM_QUANTITIES = (
    "ttft",
    "itl",
    "e2e",
    "queue_time",
    "prompt_tokens_hist",
    "generation_tokens_hist",
)
# Counter quantities. ``e2e_seconds``, ``queue_seconds`` and ``compute_seconds`` are Triton's
# cumulative durations (already in seconds here; compute is input + infer + output, as Triton's
# docs define compute time). Triton adds them up for successful requests only, so divided by the
# successful requests of the same interval they give a mean time per request (``mean_latency``).
# ``requests_aborted`` are client cancellations (vLLM finished_reason="abort", Triton
# reason="CANCELED"): neither good nor bad for availability.
COUNTER_QUANTITIES = (
    "requests_ok",
    "requests_failed",
    "requests_aborted",
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "e2e_seconds",
    "queue_seconds",
    "compute_seconds",
)
# Gauge quantities; kv_cache_usage is a fraction 0-1.
GAUGE_QUANTITIES = ("running", "waiting", "kv_cache_usage")
# The rollups' seconds covered by a bucket's increases (the spacing of the scrapes): rates divide by it.
SPAN_QUANTITY = "span_seconds"


class Quantity(NamedTuple):
    """What a metric name measures: the quantity, its kind, and the factor that turns its values
    (and, for histograms, its ``le`` bounds and ``_sum``) into the quantity's unit."""

    quantity: str
    kind: Kind
    unit_scale: float


@dataclass(frozen=True)
class _Spec:
    quantity: str
    kind: Kind
    unit_scale: float = 1.0
    # 0 for a current name, 1 for an older one: when one scrape carries both (vLLM keeps
    # deprecated names behind a flag for a release), the current one wins, never their sum.
    legacy: int = 0


# Base names: counters without ``_total``, histograms without ``_bucket``/``_sum``/``_count``.
# Sources: the vLLM production-metrics page (v0.4 to v0.11), Triton's metrics docs, TGI's
# metrics list, and ../shared/REFERENCE.md "Serving metrics".
_NAMES: dict[str, _Spec] = {
    # vLLM gauges
    "vllm:num_requests_running": _Spec("running", "gauge"),
    "vllm:num_requests_waiting": _Spec("waiting", "gauge"),
    "vllm:kv_cache_usage_perc": _Spec("kv_cache_usage", "gauge"),
    "vllm:gpu_cache_usage_perc": _Spec("kv_cache_usage", "gauge", legacy=1),  # before v0.9/0.10
    # vLLM counters
    "vllm:num_preemptions": _Spec("preemptions", "counter"),
    "vllm:prompt_tokens": _Spec("prompt_tokens", "counter"),
    "vllm:generation_tokens": _Spec("generation_tokens", "counter"),
    "vllm:request_success": _Spec("requests_ok", "counter"),  # finished_reason decides, below
    # vLLM histograms
    "vllm:time_to_first_token_seconds": _Spec("ttft", "histogram"),
    "vllm:inter_token_latency_seconds": _Spec("itl", "histogram"),
    "vllm:time_per_output_token_seconds": _Spec("itl", "histogram", legacy=1),  # before v0.11
    "vllm:e2e_request_latency_seconds": _Spec("e2e", "histogram"),
    "vllm:request_queue_time_seconds": _Spec("queue_time", "histogram"),
    "vllm:request_prompt_tokens": _Spec("prompt_tokens_hist", "histogram"),
    "vllm:request_generation_tokens": _Spec("generation_tokens_hist", "histogram"),
    # Triton (per model, label "model"; durations are cumulative microsecond counters)
    "nv_inference_request_success": _Spec("requests_ok", "counter"),
    "nv_inference_request_failure": _Spec("requests_failed", "counter"),  # reason decides, below
    "nv_inference_pending_request_count": _Spec("waiting", "gauge"),
    "nv_inference_request_duration_us": _Spec("e2e_seconds", "counter", 1e-6),
    "nv_inference_queue_duration_us": _Spec("queue_seconds", "counter", 1e-6),
    "nv_inference_compute_input_duration_us": _Spec("compute_seconds", "counter", 1e-6),
    "nv_inference_compute_infer_duration_us": _Spec("compute_seconds", "counter", 1e-6),
    "nv_inference_compute_output_duration_us": _Spec("compute_seconds", "counter", 1e-6),
    "nv_inference_first_response_histogram_ms": _Spec("ttft", "histogram", 1e-3),
    # Hugging Face TGI (no TTFT metric; its per-token figure is each request's mean)
    "tgi_queue_size": _Spec("waiting", "gauge"),
    "tgi_batch_current_size": _Spec("running", "gauge"),
    "tgi_request_success": _Spec("requests_ok", "counter"),
    "tgi_request_failure": _Spec("requests_failed", "counter"),
    "tgi_request_duration": _Spec("e2e", "histogram"),
    "tgi_request_queue_duration": _Spec("queue_time", "histogram"),
    "tgi_request_mean_time_per_token_duration": _Spec("itl", "histogram"),
    "tgi_request_input_length": _Spec("prompt_tokens_hist", "histogram"),
    "tgi_request_generated_tokens": _Spec("generation_tokens_hist", "histogram"),
}
_HISTOGRAM_SUFFIXES: tuple[tuple[str, HistogramPart], ...] = (
    ("_bucket", "bucket"),
    ("_sum", "sum"),
    ("_count", "count"),
)
# Request outcomes that are the client's doing, not the server's.
_ABORT_REASONS = frozenset({"abort", "canceled", "cancelled"})
_FAILED_VLLM_REASONS = frozenset({"error"})


# Triton's failure reasons (nv_inference_request_failure{reason}); a failure without the label
# (releases before it) is UNSPECIFIED, a reason this list does not know is counted as OTHER.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER", "UNSPECIFIED")
FAILURE_PREFIX = "failures:"
FAILURE_QUANTITIES = tuple(FAILURE_PREFIX + reason for reason in FAILURE_REASONS)
_FAILURE_METRICS = frozenset({"nv_inference_request_failure", "nv_inference_request_failure_total"})


def failure_reason_quantity(metric_name: str, labels: Mapping[str, str]) -> str | None:
    """The per-reason quantity (``failures:REJECTED``...) a Triton failure counter also counts
    under, beside requests_failed or requests_aborted; None for every other series."""
    if metric_name not in _FAILURE_METRICS:
        return None
    reason = labels.get("reason", "").strip().upper()
    if not reason:
        reason = "UNSPECIFIED"
    elif reason not in FAILURE_REASONS:
        reason = "OTHER"
    return FAILURE_PREFIX + reason


def _lookup(metric_name: str) -> tuple[_Spec, HistogramPart | None] | None:
    # Whole names first: Triton's nv_inference_count and TGI's tgi_request_count are counters
    # whose names merely end like a histogram's _count.
    base = metric_name.removesuffix("_total")
    spec = _NAMES.get(base) or _NAMES.get(metric_name)
    if spec is not None and spec.kind != "histogram":
        return spec, None
    for suffix, part in _HISTOGRAM_SUFFIXES:
        if metric_name.endswith(suffix):
            spec = _NAMES.get(metric_name.removesuffix(suffix))
            if spec is not None and spec.kind == "histogram":
                return spec, part
    return None


def _refine(spec: _Spec, labels: Mapping[str, str]) -> _Spec:
    """The outcome counters split by label: vLLM's finished_reason, Triton's failure reason."""
    if spec.quantity == "requests_ok" and "finished_reason" in labels:
        reason = labels["finished_reason"].lower()
        if reason in _ABORT_REASONS:
            return _Spec("requests_aborted", spec.kind, spec.unit_scale, spec.legacy)
        if reason in _FAILED_VLLM_REASONS:
            return _Spec("requests_failed", spec.kind, spec.unit_scale, spec.legacy)
    if spec.quantity == "requests_failed" and labels.get("reason", "").lower() in _ABORT_REASONS:
        return _Spec("requests_aborted", spec.kind, spec.unit_scale, spec.legacy)
    return spec


def quantity_of(metric_name: str, labels: Mapping[str, str] | None = None) -> Quantity | None:
    """The quantity a sample measures, whatever the exporter and version, or None if it is not one
    this console uses. ``metric_name`` is the sample name as stored (``_total``, ``_bucket``,
    ``_sum`` and ``_count`` suffixes allowed); ``labels`` split outcome counters by reason."""
    found = _lookup(metric_name)
    if found is None:
        return None
    spec = _refine(found[0], labels or {})
    return Quantity(spec.quantity, spec.kind, spec.unit_scale)


def histogram_part(metric_name: str) -> HistogramPart | None:
    """Which part of a known histogram a sample is ("bucket", "sum", "count"), else None."""
    found = _lookup(metric_name)
    return None if found is None else found[1]


def is_legacy_name(metric_name: str) -> bool:
    """Is this an older name of a quantity (superseded when the current name is present)?"""
    found = _lookup(metric_name)
    return found is not None and found[0].legacy > 0


def histogram_mean(histogram: Histogram) -> float | None:
    """_sum / _count, or None with no observations."""
    return finite(histogram.sum / histogram.count) if histogram.count > 0 else None


def mean_latency(seconds_increase: float, successes_increase: float) -> float | None:
    """Mean time per request over an interval from cumulative-duration counters (Triton's
    *_duration_us, scaled to seconds) and the successful requests of the same interval: Triton
    adds the durations of successful requests only. None with no successes."""
    return finite(seconds_increase / successes_increase) if successes_increase > 0 else None


def rate(increase: float, seconds: float) -> float | None:
    """Per second over the time the scrapes' increases cover (not a fixed step): a server scraped
    every two minutes credits two minutes of traffic to one minute. None when nothing is covered."""
    return finite(increase / seconds) if seconds > 0 else None


# --- SLIs, error budgets, burn rates ------------------------------------------------------


@dataclass(frozen=True)
class Sli:
    """Good events over all events. ``interpolated``: the threshold fell between bucket bounds (or
    beyond the last finite one), so ``good`` is an estimate the page must say is one."""

    good: float
    total: float
    interpolated: bool = False

    @property
    def ratio(self) -> float | None:
        return self.good / self.total if self.total > 0 else None

    @property
    def error_ratio(self) -> float | None:
        return None if self.total <= 0 else 1.0 - self.good / self.total


def latency_sli(histogram: Histogram, threshold: float) -> Sli:
    """Events <= threshold from bucket counts. A threshold on a bound is exact; between two bounds
    the bucket is assumed uniform (linear interpolation, as histogram_quantile assumes); below the
    lowest bound it interpolates from 0; above the highest finite bound the +Inf bucket's events
    count as bad (nothing says how far past the bound they are)."""
    bounds = histogram.bounds
    if not bounds:
        return Sli(0.0, 0.0)
    counts = monotonic(histogram.counts)
    total = histogram.total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if threshold == bound:
            return Sli(min(count, total), total)
        if threshold < bound:
            if bound == math.inf:
                return Sli(prev_count, total, interpolated=True)
            if threshold <= prev_bound:
                return Sli(prev_count if threshold == prev_bound else 0.0, total, interpolated=threshold != prev_bound)
            fraction = (threshold - prev_bound) / (bound - prev_bound)
            return Sli(prev_count + (count - prev_count) * fraction, total, interpolated=True)
        prev_bound, prev_count = bound, count
    return Sli(min(prev_count, total), total, interpolated=True)


def availability_sli(ok: float, failed: float) -> Sli:
    """Successful requests over finished ones (client aborts left out by the caller)."""
    return Sli(ok, ok + failed)


def _check_target(target: float) -> None:
    if not 0 < target < 1:
        raise ValueError(f"SLO target must be a fraction between 0 and 1 (exclusive), not {target}.")


def burn_rate(error_ratio: float, target: float) -> float:
    """How fast the error budget burns: the error ratio over the allowed one (1 - target). 1 spends
    exactly the budget over the SLO period."""
    _check_target(target)
    return error_ratio / (1.0 - target)


def budget_left(error_ratio: float, target: float) -> float:
    """The fraction of the error budget left after a period with this error ratio (1 untouched,
    0 spent, negative overspent)."""
    return 1.0 - burn_rate(error_ratio, target)


def budget_spent(burn: float, window: timedelta, period: timedelta = timedelta(days=30)) -> float:
    """The fraction of the period's budget a burn rate spends over a window (14.4x for 1 h of a
    30-day SLO: 0.02)."""
    return burn * (window / period)


@dataclass(frozen=True)
class BurnRule:
    """A multi-window burn-rate alert: fires when both windows burn faster than ``factor``."""

    name: str
    severity: Literal["page", "ticket"]
    factor: float
    long_window: timedelta
    short_window: timedelta


# Google SRE Workbook, "Alerting on SLOs", for a 30-day SLO (the short window is 1/12 the long).
BURN_RULES: tuple[BurnRule, ...] = (
    BurnRule("fast_burn", "page", 14.4, timedelta(hours=1), timedelta(minutes=5)),
    BurnRule("medium_burn", "page", 6.0, timedelta(hours=6), timedelta(minutes=30)),
    BurnRule("slow_burn", "ticket", 1.0, timedelta(days=3), timedelta(hours=6)),
)
BURN_WINDOWS: tuple[timedelta, ...] = tuple(sorted({w for r in BURN_RULES for w in (r.long_window, r.short_window)}))


@dataclass(frozen=True)
class BurnAlert:
    rule: BurnRule
    long_burn: float
    short_burn: float
    budget_spent: float = field(default=0.0)  # of the period's budget, over the long window at its burn


def burn_alerts(
    error_ratios: Mapping[timedelta, float | None],
    target: float,
    *,
    rules: Iterable[BurnRule] = BURN_RULES,
    period: timedelta = timedelta(days=30),
) -> list[BurnAlert]:
    """The burn-rate alerts firing, given each window's error ratio (None or absent: no events,
    which never fires). A rule fires only when both its windows burn strictly faster than its
    factor, compared as the Workbook writes it (error ratio > factor x (1 - target)), so 14.4x on
    the nose does not page and float noise in the division cannot tip it."""
    _check_target(target)
    allowed = 1.0 - target
    firing: list[BurnAlert] = []
    for rule in rules:
        long_ratio = error_ratios.get(rule.long_window)
        short_ratio = error_ratios.get(rule.short_window)
        if long_ratio is None or short_ratio is None:
            continue
        threshold = rule.factor * allowed
        if long_ratio > threshold and short_ratio > threshold:
            long_burn = long_ratio / allowed
            firing.append(
                BurnAlert(rule, long_burn, short_ratio / allowed, budget_spent(long_burn, rule.long_window, period))
            )
    return firing


# --- a scrape's quantities ------------------------------------------------------------------


@dataclass
class Quantities:
    """One scrape's figures by quantity: gauges, cumulative counters, cumulative histograms (all in
    the quantity's unit, summed over engines, replicas and reasons)."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    failures: dict[str, float] = field(default_factory=dict)  # Triton's failures by reason


# How a gauge combines over several series (engines of one server, models of one endpoint).
_GAUGE_MEAN = frozenset({"kv_cache_usage"})


def scrape_quantities(rows: Iterable[tuple[str, str, float]]) -> Quantities:
    """Fold one scrape's (metric, series, value) triples, as ServingSample stores them, into
    quantities. Unknown metrics are skipped; where a scrape carries a quantity under both its
    current and an older name, only the current name counts."""
    # quantity -> legacy rank -> accumulated parts
    gauges: dict[str, dict[int, list[float]]] = {}
    counters: dict[str, dict[int, float]] = {}
    buckets: dict[tuple[str, int], dict[str, dict[float, float]]] = {}  # per series: le -> count
    sums: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], float] = {}
    failures: dict[str, float] = {}
    for metric, series, value in rows:
        found = _lookup(metric)
        if found is None or not readable(value):
            continue
        labels = parse_series(series)
        spec, part = _refine(found[0], labels), found[1]
        if (reason := failure_reason_quantity(metric, labels)) is not None:
            failures[reason] = failures.get(reason, 0.0) + value
        if spec.kind == "gauge":
            gauges.setdefault(spec.quantity, {}).setdefault(spec.legacy, []).append(value * spec.unit_scale)
        elif spec.kind == "counter":
            per = counters.setdefault(spec.quantity, {})
            per[spec.legacy] = per.get(spec.legacy, 0.0) + value * spec.unit_scale
        else:
            key = (spec.quantity, spec.legacy)
            if part == "bucket":
                if "le" not in labels:
                    continue
                bound = bucket_bound(labels["le"])
                if bound is None:
                    continue  # not a bound (the door refuses these; rows from before it did are skipped)
                rest = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "le")
                buckets.setdefault(key, {}).setdefault(rest, {})[bound * spec.unit_scale] = value
            elif part == "sum":
                sums[key] = sums.get(key, 0.0) + value * spec.unit_scale
            else:
                counts[key] = counts.get(key, 0.0) + value
    out = Quantities(failures=failures)
    for quantity, by_rank in gauges.items():
        values = by_rank[min(by_rank)]
        out.gauges[quantity] = sum(values) / len(values) if quantity in _GAUGE_MEAN else sum(values)
    for quantity, per in counters.items():
        out.counters[quantity] = per[min(per)]
    for quantity in {q for q, _ in (*buckets, *counts)}:
        ranks = [r for q, r in (*buckets, *counts) if q == quantity]
        key = (quantity, min(ranks))
        merged = EMPTY_HISTOGRAM
        for per_le in buckets.get(key, {}).values():
            merged = merged + Histogram.from_buckets(per_le)
        count = counts.get(key, merged.total)
        out.histograms[quantity] = Histogram(merged.bounds, merged.counts, count, sums.get(key, 0.0))
    return out
