"""Admission wait percentiles from Kueue's kueue_admission_wait_time_seconds histogram: the
buckets' increases over the window (a Kueue restart counted as Prometheus increase() counts it),
then histogram_quantile as Prometheus computes it, checked against the arithmetic done by hand."""

from __future__ import annotations

import itertools
import math
from datetime import timedelta

import pytest

from fleet.models import SchedulerQueue, SchedulerRollup1m
from fleet.scheduler.read import WAIT_WINDOWS, admission_waits, wait_histogram
from fleet.telemetry.histograms import histogram_quantile
from tests.fleet.scheduler.support import minute_ago, push, stamped

# Kueue's first bounds (pkg/metrics/metrics.go generateExponentialBuckets: 1, then 2.5 doubling), cut short.
BOUNDS = ("1", "2.5", "5", "10", "20", "40", "80", "+Inf")
TYPES = {"kueue_admission_wait_time_seconds": "histogram", "kueue_admitted_workloads_total": "counter"}


def _scrape(cq: str, cumulative: dict[str, float], priority_class: str = "") -> list[str]:
    pc = f',priority_class="{priority_class}"' if priority_class else ""
    lines = [
        f'kueue_admission_wait_time_seconds_bucket{{cluster_queue="{cq}"{pc},le="{le}"}} {cumulative[le]}'
        for le in BOUNDS
    ]
    lines.append(f'kueue_admission_wait_time_seconds_count{{cluster_queue="{cq}"{pc}}} {cumulative["+Inf"]}')
    return lines


def _push_scrapes(client, token, cq: str, scrapes, start, *, priority_class: str = "") -> None:  # type: ignore[no-untyped-def]
    for minute, cumulative in enumerate(scrapes):
        body = stamped(_scrape(cq, cumulative, priority_class), start + timedelta(minutes=minute), TYPES)
        assert push(client, token, body).status_code == 202


def _queue(name: str) -> int:
    return SchedulerQueue.objects.get(scheduler="kueue", name=name).pk


# Three scrapes a minute apart; Kueue restarts before the third (every bucket falls back).
SCRAPES = [
    {"1": 2, "2.5": 4, "5": 10, "10": 20, "20": 30, "40": 40, "80": 40, "+Inf": 40},
    {"1": 4, "2.5": 9, "5": 18, "10": 36, "20": 54, "40": 66, "80": 70, "+Inf": 72},
    {"1": 1, "2.5": 1, "5": 3, "10": 5, "20": 8, "40": 10, "80": 12, "+Inf": 12},
]


def test_percentiles_equal_histogram_quantile_done_by_hand_across_a_restart(client, token_a) -> None:
    start = minute_ago(10)
    _push_scrapes(client, token_a, "team-a-h100", SCRAPES, start)
    # By hand: increase() per bucket sums the rises, a fall counting from zero (the restart).
    increase = {
        le: sum(b[le] - a[le] if b[le] >= a[le] else b[le] for a, b in itertools.pairwise(SCRAPES)) for le in BOUNDS
    }
    assert increase == {"1": 3, "2.5": 6, "5": 11, "10": 21, "20": 32, "40": 36, "80": 42, "+Inf": 44}
    # p50: rank 22 falls in (10, 20] holding 32 - 21 = 11: 10 + 10 * (22 - 21) / 11.
    # p95: rank 41.8 falls in (40, 80] holding 42 - 36 = 6: 40 + 40 * (41.8 - 36) / 6.
    wait = admission_waits([_queue("team-a-h100")], window=WAIT_WINDOWS["1h"])[_queue("team-a-h100")]
    assert wait.p50 == pytest.approx(10 + 10 * 1 / 11)
    assert wait.p95 == pytest.approx(40 + 40 * 5.8 / 6)
    assert wait.admissions == 44


def test_a_rank_in_the_inf_bucket_gives_the_highest_finite_bound(client, token_a) -> None:
    start = minute_ago(5)
    low = dict.fromkeys(BOUNDS, 0)
    high = {"1": 1, "2.5": 1, "5": 1, "10": 1, "20": 1, "40": 1, "80": 1, "+Inf": 20}
    _push_scrapes(client, token_a, "slow", [low, high], start)
    wait = admission_waits([_queue("slow")], window=WAIT_WINDOWS["1h"])[_queue("slow")]
    assert (wait.p50, wait.p95) == (80, 80)


def test_the_first_bucket_interpolates_from_zero(client, token_a) -> None:
    start = minute_ago(5)
    after = {"1": 10, "2.5": 10, "5": 10, "10": 10, "20": 10, "40": 10, "80": 10, "+Inf": 10}
    _push_scrapes(client, token_a, "fast", [dict.fromkeys(BOUNDS, 0), after], start)
    wait = admission_waits([_queue("fast")], window=WAIT_WINDOWS["1h"])[_queue("fast")]
    assert (wait.p50, wait.p95) == (0.5, 0.95)


def test_priority_classes_are_added_bucket_by_bucket_before_the_quantile(client, token_a) -> None:
    start = minute_ago(5)
    zero = dict.fromkeys(BOUNDS, 0)
    quick = {"1": 10, "2.5": 10, "5": 10, "10": 10, "20": 10, "40": 10, "80": 10, "+Inf": 10}
    slow = {"1": 0, "2.5": 0, "5": 0, "10": 0, "20": 0, "40": 10, "80": 10, "+Inf": 10}
    _push_scrapes(client, token_a, "q", [zero, quick], start, priority_class="high")
    _push_scrapes(client, token_a, "q", [zero, slow], start, priority_class="low")
    wait = admission_waits([_queue("q")], window=WAIT_WINDOWS["1h"])[_queue("q")]
    # sum by (le): 10 at le=1 ... 20 from le=40; p50 is rank 10, the top of (0, 1]; p95 rank 19 in (20, 40].
    assert wait.p50 == 1 and wait.p95 == pytest.approx(20 + 20 * 9 / 10) and wait.admissions == 20


def test_the_window_counts_only_its_own_minutes(client, token_a) -> None:
    now = minute_ago(0)
    early = now - timedelta(hours=3)
    zero = dict.fromkeys(BOUNDS, 0)
    slow = {"1": 0, "2.5": 0, "5": 0, "10": 0, "20": 0, "40": 0, "80": 4, "+Inf": 4}
    fast = {"1": 6, "2.5": 6, "5": 6, "10": 6, "20": 6, "40": 6, "80": 10, "+Inf": 10}  # six more, each under 1 s
    _push_scrapes(client, token_a, "q", [zero, slow], early)  # three hours ago: four slow admissions
    _push_scrapes(client, token_a, "q", [slow, fast], now - timedelta(minutes=20))  # six quick ones since
    queue = _queue("q")
    hour = admission_waits([queue], window=WAIT_WINDOWS["1h"], now=now)[queue]
    day = admission_waits([queue], window=WAIT_WINDOWS["24h"], now=now)[queue]
    # The hour: six admissions in (0, 1]; p95 is rank 5.7 of 6 there.
    assert hour.admissions == 6 and hour.p95 == pytest.approx(5.7 / 6)
    # The day: ten; p50 rank 5 of the six in (0, 1]; p95 rank 9.5 in (40, 80], which holds 4.
    assert day.admissions == 10 and day.p50 == pytest.approx(5 / 6)
    assert day.p95 == pytest.approx(40 + 40 * (9.5 - 6) / 4)


def test_a_queue_without_admissions_in_the_window_is_left_out(client, token_a) -> None:
    start = minute_ago(5)
    same = {le: 3 for le in BOUNDS}
    _push_scrapes(client, token_a, "idle", [same, same], start)
    assert admission_waits([_queue("idle")], window=WAIT_WINDOWS["1h"]) == {}


def test_bucket_counters_roll_up_per_minute_as_increase_with_a_reset(client, token_a) -> None:
    start = minute_ago(6)
    # admitted 10 -> 16 -> (Kueue restarted) 2 -> 5: the first minute holds 6, the second 2 + 3.
    for offset, value in ((5, 10), (35, 16), (65, 2), (95, 5)):
        line = f'kueue_admitted_workloads_total{{cluster_queue="team-a-h100"}} {value}'
        assert push(client, token_a, stamped([line], start + timedelta(seconds=offset), TYPES)).status_code == 202
    rows = {r.bucket: r for r in SchedulerRollup1m.objects.filter(quantity="admitted_workloads")}
    assert rows[start].increase == 6 and rows[start].samples == 2
    assert rows[start + timedelta(minutes=1)].increase == 5 and rows[start + timedelta(minutes=1)].last == 5


def test_gauges_roll_up_without_an_increase(client, token_a) -> None:
    start = minute_ago(3)
    for offset, value in ((5, 3), (25, 9), (45, 4)):
        line = f'kueue_pending_workloads{{cluster_queue="q",status="active"}} {value}'
        body = stamped([line], start + timedelta(seconds=offset), {"kueue_pending_workloads": "gauge"})
        assert push(client, token_a, body).status_code == 202
    row = SchedulerRollup1m.objects.get(quantity="pending_workloads")
    assert (row.min, row.max, row.last, row.samples, row.increase) == (3, 9, 4, 3, None)


def test_wait_histogram_reads_le_from_the_stored_series_text() -> None:
    pairs = [('le="1"', 2.0), ('le="4"', 6.0), ('le="+Inf"', 8.0)]
    histogram = wait_histogram(pairs)
    assert histogram.bounds == (1.0, 4.0, math.inf) and histogram.counts == (2.0, 6.0, 8.0)
    assert histogram_quantile(0.5, histogram) == pytest.approx(1 + 3 * (4 - 2) / 4)


def test_a_timestamped_scrape_sent_twice_is_stored_once(client, token_a) -> None:
    body = stamped(_scrape("q", SCRAPES[0]), minute_ago(2), TYPES)
    for _ in range(2):
        assert push(client, token_a, body).status_code == 202
    assert SchedulerRollup1m.objects.filter(quantity="admission_wait_bucket").count() == len(BOUNDS)
    assert sum(r.samples for r in SchedulerRollup1m.objects.all()) == len(BOUNDS) + 1
