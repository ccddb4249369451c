"""End to end: the fleet dashboard in headless Chromium follows new telemetry live.

The whole production path runs for real: an agent's HTTP batch reaches uvicorn, is queued on
Redis, stored by a Celery worker process in the test database, and pushed as a delta over
channels-redis to the page's websocket, where fleet.js appends to the Plotly charts with
extendTraces. Nothing reloads the page, or re-fetches its snapshot, between the first snapshot and
the assertions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from fleet.models import Gpu, GpuState, Site
from tests.browser.support import ARTIFACTS, launch, sign_in, wait_for, wait_in_page, wait_until
from tests.conftest import make_sample
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

SNAPSHOT_PATH = "/api/v1/fleet/overview/"

# Points in the first trace of the utilisation chart, as Plotly holds them (-1: not drawn yet).
JS_UTIL_POINTS = "(document.getElementById('chart-util').data?.[0]?.x.length ?? -1)"
JS_TABLE_ROWS = "document.querySelectorAll('#gpu-table tbody tr').length"
JS_GPU_TOTAL = "document.querySelector('[data-total=\"gpus\"]').textContent"


def _uuid(n: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{n:012d}"


def _samples(gpus: list[tuple[str, str, int]], *, ages_s: list[float], util: float) -> list[dict[str, Any]]:
    """One sample per GPU per age (seconds before now); ``gpus`` holds (uuid, hostname, index)."""
    now = datetime.now(UTC)
    return [
        make_sample(
            gpu_uuid=uuid,
            hostname=hostname,
            gpu_index=index,
            ts=(now - timedelta(seconds=age)).isoformat(),
            gpu_util=util,
            gpu_temp_c=55.0 + index,
        )
        for age in ages_s
        for uuid, hostname, index in gpus
    ]


def _post_samples(stack: Stack, token: str, samples: list[dict[str, Any]]) -> None:
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": samples},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == len(samples)


def test_fleet_dashboard_follows_live_telemetry(stack: Stack, viewer_user: User, site_a: Site, token_a: str) -> None:
    # --- batch 1: 4 GPUs on 2 hosts, with history in past 10 s buckets, so the snapshot has a
    # series (the newest, still-filling bucket is left out of it) -------------------------------
    first = [(_uuid(i), f"gpu-a-00{1 + i // 2}", i % 2) for i in range(4)]
    _post_samples(stack, token_a, _samples(first, ages_s=[55, 40, 25], util=60.0))
    wait_for(lambda: GpuState.objects.filter(gpu__node__site=site_a).count() == 4, "the worker to store batch 1")
    username = viewer_user.username

    # No ORM inside the Playwright block: its sync API runs an event loop in this thread (Django
    # refuses queries there as async-unsafe) and switches greenlets, whose separate contexts open a
    # second database connection that outlives the test and blocks the test database's teardown.
    # The page is the witness inside; the database is checked after the browser has closed.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/fleet/", SNAPSHOT_PATH)

            # --- the snapshot: table, totals, and a chart with history --------------------------
            wait_until(page, f"{JS_TABLE_ROWS} === 4")
            wait_until(page, f"{JS_UTIL_POINTS} >= 0")
            # The fleet topic first, then the table page's own topic, named by the snapshot.
            wait_in_page(
                page,
                lambda: any(len(f["topics"]) == 2 for f in log.of_type("subscribed")),
                "the websocket subscription to be confirmed",
            )
            assert log.of_type("subscribed")[0]["topics"] == ["fleet"]
            topics = log.of_type("subscribed")[-1]["topics"]
            assert topics[0] == "fleet" and topics[1].startswith("fleetview.")
            points_before = page.evaluate(JS_UTIL_POINTS)
            assert points_before >= 1, "the snapshot's series should hold batch 1's past buckets"
            assert page.text_content('[data-total="gpus"]') == "4"
            assert page.get_attribute("#live-status", "class") == "live-dot on"
            page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
            deltas_before = len(log.of_type("fleet.delta"))

            # --- batch 2: 2 new GPUs on a new host, and newer samples for the first 4 ------------
            second = [(_uuid(10 + i), "gpu-a-003", i) for i in range(2)]
            _post_samples(stack, token_a, _samples(first + second, ages_s=[0], util=90.0))

            # --- the page follows over the websocket --------------------------------------------
            wait_until(page, f"{JS_GPU_TOTAL} === '6'")
            wait_until(page, f"{JS_TABLE_ROWS} === 6")
            wait_until(page, f"{JS_UTIL_POINTS} > {points_before}")

            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            assert log.fetches == 1, "the page re-fetched its snapshot instead of applying the delta"
            assert len(log.of_type("fleet.delta")) > deltas_before
            # The new rows came over the table page's topic; the fleet topic carries no rows.
            assert log.of_type("fleet.rows") and all("gpus" not in d for d in log.of_type("fleet.delta"))
            assert page.evaluate(JS_UTIL_POINTS) == points_before + 1, "one push appends one point"
            assert page.evaluate("document.getElementById('chart-util').data[0].y.slice(-1)[0]") == 90.0
            assert page.text_content("#gpu-count") == "6 of 6"
            assert page.locator("#gpu-table tbody a[href='/fleet/nodes/gpu-a-003/']").count() == 2
            assert page.text_content('[data-total="reporting"]') == "6"
            assert page.text_content('[data-total="mean_util"]') == "90.0"

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "fleet-dashboard.png"), full_page=True)
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()

    assert Gpu.objects.filter(node__site=site_a).count() == 6
    assert set(GpuState.objects.filter(gpu__node__site=site_a).values_list("gpu_util", flat=True)) == {90.0}


def test_live_socket_stays_up_between_pushes(stack: Stack, viewer_user: User, site_a: Site, token_a: str) -> None:
    """A quiet fleet must not cost a reconnect and a full snapshot every few seconds."""
    first = [(_uuid(i), "gpu-a-001", i) for i in range(2)]
    _post_samples(stack, token_a, _samples(first, ages_s=[30], util=50.0))
    wait_for(lambda: GpuState.objects.filter(gpu__node__site=site_a).count() == 2, "the worker to store batch 1")
    username = viewer_user.username

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/fleet/", SNAPSHOT_PATH)
            wait_until(page, f"{JS_TABLE_ROWS} === 2")
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription to be confirmed")
            page.wait_for_timeout(8_000)  # longer than the layer's 5 s blocking receive

            _post_samples(stack, token_a, _samples([*first, (_uuid(10), "gpu-a-002", 0)], ages_s=[0], util=70.0))
            wait_until(page, f"{JS_GPU_TOTAL} === '3'")
            assert (log.sockets_opened, log.sockets_closed) == (1, 0), "the live websocket dropped and reconnected"
            assert log.fetches == 1, "the page re-fetched its snapshot"
            assert len(log.of_type("fleet.delta")) >= 1
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
