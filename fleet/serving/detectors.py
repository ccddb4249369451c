"""Serving detectors: functions from endpoints' recent rollups, change events and evals to the
findings present now, registered with the incident engine like the GPU and training detectors.

* serving-queueing-collapse: arrivals above completions, the waiting queue growing over k
  consecutive minutes, and TTFT p99 rising (the endpoint answers health checks and is useless);
* serving-kv-exhaustion: KV-cache usage >= 95 % for 5 minutes with preemptions rising, naming a
  shift in the prompt-length distribution (p50 / p90 against the 7-day baseline) when there is one;
* serving-cold-start: a replica whose load-to-ready time passed 5 minutes, or a scale-out whose
  capacity was ready only after the load peak it was for;
* serving-quality-regression: eval scores after the latest model, quantisation, kernel or
  framework change below their baseline before it by more than the tolerance; names the change;
* serving-burn-rate: the SRE Workbook's multi-window burn-rate alerts per endpoint and SLO (TTFT,
  ITL, availability): 14.4x over 1 h and 5 m or 6x over 6 h and 30 m page, 1x over 3 d and 6 h is a
  ticket. The impact carries the budget spent over the long window (``error_budget``, which the
  engine keeps as the incident's error budget burned) and every window's burn rate.

Every finding carries the labels site, endpoint (its id: the engine groups an endpoint's findings
into one incident by it), endpoint_name and model.

Queries are bounded per run and read rollups only, never raw scrapes: one for the endpoints with
recent data (an index probe per endpoint), one over the last 30 minutes' per-minute rollups of
those endpoints (queueing and KV), three per endpoint for the burn rates (``serving.slo_status``)
and one per new burn-rate finding for its start,
two per KV-exhausted endpoint for its prompt lengths, one for recent capacity changes (and one
chart read per recent scale-out), and two for the latest change events and their evals.

Hysteresis: a firing queueing collapse holds while the queue is still long or TTFT p99 above the
SLO threshold; a KV exhaustion while usage stays >= 90 %; a burn-rate finding while its long
window burns past the factor and its short window past half of it; a quality regression until the
drop is under half the tolerance. A telemetry finding whose endpoint stopped sending is held
(``judged``): missing data is not health.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import OuterRef, Subquery

from fleet.serving import metrics as sm
from fleet.serving import slo as serving
from fleet.serving.models import Endpoint, EndpointChange, EndpointChangeKind, EndpointEval, ServingRollup1m
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector, firing_since

MINUTE = timedelta(minutes=1)
RECENT = timedelta(minutes=30)  # the per-minute rollups read for queueing and KV
ACTIVE_WITHIN = timedelta(minutes=10)  # an endpoint with a minute this recent is judged now
BURN_ACTIVE_WITHIN = timedelta(hours=6)  # the ticket rule's short window: burn rates still mean something
# Queueing collapse
QUEUE_GROWTH_MINUTES = 5  # k: consecutive minutes of a growing waiting queue
QUEUE_MIN_WAITING = 10.0  # requests waiting at the end of the growth (a queue of 1 -> 2 -> 3 is noise)
ARRIVAL_RATIO = 1.05  # arrivals at least this x completions over the k minutes
TTFT_RISE = 1.5  # TTFT p99 over the k minutes vs the minutes before them
TTFT_BASELINE = timedelta(minutes=10)
# KV-cache exhaustion
KV_FULL = 0.95
KV_HOLD = 0.90  # a firing exhaustion clears only under this
KV_SUSTAIN_MINUTES = 5
PROMPT_RECENT = timedelta(minutes=15)
PROMPT_BASELINE = timedelta(days=7)
PROMPT_SHIFT = 1.5  # p50 or p90 at least this x its baseline
PROMPT_MIN_BASELINE = 100  # observations the baseline needs to be one
# Cold start
LOAD_TO_READY_S = 300.0
COLD_START_SHOWN_FOR = timedelta(hours=1)  # a late replica stays a finding this long after it was ready
PEAK_MARGIN = timedelta(minutes=15)  # the load peak is looked for this far around a scale-out
PEAK_DROP = 0.9  # the load when the capacity arrived was at most this x the peak
# Quality regression
QUALITY_CHANGE_KINDS = (
    EndpointChangeKind.MODEL,
    EndpointChangeKind.QUANTISATION,
    EndpointChangeKind.KERNEL,
    EndpointChangeKind.FRAMEWORK,
)
QUALITY_TOLERANCE = 0.02  # relative drop
QUALITY_BASELINE_EVALS = 3  # the baseline is the mean of the last few evals before the change
QUALITY_AFTER_EVALS = 3  # ... compared with the mean of the latest few after it
# Burn rate
BURN_HOLD_SHORT = 0.5  # a firing alert holds while its short window burns past half the factor
SLO_NAMES = {"ttft": "TTFT", "itl": "ITL", "availability": "availability"}
RECENT_QUANTITIES = (
    "waiting",
    "running",
    "kv_cache_usage",
    "requests_ok",
    "requests_failed",
    "requests_aborted",
    "preemptions",
    "ttft",
)


def labels_of(endpoint: Endpoint) -> dict[str, str]:
    return {
        "site": endpoint.site.name,
        "endpoint": str(endpoint.pk),
        "endpoint_name": endpoint.name,
        "model": endpoint.model_name or endpoint.name,
    }


def _minute_floor(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def active_endpoints(now: datetime, within: timedelta = ACTIVE_WITHIN) -> list[Endpoint]:
    """Endpoints with a per-minute rollup in ``within`` before now, with ``last_minute`` set. One
    query: a probe of each endpoint's (endpoint, bucket) index."""
    end = serving.read_end(now)
    minutes = ServingRollup1m.objects.filter(endpoint_id=OuterRef("pk"), bucket__lt=end)
    endpoints = Endpoint.objects.select_related("site").annotate(
        last_minute=Subquery(minutes.filter(bucket__gte=end - within).order_by("-bucket").values("bucket")[:1])
    )
    return list(endpoints.filter(last_minute__isnull=False).order_by("pk"))


def _judged_recent(now: datetime, labels: dict[str, Any]) -> bool:
    """Whether the finding's endpoint sent anything in the last ten minutes: without data its
    queue, cache or burn cannot be judged healthy, and the finding is held."""
    try:
        endpoint_id = int(labels.get("endpoint", ""))
    except ValueError:
        return True
    end = serving.read_end(now)
    return ServingRollup1m.objects.filter(
        endpoint_id=endpoint_id, bucket__gte=end - ACTIVE_WITHIN, bucket__lt=end
    ).exists()


# --- the last half hour, per minute ----------------------------------------------------------


@dataclass
class Minute:
    """One complete minute of an endpoint, from its rollup rows."""

    bucket: datetime
    waiting: float | None = None
    running: float | None = None
    kv: float | None = None
    finished: float = 0.0  # requests completed (ok, failed, aborted)
    preemptions: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)  # le -> observations in that bucket

    @property
    def in_flight(self) -> float:
        return (self.waiting or 0.0) + (self.running or 0.0)


def recent_minutes(now: datetime, endpoint_ids: Iterable[int]) -> dict[int, list[Minute]]:
    """Per endpoint: its complete minutes of the last RECENT, oldest first. The minute now is in
    is still filling (its completions partial), so it is left out. One query: range scans of the
    per-minute rollups' (endpoint, bucket) index."""
    ids = sorted(set(endpoint_ids))
    if not ids:
        return {}
    end = _minute_floor(now)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT endpoint_id, bucket, quantity, le, value FROM fleet_servingrollup_1m "
            "WHERE endpoint_id = ANY(%s) AND bucket >= %s AND bucket < %s AND quantity = ANY(%s) "
            "ORDER BY endpoint_id, bucket",
            [ids, end - RECENT, end, list(RECENT_QUANTITIES)],
        )
        rows = cursor.fetchall()
    out: dict[int, dict[datetime, Minute]] = {}
    for endpoint_id, bucket, quantity, le, value in rows:
        minute = out.setdefault(endpoint_id, {}).setdefault(bucket, Minute(bucket))
        if quantity == "waiting":
            minute.waiting = value
        elif quantity == "running":
            minute.running = value
        elif quantity == "kv_cache_usage":
            minute.kv = value
        elif quantity == "preemptions":
            minute.preemptions = value
        elif quantity == "ttft":
            minute.ttft[le] = value
        else:
            minute.finished += value
    return {e: [m[b] for b in sorted(m)] for e, m in out.items()}


def _histogram(minutes: Iterable[Minute]) -> sm.Histogram:
    """The TTFT histogram of these minutes (their per-bucket increases, made cumulative)."""
    per_bucket: dict[float, float] = {}
    for minute in minutes:
        for le, value in minute.ttft.items():
            per_bucket[le] = per_bucket.get(le, 0.0) + value
    return sm.Histogram.from_bucket_counts(per_bucket)


def _contiguous_tail(minutes: list[Minute], length: int) -> list[Minute] | None:
    """The last ``length`` minutes if they are consecutive (no minute without a scrape)."""
    if len(minutes) < length:
        return None
    tail = minutes[-length:]
    if any(b.bucket - a.bucket != MINUTE for a, b in itertools.pairwise(tail)):
        return None
    return tail


def _whole_ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:,.0f} ms"


# --- queueing collapse -----------------------------------------------------------------------


@dataclass
class Collapse:
    started_at: datetime
    waiting_from: float
    waiting_to: float
    arrivals_per_s: float
    completions_per_s: float
    ttft_p99_before: float | None
    ttft_p99_now: float | None
    minutes: int


def queueing_collapse(
    minutes: list[Minute], *, was_firing: bool, ttft_threshold_s: float, k: int = QUEUE_GROWTH_MINUTES
) -> Collapse | None:
    """Arrivals above completions, the waiting queue growing for ``k`` consecutive minutes, and
    TTFT p99 rising (over the k minutes against the ten before; against the SLO threshold where
    those have no requests). A collapse already firing holds while the queue is still long or TTFT
    p99 over the last k minutes is above the SLO threshold."""
    tail = _contiguous_tail(minutes, k + 1)
    if tail is None or any(m.waiting is None for m in tail):
        if not was_firing:
            return None
        # A minute without a scrape does not end a collapse already firing: judge the hold on
        # the minutes there are.
        tail = [m for m in minutes if m.waiting is not None][-(k + 1) :]
        if len(tail) < 2:
            return None
    recent = tail[1:]
    completions = sum(m.finished for m in recent)
    arrivals = completions + tail[-1].in_flight - tail[0].in_flight
    p99_now = sm.histogram_quantile(0.99, _histogram(recent))
    before = [m for m in minutes if recent[0].bucket - TTFT_BASELINE <= m.bucket < recent[0].bucket]
    p99_before = sm.histogram_quantile(0.99, _histogram(before))
    seconds = 60.0 * k
    waiting = [m.waiting or 0.0 for m in tail]
    growing = all(b > a for a, b in itertools.pairwise(waiting)) and waiting[-1] >= QUEUE_MIN_WAITING
    outrun = arrivals > ARRIVAL_RATIO * completions
    if p99_before is not None:
        rising = p99_now is not None and p99_now >= TTFT_RISE * p99_before
    else:
        rising = p99_now is not None and p99_now > ttft_threshold_s
    collapsed = growing and outrun and rising
    if not collapsed and was_firing:
        collapsed = waiting[-1] >= QUEUE_MIN_WAITING or (p99_now is not None and p99_now > ttft_threshold_s)
    if not collapsed:
        return None
    # The episode began where the queue started to grow (within the half hour read).
    start = len(minutes) - 1
    while start > 0 and (minutes[start - 1].waiting or 0.0) < (minutes[start].waiting or 0.0):
        start -= 1
    return Collapse(
        started_at=minutes[start].bucket,
        waiting_from=waiting[0],
        waiting_to=waiting[-1],
        arrivals_per_s=arrivals / seconds,
        completions_per_s=completions / seconds,
        ttft_p99_before=p99_before,
        ttft_p99_now=p99_now,
        minutes=k,
    )


@detector("serving-queueing-collapse", judged=_judged_recent)
def serving_queueing_collapse(now: datetime) -> list[FindingSpec]:
    """Queueing collapse per endpoint (see ``queueing_collapse``)."""
    endpoints = active_endpoints(now)
    if not endpoints:
        return []
    recent = recent_minutes(now, (e.pk for e in endpoints))
    already = firing_since("serving-queueing-collapse")
    specs = []
    for endpoint in endpoints:
        fingerprint = f"serving-queueing-collapse:{endpoint.pk}"
        found = queueing_collapse(
            recent.get(endpoint.pk, []),
            was_firing=fingerprint in already,
            ttft_threshold_s=endpoint.ttft_threshold_ms / 1000,
        )
        if found is None:
            continue
        summary = (
            f"Queueing collapse on {endpoint.name}: arrivals {found.arrivals_per_s:.1f}/s above completions "
            f"{found.completions_per_s:.1f}/s, waiting queue {found.waiting_from:.0f} -> {found.waiting_to:.0f} "
            f"over {found.minutes} min, TTFT p99 {_ms(found.ttft_p99_before)} -> {_ms(found.ttft_p99_now)}"
        )
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels=labels_of(endpoint),
                severity=Severity.SEV2,
                summary=summary,
                description=(
                    "Requests arrive faster than the batch completes them: the queue grows and latency "
                    "degrades non-linearly while the endpoint stays up. Add replicas, shed or rate-limit "
                    "load, or lower max_num_seqs / max tokens per request to raise throughput."
                ),
                impact={
                    "arrivals_per_s": round(found.arrivals_per_s, 3),
                    "completions_per_s": round(found.completions_per_s, 3),
                    "waiting_from": round(found.waiting_from, 1),
                    "waiting": round(found.waiting_to, 1),
                    "growth_minutes": found.minutes,
                    "ttft_p99_before_ms": None
                    if found.ttft_p99_before is None
                    else round(found.ttft_p99_before * 1000),
                    "ttft_p99_ms": None if found.ttft_p99_now is None else round(found.ttft_p99_now * 1000),
                },
                category="serving",
                started_at=already.get(fingerprint) or found.started_at,
            )
        )
    return specs


# --- KV-cache exhaustion ---------------------------------------------------------------------


@dataclass
class Exhaustion:
    started_at: datetime
    usage_min: float
    usage_last: float
    full_minutes: int
    preemptions: float
    preemptions_before_per_min: float


def kv_exhaustion(minutes: list[Minute], *, was_firing: bool) -> Exhaustion | None:
    """KV-cache usage (each minute's mean) >= 95 % for the last 5 consecutive minutes, with more
    preemptions a minute over them than over the minutes before (and at least one). A firing one
    holds while the last minute's usage stays >= 90 %."""
    known = [m for m in minutes if m.kv is not None]
    if not known or (minutes[-1].kv is None and not was_firing):
        return None  # a firing one holds over a minute without a scrape, on its last known usage
    tail = _contiguous_tail(minutes, KV_SUSTAIN_MINUTES)
    full = tail is not None and all(m.kv is not None and m.kv >= KV_FULL for m in tail)
    recent = minutes[-KV_SUSTAIN_MINUTES:]
    before = minutes[:-KV_SUSTAIN_MINUTES]
    preempted = sum(m.preemptions for m in recent)
    rate_before = sum(m.preemptions for m in before) / len(before) if before else 0.0
    rising = preempted >= 1 and preempted / KV_SUSTAIN_MINUTES > rate_before
    exhausted = full and rising
    if not exhausted and was_firing:
        exhausted = (known[-1].kv or 0.0) >= KV_HOLD
    if not exhausted:
        return None
    start = len(minutes) - 1
    while start > 0 and (minutes[start - 1].kv or 0.0) >= KV_FULL:
        start -= 1
    run = minutes[start:]
    return Exhaustion(
        started_at=minutes[start].bucket,
        usage_min=min(m.kv or 0.0 for m in recent),
        usage_last=known[-1].kv or 0.0,
        full_minutes=sum(1 for m in run if (m.kv or 0.0) >= KV_FULL),
        preemptions=preempted,
        preemptions_before_per_min=rate_before,
    )


def _subtract(whole: sm.Histogram, part: sm.Histogram) -> sm.Histogram:
    """``whole`` less ``part`` (a window less its most recent stretch), per bound."""
    if not part.bounds:
        return whole
    counts = []
    for bound, count in zip(whole.bounds, whole.counts, strict=True):
        below = 0.0
        for b, c in zip(part.bounds, part.counts, strict=True):
            if b > bound:
                break
            below = c
        counts.append(max(count - below, 0.0))
    return sm.Histogram(whole.bounds, tuple(counts), max(whole.count - part.count, 0.0))


@dataclass
class PromptShift:
    p50: float | None
    p90: float | None
    base_p50: float | None
    base_p90: float | None

    @property
    def shifted(self) -> bool:
        pairs = ((self.p50, self.base_p50), (self.p90, self.base_p90))
        return any(now is not None and base and now >= PROMPT_SHIFT * base for now, base in pairs)

    @property
    def known(self) -> bool:
        return self.base_p90 is not None and self.p90 is not None

    def text(self) -> str:
        if not self.known:
            return "no 7-day prompt-length baseline to compare with"
        figures = (
            f"p50 {self.base_p50 or 0:,.0f} -> {self.p50 or 0:,.0f} tokens, "
            f"p90 {self.base_p90 or 0:,.0f} -> {self.p90 or 0:,.0f} tokens"
        )
        if self.shifted:
            return f"prompt lengths shifted ({figures}, last {PROMPT_RECENT.seconds // 60} min vs the 7-day baseline)"
        return f"no prompt-length shift ({figures})"


def prompt_shift(endpoint_id: int, now: datetime) -> PromptShift:
    """p50 / p90 of the prompt lengths over the last 15 minutes against the 7 days before them.
    Two queries (``serving.window_totals``: minute and hour rollups)."""
    totals = serving.window_totals(
        endpoint_id, {"recent": PROMPT_RECENT, "week": PROMPT_BASELINE}, now=now, quantities=["prompt_tokens_hist"]
    )
    recent = totals["recent"].histogram("prompt_tokens_hist")
    baseline = _subtract(totals["week"].histogram("prompt_tokens_hist"), recent)
    enough = baseline.total >= PROMPT_MIN_BASELINE
    return PromptShift(
        p50=sm.histogram_quantile(0.5, recent),
        p90=sm.histogram_quantile(0.9, recent),
        base_p50=sm.histogram_quantile(0.5, baseline) if enough else None,
        base_p90=sm.histogram_quantile(0.9, baseline) if enough else None,
    )


@detector("serving-kv-exhaustion", judged=_judged_recent)
def serving_kv_exhaustion(now: datetime) -> list[FindingSpec]:
    """KV-cache exhaustion per endpoint (see ``kv_exhaustion``), naming a prompt-length shift."""
    endpoints = active_endpoints(now)
    if not endpoints:
        return []
    recent = recent_minutes(now, (e.pk for e in endpoints))
    already = firing_since("serving-kv-exhaustion")
    specs = []
    for endpoint in endpoints:
        fingerprint = f"serving-kv-exhaustion:{endpoint.pk}"
        found = kv_exhaustion(recent.get(endpoint.pk, []), was_firing=fingerprint in already)
        if found is None:
            continue
        shift = prompt_shift(endpoint.pk, now)
        summary = (
            f"KV-cache exhaustion on {endpoint.name}: usage >= {found.usage_min:.0%} for {found.full_minutes} min, "
            f"{found.preemptions:.0f} preemptions in the last {KV_SUSTAIN_MINUTES} min; {shift.text()}"
        )
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels=labels_of(endpoint),
                severity=Severity.SEV3,
                summary=summary,
                description=(
                    "The KV cache is full: the scheduler preempts running requests (recomputing or swapping "
                    "them) and admits fewer, so latency and throughput suffer. Longer prompts, not more "
                    "requests, are the usual cause. Cap max_model_len or prompt length, add replicas, or "
                    "give the cache more memory (gpu_memory_utilization, a quantised KV cache)."
                ),
                impact={
                    "kv_cache_usage": round(found.usage_last, 4),
                    "full_minutes": found.full_minutes,
                    "preemptions": round(found.preemptions),
                    "preemptions_before_per_min": round(found.preemptions_before_per_min, 2),
                    "prompt_shift": shift.shifted,
                    "prompt_p50": _round(shift.p50),
                    "prompt_p90": _round(shift.p90),
                    "prompt_baseline_p50": _round(shift.base_p50),
                    "prompt_baseline_p90": _round(shift.base_p90),
                },
                category="serving",
                started_at=already.get(fingerprint) or found.started_at,
            )
        )
    return specs


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# --- cold start ------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def load_peak(endpoint_id: int, start: datetime, end: datetime) -> tuple[datetime, float, dict[datetime, float]] | None:
    """The minute of peak request rate in [start, end), its rate, and every minute's rate."""
    points = serving.timeseries(endpoint_id, start, end, step=MINUTE)
    rates = {datetime.fromisoformat(p["t"]): p["rps"] for p in points if p["rps"]}
    if not rates:
        return None
    peak = max(rates, key=lambda t: (rates[t], -t.timestamp()))
    return peak, rates[peak], rates


@detector("serving-cold-start")
def serving_cold_start(now: datetime) -> list[FindingSpec]:
    """Replica loads and scale-outs ready within the last hour: load-to-ready over 5 minutes, or
    (a scale-out) ready only after the load peak it was for. One finding per change event."""
    changes = (
        EndpointChange.objects.select_related("endpoint__site")
        .filter(
            kind__in=[EndpointChangeKind.REPLICA_LOAD, EndpointChangeKind.SCALE_OUT],
            ready_at__isnull=False,
            ready_at__gt=now - COLD_START_SHOWN_FOR,
            ready_at__lte=now,
        )
        .order_by("pk")
    )
    specs = []
    for change in changes:
        assert change.ready_at is not None
        endpoint = change.endpoint
        load_s = (change.ready_at - change.ts).total_seconds()
        reasons: list[str] = []
        impact: dict[str, Any] = {"change": change.pk, "kind": change.kind, "load_to_ready_s": round(load_s)}
        if load_s > LOAD_TO_READY_S:
            reasons.append(f"load-to-ready took {_duration(load_s)} (threshold {_duration(LOAD_TO_READY_S)})")
        if change.kind == EndpointChangeKind.SCALE_OUT:
            found = load_peak(endpoint.pk, change.ts - PEAK_MARGIN, min(now, change.ready_at + PEAK_MARGIN))
            if found is not None:
                peak_at, peak_rps, rates = found
                ready_minute = _minute_floor(change.ready_at)
                at_ready = rates.get(ready_minute)
                if peak_at < ready_minute and at_ready is not None and at_ready <= PEAK_DROP * peak_rps:
                    late = (change.ready_at - peak_at).total_seconds()
                    reasons.append(
                        f"capacity arrived after the peak: ready at {change.ready_at:%H:%M} UTC, "
                        f"{_duration(late)} after the load peaked at {peak_rps:.1f} req/s ({peak_at:%H:%M} UTC)"
                    )
                    impact.update(peak_at=peak_at.isoformat(), peak_rps=round(peak_rps, 2), late_s=round(late))
        if not reasons:
            continue
        what = "Scale-out" if change.kind == EndpointChangeKind.SCALE_OUT else "Replica load"
        target = f" to {change.to_value}" if change.to_value else ""
        specs.append(
            FindingSpec(
                fingerprint=f"serving-cold-start:{change.pk}",
                labels=labels_of(endpoint),
                severity=Severity.SEV3,
                summary=f"Cold start on {endpoint.name}: {what}{target} at {change.ts:%H:%M} UTC: {'; '.join(reasons)}",
                description=(
                    "New capacity that takes minutes to load (tens of GB of weights, CUDA graphs, warm-up) "
                    "arrives after the load it was for. Keep weights on local NVMe or in a warm pool, scale "
                    "out earlier (on queue depth or a schedule), or keep a warm spare replica."
                ),
                impact=impact,
                category="serving",
                started_at=change.ts,
            )
        )
    return specs


# --- quality regression ----------------------------------------------------------------------


@dataclass
class Regression:
    suite: str
    metric: str
    before: float
    after: float
    drop: float  # relative, positive = worse


def eval_regressions(evals: Iterable[tuple[str, str, float, bool, bool]], *, tolerance: float) -> list[Regression]:
    """From (suite, metric, score, higher_is_better, after_change) rows (each side's latest few),
    the metrics whose mean after the change is worse than the mean before by more than
    ``tolerance`` (relative)."""
    sides: dict[tuple[str, str], dict[bool, list[float]]] = {}
    better: dict[tuple[str, str], bool] = {}
    for suite, metric, score, higher_is_better, after in evals:
        sides.setdefault((suite, metric), {}).setdefault(after, []).append(score)
        better[(suite, metric)] = higher_is_better
    out = []
    for key, side in sorted(sides.items()):
        if not side.get(True) or not side.get(False):
            continue
        before = sum(side[False]) / len(side[False])
        after = sum(side[True]) / len(side[True])
        if before == 0:
            continue
        change = (after - before) / abs(before)
        drop = -change if better[key] else change
        if drop > tolerance:
            out.append(Regression(key[0], key[1], before, after, drop))
    return sorted(out, key=lambda r: -r.drop)


def latest_changes(now: datetime) -> list[EndpointChange]:
    """Each endpoint's latest model, quantisation, kernel or framework change up to now."""
    return list(
        EndpointChange.objects.select_related("endpoint__site")
        .filter(kind__in=QUALITY_CHANGE_KINDS, ts__lte=now)
        .order_by("endpoint_id", "-ts", "-pk")
        .distinct("endpoint_id")
    )


def evals_around(now: datetime, changes: list[EndpointChange]) -> dict[int, list[tuple[str, str, float, bool, bool]]]:
    """Per endpoint: for each (suite, metric), its latest evals before the change and after it
    (up to now), a few of each. One query over the (endpoint, suite, metric, ts) index."""
    if not changes:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT endpoint_id, suite, metric, score, higher_is_better, after_change FROM (
                SELECT e.endpoint_id, e.suite, e.metric, e.score, e.higher_is_better,
                       e.ts > c.ts AS after_change,
                       row_number() OVER (PARTITION BY e.endpoint_id, e.suite, e.metric, e.ts > c.ts
                                          ORDER BY e.ts DESC, e.id DESC) AS n
                FROM {EndpointEval._meta.db_table} e
                JOIN unnest(%s::bigint[], %s::timestamptz[]) AS c(endpoint_id, ts) ON c.endpoint_id = e.endpoint_id
                WHERE e.ts <= %s
            ) ranked
            WHERE (after_change AND n <= %s) OR (NOT after_change AND n <= %s)
            """,
            [
                [c.endpoint_id for c in changes],
                [c.ts for c in changes],
                now,
                QUALITY_AFTER_EVALS,
                QUALITY_BASELINE_EVALS,
            ],
        )
        out: dict[int, list[tuple[str, str, float, bool, bool]]] = {}
        for endpoint_id, *row in cursor.fetchall():
            out.setdefault(endpoint_id, []).append(tuple(row))  # type: ignore[arg-type]
        return out


def _change_text(change: EndpointChange) -> str:
    label = EndpointChangeKind(change.kind).label.lower()
    values = f" {change.from_value or '?'} -> {change.to_value or '?'}" if change.from_value or change.to_value else ""
    return f"the {label} change{values} at {change.ts:%Y-%m-%d %H:%M} UTC"


@detector("serving-quality-regression")
def serving_quality_regression(now: datetime) -> list[FindingSpec]:
    """Per endpoint, its latest model, quantisation, kernel or framework change: each eval
    (suite, metric) after it (the mean of the latest few) against its baseline before it (the
    mean of the last few), worse by more than 2 % (respecting higher_is_better) opens a finding
    that names the change. A firing one clears under half the tolerance."""
    changes = latest_changes(now)
    evals = evals_around(now, changes)
    already = firing_since("serving-quality-regression")
    specs = []
    for change in changes:
        endpoint = change.endpoint
        fingerprint = f"serving-quality-regression:{endpoint.pk}:{change.pk}"
        tolerance = QUALITY_TOLERANCE / 2 if fingerprint in already else QUALITY_TOLERANCE
        regressions = eval_regressions(evals.get(endpoint.pk, []), tolerance=tolerance)
        if not regressions:
            continue
        worst = regressions[0]
        more = f" and {len(regressions) - 1} more" if len(regressions) > 1 else ""
        summary = (
            f"Quality regression on {endpoint.name} after {_change_text(change)}: {worst.suite}/{worst.metric} "
            f"{worst.before:.4g} -> {worst.after:.4g} ({worst.drop:.1%} worse){more}"
        )
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels=labels_of(endpoint),
                severity=Severity.SEV3,
                summary=summary,
                description=(
                    "Eval scores after the change are worse than before it beyond the tolerance, while "
                    "latency may look fine. Compare the change's outputs with the previous configuration "
                    "and roll it back if the drop is confirmed."
                ),
                impact={
                    "change": change.pk,
                    "change_kind": change.kind,
                    "from": change.from_value,
                    "to": change.to_value,
                    "changed_at": change.ts.isoformat(),
                    "model_version": change.model_version,
                    "regressions": [
                        {
                            "suite": r.suite,
                            "metric": r.metric,
                            "before": round(r.before, 6),
                            "after": round(r.after, 6),
                            "drop": round(r.drop, 4),
                        }
                        for r in regressions
                    ],
                },
                category="serving",
                started_at=change.ts,
            )
        )
    return specs


# --- burn rates (registered last: a cause found in the same run names the incident) ----------


def _hold(status: dict[str, Any], slo: str) -> dict[str, Any] | None:
    """For a firing finding no rule fires now: the worst rule whose long window still burns past
    its factor and whose short window burns past half of it, as the alert dict slo_status gives."""
    windows = status[slo]["windows"]
    for rule in sm.BURN_RULES:
        long_w, short_w = (
            windows.get(serving.window_name(rule.long_window)),
            windows.get(serving.window_name(rule.short_window)),
        )
        if not long_w or not short_w or long_w["burn_rate"] is None or short_w["burn_rate"] is None:
            continue
        if long_w["burn_rate"] > rule.factor and short_w["burn_rate"] > BURN_HOLD_SHORT * rule.factor:
            return {
                "rule": rule.name,
                "severity": rule.severity,
                "factor": rule.factor,
                "long_window": serving.window_name(rule.long_window),
                "short_window": serving.window_name(rule.short_window),
                "long_burn": long_w["burn_rate"],
                "short_burn": short_w["burn_rate"],
                "budget_spent": round(sm.budget_spent(long_w["burn_rate"], rule.long_window), 4),
            }
    return None


def _slo_text(endpoint: Endpoint, slo: str) -> str:
    if slo == "ttft":
        return f"TTFT SLO ({endpoint.ttft_target_pct:g} % within {endpoint.ttft_threshold_ms:g} ms)"
    if slo == "itl":
        return f"ITL SLO ({endpoint.itl_target_pct:g} % within {endpoint.itl_threshold_ms:g} ms)"
    return f"availability SLO ({endpoint.availability_target_pct:g} %)"


@detector("serving-burn-rate", judged=_judged_recent)
def serving_burn_rate(now: datetime) -> list[FindingSpec]:
    """The multi-window burn-rate alerts of each endpoint's SLOs (``serving.slo_status``: two
    queries per endpoint with data in the last 6 hours). One finding per (endpoint, SLO), the worst
    rule firing: a page (14.4x over 1 h and 5 m, 6x over 6 h and 30 m) is SEV2, a ticket (1x over
    3 d and 6 h) SEV4. A rule counts once the endpoint's data spans its short window
    (``serving.rules_covered``, the rule the SLO pages show alerts by). A new finding starts at the
    first minute of the short window that breached (``serving.first_breach``)."""
    already = firing_since("serving-burn-rate")
    specs = []
    for endpoint in active_endpoints(now, BURN_ACTIVE_WITHIN):
        status = serving.slo_status(endpoint, now=now)
        for slo in ("ttft", "itl", "availability"):
            fingerprint = f"serving-burn-rate:{endpoint.pk}:{slo}"
            alerts = sorted(status[slo]["alerts"], key=lambda a: (a["severity"] != "page", -a["long_burn"]))
            alert = alerts[0] if alerts else None
            if alert is None and fingerprint in already:
                alert = _hold(status, slo)
            if alert is None:
                continue
            page = alert["severity"] == "page"
            burns = {name: w["burn_rate"] for name, w in status[slo]["windows"].items()}
            summary = (
                f"Error budget burn on {endpoint.name}: {_slo_text(endpoint, slo)} burning "
                f"{alert['long_burn']:.1f}x over {alert['long_window']} and {alert['short_burn']:.1f}x over "
                f"{alert['short_window']} ({alert['severity']}: over {alert['factor']:g}x on both); "
                f"{alert['budget_spent']:.1%} of the {endpoint.slo_window_days}-day budget spent in "
                f"{alert['long_window']}"
            )
            specs.append(
                FindingSpec(
                    fingerprint=fingerprint,
                    labels={**labels_of(endpoint), "slo": slo},
                    severity=Severity.SEV2 if page else Severity.SEV4,
                    summary=summary,
                    description=(
                        "Multi-window burn-rate alert (Google SRE Workbook, 'Alerting on SLOs'): the error "
                        "ratio over both windows is above factor x (1 - target). At 14.4x a 30-day budget "
                        "is gone in about 2 days; at 1x exactly at the end of the period."
                    ),
                    impact={
                        "slo": slo,
                        "rule": alert["rule"],
                        "alert": alert["severity"],
                        "factor": alert["factor"],
                        "long_window": alert["long_window"],
                        "short_window": alert["short_window"],
                        "long_burn": alert["long_burn"],
                        "short_burn": alert["short_burn"],
                        "budget_spent": alert["budget_spent"],
                        "error_budget": alert["budget_spent"],  # the incident's error budget burned
                        "budget_left": status[slo]["budget_left"],
                        "burn_rates": burns,
                        "symptom": True,  # a cause joining the incident gives it its title
                    },
                    category="serving",
                    started_at=already.get(fingerprint) or _breach_start(endpoint, slo, alert, now),
                )
            )
    return specs


def _breach_start(endpoint: Endpoint, slo: str, alert: dict[str, Any], now: datetime) -> datetime:
    """A new burn-rate finding's start: the first minute of its short window that breached on its
    own; failing that, the start of the short window's data (never before the endpoint's first)."""
    rule = next(r for r in sm.BURN_RULES if r.name == alert["rule"])
    breach = serving.first_breach(endpoint, slo, rule, now=now)
    if breach is not None:
        return breach
    end = serving.read_end(now)
    first = serving.first_data(endpoint.pk, end - rule.short_window, end)
    return first or end - rule.short_window
