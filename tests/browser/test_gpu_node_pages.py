"""End to end on the real stack: the GPU and node pages follow live samples and switch range, and the
fleet page draws no error when live deltas race its snapshot (first load, a range change)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from fleet.models import GpuState, Site
from tests.browser.support import ARTIFACTS, BrowserLog, launch, sign_in, wait_for, wait_in_page, wait_until
from tests.conftest import PASSWORD, make_sample
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

HOST = "gpu-a-007"
G0, G1 = "GPU-77777777-0000-4000-8000-000000000000", "GPU-77777777-0000-4000-8000-000000000001"


def _post(stack: Stack, token: str, *, ages_s: list[float], util: float, gpus: tuple[str, ...] = (G0, G1)) -> None:
    now = datetime.now(UTC)
    samples = [
        make_sample(
            gpu_uuid=uuid,
            hostname=HOST,
            gpu_index=i,
            ts=(now - timedelta(seconds=age)).isoformat(),
            gpu_util=util,
            power_w=400.0 + i,
        )
        for age in ages_s
        for i, uuid in enumerate(gpus)
    ]
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": samples},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text


def _points(chart: str, trace: int = 0) -> str:
    return f"(document.getElementById('{chart}').data?.[{trace}]?.x.length ?? -1)"


def _last_y(chart: str, trace: int = 0) -> str:
    return f"document.getElementById('{chart}').data[{trace}].y.slice(-1)[0]"


def test_the_gpu_page_follows_a_live_sample_and_switches_range(
    stack: Stack, viewer_user: User, site_a: Site, token_a: str
) -> None:
    _post(stack, token_a, ages_s=[60, 45, 30], util=40.0)
    wait_for(lambda: GpuState.objects.filter(gpu__node__hostname=HOST).count() == 2, "the worker to store batch 1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer_user.username, f"/fleet/gpus/{G0}/", "/series/")
            wait_until(page, f"{_points('chart-util')} >= 1")
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription")
            [topic] = log.of_type("subscribed")[-1]["topics"]
            assert topic.startswith("gpu.")
            # One unit per chart: utilisation, temperature and power each have their own.
            assert page.evaluate("document.getElementById('chart-util').layout.yaxis.title.text") == "%"
            assert page.evaluate("document.getElementById('chart-temp').layout.yaxis.title.text") == "°C"
            assert page.evaluate("document.getElementById('chart-power').layout.yaxis.title.text") == "W"
            before = page.evaluate(_points("chart-util"))

            _post(stack, token_a, ages_s=[0], util=93.0)
            wait_until(page, f"{_last_y('chart-util')} === 93")
            assert page.evaluate(_points("chart-util")) > before
            assert page.evaluate(_last_y("chart-power")) == 400.0
            assert any(f["topic"] == topic for f in log.of_type("gpu.delta"))

            fetches = log.fetches
            page.select_option("#range", "1h")
            wait_until(page, "document.getElementById('last-update').textContent.includes('1m rollups')")
            assert log.fetches == fetches + 1
            page.select_option("#range", "7d")
            wait_until(page, "document.getElementById('last-update').textContent.includes('1h rollups')")
            page.select_option("#range", "15m")
            wait_until(page, "document.getElementById('last-update').textContent.includes('raw samples')")
            _post(stack, token_a, ages_s=[0], util=71.0)
            wait_until(page, f"{_last_y('chart-util')} === 71")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "gpu-page.png"), full_page=True)
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()


def test_the_node_page_charts_its_gpus_side_by_side_live(
    stack: Stack, viewer_user: User, site_a: Site, token_a: str
) -> None:
    _post(stack, token_a, ages_s=[60, 45, 30], util=40.0)
    wait_for(lambda: GpuState.objects.filter(gpu__node__hostname=HOST).count() == 2, "the worker to store batch 1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer_user.username, f"/fleet/nodes/{HOST}/", "/series/")
            wait_until(page, "document.getElementById('chart-util').data?.length === 2")
            names = page.evaluate("document.getElementById('chart-power').data.map(t => t.name)")
            assert names == ["gpu0", "gpu1"]
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription")
            _post(stack, token_a, ages_s=[0], util=88.0)
            wait_until(page, f"{_last_y('chart-util', 1)} === 88")
            assert page.evaluate(_last_y("chart-power", 1)) == 401.0
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "node-page.png"), full_page=True)
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()


def test_the_fleet_page_draws_no_error_when_deltas_race_its_snapshot(
    stack: Stack, viewer_user: User, site_a: Site, token_a: str
) -> None:
    """'gd.data must be an array': a delta that arrived before the snapshot drew the charts."""
    _post(stack, token_a, ages_s=[60, 45, 30], util=40.0)
    wait_for(lambda: GpuState.objects.filter(gpu__node__hostname=HOST).count() == 2, "the worker to store batch 1")
    from playwright.sync_api import sync_playwright

    held: list[Any] = []

    def hold_snapshot(route: Any) -> None:
        # While the snapshot is held, new telemetry makes the server push a delta to the page.
        if len(held) < 2:
            held.append(route.request.url)
            time.sleep(0.5)
            _post(stack, token_a, ages_s=[0], util=50.0 + len(held))
            time.sleep(2.5)
        route.continue_()

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            log = BrowserLog(page, "/api/v1/fleet/overview/")
            page.goto(f"{stack.base_url}/accounts/login/?next=/fleet/")
            page.fill("#id_username", viewer_user.username)
            page.fill("#id_password", PASSWORD)
            page.route("**/api/v1/fleet/overview/**", hold_snapshot)
            with page.expect_navigation():
                page.click("form button[type=submit]")
            wait_until(page, "(document.getElementById('chart-util').data?.[0]?.x.length ?? -1) >= 1")
            page.select_option("#range", "1h")
            wait_in_page(page, lambda: len(held) == 2, "the range change's snapshot")
            wait_until(page, "document.querySelectorAll('#gpu-table tbody tr').length === 2")
            page.wait_for_timeout(1500)
            assert len(log.of_type("fleet.delta")) >= 1, "no delta raced the snapshot: the test proves nothing"
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
