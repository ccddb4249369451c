"""Prometheus counters and classic histograms as plain numbers: increases with resets as
``increase()`` counts them, and ``histogram_quantile`` exactly as Prometheus computes it.

Shared by every room that reads exporter histograms: serving (TTFT, ITL, queue time from vLLM,
Triton and TGI) and scheduler (Kueue's admission wait). No database here.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Labels as stored: canonical text, sorted and escaped as Prometheus writes them.
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_series(series: str) -> dict[str, str]:
    """The labels of a stored series text (``finished_reason="stop",le="0.5"``), unescaped."""
    return {
        key: re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], value) for key, value in _LABEL_RE.findall(series)
    }


# The largest magnitude a stored serving value or bucket bound may have. Counters past it (about
# 31,700 years of microseconds) are not readings; below it, sums over any number of series and
# intervals stay far from float overflow, so no read can reach infinity by adding.
MAX_MAGNITUDE = 1e18


def parse_le(text: str) -> float:
    """A bucket bound as exposed: a float, or +Inf in any of Prometheus's spellings."""
    return math.inf if text.strip().lower() in ("+inf", "inf") else float(text)


def bucket_bound(text: str) -> float | None:
    """A bucket bound that can be read: a finite number within MAX_MAGNITUDE, or +Inf spelt as
    Prometheus spells it; None for anything else (``fast``, NaN, -Inf, 1e400)."""
    stripped = text.strip().lower()
    if stripped in ("+inf", "inf"):
        return math.inf
    try:
        bound = float(stripped)
    except ValueError:
        return None
    return bound if math.isfinite(bound) and abs(bound) <= MAX_MAGNITUDE else None


def readable(value: float) -> bool:
    """Can this stored value be added into a figure: finite and within MAX_MAGNITUDE."""
    return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE


def finite(value: float | None) -> float | None:
    """The value, or None where it is not a finite number: what a read may show."""
    return value if value is not None and math.isfinite(value) else None


# --- histograms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """A classic Prometheus histogram: upper bounds ascending (the last is +Inf), cumulative counts
    per bound, and the observation count and sum. Cumulative since the server started, or an
    interval's increase (``histogram_increase``)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    count: float = 0.0
    sum: float = 0.0

    @classmethod
    def from_buckets(
        cls, buckets: Mapping[float, float], *, count: float | None = None, sum_: float = 0.0
    ) -> Histogram:
        """Build from {upper bound: cumulative count}; ``count`` defaults to the +Inf bucket, ``sum_``
        is the observations' sum."""
        bounds = tuple(sorted(buckets))
        counts = tuple(float(buckets[b]) for b in bounds)
        if count is None:
            count = counts[-1] if counts and bounds[-1] == math.inf else 0.0
        return cls(bounds, counts, float(count), float(sum_))

    @classmethod
    def from_bucket_counts(
        cls, per_bucket: Mapping[float, float], *, count: float | None = None, sum_: float = 0.0
    ) -> Histogram:
        """Build from {upper bound: observations in that bucket alone} (the rollups keep per-bucket
        increases). The one rule for +Inf: the bounds always end with it, and where the buckets
        have none its count is the total of the others. ``count`` defaults to that total."""
        if not per_bucket:
            return cls((), (), 0.0 if count is None else float(count), float(sum_))
        bounds = sorted(per_bucket)
        counts, running = [], 0.0
        for bound in bounds:
            running += per_bucket[bound]
            counts.append(running)
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
            counts.append(running)
        return cls(tuple(bounds), tuple(counts), running if count is None else float(count), float(sum_))

    @property
    def total(self) -> float:
        """Observations: the +Inf bucket when there is one (the truth for quantiles), else _count."""
        return self.counts[-1] if self.bounds and self.bounds[-1] == math.inf else self.count

    def __add__(self, other: Histogram) -> Histogram:
        """Merge two histograms (engines, replicas, intervals); bounds present in only one are kept
        with the other's count taken from its next lower bound, as cumulative counts are."""
        if not self.bounds:
            return other
        if not other.bounds:
            return self
        bounds = tuple(sorted(set(self.bounds) | set(other.bounds)))
        counts = tuple(_cumulative_at(self, b) + _cumulative_at(other, b) for b in bounds)
        return Histogram(bounds, counts, self.count + other.count, self.sum + other.sum)


def _cumulative_at(h: Histogram, bound: float) -> float:
    """Observations <= bound that a histogram can vouch for (its largest bound not above it)."""
    found = 0.0
    for b, c in zip(h.bounds, h.counts, strict=True):
        if b > bound:
            break
        found = c
    return found


EMPTY_HISTOGRAM = Histogram((), ())


def counter_increase(previous: float | None, current: float) -> float:
    """A counter's increase between two scrapes, as Prometheus ``increase()`` counts it: a decrease
    is a restart, so the new value is all that was counted since (never a negative increase)."""
    if previous is None:
        return 0.0
    return current - previous if current >= previous else current


def counter_increases(values: Sequence[float]) -> float:
    """The total increase over a run of scrapes of one counter (no extrapolation to the window
    edges: the exact sum of the per-interval increases, which rollups can add up)."""
    return sum(counter_increase(a, b) for a, b in itertools.pairwise(values))


def histogram_reset(previous: Histogram, current: Histogram) -> bool:
    """Did the server restart between these scrapes? Any bucket or the count going down, or the
    bucket layout changing (a restart with another configuration), resets the whole histogram."""
    if previous.bounds != current.bounds:
        return bool(previous.bounds)
    if current.count < previous.count:
        return True
    return any(c < p for p, c in zip(previous.counts, current.counts, strict=True))


def histogram_increase(previous: Histogram | None, current: Histogram) -> Histogram:
    """Per-``le`` increases between two cumulative scrapes, with ``_count`` and ``_sum``; after a
    reset the current cumulative values are the increase since the restart. With no previous
    scrape nothing is known to have happened in the interval: all zeros, as ``increase()`` does."""
    if previous is None or not previous.bounds:
        return Histogram(current.bounds, tuple(0.0 for _ in current.counts))
    if histogram_reset(previous, current):
        return current
    return Histogram(
        current.bounds,
        tuple(c - p for p, c in zip(previous.counts, current.counts, strict=True)),
        current.count - previous.count,
        current.sum - previous.sum,
    )


def histogram_increases(scrapes: Sequence[Histogram]) -> Histogram:
    """The histogram of everything observed over a run of cumulative scrapes (restarts included)."""
    out = EMPTY_HISTOGRAM
    for a, b in itertools.pairwise(scrapes):
        out = out + histogram_increase(a, b)
    return out


def monotonic(counts: Sequence[float]) -> list[float]:
    """Prometheus's fix for non-monotonic buckets (scrapes racing observations, float error): each
    cumulative count is raised to the largest count below it."""
    out: list[float] = []
    high = -math.inf
    for c in counts:
        high = max(high, c)
        out.append(high)
    return out


def histogram_quantile(q: float, histogram: Histogram) -> float | None:
    """The q-quantile (0 <= q <= 1) with Prometheus ``histogram_quantile`` semantics.

    Linear interpolation inside the bucket that holds rank q*total; the lowest bucket interpolates
    from 0 (unless its bound is <= 0: that bound is returned); a rank in the +Inf bucket returns
    the highest finite bound. None where Prometheus gives NaN: no observations, no +Inf bucket, or
    fewer than two buckets. q < 0 gives -inf and q > 1 gives +inf, as in Prometheus.
    """
    if math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bounds = histogram.bounds
    if len(bounds) < 2 or bounds[-1] != math.inf:
        return None
    counts = monotonic(histogram.counts)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, in_bucket = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        in_bucket -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / in_bucket)
