"""End to end: the serving pages in headless Chromium follow an endpoint's scrapes live.

A vLLM scrape is pushed as is to the Prometheus ingest door (agent token), stored by a real Celery
worker; the rollup task (the beat's ``fleet.tasks.update_serving_rollups``, sent to the worker
here as the beat would) rolls its minutes and requests the ``serving`` and ``endpoint.<id>``
pushes, which go through channels-redis to the page's websocket: serving.js and
serving_endpoint.js extend the TTFT chart. Nothing reloads the page or re-reads its snapshot in
between. The pages are also photographed with a few hours of history, on a desk and on a phone.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from fleet.models import Endpoint, ServingRollup1m, Site
from fleet.serving import rollups as serving_rollups
from fleet.serving.models import EndpointChange, EndpointEval
from fleet.serving.store import ServingPoint, store_serving_points
from fleet.tasks import update_serving_rollups
from tests.browser.support import ARTIFACTS, LIVE_TIMEOUT_MS, launch, sign_in, wait_for, wait_in_page, wait_until
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

OVERVIEW_PATH = "/api/v1/serving/overview"
DESK = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
MODEL = "llama-live"
TTFT_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, math.inf)
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.1, math.inf)


class Server:
    """A vLLM server's cumulative counters: each ``serve`` adds requests with the given TTFTs."""

    def __init__(self) -> None:
        self.ttft = dict.fromkeys(TTFT_BOUNDS, 0.0)
        self.itl = dict.fromkeys(ITL_BOUNDS, 0.0)
        self.ok = 0.0
        self.tokens = 0.0

    def serve(self, ttfts: dict[float, int], itl_slow: int = 0) -> None:
        for bound, n in ttfts.items():
            self.ttft[bound] += n
        requests_ = sum(ttfts.values())
        self.ok += requests_
        self.tokens += 200 * requests_
        self.itl[0.025] += 200 * requests_ - itl_slow
        self.itl[0.1] += itl_slow

    def text(self, ts: datetime, *, waiting: float, running: float, kv: float) -> str:
        ms = int(ts.timestamp() * 1000)
        label = f'model_name="{MODEL}",engine="0"'
        lines = [
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} {waiting} {ms}",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {running} {ms}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{label}}} {kv} {ms}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{finished_reason="stop",{label}}} {self.ok} {ms}',
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {self.tokens} {ms}",
        ]
        for name, buckets in (
            ("vllm:time_to_first_token_seconds", self.ttft),
            ("vllm:inter_token_latency_seconds", self.itl),
        ):
            lines.append(f"# TYPE {name} histogram")
            running_count = 0.0
            for bound, n in buckets.items():
                running_count += n
                le = "+Inf" if bound == math.inf else repr(bound)
                lines.append(f'{name}_bucket{{le="{le}",{label}}} {running_count} {ms}')
            lines.append(f"{name}_count{{{label}}} {running_count} {ms}")
            lines.append(f"{name}_sum{{{label}}} 0.0 {ms}")
        return "\n".join(lines) + "\n"


def _push(stack: Stack, token: str, text: str) -> None:
    response = requests.post(
        stack.base_url + "/api/v1/ingest/prometheus",
        params={"kind": "vllm"},
        data=text.encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    assert response.json()["serving_samples"] > 0


def _roll_until(page: Any, expression: str, what: str) -> None:
    """What the beat does every 5 s: send the rollup task to the worker, here every 1.5 s until
    the page shows ``expression``."""
    deadline = time.monotonic() + LIVE_TIMEOUT_MS / 1000
    kicked = 0.0
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {expression}")
        if time.monotonic() - kicked > 1.5:
            update_serving_rollups.delay()
            kicked = time.monotonic()
        page.wait_for_timeout(100)


def _chart(element_id: str, trace: int = 1) -> str:
    return f"document.getElementById('{element_id}')?.data?.[{trace}]"


def test_the_serving_pages_follow_scrapes_live(stack: Stack, viewer_user: User, site_a: Site, token_a: str) -> None:
    server = Server()
    start = datetime.now(UTC) - timedelta(minutes=3)
    for i in range(3):  # three scrapes a minute apart: two minutes of traffic
        if i:
            server.serve({0.05: 95, 0.25: 4, 1.0: 1})
        _push(stack, token_a, server.text(start + timedelta(minutes=i), waiting=2, running=16, kv=0.4))
    wait_for(lambda: Endpoint.objects.filter(name=MODEL).exists(), "the worker to store the scrapes")
    endpoint = Endpoint.objects.get(name=MODEL)

    def rolled() -> bool:
        update_serving_rollups.delay()
        time.sleep(0.5)
        return (
            ServingRollup1m.objects.filter(endpoint_id=endpoint.pk, quantity="ttft").values("bucket").distinct().count()
            >= 2
        )

    wait_for(rolled, "the two minutes of traffic to be rolled up")
    username = viewer_user.username
    p99 = _chart(f"ttft-{endpoint.pk}")

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the page is the witness.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/serving/", OVERVIEW_PATH)
            wait_until(page, f"({p99}?.x.length ?? 0) >= 3")  # the baseline's minute and two of traffic
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription to be confirmed")
            assert log.of_type("subscribed")[-1]["topics"] == ["serving"]
            before = page.evaluate(f"({{n: {p99}.x.length, last: {p99}.y[{p99}.y.length - 1]}})")
            assert before["last"] == pytest.approx(250.0)  # the 99th of 100 is the last of (0.1, 0.25] s
            page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

            # --- a new scrape: a slow minute, 10 of 100 requests over a second --------------------
            server.serve({0.05: 80, 0.25: 10, 2.5: 10})
            _push(stack, token_a, server.text(datetime.now(UTC), waiting=9, running=32, kv=0.93))
            _roll_until(
                page,
                f"{p99}.x.length > {before['n']} && {p99}.y[{p99}.y.length - 1] > 1000",
                "the TTFT chart to take the new minute",
            )
            after = page.evaluate(f"({{n: {p99}.x.length, last: {p99}.y[{p99}.y.length - 1]}})")
            # 99th of 100 in (1, 2.5] s: 1 + 1.5 x (99 - 90) / 10.
            assert after["last"] == pytest.approx(2350.0)
            assert after["n"] == before["n"] + 1
            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            assert log.fetches == 1, "the page re-fetched its snapshot instead of applying the push"
            assert log.of_type("serving.delta")
            waiting = page.text_content(f"[data-endpoint='{endpoint.pk}'] [data-field='waiting']")
            assert waiting == "9.0"
            assert not log.errors, f"the browser reported errors: {log.errors}"
            page.close()

            # --- the endpoint's own page follows its topic ------------------------------------------
            chart = _chart("chart-ttft")
            page, log = sign_in(browser, stack, username, f"/serving/endpoints/{endpoint.pk}/", "/snapshot")
            wait_until(page, f"({chart}?.x.length ?? 0) >= 4")
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the endpoint page's subscription")
            assert log.of_type("subscribed")[-1]["topics"] == [f"endpoint.{endpoint.pk}"]
            page.evaluate("window.__sameDocument = true")
            before = page.evaluate(f"({{n: {chart}.x.length, last: {chart}.y[{chart}.y.length - 1]}})")
            server.serve({0.05: 50, 2.5: 50})
            _push(
                stack, token_a, server.text(datetime.now(UTC) + timedelta(seconds=1), waiting=30, running=32, kv=0.99)
            )
            # A new minute, or the same minute re-rolled with the new requests: either way it moves.
            _roll_until(
                page,
                f"{chart}.x.length !== {before['n']} || {chart}.y[{chart}.y.length - 1] !== {before['last']}",
                "the endpoint page's TTFT chart to move",
            )
            assert page.evaluate("window.__sameDocument === true"), "the endpoint page reloaded"
            assert log.fetches == 1, "the endpoint page re-fetched its snapshot instead of applying the push"
            assert log.of_type("endpoint.delta")
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()


# --- how the pages look with a few hours of history ------------------------------------------------


def _history(site: Site, name: str, *, hours: int, trouble: tuple[int, int] | None, now: datetime) -> None:
    """``hours`` of a server breathing with load, scraped each minute; during ``trouble`` (minutes
    from the start) TTFT degrades, the queue grows and the KV cache fills."""
    points: list[ServingPoint] = []
    server = Server()
    first = now.replace(second=0, microsecond=0) - timedelta(hours=hours)
    prompt = {100.0: 0.0, 1000.0: 0.0, 4000.0: 0.0, math.inf: 0.0}
    for i in range(hours * 60 + 1):
        ts = first + timedelta(minutes=i)
        load = 0.75 + 0.25 * math.sin(i / 50)
        bad = trouble is not None and trouble[0] <= i < trouble[1]
        n = int(120 * load)
        if i:
            slow = int(n * (0.3 if bad else 0.004))
            server.serve({0.05: n // 2, 0.1: n - n // 2 - slow - 1, 0.5: 1, 2.5: slow}, itl_slow=int(n * 0.2))
            for bound, share in ((100.0, 0.5), (1000.0, 0.4 if not bad else 0.1), (4000.0, 0.1 if not bad else 0.4)):
                prompt[bound] += n * share
        label = "engine"
        values = {
            "vllm:num_requests_waiting": 40.0 if bad else 2 * load,
            "vllm:num_requests_running": 24 * load,
            "vllm:kv_cache_usage_perc": 0.97 if bad else 0.5 * load,
        }
        for metric, value in values.items():
            points.append(ServingPoint(name, "vllm", name, ts, metric, f'{label}="0"', value))
        points.append(
            ServingPoint(name, "vllm", name, ts, "vllm:request_success_total", 'finished_reason="stop"', server.ok)
        )
        points.append(ServingPoint(name, "vllm", name, ts, "vllm:generation_tokens_total", "", server.tokens))
        for metric, buckets in (
            ("vllm:time_to_first_token_seconds", server.ttft),
            ("vllm:inter_token_latency_seconds", server.itl),
            ("vllm:request_prompt_tokens", prompt),
        ):
            running = 0.0
            for bound, count in buckets.items():
                running += count
                le = "+Inf" if bound == math.inf else repr(bound)
                points.append(ServingPoint(name, "vllm", name, ts, f"{metric}_bucket", f'le="{le}"', running))
            points.append(ServingPoint(name, "vllm", name, ts, f"{metric}_count", "", running))
    store_serving_points(site_id=site.pk, batch_key=f"history-{name}", points=points)


def test_the_serving_pages_look_finished_on_desk_and_phone(stack: Stack, admin_user: User, site_a: Site) -> None:
    now = datetime.now(UTC)
    _history(site_a, "llama-3-70b-chat", hours=3, trouble=(120, 150), now=now)
    _history(site_a, "mistral-7b-batch", hours=3, trouble=None, now=now)
    serving_rollups.roll_everything(now=now)
    chat = Endpoint.objects.get(name="llama-3-70b-chat")
    Endpoint.objects.filter(pk=chat.pk).update(
        model_name="meta-llama/Llama-3.1-70B-Instruct", version="7", region="eu-west", replicas=4, ttft_threshold_ms=400
    )
    EndpointChange.objects.create(
        endpoint=chat, ts=now - timedelta(minutes=65), kind="quantisation", from_value="bf16", to_value="fp8"
    )
    EndpointEval.objects.create(endpoint=chat, ts=now - timedelta(minutes=40), suite="mmlu", metric="acc", score=0.79)
    username = admin_user.username

    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/serving/", OVERVIEW_PATH)
            for viewport in (DESK, PHONE):
                page.set_viewport_size(viewport)
                for path, ready, name in (
                    ("/serving/", "document.querySelectorAll('.endpoint-card').length === 2", "serving"),
                    (
                        f"/serving/endpoints/{chat.pk}/",
                        "(document.getElementById('chart-prompt')?.data?.length ?? 0) === 2",
                        "serving-endpoint",
                    ),
                ):
                    page.goto(stack.base_url + path)
                    wait_until(page, ready)
                    wait_until(page, "document.getElementById('live-status').classList.contains('on')")
                    page.wait_for_timeout(400)  # Plotly's resize after the layout settles
                    width = page.evaluate("document.documentElement.scrollWidth")
                    assert width <= viewport["width"], f"{path} is {width} px wide on a {viewport['width']} px screen"
                    page.screenshot(path=str(ARTIFACTS / f"{name}-{viewport['width']}.png"), full_page=True)
            # The change and the eval are marked on the TTFT chart, beside the SLO line.
            shapes = page.evaluate("document.getElementById('chart-ttft').layout.shapes.length")
            assert shapes == 3
            assert "Quantisation" in page.text_content("#markers-list")
            assert page.query_selector("#settings-form") is not None  # an Admin may edit the SLOs
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
