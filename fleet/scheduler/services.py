"""Reads of the scheduler series. Admission wait percentiles come from Kueue's
``kueue_admission_wait_time_seconds`` histogram: the buckets' increases over the window, resets
counted as Prometheus ``increase()`` counts them, then ``histogram_quantile`` as Prometheus computes
it (fleet.telemetry.histograms, the one implementation the serving room uses too)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Sum
from django.utils import timezone

from fleet.scheduler.models import SchedulerRollup1m
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
