"""Serving rollups and the reads on them: per-minute increases from cumulative scrapes (restarts
included), hours from minutes, window totals, percentiles and SLIs that agree with raw."""

from __future__ import annotations

import math
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from fleet.ingest.prometheus import parse_exposition, store_exposition
from fleet.models import Endpoint, ServingRollup1h, ServingRollup1m, Site
from fleet.serving import metrics as sm
from fleet.serving import rollups as serving_rollups
from fleet.serving import slo as serving
from fleet.serving.store import ServingPoint, store_serving_points

pytestmark = pytest.mark.django_db

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm.prom"
NOW = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _fixture_text() -> str:
    return FIXTURE.read_text()


def _scaled(text: str, factor: float) -> str:
    """The fixture with every sample value multiplied (a later scrape of the same server)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        head, value = line.rsplit(" ", 1)
        out.append(f"{head} {float(value) * factor!r}")
    return "\n".join(out) + "\n"


def _push(site: Site, text: str, ts: datetime, key: str) -> None:
    exposition = parse_exposition(text, kind="vllm", now=ts)
    store_exposition(exposition, site_id=site.pk, batch_key=key)


def _histogram_points(
    endpoint: str, ts: datetime, cumulative: dict[float, float], *, name: str, total_sum: float = 0.0
) -> list[ServingPoint]:
    points = []
    for le in (*BOUNDS, math.inf):
        text = "+Inf" if le == math.inf else repr(le)
        points.append(
            ServingPoint(endpoint, "vllm", endpoint, ts, f"{name}_bucket", f'le="{text}"', cumulative.get(le, 0.0))
        )
    points.append(ServingPoint(endpoint, "vllm", endpoint, ts, f"{name}_count", "", cumulative.get(math.inf, 0.0)))
    points.append(ServingPoint(endpoint, "vllm", endpoint, ts, f"{name}_sum", "", total_sum))
    return points


def _cumulative(latencies: list[float]) -> dict[float, float]:
    return {le: float(sum(1 for x in latencies if x <= le)) for le in (*BOUNDS, math.inf)}


def _endpoint(site: Site, name: str = "m") -> Endpoint:
    return Endpoint.objects.get(site=site, name=name)


def test_vllm_fixture_gives_the_p99s_an_independent_calculation_gives(site_a: Site) -> None:
    text = _fixture_text()
    _push(site_a, text, NOW - timedelta(minutes=2), "a")
    _push(site_a, _scaled(text, 2.0), NOW - timedelta(minutes=1), "b")
    serving_rollups.roll_everything(now=NOW)
    endpoint = Endpoint.objects.get(site=site_a)

    def independent_p99(metric: str) -> float:
        # Parse the cumulative buckets by hand and interpolate inside the bucket holding rank 0.99 n.
        buckets = sorted(
            (math.inf if le == "+Inf" else float(le), float(v))
            for le, v in re.findall(rf'^{re.escape(metric)}_bucket{{le="([^"]+)"[^}}]*}} (\S+)$', text, re.M)
        )
        rank = 0.99 * buckets[-1][1]
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in buckets:
            if count >= rank:
                return (lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)) * 1000
            lower_bound, lower_count = bound, count
        raise AssertionError("no bucket holds the rank")

    ttft, itl = independent_p99("vllm:time_to_first_token_seconds"), independent_p99("vllm:inter_token_latency_seconds")
    since = serving.since_start(endpoint.pk, now=NOW)
    assert since is not None
    assert since["ttft"]["p99"] == pytest.approx(ttft, abs=1e-3)
    assert since["itl"]["p99"] == pytest.approx(itl, abs=1e-3)
    # The interval between the two scrapes saw exactly the fixture's counts again.
    window = serving.window_totals(endpoint.pk, {"5m": timedelta(minutes=5)}, now=NOW)["5m"]
    figures = serving.latency_figures(window)
    assert figures["ttft"]["p99"] == pytest.approx(ttft, abs=1e-3)
    assert figures["itl"]["p99"] == pytest.approx(itl, abs=1e-3)
    assert window.counters["requests_ok"] == pytest.approx(40102 + 2211)
    assert window.counters["requests_aborted"] == pytest.approx(37)


def test_quantiles_agree_with_exact_percentiles_within_the_bucket(site_a: Site) -> None:
    rng = random.Random(7)
    latencies: list[float] = []
    points: list[ServingPoint] = []
    ts = NOW - timedelta(minutes=30)
    points += _histogram_points("m", ts, {}, name="vllm:time_to_first_token_seconds")
    for minute in range(1, 21):
        latencies += [rng.lognormvariate(math.log(0.2), 0.6) for _ in range(50)]
        when = NOW - timedelta(minutes=30) + timedelta(minutes=minute)
        points += _histogram_points(
            "m", when, _cumulative(latencies), name="vllm:time_to_first_token_seconds", total_sum=sum(latencies)
        )
    store_serving_points(site_id=site_a.pk, batch_key="q", points=points)
    serving_rollups.roll_everything(now=NOW)
    totals = serving.window_totals(_endpoint(site_a).pk, {"1h": timedelta(hours=1)}, now=NOW)["1h"]
    histogram = totals.histogram("ttft")
    assert histogram.total == len(latencies)
    assert histogram.sum == pytest.approx(sum(latencies))
    ordered = sorted(latencies)
    edges = (0.0, *BOUNDS, math.inf)
    for q in (0.5, 0.9, 0.99):
        exact = ordered[math.ceil(q * len(ordered)) - 1]
        estimate = sm.histogram_quantile(q, histogram)
        assert estimate is not None
        # Both fall in the same bucket (or the estimate is the top finite bound for a rank in +Inf).
        bucket = next(i for i in range(1, len(edges)) if exact <= edges[i])
        low, high = edges[bucket - 1], edges[bucket]
        if high == math.inf:
            assert estimate == BOUNDS[-1]
        else:
            assert low <= estimate <= high, (q, exact, estimate)


def test_a_lower_second_scrape_is_a_restart_never_a_negative_rate(site_a: Site) -> None:
    first = _cumulative([0.07] * 1000)
    second = _cumulative([0.3] * 4)  # the server restarted and has served four requests since
    ok = "vllm:request_success_total"
    points = _histogram_points("m", NOW - timedelta(minutes=3), first, name="vllm:time_to_first_token_seconds")
    points += _histogram_points("m", NOW - timedelta(minutes=2), second, name="vllm:time_to_first_token_seconds")
    points += [
        ServingPoint("m", "vllm", "m", NOW - timedelta(minutes=3), ok, 'finished_reason="stop"', 1000),
        ServingPoint("m", "vllm", "m", NOW - timedelta(minutes=2), ok, 'finished_reason="stop"', 4),
    ]
    store_serving_points(site_id=site_a.pk, batch_key="r", points=points)
    serving_rollups.roll_everything(now=NOW)
    assert not ServingRollup1m.objects.filter(value__lt=0).exists()
    totals = serving.window_totals(_endpoint(site_a).pk, {"10m": timedelta(minutes=10)}, now=NOW)["10m"]
    assert totals.histogram("ttft").total == 4
    assert totals.counters["requests_ok"] == 4
    assert sm.histogram_quantile(0.5, totals.histogram("ttft")) == pytest.approx(0.25 + 0.25 * 0.5)


def test_old_and_current_vllm_names_give_the_same_endpoint_figures(site_a: Site, site_b: Site) -> None:
    current = _fixture_text()
    legacy = current.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc").replace(
        "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
    )
    assert "inter_token_latency" not in legacy and "kv_cache_usage_perc" not in legacy
    for site, text in ((site_a, current), (site_b, legacy)):
        _push(site, text, NOW - timedelta(minutes=2), f"{site.pk}a")
        _push(site, _scaled(text, 1.5), NOW - timedelta(minutes=1), f"{site.pk}b")
    serving_rollups.roll_everything(now=NOW)
    figures = []
    for site in (site_a, site_b):
        endpoint = Endpoint.objects.get(site=site)
        windows = serving.window_totals(endpoint.pk, {"5m": timedelta(minutes=5)}, now=NOW)
        series = serving.timeseries(endpoint.pk, NOW - timedelta(minutes=5), NOW)
        since = serving.since_start(endpoint.pk, now=NOW)
        figures.append((serving.latency_figures(windows["5m"]), windows["5m"].counters, series, since))
    assert figures[0] == figures[1]
    assert figures[0][2][-1]["kv_cache_usage"] == pytest.approx(0.8713 * 1.5, abs=1e-4)


def test_a_scrape_carrying_both_names_counts_each_quantity_once(site_a: Site) -> None:
    text = _fixture_text()
    both = text + "\n".join(
        line.replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
        for line in text.splitlines()
        if line.startswith("vllm:inter_token_latency_seconds")
    )
    _push(site_a, both, NOW - timedelta(minutes=2), "a")
    _push(site_a, _scaled(both, 2.0), NOW - timedelta(minutes=1), "b")
    serving_rollups.roll_everything(now=NOW)
    totals = serving.window_totals(Endpoint.objects.get(site=site_a).pk, {"5m": timedelta(minutes=5)}, now=NOW)
    assert totals["5m"].histogram("itl").total == 8980254


def test_hours_and_minutes_add_up_to_the_same_totals_as_minutes_alone(site_a: Site) -> None:
    ok = "vllm:request_success_total"
    points = []
    start = NOW - timedelta(hours=5)
    value = 0.0
    for i in range(0, 5 * 60, 1):  # one scrape a minute for five hours, 10 requests a minute
        points.append(ServingPoint("m", "vllm", "m", start + timedelta(minutes=i), ok, 'finished_reason="stop"', value))
        value += 10
    store_serving_points(site_id=site_a.pk, batch_key="h", points=points)
    serving_rollups.roll_everything(now=NOW)
    assert ServingRollup1h.objects.filter(quantity="requests_ok").count() >= 5
    endpoint = _endpoint(site_a)
    windows = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "3h": timedelta(hours=3), "6h": timedelta(hours=6)}
    totals = serving.window_totals(endpoint.pk, windows, now=NOW)
    last = start + timedelta(minutes=299)  # the last scrape; the first one counts nothing
    for name, length in windows.items():
        begin = max(start + timedelta(minutes=1), (NOW - length).replace(second=0) + timedelta(minutes=1))
        expected = 10 * ((last - begin) // timedelta(minutes=1) + 1)
        assert totals[name].counters["requests_ok"] == pytest.approx(expected), name


def test_late_scrapes_re_roll_their_minute_and_the_next(site_a: Site) -> None:
    ok = "vllm:request_success_total"
    t0 = (NOW - timedelta(minutes=30)).replace(second=0)
    points = [
        ServingPoint("m", "vllm", "m", t0, ok, 'finished_reason="stop"', 0),
        ServingPoint("m", "vllm", "m", t0 + timedelta(minutes=2), ok, 'finished_reason="stop"', 100),
    ]
    store_serving_points(site_id=site_a.pk, batch_key="x", points=points)
    serving_rollups.roll_everything(now=NOW)
    endpoint = _endpoint(site_a)
    row = ServingRollup1m.objects.get(endpoint=endpoint, quantity="requests_ok")
    assert row.bucket == t0 + timedelta(minutes=2) and row.value == 100
    # The missing middle scrape arrives late: the increase splits between its minute and the next.
    late = [ServingPoint("m", "vllm", "m", t0 + timedelta(minutes=1), ok, 'finished_reason="stop"', 40)]
    store_serving_points(site_id=site_a.pk, batch_key="y", points=late)
    serving_rollups.roll_everything(now=NOW)
    rows = dict(
        ServingRollup1m.objects.filter(endpoint=endpoint, quantity="requests_ok").values_list("bucket", "value")
    )
    assert rows == {t0 + timedelta(minutes=1): 40, t0 + timedelta(minutes=2): 60}


def test_slo_status_and_interpolated_threshold(site_a: Site) -> None:
    # 1000 requests: 985 at 70 ms, 15 at 700 ms; TTFT SLO 99 % under 500 ms is missed (98.5 %).
    latencies = [0.07] * 985 + [0.7] * 15
    points = _histogram_points("m", NOW - timedelta(minutes=3), {}, name="vllm:time_to_first_token_seconds")
    points += _histogram_points(
        "m", NOW - timedelta(minutes=2), _cumulative(latencies), name="vllm:time_to_first_token_seconds"
    )
    store_serving_points(site_id=site_a.pk, batch_key="s", points=points)
    serving_rollups.roll_everything(now=NOW)
    endpoint = _endpoint(site_a)
    status = serving.slo_status(endpoint, now=NOW)
    ttft = status["ttft"]
    assert ttft["sli"] == pytest.approx(0.985)
    assert ttft["interpolated"] is False  # 500 ms is a bucket bound
    assert ttft["budget_left"] == pytest.approx(1 - 0.015 / 0.01)
    assert ttft["windows"]["5m"]["burn_rate"] == pytest.approx(1.5)
    Endpoint.objects.filter(pk=endpoint.pk).update(ttft_threshold_ms=400)
    endpoint.refresh_from_db()
    assert serving.slo_status(endpoint, now=NOW)["ttft"]["interpolated"] is True
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fleet_servingrollupdirty")
        assert cursor.fetchone()[0] == 0


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _bump(text: str, increases: dict[str, float], *, match: str = "") -> str:
    """A later scrape: each sample whose name is in ``increases`` (and whose line contains
    ``match``) grows by that amount; histogram buckets at or above a bound grow with it."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip() or match not in line:
            out.append(line)
            continue
        head, value = line.rsplit(" ", 1)
        name = head.split("{", 1)[0]
        out.append(f"{head} {float(value) + increases.get(name, 0.0)!r}")
    return "\n".join(out) + "\n"


def test_triton_counters_give_mean_queue_and_compute_time_pending_and_failures(site_a: Site) -> None:
    text = (FIXTURES / "triton.prom").read_text()
    later = _bump(
        text,
        {
            "nv_inference_request_success": 1000,
            "nv_inference_queue_duration_us": 1000 * 4_000,  # 4 ms queued per request
            "nv_inference_compute_infer_duration_us": 1000 * 25_000,  # 25 ms of inference
            "nv_inference_request_duration_us": 1000 * 31_000,
        },
        match='model="bert_large",version="3"',
    )
    for i, body in enumerate((text, later)):
        exposition = parse_exposition(body, kind="triton", now=NOW - timedelta(minutes=2 - i))
        store_exposition(exposition, site_id=site_a.pk, batch_key=f"t{i}")
    serving_rollups.roll_everything(now=NOW)
    bert = Endpoint.objects.get(site=site_a, name="bert_large")
    point = serving.timeseries(bert.pk, NOW - timedelta(minutes=5), NOW)[-1]
    assert point["queue_mean_ms"] == pytest.approx(4.0)
    assert point["compute_mean_ms"] == pytest.approx(25.0)
    assert point["request_mean_ms"] == pytest.approx(31.0)
    assert point["waiting"] == pytest.approx(11)  # pending requests, both versions summed
    since = serving.since_start(bert.pk, now=NOW)
    assert since is not None
    # Failures by reason: CANCELED is the client's doing (aborted), BACKEND and REJECTED are failures.
    assert since["requests"]["requests_failed"] == 2 + 7 + 126
    assert since["requests"]["requests_aborted"] == 41


def test_tgi_histograms_map_onto_the_same_quantities(site_a: Site) -> None:
    text = (FIXTURES / "tgi.prom").read_text()
    exposition = parse_exposition(text, kind="tgi", endpoint="tgi-mistral", now=NOW - timedelta(minutes=1))
    store_exposition(exposition, site_id=site_a.pk, batch_key="tgi")
    endpoint = Endpoint.objects.get(site=site_a, name="tgi-mistral")
    since = serving.since_start(endpoint.pk, now=NOW)
    assert since is not None
    buckets = sorted(
        (math.inf if le == "+Inf" else float(le), float(v))
        for le, v in re.findall(r'^tgi_request_duration_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)
    )
    expected = sm.histogram_quantile(0.99, sm.Histogram.from_buckets(dict(buckets)))
    assert expected is not None
    assert since["e2e"]["p99"] == pytest.approx(expected * 1000, abs=1e-3)
    assert since["itl"]["count"] > 0  # tgi_request_mean_time_per_token_duration
    assert since["ttft"]["count"] == 0  # TGI exposes no time-to-first-token histogram
    assert since["gauges"]["waiting"] == 4 and since["gauges"]["running"] == 31


def test_rollup_lag_and_retention_bounds(site_a: Site) -> None:
    ok = "vllm:request_success_total"
    old = NOW - timedelta(days=400)  # past every rollup retention: dropped from the queue, not rolled
    points = [
        ServingPoint("m", "vllm", "m", NOW - timedelta(minutes=6), ok, 'finished_reason="stop"', 1),
        ServingPoint("m", "vllm", "m", NOW - timedelta(minutes=5), ok, 'finished_reason="stop"', 2),
    ]
    store_serving_points(site_id=site_a.pk, batch_key="lag", points=points)
    assert serving_rollups.rollup_lag_seconds(now=NOW) > 4 * 60
    serving_rollups.mark_dirty([(_endpoint(site_a).pk, old)], now=NOW)
    serving_rollups.roll_everything(now=NOW)
    assert serving_rollups.rollup_lag_seconds(now=NOW) == 0
    assert not ServingRollup1m.objects.filter(bucket__lt=NOW - timedelta(days=100)).exists()
    assert ServingRollup1m.objects.filter(quantity="requests_ok").count() == 1


def test_a_late_scrape_re_rolls_the_current_minute_after_it(site_a: Site) -> None:
    ok = "vllm:request_success_total"
    now = timezone.now()  # the writer judges "current minute" by the real clock
    current = now.replace(second=0, microsecond=0)
    early = [
        ServingPoint("m", "vllm", "m", current - timedelta(seconds=50), ok, 'finished_reason="stop"', 100),
        ServingPoint("m", "vllm", "m", now, ok, 'finished_reason="stop"', 300),
    ]
    store_serving_points(site_id=site_a.pk, batch_key="e", points=early)
    serving_rollups.roll_everything(now=now)
    late = [ServingPoint("m", "vllm", "m", current - timedelta(seconds=20), ok, 'finished_reason="stop"', 200)]
    store_serving_points(site_id=site_a.pk, batch_key="l", points=late)
    serving_rollups.roll_everything(now=now)
    totals = serving.window_totals(_endpoint(site_a).pk, {"5m": timedelta(minutes=5)}, now=now)["5m"]
    assert totals.counters["requests_ok"] == 200  # 100 -> 200 -> 300, never 300


def test_an_upgrade_to_current_names_inside_one_run_keeps_the_old_minutes(site_a: Site) -> None:
    points = []
    start = (NOW - timedelta(minutes=25)).replace(second=0)
    for i in range(21):
        name = "vllm:time_per_output_token_seconds" if i < 10 else "vllm:inter_token_latency_seconds"
        value = 0.0 if i in (0, 10) else float(90 * (i if i < 10 else i - 10))
        when = start + timedelta(minutes=i)
        points += _histogram_points("m", when, {0.05: value, math.inf: value}, name=name)
    store_serving_points(site_id=site_a.pk, batch_key="u", points=points)
    serving_rollups.roll_everything(now=NOW)
    totals = serving.window_totals(_endpoint(site_a).pk, {"1h": timedelta(hours=1)}, now=NOW)["1h"]
    assert totals.histogram("itl").total == 9 * 90 + 10 * 90


def test_a_histogram_restart_resets_every_bucket_together(site_a: Site) -> None:
    # Before: 100 fast requests. After a restart: 150 slow ones. The +Inf bucket grew (100 -> 150)
    # while the fast bucket fell (100 -> 0): the whole histogram restarted, not just one bucket.
    name = "vllm:time_to_first_token_seconds"
    points = _histogram_points("m", NOW - timedelta(minutes=3), _cumulative([0.04] * 100), name=name)
    points += _histogram_points("m", NOW - timedelta(minutes=2), _cumulative([2.0] * 150), name=name)
    store_serving_points(site_id=site_a.pk, batch_key="hr", points=points)
    serving_rollups.roll_everything(now=NOW)
    assert not ServingRollup1m.objects.filter(value__lt=0).exists()
    histogram = serving.window_totals(_endpoint(site_a).pk, {"5m": timedelta(minutes=5)}, now=NOW)["5m"].histogram(
        "ttft"
    )
    assert histogram.total == 150
    assert sm.latency_sli(histogram, 0.5).good == 0


def test_triton_millisecond_histograms_count_requests_not_thousandths(site_a: Site) -> None:
    # nv_inference_first_response_histogram_ms: the 1e-3 turns its bounds into seconds; its bucket
    # counts are requests. 1,000 more requests, all within 100 ms, between two scrapes.
    text = (FIXTURES / "triton.prom").read_text()
    histogram = "nv_inference_first_response_histogram_ms"
    later = _bump(
        text,
        {f"{histogram}_bucket": 1000, f"{histogram}_count": 1000, f"{histogram}_sum": 1000 * 40},
        match='model="bert_large",version="3"',
    )
    for i, body in enumerate((text, later)):
        exposition = parse_exposition(body, kind="triton", now=NOW - timedelta(minutes=2 - i))
        store_exposition(exposition, site_id=site_a.pk, batch_key=f"ms{i}")
    serving_rollups.roll_everything(now=NOW)
    bert = Endpoint.objects.get(site=site_a, name="bert_large")
    ttft = serving.window_totals(bert.pk, {"5m": timedelta(minutes=5)}, now=NOW)["5m"].histogram("ttft")
    assert (ttft.total, ttft.count) == (1000, 1000)
    assert ttft.sum == pytest.approx(40.0)  # 40 ms each, in seconds
    assert sm.histogram_quantile(0.99, ttft) == pytest.approx(0.099)  # within the 100 ms bucket
    status = serving.slo_status(bert, now=NOW)
    assert (status["ttft"]["windows"]["5m"]["good"], status["ttft"]["windows"]["5m"]["total"]) == (1000, 1000)
    assert status["latency"]["5m"]["ttft"]["count"] == 1000
    # The figures since the server started count the same way: the 611,905 of the first scrape plus
    # the 1,000 since.
    since = serving.since_start(bert.pk, now=NOW)
    assert since is not None and since["ttft"]["count"] == 611_905 + 1000


def test_rates_divide_by_the_seconds_the_scrapes_cover(site_a: Site) -> None:
    # A server scraped every two minutes, serving 2 requests and 50 tokens a second: each scrape
    # brings 240 requests and 6,000 tokens, credited to one minute. Over the seconds they cover,
    # the rate is 2/s in that minute, not 240/60 = 4/s (and nothing the next).
    ok, tokens = "vllm:request_success_total", "vllm:generation_tokens_total"
    start = (NOW - timedelta(minutes=20)).replace(second=10)
    points = []
    for i in range(8):
        ts = start + timedelta(minutes=2 * i)
        points.append(ServingPoint("m", "vllm", "m", ts, ok, 'finished_reason="stop"', 240.0 * i))
        points.append(ServingPoint("m", "vllm", "m", ts, tokens, "", 6000.0 * i))
    store_serving_points(site_id=site_a.pk, batch_key="every-2-min", points=points)
    serving_rollups.roll_everything(now=NOW)
    series = serving.timeseries(_endpoint(site_a).pk, NOW - timedelta(minutes=30), NOW, step=timedelta(minutes=1))
    assert len(series) == 7  # a point for each minute with a scrape after the first
    for point in series:
        assert point["rps"] == pytest.approx(2.0) and point["tokens_per_s"] == pytest.approx(50.0)
        assert point["activity"]["span_seconds"] == 120
    # A wider step covering several scrapes: their increases over the seconds they cover.
    wide = serving.timeseries(_endpoint(site_a).pk, NOW - timedelta(minutes=30), NOW, step=timedelta(minutes=10))
    assert {p["rps"] for p in wide} == {2.0}
