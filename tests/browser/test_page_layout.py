"""How pages lay out, in headless Chromium: the incident list fits a desk window, chart labels do
not run into each other (eval markers on an endpoint's charts, conflict months on the capacity
plan on a phone), and a count axis has no half incidents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleet.models import Endpoint, Gpu, Node, Pool, Reservation, Site, Team
from fleet.serving.models import EndpointEval
from incidents.services.engine import raise_finding
from tests.browser.support import ARTIFACTS, launch, sign_in, wait_until
from tests.conftest import _make_user
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

DESK = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}

# Each annotation of a Plotly chart: its text and its box on the screen.
ANNOTATIONS = """id => [...document.querySelectorAll('#' + id + ' g.annotation')].map(g => {
  const r = g.getBoundingClientRect();
  return {text: g.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
})"""


def _overlaps(boxes: list[dict[str, Any]]) -> list[str]:
    found = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if (
                a["left"] < b["right"] - 1
                and b["left"] < a["right"] - 1
                and a["top"] < b["bottom"] - 1
                and b["top"] < a["bottom"] - 1
            ):
                found.append(f"{a['text']!r} runs into {b['text']!r}")
    return found


def _page(browser: Any, stack: Stack, username: str, path: str, viewport: dict[str, int]) -> tuple[Any, Any]:
    page, log = sign_in(browser, stack, username, path, "/api/")
    page.set_viewport_size(viewport)
    page.wait_for_timeout(300)
    return page, log


def test_the_incident_list_fits_a_desk_window_with_long_titles(stack: Stack, site_a: Site) -> None:
    viewer = _make_user("vera", "Viewer")
    for n in range(6):
        raise_finding(
            f"layout:{n}",
            {"site": site_a.name, "hostname": f"gpu-a-{n:03d}"},
            "SEV2",
            f"Double-bit ECC errors on gpu-a-{n:03d} GPU {n}: 2 since the driver loaded (+1 in 10 min); "
            "the node must be drained and its jobs restarted elsewhere before the next checkpoint",
            category="gpu-health",
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = _page(browser, stack, viewer.username, "/incidents/", DESK)
            wait_until(page, "document.getElementById('live-status').classList.contains('on')")
            table = page.evaluate("document.getElementById('incident-table').getBoundingClientRect().right")
            card = page.evaluate(
                "document.getElementById('incident-table').parentElement.getBoundingClientRect().right"
            )
            width = page.evaluate("document.documentElement.scrollWidth")
            heads = page.evaluate("[...document.querySelectorAll('#incident-table th')].map(th => th.textContent)")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "incident-list-1440.png"), full_page=True)
            assert not log.errors, log.errors
        finally:
            browser.close()
    assert heads[-5:] == ["Site", "Category", "Detected", "GPU-hours", "Commander"]
    assert width <= DESK["width"] and table <= card + 0.5, f"the table ends at {table} px in a card ending at {card}"


def test_the_incident_count_axis_has_whole_numbers_only(stack: Stack, site_a: Site) -> None:
    viewer = _make_user("vera", "Viewer")
    raise_finding("axis:1", {"site": site_a.name}, "SEV3", "One incident", category="gpu-health")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = _page(browser, stack, viewer.username, "/incidents/metrics/", DESK)
            wait_until(page, "document.querySelectorAll('#chart-categories .ytick').length > 0")
            ticks = page.evaluate("[...document.querySelectorAll('#chart-categories .ytick')].map(t => t.textContent)")
            assert not log.errors, log.errors
        finally:
            browser.close()
    assert ticks and all(t.isdigit() for t in ticks), f"the incident-count axis reads {ticks}"


def test_evals_posted_together_share_one_label_on_the_endpoint_charts(stack: Stack, site_a: Site) -> None:
    viewer = _make_user("vera", "Viewer")
    endpoint = Endpoint.objects.create(site=site_a, name="labels")
    now = datetime.now(UTC)
    for n, suite in enumerate(("mmlu", "gsm8k", "hellaswag", "arc", "truthfulqa")):
        EndpointEval.objects.create(
            endpoint=endpoint,
            ts=now - timedelta(minutes=90 - 2 * n),
            suite=suite,
            metric="accuracy",
            score=0.7 + n / 100,
        )
    EndpointEval.objects.create(
        endpoint=endpoint, ts=now - timedelta(hours=4), suite="mmlu", metric="accuracy", score=0.69
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = _page(browser, stack, viewer.username, f"/serving/endpoints/{endpoint.pk}/", DESK)
            wait_until(page, "document.querySelectorAll('#chart-ttft g.annotation').length > 0")
            boxes = page.evaluate(ANNOTATIONS, "chart-ttft")
            page.screenshot(path=str(ARTIFACTS / "endpoint-eval-labels-1440.png"), full_page=True)
            assert not log.errors, log.errors
        finally:
            browser.close()
    evals = [b for b in boxes if "eval" in b["text"]]
    assert sorted(b["text"] for b in evals) == ["5 evals", "eval 0.69"]
    assert _overlaps(evals) == []


def test_the_capacity_plan_on_a_phone_labels_conflict_months_legibly(stack: Stack, site_a: Site) -> None:
    viewer = _make_user("vera", "Viewer")
    node = Node.objects.create(site=site_a, hostname="cap-1")
    for i in range(2):
        Gpu.objects.create(node=node, index=i, uuid=f"GPU-cap-{i}", model="NVIDIA H100 80GB HBM3")
    pool = Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="h100")
    start = datetime.now(UTC) - timedelta(days=1)
    # Four GPUs reserved for eight months on two installed: every one of those months in conflict.
    Reservation.objects.create(
        pool=pool,
        team=Team.objects.create(name="nlp"),
        gpus=4,
        start=start,
        end=start + timedelta(days=240),
        state="approved",
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = _page(browser, stack, viewer.username, "/capacity/", PHONE)
            wait_until(
                page, "document.querySelectorAll('#chart-plan .shapelayer path, #chart-plan g.annotation').length > 0"
            )
            page.wait_for_timeout(500)  # the redraw for the phone's width
            boxes = page.evaluate(ANNOTATIONS, "chart-plan")
            shaded = page.evaluate("document.getElementById('chart-plan').layout.shapes.length")
            page.screenshot(path=str(ARTIFACTS / "capacity-plan-labels-390.png"), full_page=True)
            assert not log.errors, log.errors
        finally:
            browser.close()
    conflicts = [b for b in boxes if "conflict" in b["text"]]
    assert shaded >= 8 and conflicts, "the months in conflict are shaded and labelled"
    assert all(b["text"] == "conflict" for b in conflicts)
    assert _overlaps(conflicts) == []
