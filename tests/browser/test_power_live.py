"""End to end: the power page in headless Chromium follows a rack's draw live.

GPU samples go to the JSON ingest door with an agent token, are stored by a real Celery worker, and
ingest requests the ``power`` push while a page follows it; the push goes through channels-redis to
the page's websocket, where power.js moves the rack's draw, its bar against the budget, and (once
the rollup task, sent to the worker here as the beat would, has rolled a minute) the site's draw
chart. Nothing reloads the page or re-reads its snapshot in between. The page is also photographed
on a desk and on a phone.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
import requests
from django.contrib.auth.models import User

from fleet.models import GpuState, Node, Rack, Site
from fleet.tasks import update_rollups
from tests.browser.support import ARTIFACTS, LIVE_TIMEOUT_MS, launch, sign_in, wait_for, wait_in_page, wait_until
from tests.conftest import make_sample
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

SNAPSHOT_PATH = "/api/v1/power/"
PHONE = {"width": 390, "height": 844}
GPUS = [(f"GPU-00000000-0000-4000-9000-{i:012d}", "pw-1", i) for i in range(2)]


def _post(stack: Stack, token: str, watts: float) -> None:
    now = datetime.now(UTC).isoformat()
    samples = [
        make_sample(gpu_uuid=uuid, hostname=host, gpu_index=index, ts=now, power_w=watts) for uuid, host, index in GPUS
    ]
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": samples},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text


def _rack_cell(rack_id: int, col: str) -> str:
    return f"document.querySelector(\"tr[data-rack='{rack_id}'] [data-col='{col}']\")?.textContent"


def test_the_power_page_follows_a_racks_draw_live(stack: Stack, viewer_user: User, site_a: Site, token_a: str) -> None:
    # One node of two GPUs in a 4 kW rack: draw = 2 x power + the node overhead (2 kW by default).
    rack = Rack.objects.create(site=site_a, name="r01", power_budget_kw=4)
    Node.objects.create(site=site_a, rack=rack, hostname="pw-1")
    _post(stack, token_a, 400.0)
    wait_for(lambda: GpuState.objects.filter(gpu__node__site=site_a).count() == 2, "the worker to store the samples")
    username = viewer_user.username
    draw, pct = _rack_cell(rack.pk, "draw"), _rack_cell(rack.pk, "pct")
    bar = f"document.querySelector(\"tr[data-rack='{rack.pk}'] .power-bar\")"
    chart = f"document.getElementById('power-chart-{site_a.pk}')?.data?.[0]"

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the page is the witness.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/power/", SNAPSHOT_PATH)
            wait_until(page, f"{draw} === '2.8 kW'")
            assert page.evaluate(pct) == "70 %"
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription to be confirmed")
            assert log.of_type("subscribed")[-1]["topics"] == ["power"]
            page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

            # --- the rack runs hot: 2 x 1,100 W + 2 kW = 4.2 kW of its 4 kW budget --------------
            _post(stack, token_a, 1100.0)
            wait_until(page, f"{draw} === '4.2 kW'")
            assert page.evaluate(pct) == "105 %"
            assert page.evaluate(f"{bar}.dataset.level") == "over"
            assert page.evaluate(f"{bar}.querySelector('i').style.width") == "100%"
            # The site's only rack is over its budget: the site has no room left, whatever its
            # 500 kW contract says.
            headroom = page.text_content(f"[data-site='{site_a.pk}'] [data-field='headroom']")
            assert headroom == "0.0 kW"
            limit = page.text_content(f"[data-site='{site_a.pk}'] [data-field='headroom-limit']")
            assert limit == "what the rack budgets allow"
            parts = page.text_content(f"[data-site='{site_a.pk}'] [data-field='draw-parts']")
            assert parts == "GPUs 2.2 kW + node overhead 2.0 kW (assumed)"

            # --- the chart takes the rolled-up minute from a later push -----------------------------
            deadline = time.monotonic() + LIVE_TIMEOUT_MS / 1000
            while not page.evaluate(f"({chart}?.x.length ?? 0) >= 1"):
                assert time.monotonic() < deadline, "timed out waiting for the draw chart to take a minute"
                update_rollups.delay()
                page.wait_for_timeout(700)
                _post(stack, token_a, 1100.0)  # the next ingest asks for the next push
                page.wait_for_timeout(800)
            # The minute's mean: its 400 W samples and its 1,100 W ones, plus the overhead.
            assert 2.8 <= page.evaluate(f"{chart}.y[{chart}.y.length - 1]") <= 4.2

            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            assert log.fetches == 1, "the page re-fetched its snapshot instead of applying the push"
            assert log.of_type("power.delta")
            assert not log.errors, f"the browser reported errors: {log.errors}"

            # --- how it looks on a desk and on a phone ----------------------------------------------
            ARTIFACTS.mkdir(exist_ok=True)
            for viewport in ({"width": 1440, "height": 900}, PHONE):
                page.set_viewport_size(viewport)
                page.wait_for_timeout(400)  # Plotly's resize after the layout settles
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= viewport["width"], f"/power/ is {width} px wide on a {viewport['width']} px screen"
                page.screenshot(path=str(ARTIFACTS / f"power-{viewport['width']}.png"), full_page=True)
        finally:
            browser.close()
