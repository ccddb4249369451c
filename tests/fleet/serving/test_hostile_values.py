"""Hostile values at the Prometheus door and what the serving reads make of them: a value no read
can use is ignored with its whole series (a histogram with all its parts) and counted, a bucket
bound that is not a number is refused naming the line, and whatever was pushed, the serving reads
(/api/v1/serving/overview, an endpoint's /slo and /snapshot) answer 200 with finite numbers only."""

from __future__ import annotations

import json
import math
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.inventory import directory
from fleet.models import Endpoint, ServingSample, Site
from fleet.serving import rollups as serving_rollups
from fleet.serving.store import ServingPoint, store_serving_points
from fleet.telemetry import partitions

pytestmark = pytest.mark.django_db

MODEL = "llama"
TTFT = "vllm:time_to_first_token_seconds"
BOUNDS = ("0.1", "0.5", "1.0", "+Inf")


def push(client: Client, token: str, body: str):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/ingest/prometheus",
        data=body,
        content_type="text/plain; version=0.0.4",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def scrape(
    k: int, *, ms: int, bucket_values: dict[str, str] | None = None, running: tuple[str, str] = ("3", "4")
) -> str:
    """A vLLM scrape after ``k`` minutes of 100 requests a minute (90 within 0.1 s, 10 in (0.1, 0.5]),
    timestamped ``ms``; ``bucket_values`` replaces bucket values by le."""
    cumulative = {"0.1": 90 * k, "0.5": 100 * k, "1.0": 100 * k, "+Inf": 100 * k}
    lines = [f"# TYPE {TTFT} histogram"]
    for le in BOUNDS:
        value = (bucket_values or {}).get(le, str(cumulative[le]))
        lines.append(f'{TTFT}_bucket{{le="{le}",model_name="{MODEL}"}} {value} {ms}')
    lines += [
        f'{TTFT}_sum{{model_name="{MODEL}"}} {12.5 * k} {ms}',
        f'{TTFT}_count{{model_name="{MODEL}"}} {100 * k} {ms}',
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{finished_reason="stop",model_name="{MODEL}"}} {100 * k} {ms}',
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {running[0]} {ms}',
        f'vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} {running[1]} {ms}',
    ]
    return "\n".join(lines) + "\n"


def _ms_ago(minutes: float) -> int:
    return int((time.time() - minutes * 60) * 1000)


def _reads(client: Client, endpoint: Endpoint) -> list[dict]:
    """Every serving read of the endpoint, each answered 200 (strict JSON: no NaN, no Infinity)."""
    bodies = []
    for url in (
        "/api/v1/serving/overview",
        f"/api/v1/serving/endpoints/{endpoint.pk}/slo",
        f"/api/v1/serving/endpoints/{endpoint.pk}/snapshot?range=1h",
        f"/api/v1/serving/endpoints/{endpoint.pk}/snapshot?range=7d",
    ):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code, response.content[:500])
        bodies.append(json.loads(response.content, parse_constant=_refuse_constant))
    return bodies


def _refuse_constant(name: str) -> float:
    raise AssertionError(f"a read answered {name}")


def test_two_gauges_of_1e308_are_ignored_and_every_read_stays_200(
    client: Client, viewer_client: Client, site_a: Site, token_a: str
) -> None:
    # Each value is finite; their sum is not. Before, the rollup's sum was inf and every read 500.
    for k, minutes_ago in ((1, 2), (2, 1)):
        response = push(client, token_a, scrape(k, ms=_ms_ago(minutes_ago), running=("1e308", "1e308")))
        assert response.status_code == 202, response.content
        body = response.json()
        assert body["ignored"] == 2 and body["ignored_metrics"] == {"vllm:num_requests_running": 2}
    assert not ServingSample.objects.filter(metric="vllm:num_requests_running").exists()
    serving_rollups.roll_everything()
    endpoint = Endpoint.objects.get(site=site_a, name=MODEL)
    overview, slo, snapshot, _ = _reads(viewer_client, endpoint)
    assert overview["endpoints"][0]["now"]["running"] is None  # ignored, not infinite
    assert slo["slo"]["ttft"]["windows"]["5m"]["total"] == 100  # the rest of the scrape is read
    assert snapshot["now"]["requests_5m"] == 100


def test_values_stored_before_the_door_refused_them_are_skipped_by_the_reads(
    viewer_client: Client, site_a: Site
) -> None:
    now = timezone.now()
    points = [
        ServingPoint(MODEL, "vllm", MODEL, now - timedelta(minutes=m), "vllm:num_requests_running", f'engine="{e}"', v)
        for m in (2, 1)
        for e, v in (("0", 1e308), ("1", 1e308), ("2", 5.0))
    ]
    points += [
        ServingPoint(MODEL, "vllm", MODEL, now - timedelta(minutes=m), f"{TTFT}_bucket", f'le="{le}"', v)
        for m, v in ((2, 0.0), (1, 10.0))
        for le in ("fast", "0.5", "+Inf")
    ]
    store_serving_points(site_id=site_a.pk, batch_key="legacy", points=points)
    serving_rollups.roll_everything()
    endpoint = Endpoint.objects.get(site=site_a, name=MODEL)
    overview, slo, _, _ = _reads(viewer_client, endpoint)
    assert overview["endpoints"][0]["now"]["running"] == 5.0
    assert slo["since_start"]["ttft"]["count"] == 10  # le="fast" skipped, not a 500


def test_a_bucket_bound_that_is_not_a_number_is_refused_naming_the_line(
    client: Client, site_a: Site, token_a: str
) -> None:
    for le in ("fast", "NaN", "-Inf", "1e400", ""):
        body = scrape(1, ms=_ms_ago(1)).replace('le="0.5"', f'le="{le}"')
        response = push(client, token_a, body)
        assert response.status_code == 400, (le, response.content)
        error = response.json()
        assert error["item"] == 3 and error["field"] == "le", error  # the second bucket's line
        assert error["error"].startswith("line 3: label le is"), error
    assert not ServingSample.objects.exists()


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "1e300", "-5"])
def test_an_unreadable_value_in_one_bucket_ignores_the_whole_histogram(
    client: Client, viewer_client: Client, site_a: Site, token_a: str, bad: str
) -> None:
    assert push(client, token_a, scrape(1, ms=_ms_ago(3))).status_code == 202
    assert push(client, token_a, scrape(2, ms=_ms_ago(2))).status_code == 202
    # The third scrape's 0.5 bucket cannot be read: none of that histogram's parts are kept (a
    # histogram missing its 0.5 bucket would move every percentile); the counter and gauges are.
    response = push(client, token_a, scrape(3, ms=_ms_ago(1), bucket_values={"0.5": bad}))
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["ignored"] == 6 and body["ignored_metrics"] == {
        f"{TTFT}_bucket": 4,
        f"{TTFT}_sum": 1,
        f"{TTFT}_count": 1,
    }
    assert body["serving_samples"] == 3
    assert ServingSample.objects.filter(metric__startswith=TTFT).count() == 2 * 6
    serving_rollups.roll_everything()
    endpoint = Endpoint.objects.get(site=site_a, name=MODEL)
    _, slo, _, _ = _reads(viewer_client, endpoint)
    # The second minute's 100 requests, read whole: p99 in (0.1, 0.5] at 0.1 + 0.4 x 9/10.
    assert slo["slo"]["latency"]["5m"]["ttft"]["count"] == 100
    assert slo["slo"]["latency"]["5m"]["ttft"]["p99"] == pytest.approx(460.0)


# --- the property: whatever is pushed, the reads answer 200 with finite numbers ------------------

EXAMPLES = 40
EXTREME = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=1e15, max_value=1.7e308),
    st.floats(min_value=-1.7e308, max_value=-1e15),
    st.floats(min_value=0, max_value=1e-300),
    st.sampled_from([0.0, 1.0, 5e-324, 1e18, 1e18 + 1, 1.7976931348623157e308, math.nan, math.inf, -math.inf]),
)
ODD_LE = st.one_of(
    st.sampled_from(["0.1", "0.5", "+Inf", "Inf", "+inf", "1e18", "-1e18", "0", "-0.5", "1e-300", "5e-324"]),
    st.sampled_from(["fast", "NaN", "-Inf", "1e400", "", " 1", "0x10"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
METRICS = [
    ("vllm:num_requests_running", None),
    ("vllm:num_requests_waiting", None),
    ("vllm:kv_cache_usage_perc", None),
    ("vllm:request_success_total", 'finished_reason="stop"'),
    ("vllm:request_success_total", 'finished_reason="error"'),
    ("vllm:generation_tokens_total", None),
    ("nv_inference_request_success", None),
    ("nv_inference_request_duration_us", None),
    ("nv_inference_request_failure", 'reason="REJECTED"'),
]
HISTOGRAMS = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:request_prompt_tokens"]


def _render(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def hostile_scrape(draw: st.DrawFn, ms: int) -> str:
    """A vLLM or Triton scrape with extreme finite values, NaN and ±Inf in any position, and odd
    bucket bounds, timestamped ``ms``."""
    lines = []
    for name, labels in draw(st.lists(st.sampled_from(METRICS), max_size=6, unique=True)):
        model = 'model="m"' if name.startswith("nv_") else 'model_name="m"'
        label_text = ",".join(x for x in (labels, model) if x)
        lines.append(f"{name}{{{label_text}}} {_render(draw(EXTREME))} {ms}")
    for name in draw(st.lists(st.sampled_from(HISTOGRAMS), max_size=2, unique=True)):
        bounds = draw(st.lists(ODD_LE, min_size=1, max_size=5, unique=True))
        running = 0.0
        for le in bounds:
            running += draw(st.one_of(st.integers(0, 1000).map(float), EXTREME))
            lines.append(f'{name}_bucket{{le="{le}",model_name="m"}} {_render(running)} {ms}')
        lines.append(f'{name}_sum{{model_name="m"}} {_render(draw(EXTREME))} {ms}')
        lines.append(f'{name}_count{{model_name="m"}} {_render(draw(EXTREME))} {ms}')
    return "\n".join(lines) + "\n"


class _RollBack(Exception):
    pass


def test_whatever_values_are_pushed_every_serving_read_answers_200_with_finite_numbers(
    client: Client, viewer_client: Client, site_a: Site, token_a: str
) -> None:
    statuses: list[int] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        directory.clear()  # ids cached in a rolled-back example do not exist
        partitions.forget_known_partitions()
        try:
            with transaction.atomic():
                for minutes_ago in (3, 2, 1):
                    body = data.draw(hostile_scrape(_ms_ago(minutes_ago)))
                    response = push(client, token_a, body)
                    assert response.status_code in (202, 400), (response.status_code, response.content, body)
                    statuses.append(response.status_code)
                serving_rollups.roll_everything()
                for endpoint in Endpoint.objects.filter(site=site_a):
                    _reads(viewer_client, endpoint)
                raise _RollBack
        except _RollBack:
            pass

    check()
    # Both kinds of answer were exercised: stored (and read) and refused.
    assert statuses.count(202) >= EXAMPLES // 2 and statuses.count(400) >= 1, statuses
