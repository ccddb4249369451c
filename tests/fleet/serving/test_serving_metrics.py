"""The pure serving-SLO arithmetic: names, deltas with restarts, quantiles, SLIs and burn rates."""

from __future__ import annotations

import bisect
import math
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleet.serving.metrics import (
    BURN_RULES,
    Histogram,
    Quantity,
    availability_sli,
    budget_left,
    budget_spent,
    burn_alerts,
    burn_rate,
    counter_increase,
    counter_increases,
    histogram_increase,
    histogram_increases,
    histogram_part,
    histogram_quantile,
    latency_sli,
    mean_latency,
    parse_series,
    quantity_of,
    scrape_quantities,
)

# The repository's copy of ../shared/fixtures/vllm.prom, so the suite runs anywhere.
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm.prom"
INF = math.inf
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, INF)
H1, M5, M30, H6, D3 = (
    timedelta(hours=1),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=6),
    timedelta(days=3),
)


def hist(buckets: dict[float, float], total: float = 0.0) -> Histogram:
    return Histogram.from_buckets(buckets, sum_=total)


def rows_of(text: str) -> list[tuple[str, str, float]]:
    """(metric, series, value) as the ingest stores them: canonical labels, the endpoint's
    model_name label left out."""
    rows = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
            rows.append((s.name, series, s.value))
    return rows


def fixture_text() -> str:
    return FIXTURE.read_text()


# --- names -----------------------------------------------------------------------------------


def test_vllm_current_and_older_names_are_one_quantity() -> None:
    assert quantity_of("vllm:kv_cache_usage_perc") == quantity_of("vllm:gpu_cache_usage_perc")
    assert quantity_of("vllm:kv_cache_usage_perc") == Quantity("kv_cache_usage", "gauge", 1.0)
    assert quantity_of("vllm:inter_token_latency_seconds_bucket") == Quantity("itl", "histogram", 1.0)
    assert quantity_of("vllm:time_per_output_token_seconds_bucket") == Quantity("itl", "histogram", 1.0)
    # Counters with or without the _total the exposition may carry.
    assert quantity_of("vllm:num_preemptions_total") == quantity_of("vllm:num_preemptions")
    assert quantity_of("vllm:num_preemptions_total") == Quantity("preemptions", "counter", 1.0)
    assert histogram_part("vllm:time_to_first_token_seconds_sum") == "sum"
    assert quantity_of("vllm:num_requests_swapped") is None


def test_outcome_counters_split_by_reason() -> None:
    assert quantity_of("vllm:request_success_total", {"finished_reason": "stop"}).quantity == "requests_ok"
    assert quantity_of("vllm:request_success_total", {"finished_reason": "length"}).quantity == "requests_ok"
    assert quantity_of("vllm:request_success_total", {"finished_reason": "abort"}).quantity == "requests_aborted"
    assert quantity_of("nv_inference_request_failure", {"reason": "BACKEND"}).quantity == "requests_failed"
    assert quantity_of("nv_inference_request_failure", {"reason": "CANCELED"}).quantity == "requests_aborted"


def test_triton_and_tgi_map_onto_the_same_quantities() -> None:
    assert quantity_of("nv_inference_request_success") == Quantity("requests_ok", "counter", 1.0)
    assert quantity_of("nv_inference_pending_request_count") == Quantity("waiting", "gauge", 1.0)
    assert quantity_of("nv_inference_queue_duration_us") == Quantity("queue_seconds", "counter", 1e-6)
    assert quantity_of("nv_inference_first_response_histogram_ms_bucket") == Quantity("ttft", "histogram", 1e-3)
    # nv_inference_count ends like a histogram's _count but is Triton's own counter: not ours.
    assert quantity_of("nv_inference_count") is None
    assert quantity_of("tgi_queue_size") == Quantity("waiting", "gauge", 1.0)
    assert quantity_of("tgi_request_mean_time_per_token_duration_bucket") == Quantity("itl", "histogram", 1.0)
    assert quantity_of("tgi_request_input_length_count") == Quantity("prompt_tokens_hist", "histogram", 1.0)
    assert quantity_of("tgi_request_duration_bucket").quantity == "e2e"


def test_parse_series_unescapes_label_values() -> None:
    assert parse_series(r'finished_reason="stop",le="0.5",x="a\"b\\c\nd"') == {
        "finished_reason": "stop",
        "le": "0.5",
        "x": 'a"b\\c\nd',
    }


def test_old_name_only_and_new_name_only_scrapes_give_the_same_quantities() -> None:
    new = fixture_text()
    old = new.replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds").replace(
        "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
    )
    assert "inter_token_latency" not in old and "kv_cache_usage_perc" not in old
    a, b = scrape_quantities(rows_of(new)), scrape_quantities(rows_of(old))
    assert a == b
    assert a.gauges["kv_cache_usage"] == pytest.approx(0.8713)
    assert a.histograms["itl"].count == 8980254


def test_a_scrape_with_both_names_counts_the_current_one_only() -> None:
    rows = [
        ("vllm:kv_cache_usage_perc", 'engine="0"', 0.5),
        ("vllm:gpu_cache_usage_perc", 'engine="0"', 0.9),
        ("vllm:num_requests_waiting", 'engine="0"', 3.0),
        ("vllm:num_requests_waiting", 'engine="1"', 4.0),
    ]
    q = scrape_quantities(rows)
    assert q.gauges == {"kv_cache_usage": 0.5, "waiting": 7.0}  # waiting summed over engines


def test_fixture_quantities_and_outcomes() -> None:
    q = scrape_quantities(rows_of(fixture_text()))
    assert q.gauges == {"running": 48.0, "waiting": 7.0, "kv_cache_usage": pytest.approx(0.8713)}
    # stop 40102 + length 2211 are good; abort 37 is the client's doing.
    assert q.counters["requests_ok"] == 42313
    assert q.counters["requests_aborted"] == 37
    assert q.counters["preemptions"] == 12
    assert q.histograms["ttft"].sum == pytest.approx(18342.77)


def test_triton_scrape_scales_to_seconds() -> None:
    rows = [
        ("nv_inference_request_success", 'version="1"', 1000.0),
        ("nv_inference_request_failure", 'reason="BACKEND",version="1"', 10.0),
        ("nv_inference_request_duration_us", 'version="1"', 250_000_000.0),
        ("nv_inference_first_response_histogram_ms_bucket", 'le="100",version="1"', 600.0),
        ("nv_inference_first_response_histogram_ms_bucket", 'le="500",version="1"', 1000.0),
        ("nv_inference_first_response_histogram_ms_bucket", 'le="+Inf",version="1"', 1010.0),
        ("nv_inference_first_response_histogram_ms_count", 'version="1"', 1010.0),
    ]
    q = scrape_quantities(rows)
    assert q.histograms["ttft"].bounds == (0.1, 0.5, INF)
    assert q.counters["e2e_seconds"] == pytest.approx(250.0)
    # 250 s over 1010 finished requests: 0.2475 s each.
    assert mean_latency(q.counters["e2e_seconds"], q.counters["requests_ok"] + q.counters["requests_failed"]) == (
        pytest.approx(250 / 1010)
    )
    assert mean_latency(5.0, 0.0) is None


# --- deltas ----------------------------------------------------------------------------------


def test_a_lower_counter_scrape_is_a_restart() -> None:
    assert counter_increase(100.0, 130.0) == 30.0
    assert counter_increase(100.0, 30.0) == 30.0  # restarted, counted 30 since
    assert counter_increase(None, 30.0) == 0.0
    # 10 -> 50 (+40) -> 5 (restart, +5) -> 20 (+15)
    assert counter_increases([10.0, 50.0, 5.0, 20.0]) == 60.0


def test_histogram_deltas_per_le_with_count_and_sum() -> None:
    a = hist({0.1: 10, 0.5: 30, INF: 40}, total=8.0)
    b = hist({0.1: 15, 0.5: 45, INF: 60}, total=12.5)
    d = histogram_increase(a, b)
    assert d.bounds == (0.1, 0.5, INF)
    assert d.counts == (5, 15, 20)
    assert (d.count, d.sum) == (20, 4.5)


def test_a_lower_histogram_scrape_is_a_restart_of_the_whole_histogram() -> None:
    before = hist({0.1: 100, 0.5: 300, INF: 400}, total=80.0)
    after = hist({0.1: 3, 0.5: 9, INF: 10}, total=2.0)
    d = histogram_increase(before, after)
    assert d == after  # the new counts are the increase since the restart
    assert min(d.counts) >= 0 and d.count == 10
    # Only one bucket went down (count rose): still a restart, and no bucket delta is negative.
    odd = hist({0.1: 50, 0.5: 350, INF: 450}, total=90.0)
    assert histogram_increase(before, odd) == odd
    # Over a run: 400 -> restart -> 10 -> 25: 10 + 15 observations.
    later = hist({0.1: 8, 0.5: 20, INF: 25}, total=5.0)
    run = histogram_increases([before, after, later])
    assert run.counts == (8, 20, 25) and run.count == 25


def test_engines_merge_per_le() -> None:
    rows = [
        ("vllm:e2e_request_latency_seconds_bucket", 'engine="0",le="1.0"', 4.0),
        ("vllm:e2e_request_latency_seconds_bucket", 'engine="0",le="+Inf"', 5.0),
        ("vllm:e2e_request_latency_seconds_bucket", 'engine="1",le="1.0"', 6.0),
        ("vllm:e2e_request_latency_seconds_bucket", 'engine="1",le="+Inf"', 9.0),
        ("vllm:e2e_request_latency_seconds_count", 'engine="0"', 5.0),
        ("vllm:e2e_request_latency_seconds_count", 'engine="1"', 9.0),
        ("vllm:e2e_request_latency_seconds_sum", 'engine="0"', 3.0),
        ("vllm:e2e_request_latency_seconds_sum", 'engine="1"', 7.5),
    ]
    e2e = scrape_quantities(rows).histograms["e2e"]
    assert (e2e.bounds, e2e.counts, e2e.count, e2e.sum) == ((1.0, INF), (10.0, 14.0), 14.0, 10.5)
    assert histogram_increase(None, e2e).counts == (0.0, 0.0)  # a first scrape: no interval yet


# --- quantiles -------------------------------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket() -> None:
    h = hist({0.1: 10, 0.5: 30, INF: 40})
    # rank 0.5 x 40 = 20: bucket (0.1, 0.5] holds 20 with 10 below: 0.1 + 0.4 x 10/20
    assert histogram_quantile(0.5, h) == pytest.approx(0.3)
    # rank 4 in the lowest bucket, interpolated from 0: 0.1 x 4/10
    assert histogram_quantile(0.1, h) == pytest.approx(0.04)
    # rank 39.6 is in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, h) == 0.5


def test_quantile_edge_cases_as_prometheus() -> None:
    assert histogram_quantile(0.5, hist({0.1: 0, INF: 0})) is None
    assert histogram_quantile(0.5, hist({0.1: 5, 0.5: 10})) is None  # no +Inf bucket
    assert histogram_quantile(0.5, Histogram((), ())) is None
    assert histogram_quantile(-0.1, hist({0.1: 5, INF: 5})) == -INF
    assert histogram_quantile(1.1, hist({0.1: 5, INF: 5})) == INF
    assert histogram_quantile(0.5, hist({-1.0: 5, 0.0: 6, INF: 10})) == -1.0  # lowest bound <= 0


def test_non_monotonic_buckets_are_fixed_as_prometheus_does() -> None:
    h = hist({0.1: 4, 0.2: 10, 0.3: 8, 0.5: 20, INF: 20})
    # Fixed counts 4, 10, 10, 20, 20. rank 0.55 x 20 = 11 in (0.3, 0.5]: 0.3 + 0.2 x (11-10)/(20-10) = 0.32
    # (unfixed, 8 below it, would give 0.3 + 0.2 x 3/12 = 0.35).
    assert histogram_quantile(0.55, h) == pytest.approx(0.32)


@settings(max_examples=200, deadline=None)
@given(
    latencies=st.lists(st.floats(min_value=0.0, max_value=79.0, allow_nan=False), min_size=1, max_size=400),
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999, 1.0]),
)
def test_quantiles_agree_with_exact_percentiles_within_the_bucket(latencies: list[float], q: float) -> None:
    # Bucket raw latencies as an exporter would (le is inclusive), then compare with the exact
    # percentile: the ceil(q x n)-th smallest latency.
    counts = [0] * len(TTFT_BOUNDS)
    for v in latencies:
        counts[bisect.bisect_left(TTFT_BOUNDS, v)] += 1
    cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
    estimate = histogram_quantile(q, Histogram(TTFT_BOUNDS, tuple(cumulative), len(latencies), sum(latencies)))
    exact = sorted(latencies)[math.ceil(q * len(latencies)) - 1]
    b = bisect.bisect_left(TTFT_BOUNDS, exact)
    low, high = (TTFT_BOUNDS[b - 1] if b else 0.0), TTFT_BOUNDS[b]
    assert estimate is not None
    assert low - 1e-12 <= estimate <= high + 1e-12
    assert abs(estimate - exact) <= high - low + 1e-12


def _independent_p99(text: str, name: str) -> float:
    """p99 straight from the exposition's bucket lines: find the first bucket whose cumulative
    count reaches 0.99 x total and interpolate linearly from the previous bound."""
    points = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name + "_bucket":
                points.append((float(s.labels["le"]), s.value))
    points.sort()
    total = points[-1][1]
    rank = 0.99 * total
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in points:
        if count >= rank:
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (count - previous_count)
        previous_bound, previous_count = bound, count
    raise AssertionError("rank beyond the last bucket")


def test_fixture_ttft_and_itl_p99_match_an_independent_calculation() -> None:
    text = fixture_text()
    q = scrape_quantities(rows_of(text))
    ttft_p99 = histogram_quantile(0.99, q.histograms["ttft"])
    itl_p99 = histogram_quantile(0.99, q.histograms["itl"])
    assert ttft_p99 == pytest.approx(_independent_p99(text, "vllm:time_to_first_token_seconds"))
    assert itl_p99 == pytest.approx(_independent_p99(text, "vllm:inter_token_latency_seconds"))
    # By hand. TTFT: 42252 x 0.99 = 41829.48, in (2.5, 5] (41662 -> 41962): 2.5 + 2.5 x 167.48/300.
    assert ttft_p99 == pytest.approx(2.5 + 2.5 * 167.48 / 300)
    # ITL: 8980254 x 0.99 = 8890451.46, in (0.1, 0.15] (8840000 -> 8930000): 0.1 + 0.05 x 50451.46/90000.
    assert itl_p99 == pytest.approx(0.1 + 0.05 * 50451.46 / 90000)


# --- SLIs and budgets ------------------------------------------------------------------------


def test_latency_sli_on_a_bound_is_exact_and_between_bounds_is_interpolated() -> None:
    h = hist({0.25: 60, 0.5: 90, 1.0: 98, INF: 100})
    on_bound = latency_sli(h, 0.5)
    assert (on_bound.good, on_bound.total, on_bound.interpolated) == (90, 100, False)
    assert on_bound.ratio == 0.9
    # 0.3 is 1/5 of the way from 0.25 to 0.5: 60 + 30 x 0.2 = 66
    between = latency_sli(h, 0.3)
    assert between.good == pytest.approx(66) and between.interpolated
    # below the lowest bound, from 0: 60 x 0.1/0.25 = 24
    assert latency_sli(h, 0.1).good == pytest.approx(24)
    # past the last finite bound the +Inf bucket's 2 are not known to be good
    past = latency_sli(h, 5.0)
    assert (past.good, past.interpolated) == (98, True)
    assert latency_sli(hist({0.5: 0, INF: 0}), 0.5).ratio is None


def test_availability_burn_and_budget() -> None:
    sli = availability_sli(ok=9990, failed=10)
    assert sli.error_ratio == pytest.approx(0.001)
    assert burn_rate(0.001, 0.999) == pytest.approx(1.0)
    assert burn_rate(0.0144, 0.999) == pytest.approx(14.4)
    assert budget_left(0.00025, 0.999) == pytest.approx(0.75)
    assert budget_left(0.002, 0.999) == pytest.approx(-1.0)  # overspent
    assert budget_spent(14.4, H1) == pytest.approx(0.02)
    assert budget_spent(6.0, H6) == pytest.approx(0.05)
    assert budget_spent(1.0, D3) == pytest.approx(0.10)
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError):
            burn_rate(0.01, bad)


# --- burn-rate alerts ------------------------------------------------------------------------


def _fired(ratios: dict[timedelta, float | None], target: float = 0.999) -> set[str]:
    return {a.rule.name for a in burn_alerts(ratios, target)}


def test_burn_rate_edges_page_only_above_14_4_on_both_windows() -> None:
    # 99.9 %: 14.3x is an error ratio of 0.0143, 14.5x of 0.0145.
    assert _fired({H1: 0.0143, M5: 0.0143}) == set()
    assert _fired({H1: 0.0145, M5: 0.0145}) == {"fast_burn"}
    assert _fired({H1: 0.0145, M5: 0.0143}) == set()  # the short window has recovered
    assert _fired({H1: 0.0143, M5: 0.0145}) == set()  # a blip, not a sustained burn
    assert _fired({H1: 0.0144, M5: 0.0144}) == set()  # exactly 14.4x: the Workbook's ">"
    assert _fired({H1: 0.0145, M5: None}) == set()  # no traffic in the short window


def test_medium_and_slow_burn_rules() -> None:
    assert _fired({H6: 0.0061, M30: 0.0061}) == {"medium_burn"}
    assert _fired({H6: 0.0059, M30: 0.0061}) == set()
    assert _fired({D3: 0.0011, H6: 0.0011}) == {"slow_burn"}
    # Everything burning fast fires all three, pages and the ticket.
    everything = burn_alerts({w: 0.02 for w in (M5, M30, H1, H6, D3)}, 0.999)
    assert [(a.rule.name, a.rule.severity) for a in everything] == [
        ("fast_burn", "page"),
        ("medium_burn", "page"),
        ("slow_burn", "ticket"),
    ]
    fast = everything[0]
    assert fast.long_burn == pytest.approx(20.0)
    assert fast.budget_spent == pytest.approx(20.0 / 720)  # 1 h of 720 at 20x
    assert [r.factor for r in BURN_RULES] == [14.4, 6.0, 1.0]


def test_a_99_percent_latency_slo_burns_from_the_sli() -> None:
    # TTFT SLO: 99 % within 500 ms. 97 of 100 fast: error ratio 0.03, burn 3x.
    h = hist({0.25: 60, 0.5: 97, INF: 100})
    err = latency_sli(h, 0.5).error_ratio
    assert err == pytest.approx(0.03)
    assert burn_rate(err, 0.99) == pytest.approx(3.0)
    assert _fired({H6: err, M30: err}, target=0.99) == set()
    assert _fired({D3: err, H6: err}, target=0.99) == {"slow_burn"}


# --- per-bucket counts to a cumulative histogram: one rule for +Inf ---------------------------------


def test_bucket_counts_become_cumulative_and_end_with_inf_holding_the_total() -> None:
    h = Histogram.from_bucket_counts({0.5: 2.0, 0.1: 3.0, 1.0: 1.0})
    assert h.bounds == (0.1, 0.5, 1.0, math.inf)
    assert h.counts == (3.0, 5.0, 6.0, 6.0)
    assert h.count == 6.0 and h.total == 6.0


def test_a_bucket_at_inf_counts_the_observations_above_the_last_bound() -> None:
    h = Histogram.from_bucket_counts({0.1: 3.0, math.inf: 2.0}, count=5.0, sum_=1.5)
    assert h.bounds == (0.1, math.inf) and h.counts == (3.0, 5.0)
    assert (h.count, h.sum) == (5.0, 1.5)
    assert histogram_quantile(0.99, h) == 0.1  # the rank falls in +Inf: the last finite bound


def test_no_buckets_make_the_empty_histogram() -> None:
    h = Histogram.from_bucket_counts({})
    assert (h.bounds, h.counts, h.total) == ((), (), 0.0)
    assert histogram_quantile(0.5, h) is None


def test_rollup_buckets_without_inf_still_give_quantiles() -> None:
    """Prometheus gives no quantile (NaN) for a histogram without +Inf; buckets summed from
    rollups that stop short of it get +Inf holding their total, whichever read sums them."""
    per_bucket = {0.05: 10.0, 0.1: 30.0, 0.25: 50.0, 0.5: 10.0}
    cumulative = (10.0, 40.0, 90.0, 100.0)
    assert histogram_quantile(0.5, Histogram(tuple(sorted(per_bucket)), cumulative, 100.0)) is None
    h = Histogram.from_bucket_counts(per_bucket)
    assert histogram_quantile(0.5, h) == pytest.approx(0.1 + 0.15 * 10 / 50)  # 0.13, inside (0.1, 0.25]
    assert histogram_quantile(0.95, h) == pytest.approx(0.25 + 0.25 * 5 / 10)
