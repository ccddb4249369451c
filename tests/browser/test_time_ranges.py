"""End to end on the real stack (issue 21, item 21): dragging across a chart zooms to that window
and puts from / to in the URL, reloading that URL shows the same window, and an incident's page
links to the fleet, job and endpoint pages at the incident's window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth.models import User

from fleet.models import Endpoint, GpuState, Job, JobEvent, Site
from incidents.models import Incident
from tests.browser.support import ARTIFACTS, launch, sign_in, wait_for, wait_until
from tests.conftest import make_sample
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

HOST = "gpu-r-121"
G0 = "GPU-12121212-0000-4000-8000-000000000000"


def _post_samples(stack: Stack, token: str, ages_s: list[float]) -> None:
    now = datetime.now(UTC)
    samples = [
        make_sample(
            gpu_uuid=G0, hostname=HOST, gpu_index=0, ts=(now - timedelta(seconds=age)).isoformat(), gpu_util=60.0
        )
        for age in ages_s
    ]
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": samples},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text


# A chart's x-axis ends as epoch ms: Plotly keeps what it was given, or UTC wall-clock text after a drag.
_X_RANGE = (
    "document.getElementById('{chart}').layout.xaxis.range.map(function (v) {{"
    " return Date.parse(String(v).replace(' ', 'T') + (/Z|[+-]\\d\\d:?\\d\\d$/.test(v) ? '' : 'Z')); }})"
)


def _x_range(page: Any, chart: str) -> list[float]:
    return page.evaluate(_X_RANGE.format(chart=chart))


def _ms(text: str) -> float:
    return datetime.fromisoformat(text).timestamp() * 1000


def _requests(page: Any, path: str) -> list[str]:
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url) if path in request.url else None)
    return seen


def test_dragging_across_a_chart_zooms_and_the_url_shows_the_same_window_again(
    stack: Stack, viewer_user: User, site_a: Site, token_a: str
) -> None:
    _post_samples(stack, token_a, [20.0 * i for i in range(1, 44)])  # the last 14 minutes, every 20 s
    wait_for(lambda: GpuState.objects.filter(gpu__uuid=G0).exists(), "the worker to store the samples")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer_user.username, f"/fleet/gpus/{G0}/", "/series/")
            fetched = _requests(page, "/series/")
            wait_until(page, "(document.getElementById('chart-util').data?.[0]?.x.length ?? 0) > 10")
            assert page.input_value("#range") == "15m" and "from=" not in page.url

            # Drag across the middle third of the utilisation chart (Plotly's zoom).
            box = page.locator("#chart-util .nsewdrag").bounding_box()
            y = box["y"] + box["height"] / 2
            page.mouse.move(box["x"] + box["width"] * 0.35, y)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
            page.mouse.move(box["x"] + box["width"] * 0.65, y, steps=5)
            page.mouse.up()

            wait_until(page, "location.search.indexOf('from=') >= 0 && location.search.indexOf('to=') >= 0")
            query = parse_qs(urlsplit(page.url).query)
            start, end = _ms(query["from"][0]), _ms(query["to"][0])
            assert 3 * 60_000 < end - start < 6 * 60_000, (query, "a third of the 15-minute view")
            assert page.input_value("#range") == "custom"
            # The page read that window from the server, and draws exactly it.
            wait_until(page, "document.getElementById('last-update').textContent.indexOf('raw') >= 0")
            wait_for(lambda: any("from=" in url for url in fetched), "the custom window's read")
            # (The drag itself moved the utilisation chart: the power chart moves only once redrawn.)
            wait_until(page, f"Math.abs({_X_RANGE.format(chart='chart-power')}[0] - {start}) < 1000")
            assert _x_range(page, "chart-util") == pytest.approx([start, end], abs=1000)
            assert _x_range(page, "chart-power") == pytest.approx([start, end], abs=1000)

            # Reloading the URL (or sending it to a colleague) shows the same window.
            url = page.url
            fetched.clear()
            page.goto(url)
            wait_until(page, "(document.getElementById('chart-util').data?.[0]?.x.length ?? 0) > 0")
            assert page.input_value("#range") == "custom"
            assert page.input_value("#range-from") == query["from"][0][:19]
            assert _x_range(page, "chart-util") == pytest.approx([start, end], abs=1000)
            [read] = [u for u in fetched if "/series/" in u]
            assert parse_qs(urlsplit(read).query) == query
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "time-range-custom.png"))

            # A preset again: the window leaves the URL and the charts end now.
            page.select_option("#range", "1h")
            wait_until(page, "location.search === '?range=1h'")
            wait_until(page, "document.getElementById('last-update').textContent.indexOf('1m rollups') >= 0")
            page.screenshot(path=str(ARTIFACTS / "time-range-gpu.png"), full_page=True)
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()


def test_a_bad_window_in_the_url_is_named_beside_the_range_control(
    stack: Stack, viewer_user: User, site_a: Site
) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer_user.username, "/fleet/", "/overview/")
            page.goto(f"{stack.base_url}/fleet/?from=2026-01-01T02:40:00Z&to=2026-01-01T02:10:00Z")
            wait_until(page, "!document.getElementById('range-error').hidden")
            text = page.text_content("#range-error")
            assert text.startswith("to: Must be after from"), text
            # The refused read is the only error: no script failed on it.
            assert [e.split("?")[0] for e in log.errors] == [f"HTTP 400 {stack.base_url}/api/v1/fleet/overview/"]
        finally:
            browser.close()


def test_the_incident_page_opens_the_fleet_job_and_endpoint_pages_at_its_window(
    stack: Stack, viewer_user: User, site_a: Site
) -> None:
    now = datetime.now(UTC)
    began, resolved = now - timedelta(hours=5, minutes=3), now - timedelta(hours=4, minutes=31)
    job = Job.objects.create(site=site_a, name="llama", team="foundation", gang_size=8, scheduler_id="r21")
    JobEvent.objects.bulk_create(
        JobEvent(job=job, event_id=f"s{i}", seq=i, ts=began + timedelta(minutes=i), kind="step", step=i + 1)
        for i in range(30)
    )
    endpoint = Endpoint.objects.create(site=site_a, name="llama-chat")
    incident = Incident.objects.create(
        title="Job llama failed",
        severity="SEV2",
        category="training",
        group_key="job:r21",
        state="resolved",
        labels={"job": str(job.pk), "endpoint": str(endpoint.pk), "hostname": HOST},
        started_at=began,
        resolved_at=resolved,
    )
    # From 10 minutes before the fault began to 10 minutes after it resolved, on whole minutes.
    start = (began - timedelta(minutes=10)).replace(second=0, microsecond=0)
    end = (resolved + timedelta(minutes=10)).replace(second=0, microsecond=0) + timedelta(minutes=1)
    window = [start.timestamp() * 1000, end.timestamp() * 1000]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer_user.username, f"/incidents/{incident.pk}/", "/snapshot")
            fetched = _requests(page, "/api/v1/")
            incident_url = page.url

            page.click(f".labels a[href^='/training/jobs/{job.pk}/']")
            page.wait_for_url(f"**/training/jobs/{job.pk}/?from=*")
            wait_until(page, "(document.getElementById('chart-steps').data?.[0]?.x.length ?? 0) > 0")
            assert _x_range(page, "chart-steps") == pytest.approx(window, abs=1000)
            assert page.input_value("#range") == "custom"
            steps = page.evaluate("document.getElementById('chart-steps').data[0].x.length")
            assert steps >= 25, "the job's steps inside the incident's window"

            page.goto(incident_url)
            page.click(f".labels a[href^='/serving/endpoints/{endpoint.pk}/']")
            page.wait_for_url(f"**/serving/endpoints/{endpoint.pk}/?from=*")
            wait_until(page, "!!document.getElementById('chart-ttft').layout")
            assert _x_range(page, "chart-ttft") == pytest.approx(window, abs=60_000)  # whole minutes

            page.goto(incident_url)
            page.click("#incident-window a")
            page.wait_for_url("**/fleet/?from=*")
            wait_until(page, "!!document.getElementById('chart-util').layout")
            assert _x_range(page, "chart-util") == pytest.approx(window, abs=1000)
            reads = [u for u in fetched if "/snapshot" in u or "/overview/" in u]
            assert reads and all("from=" in u and "to=" in u for u in reads), reads
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
