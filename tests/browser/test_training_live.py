"""End to end: the training pages in headless Chromium follow a job's steps live.

A training client's HTTP batches reach uvicorn, are stored by the events writer, and the live
pushes they request go through a real Celery worker and channels-redis to the page's websocket:
training.js updates the running jobs' table, training_job.js the job's step and its charts.
Nothing reloads the page, or re-fetches its snapshot, between the first snapshot and the
assertions. The pages are also photographed with a realistic history, on a desk and on a phone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from fleet.models import Gpu, GpuRollup1m, Job, Node, Site
from fleet.telemetry import partitions
from fleet.training.accounts import refresh_job_accounts
from tests.browser.support import ARTIFACTS, launch, sign_in, wait_in_page, wait_until
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

OVERVIEW_PATH = "/api/v1/training/overview"
DESK = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


def _post(stack: Stack, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = requests.post(stack.base_url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code in (200, 201), response.text
    return response.json()  # type: ignore[no-any-return]


def _register(stack: Stack, token: str, name: str, **fields: Any) -> int:
    body = {"name": name, "team": "foundation", "gang_size": 16, "scheduler": "kueue", "scheduler_id": name, **fields}
    return int(_post(stack, token, "/api/v1/training/jobs/", body)["id"])


def _events(stack: Stack, token: str, job_id: int, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 500):
        _post(stack, token, f"/api/v1/training/jobs/{job_id}/events", {"events": events[i : i + 500]})


def _steps(first: int, last: int, *, end: datetime, every_s: float, prefix: str = "st") -> list[dict[str, Any]]:
    """Step events first..last, one every ``every_s`` seconds, the last one at ``end``."""
    n = last - first
    return [
        {
            "id": f"{prefix}{s}",
            "ts": (end - timedelta(seconds=(n - i) * every_s)).isoformat(),
            "kind": "step",
            "step": s,
            "step_time_s": every_s,
            "data_wait_s": 0.1,
            "tokens": 4096 * 16,
        }
        for i, s in enumerate(range(first, last + 1))
    ]


def test_the_training_pages_follow_steps_live(stack: Stack, viewer_user: User, site_a: Site, token_a: str) -> None:
    now = datetime.now(UTC)
    job_id = _register(stack, token_a, "llama-8b-live")
    start = now - timedelta(minutes=2)
    _events(
        stack,
        token_a,
        job_id,
        [
            {"id": "alloc", "ts": start.isoformat(), "kind": "allocated"},
            {"id": "start", "ts": (start + timedelta(seconds=5)).isoformat(), "kind": "started"},
            *_steps(1, 20, end=now - timedelta(seconds=20), every_s=2.0),
        ],
    )
    username = viewer_user.username

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the page is the witness.
    from playwright.sync_api import sync_playwright

    step_cell = f'document.querySelector(\'#running-table tr[data-job="{job_id}"] [data-col="step"]\')'
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/training/", OVERVIEW_PATH)
            wait_until(page, f"{step_cell} && {step_cell}.textContent === '20'")
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription to be confirmed")
            assert log.of_type("subscribed")[-1]["topics"] == ["training"]
            rate_before = page.text_content(f'#running-table tr[data-job="{job_id}"] [data-col="step_rate"]')
            page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

            # --- the trainer reports 20 more steps, at twice the pace ----------------------------
            later = datetime.now(UTC)
            _events(stack, token_a, job_id, _steps(21, 40, end=later, every_s=1.0))
            wait_until(page, f"{step_cell}.textContent === '40'")

            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            assert log.fetches == 1, "the page re-fetched its snapshot instead of applying the push"
            deltas = log.of_type("training.delta")
            assert deltas and any(j["last_step"] == 40 for d in deltas for j in d["running"])
            rate_after = page.text_content(f'#running-table tr[data-job="{job_id}"] [data-col="step_rate"]')
            assert rate_after != rate_before, "the step rate cell should follow the new steps"
            assert not log.errors, f"the browser reported errors: {log.errors}"
            page.close()

            # --- the job's own page follows its topic ---------------------------------------------
            page, log = sign_in(browser, stack, username, f"/training/jobs/{job_id}/", "/snapshot")
            wait_until(page, "document.querySelector('[data-stat=\"last_step\"]').textContent === '40'")
            wait_until(page, "(document.getElementById('chart-steps').data?.[0]?.x.length ?? 0) > 0")
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the job page's subscription")
            assert log.of_type("subscribed")[-1]["topics"] == [f"job.{job_id}"]
            page.evaluate("window.__sameDocument = true")
            # After the last step sent (a trainer's clock only moves forward), and a few seconds on.
            last = max(datetime.now(UTC), later + timedelta(seconds=5))
            _events(
                stack,
                token_a,
                job_id,
                [
                    *_steps(41, 45, end=last, every_s=1.0),
                    {
                        "id": "ckpt45",
                        "ts": (last + timedelta(seconds=3)).isoformat(),
                        "kind": "checkpoint_saved",
                        "step": 45,
                        "duration_s": 2.5,
                        "bytes": 10**9,
                    },
                ],
            )
            wait_until(page, "document.querySelector('[data-stat=\"last_step\"]').textContent === '45'")
            wait_until(page, "document.querySelector('#timeline li.ev-checkpoint_saved') !== null")
            assert page.evaluate("window.__sameDocument === true"), "the job page reloaded"
            assert log.fetches == 1, "the job page re-fetched its snapshot instead of applying the push"
            assert log.of_type("job.delta")
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()


def _history(stack: Stack, token: str, site: Site) -> int:
    """A realistic few hours of three jobs: checkpoints, a failure and a restore, a data stall."""
    now = datetime.now(UTC).replace(microsecond=0)
    node = Node.objects.create(site=site, hostname="gpu-a-201")
    gpus = [
        Gpu.objects.create(node=node, index=i, uuid=f"GPU-00000000-0000-4000-8000-0000000002{i:02d}") for i in range(8)
    ]
    main = _register(stack, token, "llama-70b-pretrain", gang_size=8, nodes=["gpu-a-201"], checkpoint_interval_s=1800)
    begin = now - timedelta(hours=3)
    events: list[dict[str, Any]] = [
        {"id": "a", "ts": begin.isoformat(), "kind": "allocated"},
        {"id": "s", "ts": (begin + timedelta(minutes=4)).isoformat(), "kind": "started"},
    ]
    step, n, t = 0, 0, begin + timedelta(minutes=5)
    failed = False
    while t < now - timedelta(seconds=30):
        step += 1
        n += 1  # event ids stay unique when the steps repeat after the restore
        wait = 6.0 if begin + timedelta(minutes=100) < t < begin + timedelta(minutes=115) else 0.2
        events.append(
            {
                "id": f"p{n}",
                "ts": t.isoformat(),
                "kind": "step",
                "step": step,
                "step_time_s": 20.0,
                "data_wait_s": wait,
                "tokens": 8 * 4096,
            }
        )
        if step % 90 == 0:
            t += timedelta(seconds=45)
            events.append(
                {
                    "id": f"c{n}",
                    "ts": t.isoformat(),
                    "kind": "checkpoint_saved",
                    "step": step,
                    "duration_s": 45.0,
                    "bytes": 140 * 10**9,
                }
            )
        if not failed and t > begin + timedelta(minutes=75):
            failed = True
            saved = step - step % 90
            events.append(
                {
                    "id": "f1",
                    "ts": (t + timedelta(seconds=1)).isoformat(),
                    "kind": "failed",
                    "reason": "XID 79: GPU fell off the bus on gpu-a-201",
                    "node": "gpu-a-201",
                }
            )
            t += timedelta(minutes=6)
            events.append({"id": "s2", "ts": t.isoformat(), "kind": "started"})
            t += timedelta(minutes=1)
            events.append({"id": "r1", "ts": t.isoformat(), "kind": "restored", "step": saved, "duration_s": 60.0})
            step = saved
        t += timedelta(seconds=20)
    _events(stack, token, main, events)
    other = _register(stack, token, "mixtral-sft", team="research", gang_size=32)
    _events(
        stack,
        token,
        other,
        [
            {"id": "a", "ts": (now - timedelta(hours=2)).isoformat(), "kind": "allocated"},
            {"id": "s", "ts": (now - timedelta(hours=2) + timedelta(minutes=10)).isoformat(), "kind": "started"},
            *_steps(1, 200, end=now - timedelta(minutes=40), every_s=15.0, prefix="m"),
            {
                "id": "p",
                "ts": (now - timedelta(minutes=39)).isoformat(),
                "kind": "preempted",
                "reason": "higher-priority workload",
            },
        ],
    )
    partitions.ensure_partitions(partitions.GPU_ROLLUP_1M, begin, now)
    GpuRollup1m.objects.bulk_create(
        GpuRollup1m(
            gpu=g,
            bucket=(begin + timedelta(minutes=m)).replace(second=0),
            samples=6,
            util_mean=95.0 - (30 if 100 < m < 115 else 0) - (8 if g.index == 3 else 0),
            power_mean=640.0 - (200 if 100 < m < 115 else 0),
        )
        for m in range(180)
        for g in gpus
    )
    refresh_job_accounts(now=datetime.now(UTC))
    return main


def test_the_training_pages_look_finished_on_desk_and_phone(
    stack: Stack, admin_user: User, site_a: Site, token_a: str
) -> None:
    job_id = _history(stack, token_a, site_a)
    assert Job.objects.filter(accounts__isnull=False).distinct().count() == 2
    username = admin_user.username

    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/training/", OVERVIEW_PATH)
            for viewport in (DESK, PHONE):
                page.set_viewport_size(viewport)
                for path, ready, name in (
                    ("/training/", "document.querySelectorAll('#top-table tbody a').length === 2", "training"),
                    (
                        f"/training/jobs/{job_id}/",
                        "document.querySelector('.advisor-verdict') !== null",
                        "training-job",
                    ),
                ):
                    page.goto(stack.base_url + path)
                    wait_until(page, ready)
                    wait_until(page, "document.getElementById('live-status').classList.contains('on')")
                    page.wait_for_timeout(300)  # Plotly's resize after the layout settles
                    width = page.evaluate("document.documentElement.scrollWidth")
                    assert width <= viewport["width"], f"{path} is {width} px wide on a {viewport['width']} px screen"
                    page.screenshot(path=str(ARTIFACTS / f"{name}-{viewport['width']}.png"), full_page=True)
            text = page.text_content("#advisor")
            assert "MTBF of this job" in text and "Young" in text and "Daly" in text
            # The MTBF says what it is (observed, assumed or blended), the saving which interval.
            assert "Saving computed for Daly's interval" in text and "minimum is at Young's interval" in text
            assert any(f"{label} per-GPU MTBF" in text for label in ("observed", "assumed", "blended"))
            # The failure: one cost, its parts beside it, adding up; the same figure in the stat.
            row = "#losses-table tbody tr[data-kind='failed']"
            cells = [
                c.strip() for c in page.eval_on_selector_all(f"{row} td.num", "els => els.map(e => e.textContent)")
            ]
            cost, *parts = (float(c.split()[0]) for c in cells)
            assert cost > 0 and cost == pytest.approx(sum(parts), abs=0.02), cells
            assert float(page.text_content("[data-stat='failure_cost_gpu_h']")) == cost
            # Retained goodput with the share at risk beside it, never a bare number.
            assert "% retained" in page.text_content("#job-stats")
            assert page.text_content("[data-stat='at_risk_share']").strip() not in ("", "–")
            page.goto(stack.base_url + "/training/")
            wait_until(page, "document.querySelector(\"[data-at-risk-share='24h']\").textContent !== '–'")
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
