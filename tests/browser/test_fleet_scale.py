"""The fleet page at a few thousand GPUs, in headless Chromium on the real stack: while live deltas
flow, its main thread has no task over 200 ms and its JS heap stays under 300 MB, and it never
holds (or receives) more than one table page of GPU rows.

The fleet is seeded by COPY (inventory and latest state, as ingest would have left them); then an
agent keeps reporting through the JSON door, the worker stores it, and the pushes reach the page.
The issue's 100,000-GPU figure is measured by bench/scale.py; this is its smaller `make test` twin.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connection

from fleet.models import Site
from tests.browser.support import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, BrowserLog, wait_in_page, wait_until
from tests.conftest import PASSWORD, make_sample
from tests.stack import Stack

pytestmark = [pytest.mark.browser, pytest.mark.solo]

GPUS = 4000  # 500 nodes of 8
NODES = GPUS // 8
LONG_TASK_MS = 200
HEAP_LIMIT = 300 * 1024 * 1024
FLOW_SECONDS = 20
# Installed before any of the page's scripts (CDP, so the page's CSP does not apply): every main
# thread task over 50 ms, with its start, for the assertions to take those after load.
LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver(function (list) {
  list.getEntries().forEach(function (e) { window.__longTasks.push({ start: e.startTime, ms: e.duration }); });
}).observe({ type: "longtask" });
// Each websocket message's handling, timed, so a long task can be told apart from the page's work.
window.__handlers = [];
(function () {
  var desc = Object.getOwnPropertyDescriptor(WebSocket.prototype, "onmessage");
  Object.defineProperty(WebSocket.prototype, "onmessage", {
    set: function (fn) {
      desc.set.call(this, function (event) {
        var t0 = performance.now();
        fn.call(this, event);
        var type = (event.data.match(/"type":"([^"]+)"/) || [])[1];
        window.__handlers.push({ start: t0, ms: performance.now() - t0, type: type });
      });
    },
    get: function () { return desc.get.call(this); },
  });
})();
"""


def _host(n: int) -> str:
    return f"gpu-a-{n:04d}"


def _uuid(node: int, index: int) -> str:
    return f"GPU-5ca1e000-{node:04d}-{index:04d}"


def _seed_by_copy(site: Site) -> None:
    """Nodes, GPUs and their latest state for GPUS GPUs, written with COPY (committed: the stack's
    processes read it)."""
    now = datetime.now(UTC)
    with connection.cursor() as cursor:
        raw = cursor.cursor
        with raw.copy(
            "COPY fleet_node (site_id, hostname, instance_type, interconnect, created_at) FROM STDIN"
        ) as copy:
            for n in range(NODES):
                copy.write_row((site.pk, _host(n), "DGX H100", "", now))
        cursor.execute("SELECT id, hostname FROM fleet_node WHERE site_id = %s", [site.pk])
        nodes = {hostname: pk for pk, hostname in cursor.fetchall()}
        with raw.copy(
            "COPY fleet_gpu (node_id, index, uuid, mig_profile, model, hbm_gib, created_at) FROM STDIN"
        ) as copy:
            for n in range(NODES):
                for i in range(8):
                    copy.write_row((nodes[_host(n)], i, _uuid(n, i), "", "NVIDIA H100 80GB HBM3", 80, now))
        cursor.execute(
            "SELECT g.id, g.uuid FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id WHERE n.site_id = %s", [site.pk]
        )
        gpus = cursor.fetchall()
        columns = (
            "gpu_id, ts, updated_at, gpu_util, gpu_temp_c, power_w, fb_used_mib, fb_free_mib, xid, ecc_dbe_total, "
            "throttle_reasons"
        )
        with raw.copy(f"COPY fleet_gpustate ({columns}) FROM STDIN") as copy:
            for k, (pk, _uuid_text) in enumerate(gpus):
                copy.write_row((pk, now, now, 50.0 + k % 50, 40.0 + k % 45, 500.0, 60000, 21000, 0, 0, 0))


def _report(stack: Stack, token: str, round_: int) -> None:
    """One agent round: the first page's GPUs (their rows are on screen) and a spread of others."""
    picked = [(n, i) for n in range(7) for i in range(8)] + [
        ((round_ * 37 + k * 11) % NODES, k % 8) for k in range(344)
    ]
    samples = [
        make_sample(gpu_uuid=_uuid(n, i), hostname=_host(n), gpu_index=i, gpu_util=float((round_ * 7 + n) % 100))
        for n, i in dict.fromkeys(picked)
    ]
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": samples},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 202, response.text


def _favour_the_browser() -> None:
    """Where the test may (root on a shared machine), run Chromium ahead of the other work on it,
    as a person's browser runs on a machine of its own; elsewhere it keeps its priority."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if "chrom" in child.name():
            with contextlib.suppress(psutil.AccessDenied, psutil.NoSuchProcess):
                child.nice(-5)


def _heap(cdp: Any) -> int:
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return int(metrics["JSHeapUsedSize"])


def test_the_fleet_page_stays_responsive_and_small_at_thousands_of_gpus(
    stack: Stack, viewer_user: User, site_a: Site, token_a: str
) -> None:
    _seed_by_copy(site_a)
    # The measure is of the page's own work. Here the server, the worker and Chromium share two
    # cores (in use the browser has its own machine): the stack yields the CPU to the browser, so
    # a task's length is the page's work, not the time the renderer waited for the ingest writer.
    for proc in stack.procs:
        os.setpriority(os.PRIO_PROCESS, proc.pid, 15)
    username = viewer_user.username
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # The page measured is the one a person looks at: Chromium must not treat the headless
        # renderer as a background tab (it lowers a background renderer's CPU priority).
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[*CHROMIUM_ARGS, "--disable-renderer-backgrounding", "--disable-background-timer-throttling"],
            headless=True,
        )
        _favour_the_browser()
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.add_init_script(LONG_TASKS)
            page = context.new_page()
            log = BrowserLog(page, "/api/v1/fleet/overview/")
            page.goto(f"{stack.base_url}/accounts/login/?next=/fleet/")
            page.fill("#id_username", username)
            page.fill("#id_password", PASSWORD)
            with page.expect_navigation():
                page.click("form button[type=submit]")
            cdp = context.new_cdp_session(page)
            cdp.send("Performance.enable")

            wait_until(page, f"document.getElementById('gpu-count').textContent === '{GPUS} of {GPUS}'")
            wait_until(page, "(document.getElementById('chart-util').data?.[0]?.x.length ?? -1) >= 0")
            wait_in_page(
                page, lambda: any(len(f["topics"]) == 2 for f in log.of_type("subscribed")), "the table view's topic"
            )
            loaded_at = page.evaluate("performance.now()")

            # --- deltas flow: an agent round a second, each stored, pushed and drawn -------------
            heaps = [_heap(cdp)]
            started = time.monotonic()
            round_ = 0
            while time.monotonic() - started < FLOW_SECONDS:
                _report(stack, token_a, round_)
                round_ += 1
                page.wait_for_timeout(1000)
                heaps.append(_heap(cdp))
            page.wait_for_timeout(2000)  # the last round's pushes land

            deltas, rows = log.of_type("fleet.delta"), log.of_type("fleet.rows")
            assert len(deltas) >= FLOW_SECONDS // 4, f"too few fleet pushes reached the page: {len(deltas)}"
            assert rows, "no push of the table page's rows reached the page"
            # No push carries more than the page on screen; the fleet topic carries no rows at all.
            assert all("gpus" not in d and len(d["worst"]) <= 50 for d in deltas)
            assert max(len(r["gpus"]) for r in rows) <= 50 and {r["count"] for r in rows} == {GPUS}
            assert page.evaluate("window.goodputFleet.rows().length") == 50
            assert page.evaluate("document.querySelectorAll('#gpu-table tbody tr').length") == 50
            assert page.text_content('[data-total="gpus"]') == str(GPUS)

            long_after_load = page.evaluate(
                f"window.__longTasks.filter(function (t) {{ return t.start > {loaded_at}; }})"
            )
            handlers = page.evaluate(f"window.__handlers.filter(function (t) {{ return t.start > {loaded_at}; }})")
            slowest = sorted(handlers, key=lambda h: -h["ms"])[:5]
            worst_task = max((t["ms"] for t in long_after_load), default=0.0)
            heap_peak = max(heaps)
            print(
                f"fleet page at {GPUS} GPUs: {len(deltas)} fleet pushes, {len(rows)} row pushes, "
                f"longest task after load {worst_task:.0f} ms, JS heap peak {heap_peak / 2**20:.1f} MiB"
            )
            assert worst_task <= LONG_TASK_MS, (
                f"a main-thread task took {worst_task:.0f} ms after load: {long_after_load}; "
                f"the slowest message handlers: {slowest}"
            )
            assert heap_peak < HEAP_LIMIT, f"the JS heap reached {heap_peak / 2**20:.0f} MiB"

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "fleet-scale.png"), full_page=True)
            page.set_viewport_size({"width": 390, "height": 844})
            page.screenshot(path=str(ARTIFACTS / "fleet-scale-phone.png"), full_page=True)
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
