"""The serving pages and their read APIs: /serving/, /serving/endpoints/<id>/, the overview and
endpoint snapshot APIs (figures against hand calculations from rolled scrapes), the SLO form on
the endpoint page, the live pushes, and the overview tile."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.test import Client
from django.utils import timezone

from fleet.ingest.prometheus import parse_exposition, store_exposition
from fleet.models import Endpoint, Site
from fleet.serving import read as serving_read
from fleet.serving import rollups as serving_rollups
from fleet.serving.models import EndpointChange, EndpointEval
from fleet.serving.store import ServingPoint, store_serving_points

pytestmark = pytest.mark.django_db

OVERVIEW = "/api/v1/serving/overview"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
PROMPT = "vllm:request_prompt_tokens"

# Each minute of traffic, as bucket counts (non-cumulative) per upper bound, in seconds or tokens.
# TTFT: 100 requests, 90 within 0.1 s, 8 in (0.25, 0.5], 2 in (0.5, 1]: 98 % within 500 ms.
TTFT_MINUTE = {0.1: 90, 0.25: 0, 0.5: 8, 1.0: 2, math.inf: 0}
# ITL: 1000 tokens, 995 within 25 ms, 5 in (50, 100] ms: 99.5 % within 50 ms.
ITL_MINUTE = {0.025: 995, 0.05: 0, 0.1: 5, math.inf: 0}
# Prompts: 60 up to 100 tokens, 40 in (100, 1000].
PROMPT_MINUTE = {100.0: 60, 1000.0: 40, 10000.0: 0, math.inf: 0}
# The baseline's prompts, two days back: all in (1000, 10000].
PROMPT_OLD = {100.0: 0, 1000.0: 0, 10000.0: 100, math.inf: 0}


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(bound)


def _histogram(name: str, metric: str, ts: datetime, per_minute: dict[float, int], k: int) -> list[ServingPoint]:
    """Cumulative buckets after ``k`` minutes of ``per_minute`` (what the server exposes)."""
    points, running = [], 0
    for bound, count in per_minute.items():
        running += count * k
        points.append(ServingPoint(name, "vllm", name, ts, f"{metric}_bucket", f'le="{_le(bound)}"', float(running)))
    points.append(ServingPoint(name, "vllm", name, ts, f"{metric}_count", "", float(running)))
    points.append(ServingPoint(name, "vllm", name, ts, f"{metric}_sum", "", 0.0))
    return points


def scrapes(name: str, first: datetime, minutes: int, *, start_k: int = 0) -> list[ServingPoint]:
    """A vLLM server scraped on each minute from ``first`` (``minutes`` + 1 scrapes): the first is
    the baseline, each later one adds a minute of TTFT_MINUTE, ITL_MINUTE, PROMPT_MINUTE and 100
    successful requests; gauges 3 waiting, 20 running, KV cache 50 %."""
    points = []
    for i in range(minutes + 1):
        k = start_k + i
        ts = first + timedelta(minutes=i)
        points += _histogram(name, TTFT, ts, TTFT_MINUTE, k)
        points += _histogram(name, ITL, ts, ITL_MINUTE, k)
        points += _histogram(name, PROMPT, ts, PROMPT_MINUTE, k)
        points += [
            ServingPoint(name, "vllm", name, ts, "vllm:request_success_total", 'finished_reason="stop"', 100.0 * k),
            ServingPoint(name, "vllm", name, ts, "vllm:generation_tokens_total", "", 1000.0 * k),
            ServingPoint(name, "vllm", name, ts, "vllm:num_requests_waiting", "", 3.0),
            ServingPoint(name, "vllm", name, ts, "vllm:num_requests_running", "", 20.0),
            ServingPoint(name, "vllm", name, ts, "vllm:kv_cache_usage_perc", "", 0.5),
        ]
    return points


def _minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


@pytest.fixture
def served(site_a: Site) -> dict[str, Any]:
    """Endpoint "llama" with 30 minutes of traffic ending with the current minute, and ten minutes
    of prompts two days back (the prompt-length baseline), rolled up."""
    now = timezone.now()
    first = _minute(now) - timedelta(minutes=30)
    store_serving_points(site_id=site_a.pk, batch_key="recent", points=scrapes("llama", first, 30))
    old_first = _minute(now) - timedelta(days=2)
    old = []
    for i in range(11):
        old += _histogram("llama", PROMPT, old_first + timedelta(minutes=i), PROMPT_OLD, i)
    store_serving_points(site_id=site_a.pk, batch_key="old", points=old)
    serving_rollups.roll_everything(now=now)
    endpoint = Endpoint.objects.get(site=site_a, name="llama")
    return {"endpoint": endpoint, "now": now, "first": first}


def _by_slo(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["slo"]: r for r in rows}


# --- the read APIs --------------------------------------------------------------------------------


def test_the_overview_api_gives_the_figures_a_hand_calculation_gives(
    viewer_client: Client, served: dict[str, Any]
) -> None:
    response = viewer_client.get(OVERVIEW)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["burn_windows"] == ["5m", "30m", "1h", "6h", "3d"]
    (card,) = body["endpoints"]
    assert card["name"] == "llama" and card["site"] == "ams-1" and card["framework"] == "vllm"
    now = card["now"]
    # Five minutes of 100 requests each: rank 0.99 n falls in (0.5, 1] s, between 98 % and 100 %
    # of n: 0.5 + 0.5 x (0.99 - 0.98) / 0.02 = 0.75 s; the median in (0, 0.1]: 0.1 x 0.5 / 0.9.
    assert now["ttft_p99"] == pytest.approx(750.0)
    assert now["ttft_p50"] == pytest.approx(100 * 0.5 / 0.9, abs=1e-3)
    # ITL: 99.5 % of tokens are within 25 ms, so rank 0.99 n falls in (0, 0.025]: 25 x 0.99 / 0.995 ms.
    assert now["itl_p99"] == pytest.approx(25.0 * 0.99 / 0.995, abs=1e-3)
    assert now["rps"] == pytest.approx(100 / 60, abs=1e-3)
    assert now["tokens_per_s"] == pytest.approx(1000 / 60, abs=0.01)
    assert (now["waiting"], now["running"], now["kv_cache_usage"]) == (3.0, 20.0, 0.5)

    slos = _by_slo(card["slos"])
    # TTFT: 2 % of requests over 500 ms against a 99 % target: burn 0.02 / 0.01 = 2 in every window,
    # the budget overspent by its whole size (1 - 2 = -1), and the ticket rule (1x over 3 d and 6 h) fires.
    ttft = slos["ttft"]
    assert ttft["sli"] == pytest.approx(0.98) and ttft["budget_left"] == pytest.approx(-1.0)
    assert ttft["burn"] == {w: pytest.approx(2.0) for w in body["burn_windows"]}
    assert [a["rule"] for a in ttft["alerts"]] == ["slow_burn"]
    assert ttft["alerting_windows"] == ["3d", "6h"]
    assert not ttft["interpolated"]  # 500 ms is a bucket bound
    # ITL: 0.5 % over 50 ms against 99 %: burn 0.5, half the budget left, no alert.
    assert slos["itl"]["burn"]["1h"] == pytest.approx(0.5)
    assert slos["itl"]["budget_left"] == pytest.approx(0.5) and slos["itl"]["alerts"] == []
    assert slos["availability"]["sli"] == 1.0 and slos["availability"]["budget_left"] == 1.0
    assert card["verdict"] == "missing"
    assert body["totals"] == {
        "endpoints": 1,
        "meeting": 0,
        "missing": 1,
        "no_data": 0,
        "alerts": 1,
        "pages": 0,
        "worst_budget_left": pytest.approx(-1.0),
    }
    # The last hour's minutes: every minute with traffic has its point, each minute's p99 750 ms.
    series = card["series"]
    assert len(series["t"]) == 31  # the baseline scrape's minute (gauges only) and 30 minutes of traffic
    assert series["ttft_p99"][1:] == [pytest.approx(750.0)] * 30
    assert series["ttft_p99"][0] is None


def test_the_endpoint_snapshot_draws_the_range_with_its_markers_and_prompt_lengths(
    viewer_client: Client, served: dict[str, Any]
) -> None:
    endpoint = served["endpoint"]
    now = served["now"]
    EndpointChange.objects.create(
        endpoint=endpoint, ts=now - timedelta(minutes=20), kind="quantisation", to_value="fp8"
    )
    EndpointChange.objects.create(endpoint=endpoint, ts=now - timedelta(hours=3), kind="model")  # outside 1h
    EndpointEval.objects.create(
        endpoint=endpoint, ts=now - timedelta(minutes=10), suite="mmlu", metric="acc", score=0.71
    )
    response = viewer_client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/snapshot", {"range": "1h"})
    assert response.status_code == 200, response.content
    snap = response.json()
    assert snap["range"] == "1h" and snap["step_seconds"] == 60
    assert snap["endpoint"]["name"] == "llama"
    assert [c["kind"] for c in snap["changes"]] == ["quantisation"]
    assert [(e["suite"], e["score"]) for e in snap["evals"]] == [("mmlu", 0.71)]
    assert snap["series"]["ttft_p99"][-1] == pytest.approx(750.0)
    assert _by_slo(snap["slos"])["ttft"]["budget_left"] == pytest.approx(-1.0)
    assert snap["since_start"]["requests"]["requests_ok"] == 3000.0

    p = snap["prompt_lengths"]
    # The hour: 60 % of prompts up to 100 tokens, 40 % in (100, 1000]; the 7 days before it: all in
    # (1000, 10000]. Medians and p90 by interpolation inside the bucket holding the rank.
    assert p["bounds"] == [100.0, 1000.0, 10000.0]
    assert p["counts"] == [1800.0, 1200.0, 0.0]
    assert p["share"] == [0.6, 0.4, 0.0] and p["baseline_share"] == [0.0, 0.0, 1.0]
    assert p["baseline_total"] == 1000.0
    assert p["p50"] == pytest.approx(round(100 * 0.5 / 0.6, 1))
    assert p["p90"] == pytest.approx(100 + 900 * (0.9 - 0.6) / 0.4)
    assert p["baseline_p50"] == pytest.approx(1000 + 9000 * 0.5)
    assert p["p50_ratio"] == pytest.approx(round(p["p50"] / p["baseline_p50"], 3))


@pytest.mark.parametrize("bad", ["2h", "", "1H", "30d;"])
def test_a_bad_range_is_a_400_naming_the_parameter(viewer_client: Client, served: dict[str, Any], bad: str) -> None:
    response = viewer_client.get(f"/api/v1/serving/endpoints/{served['endpoint'].pk}/snapshot", {"range": bad})
    assert response.status_code == 400
    assert "range" in response.json()


def test_every_range_answers_and_wide_ranges_step_by_the_hour(viewer_client: Client, served: dict[str, Any]) -> None:
    url = f"/api/v1/serving/endpoints/{served['endpoint'].pk}/snapshot"
    steps = {key: viewer_client.get(url, {"range": key}).json()["step_seconds"] for key in serving_read.RANGES}
    assert steps == {"1h": 60, "6h": 60, "24h": 240, "7d": 3600, "30d": 7200}


# --- the pages ----------------------------------------------------------------------------------


def test_the_pages_render_for_a_viewer_with_data(viewer_client: Client, served: dict[str, Any]) -> None:
    response = viewer_client.get("/serving/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Serving SLOs" in html and '"topic": "serving"' in html and "serving-empty" not in html
    assert 'href="/serving/"' in html  # the navigation bar's Serving entry
    page = viewer_client.get(f"/serving/endpoints/{served['endpoint'].pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "llama" in html and f'"topic": "endpoint.{served["endpoint"].pk}"' in html
    # A Viewer reads the SLOs; the form is for Operators.
    assert 'id="settings-readonly"' in html and 'id="settings-form"' not in html


def test_the_pages_need_a_role(norole_client: Client, anon_client: Client, served: dict[str, Any]) -> None:
    for path in ("/serving/", f"/serving/endpoints/{served['endpoint'].pk}/"):
        assert norole_client.get(path).status_code == 403
        assert anon_client.get(path).status_code == 302
    assert norole_client.get(OVERVIEW).status_code == 403


def test_an_empty_console_says_how_to_send_serving_metrics(viewer_client: Client, db: None) -> None:
    html = viewer_client.get("/serving/").content.decode()
    assert "serving-empty" in html and "/api/v1/ingest/prometheus" in html
    assert viewer_client.get(OVERVIEW).json()["endpoints"] == []


# --- the SLO form ------------------------------------------------------------------------------

FORM = {
    "model_name": "meta-llama/Llama-3.1-70B-Instruct",
    "version": "3",
    "framework": "vllm",
    "region": "eu-west",
    "replicas": "4",
    "ttft_threshold_ms": "400",
    "ttft_target_pct": "99.5",
    "itl_threshold_ms": "50",
    "itl_target_pct": "99",
    "availability_target_pct": "99.9",
    "slo_window_days": "28",
}


def test_an_operator_saves_the_slos_and_leaves_an_audit_entry(
    operator_client: Client, operator_user: Any, served: dict[str, Any]
) -> None:
    endpoint = served["endpoint"]
    page = operator_client.get(f"/serving/endpoints/{endpoint.pk}/").content.decode()
    assert 'id="settings-form"' in page
    response = operator_client.post(f"/serving/endpoints/{endpoint.pk}/", FORM)
    assert response.status_code == 302 and response["Location"] == f"/serving/endpoints/{endpoint.pk}/"
    endpoint.refresh_from_db()
    assert (endpoint.ttft_threshold_ms, endpoint.ttft_target_pct, endpoint.slo_window_days) == (400.0, 99.5, 28)
    assert (endpoint.replicas, endpoint.region, endpoint.version) == (4, "eu-west", "3")
    entry = LogEntry.objects.get(object_id=str(endpoint.pk), content_type__model="endpoint")
    assert entry.user_id == operator_user.pk and entry.action_flag == CHANGE
    assert "ttft_target_pct: 99.0 -> 99.5" in entry.change_message
    assert "itl_target_pct" not in entry.change_message  # unchanged fields are not claimed as changed
    # The snapshot follows: the TTFT SLO is now judged against 400 ms, 99.5 %.
    ttft = _by_slo(operator_client.get(OVERVIEW).json()["endpoints"][0]["slos"])["ttft"]
    assert (ttft["threshold_ms"], ttft["target_pct"]) == (400.0, 99.5)


def test_a_viewer_cannot_post_the_form(viewer_client: Client, served: dict[str, Any]) -> None:
    endpoint = served["endpoint"]
    response = viewer_client.post(f"/serving/endpoints/{endpoint.pk}/", FORM)
    assert response.status_code == 403
    endpoint.refresh_from_db()
    assert endpoint.ttft_target_pct == 99.0 and endpoint.replicas == 1
    assert not LogEntry.objects.filter(content_type__model="endpoint").exists()


@pytest.mark.parametrize(
    ("field", "value"), [("ttft_target_pct", "100"), ("availability_target_pct", "0"), ("itl_target_pct", "-5")]
)
def test_a_target_outside_0_100_is_an_error_on_its_field_and_nothing_is_saved(
    operator_client: Client, served: dict[str, Any], field: str, value: str
) -> None:
    endpoint = served["endpoint"]
    response = operator_client.post(f"/serving/endpoints/{endpoint.pk}/", {**FORM, field: value})
    assert response.status_code == 400
    html = response.content.decode()
    assert f'data-error-for="{field}"' in html and "strictly between 0 and 100" in html
    assert html.count("data-error-for=") == 1  # only the field at fault
    assert f'value="{value}"' in html  # the form keeps what was typed
    endpoint.refresh_from_db()
    assert (endpoint.ttft_target_pct, endpoint.availability_target_pct, endpoint.replicas) == (99.0, 99.9, 1)
    assert not LogEntry.objects.filter(content_type__model="endpoint").exists()


# --- live pushes and the overview tile ------------------------------------------------------------


def test_the_serving_push_sends_only_the_minutes_since_its_watermark(site_a: Site) -> None:
    now = timezone.now()
    current = _minute(now)
    # Traffic up to three minutes ago.
    store_serving_points(site_id=site_a.pk, batch_key="a", points=scrapes("m", current - timedelta(minutes=8), 5))
    serving_rollups.roll_everything(now=now)
    endpoint_id = str(Endpoint.objects.get(name="m").pk)

    first, mark = serving_read.build_serving_delta("serving", None, now=now)
    assert first is not None and first["type"] == "serving.delta"
    (delta,) = first["endpoints"]
    # Without a watermark: the last five minutes (two of them have traffic).
    assert delta["points"]["t"] == [(current - timedelta(minutes=m)).isoformat() for m in (4, 3)]
    assert mark == {endpoint_id: (current - timedelta(minutes=3)).isoformat()}
    assert _by_slo(delta["slos"])["ttft"]["budget_left"] == pytest.approx(-1.0)
    assert set(delta["now"]) >= {"ttft_p99", "itl_p99", "waiting", "kv_cache_usage", "rps"}

    # Nothing new: only the watermark's minute again (it may have been filling).
    second, mark2 = serving_read.build_serving_delta("serving", mark, now=now)
    assert second["endpoints"][0]["points"]["t"] == [(current - timedelta(minutes=3)).isoformat()]
    assert mark2 == mark

    # Two more minutes of scrapes: the push carries the watermark's minute and those two, nothing older.
    store_serving_points(
        site_id=site_a.pk, batch_key="b", points=scrapes("m", current - timedelta(minutes=2), 1, start_k=6)
    )
    serving_rollups.roll_everything(now=now)
    third, mark3 = serving_read.build_serving_delta("serving", mark2, now=now)
    assert third["endpoints"][0]["points"]["t"] == [(current - timedelta(minutes=m)).isoformat() for m in (3, 2, 1)]
    assert third["endpoints"][0]["points"]["ttft_p99"][-1] == pytest.approx(750.0)
    assert mark3 == {endpoint_id: (current - timedelta(minutes=1)).isoformat()}


def test_the_serving_topic_is_pushed_at_most_once_an_overview_interval(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A serving push reads every endpoint: after one, the next waits SERVING_SUMMARY_SECONDS;
    one endpoint's own topic keeps LIVE_MIN_INTERVAL_MS."""
    import time

    from django.core.cache import cache

    from console import live, tasks

    settings.EAGER_TASKS = False
    settings.SERVING_SUMMARY_SECONDS, settings.LIVE_MIN_INTERVAL_MS = 10, 500
    scheduled: list[tuple[str, float]] = []
    monkeypatch.setattr(
        tasks.push_live_topic, "apply_async", lambda args, countdown: scheduled.append((args[0], countdown))
    )
    for topic in ("serving", "endpoint.3"):
        cache.delete(f"live:pending:{topic}")
        cache.set(f"live:last:{topic}", time.time())  # each was just pushed
    live.request_push("serving", "endpoint.3")
    (serving, serving_wait), (endpoint, endpoint_wait) = scheduled
    assert serving == "serving" and 9 < serving_wait <= 10
    assert endpoint == "endpoint.3" and 0 < endpoint_wait <= 0.5
    settings.SERVING_SUMMARY_SECONDS = 0  # kept at every read: the usual interval
    cache.delete("live:pending:serving")
    live.request_push("serving")
    assert scheduled[-1][0] == "serving" and scheduled[-1][1] <= 0.5
    cache.clear()


def test_the_endpoint_push_follows_its_own_watermark(served: dict[str, Any]) -> None:
    endpoint = served["endpoint"]
    topic = f"endpoint.{endpoint.pk}"
    first, mark = serving_read.build_endpoint_delta(topic, None)
    assert first["type"] == "endpoint.delta" and first["topic"] == topic
    assert mark == first["points"]["t"][-1]
    second, mark2 = serving_read.build_endpoint_delta(topic, mark)
    assert second["points"]["t"] == [mark] and mark2 == mark
    assert serving_read.build_endpoint_delta("endpoint.999999", None) == (None, None)


def test_the_overview_tile_counts_endpoints_missing_their_slos(viewer_client: Client, served: dict[str, Any]) -> None:
    html = viewer_client.get("/").content.decode()
    assert "Serving SLOs →" in html
    assert "Missing their SLOs" in html and f'href="/serving/endpoints/{served["endpoint"].pk}/">llama</a>' in html
    tile = serving_read.overview_tile()
    assert (tile["endpoints"], tile["meeting"], len(tile["missing"]), tile["alerts"]) == (1, 0, 1, 1)
    assert tile["worst_budget_pct"] == pytest.approx(-100.0)


def test_the_overview_tile_without_endpoints(viewer_client: Client, db: None) -> None:
    html = viewer_client.get("/").content.decode()
    assert "No serving endpoints yet" in html


def test_the_overview_and_its_tile_are_computed_once_an_interval_for_every_reader(
    viewer_client: Client,
    served: dict[str, Any],
    settings,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """SERVING_SUMMARY_SECONDS: within it a read is the kept value (an endpoint added since does
    not show yet); past it the read is still answered at once and the value recomputed behind it."""
    from django.core.cache import cache

    from console import figures

    settings.SERVING_SUMMARY_SECONDS = 10
    cache.clear()
    clock = {"now": 5_000_000.0}
    monkeypatch.setattr(figures, "_clock", lambda: clock["now"])
    monkeypatch.setattr(figures, "_in_background", lambda work: work())  # in place: this test's transaction
    names = lambda: [c["name"] for c in viewer_client.get(OVERVIEW).json()["endpoints"]]  # noqa: E731
    assert names() == ["llama"] and serving_read.overview_tile()["endpoints"] == 1
    Endpoint.objects.create(site=served["endpoint"].site, name="mistral", framework="vllm")
    clock["now"] += 5
    assert names() == ["llama"] and serving_read.overview_tile()["endpoints"] == 1  # kept
    clock["now"] += 6
    assert names() == ["llama"]  # expired: answered with the kept value, recomputed behind it
    assert sorted(names()) == ["llama", "mistral"]
    serving_read.overview_tile()
    assert serving_read.overview_tile()["endpoints"] == 2
    cache.clear()


# --- each framework's own series: Triton's time per request, TGI's requests and tokens -------------

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _bump(text: str, increases: dict[str, float], *, match: str) -> str:
    """A later scrape: each sample whose name is in ``increases`` and whose line contains every
    part of ``match`` grows by that amount."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip() or not all(m in line for m in match.split("|")):
            out.append(line)
            continue
        head, value = line.rsplit(" ", 1)
        out.append(f"{head} {float(value) + increases.get(head.split('{', 1)[0], 0.0)!r}")
    return "\n".join(out) + "\n"


def _scrape(site: Site, text: str, ts: datetime, *, kind: str, endpoint: str | None = None) -> None:
    exposition = parse_exposition(text, kind=kind, endpoint=endpoint, now=ts)
    store_exposition(exposition, site_id=site.pk, batch_key=f"{kind}-{ts.isoformat()}")


def test_a_triton_endpoint_shows_its_time_per_successful_request_and_failures_by_reason(
    viewer_client: Client, site_a: Site
) -> None:
    # A minute of bert_large version 3: 1,000 successes, 115 failures (100 rejected, 10 in the
    # backend, 5 canceled by clients). Triton adds durations for the 1,000 successes only: 31 ms of
    # request, 4 ms queued and 1 + 25 + 0.5 ms of compute each.
    text = (FIXTURES / "triton.prom").read_text()
    v3 = 'model="bert_large"|version="3"'
    later = _bump(
        text,
        {
            "nv_inference_request_success": 1000,
            "nv_inference_request_duration_us": 1000 * 31_000,
            "nv_inference_queue_duration_us": 1000 * 4_000,
            "nv_inference_compute_input_duration_us": 1000 * 1_000,
            "nv_inference_compute_infer_duration_us": 1000 * 25_000,
            "nv_inference_compute_output_duration_us": 1000 * 500,
        },
        match=v3,
    )
    later = _bump(later, {"nv_inference_request_failure": 100}, match=v3 + '|reason="REJECTED"')
    later = _bump(later, {"nv_inference_request_failure": 10}, match=v3 + '|reason="BACKEND"')
    later = _bump(later, {"nv_inference_request_failure": 5}, match=v3 + '|reason="CANCELED"')
    now = timezone.now()
    _scrape(site_a, text, now - timedelta(minutes=2), kind="triton")
    _scrape(site_a, later, now - timedelta(minutes=1), kind="triton")
    serving_rollups.roll_everything(now=now)
    bert = Endpoint.objects.get(site=site_a, name="bert_large")

    snap = viewer_client.get(f"/api/v1/serving/endpoints/{bert.pk}/snapshot", {"range": "1h"}).json()
    means = {"request_mean_ms": 31.0, "queue_mean_ms": 4.0, "compute_mean_ms": 26.5}
    # Divided by the successes, not the 1,115 finished requests (27.8, 3.6 and 23.8 ms).
    assert {k: snap["now"][k] for k in means} == pytest.approx(means)
    assert {k: snap["range_figures"][k] for k in means} == pytest.approx(means)
    assert {k: [v for v in snap["series"][k] if v is not None] for k in means} == {
        k: [pytest.approx(v)] for k, v in means.items()
    }
    assert snap["range_figures"]["successes"] == 1000
    assert snap["range_figures"]["failures_by_reason"] == {"BACKEND": 10, "CANCELED": 5, "REJECTED": 100}
    assert snap["since_start"]["failures_by_reason"] == {
        "BACKEND": 2 + 7 + 10,
        "CANCELED": 41 + 5,
        "OTHER": 0,
        "REJECTED": 126 + 100,
    }
    # The overview card shows the same number, from the same function.
    overview = viewer_client.get(OVERVIEW).json()
    card = next(c for c in overview["endpoints"] if c["name"] == "bert_large")
    assert card["now"]["request_mean_ms"] == snap["now"]["request_mean_ms"]
    # The page has its Triton card; a vLLM endpoint's page has none.
    page = viewer_client.get(f"/serving/endpoints/{bert.pk}/").content.decode()
    assert 'id="triton-card"' in page and 'id="chart-duration"' in page
    store_serving_points(site_id=site_a.pk, batch_key="v", points=scrapes("llama", now - timedelta(minutes=3), 1))
    llama = Endpoint.objects.get(site=site_a, name="llama")
    assert 'id="triton-card"' not in viewer_client.get(f"/serving/endpoints/{llama.pk}/").content.decode()


def test_a_tgi_endpoint_reads_its_requests_and_tokens_from_its_own_series(viewer_client: Client, site_a: Site) -> None:
    # TGI has no TTFT histogram and no token counter: 600 requests (tgi_request_success) and 60,000
    # generated tokens (the sum of tgi_request_generated_tokens) between two scrapes two minutes apart.
    text = (FIXTURES / "tgi.prom").read_text()
    later = _bump(
        text,
        {
            "tgi_request_success": 600,
            "tgi_request_count": 600,
            "tgi_request_generated_tokens_sum": 60_000,
            "tgi_request_generated_tokens_count": 600,
            "tgi_request_generated_tokens_bucket": 600,
        },
        match="tgi_",
    )
    now = timezone.now()
    _scrape(site_a, text, now - timedelta(minutes=3), kind="tgi", endpoint="mistral")
    _scrape(site_a, later, now - timedelta(minutes=1), kind="tgi", endpoint="mistral")
    serving_rollups.roll_everything(now=now)
    card = viewer_client.get(OVERVIEW).json()["endpoints"][0]
    assert card["now"]["requests_5m"] == 600
    # Over the two minutes the scrapes cover, not per 60 s.
    assert card["now"]["rps"] == pytest.approx(600 / 120)
    assert card["now"]["tokens_per_s"] == pytest.approx(60_000 / 120)
    point = next(p for p in reversed(card["series"]["rps"]) if p is not None)
    assert point == pytest.approx(600 / 120)


# --- what the SLO figures cover ----------------------------------------------------------------------


def test_a_budget_over_less_data_than_its_window_says_what_it_covers(viewer_client: Client, site_a: Site) -> None:
    now = timezone.now()
    first = _minute(now) - timedelta(minutes=30)
    store_serving_points(site_id=site_a.pk, batch_key="recent", points=scrapes("llama", first, 30))
    serving_rollups.roll_everything(now=now)
    endpoint = Endpoint.objects.get(site=site_a, name="llama")
    card = viewer_client.get(OVERVIEW).json()["endpoints"][0]
    # The "30-day budget" rests on the data since the first scrape's minute, to the end of the
    # current one: 31 minutes.
    coverage = card["coverage"]
    assert coverage == {
        "since": first.isoformat(),
        "seconds": 31 * 60,
        "period_days": 30,
        "complete": False,
    }
    slo = viewer_client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/slo").json()["slo"]
    assert slo["coverage"] == coverage
    # 2 % of TTFTs over 500 ms burns 2x on every window, yet 30 minutes of data carry no ticket
    # (1x over 3 d and 6 h needs 6 h of data), on the page as in the incident engine.
    assert _by_slo(card["slos"])["ttft"]["burn"]["3d"] == pytest.approx(2.0)
    assert card["alerts"] == [] and card["verdict"] == "missing"  # the budget is overspent all the same
    snap = viewer_client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/snapshot").json()
    assert snap["coverage"] == coverage
