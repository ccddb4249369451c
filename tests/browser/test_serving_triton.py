"""In headless Chromium: a Triton endpoint's page shows its mean request, queue and compute time
per successful request (table and chart) and its failures by reason, the overview card its time
per request, and both say that a 30-day budget rests on the few minutes of data there are."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from fleet.ingest.prometheus import parse_exposition, store_exposition
from fleet.models import Endpoint, Site
from fleet.serving import rollups as serving_rollups
from tests.browser.support import launch, sign_in, wait_until
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

TRITON = (Path(__file__).resolve().parents[1] / "fixtures" / "triton.prom").read_text()
V3 = ('model="bert_large"', 'version="3"')


def _later(minutes: int) -> str:
    """The fixture ``minutes`` later: bert_large 3 served 1,000 requests a minute (31 ms each, 4 ms
    of it queued, 26.5 ms of compute) and rejected 100."""
    increases = {
        "nv_inference_request_success": 1000,
        "nv_inference_request_duration_us": 1000 * 31_000,
        "nv_inference_queue_duration_us": 1000 * 4_000,
        "nv_inference_compute_input_duration_us": 1000 * 1_000,
        "nv_inference_compute_infer_duration_us": 1000 * 25_000,
        "nv_inference_compute_output_duration_us": 1000 * 500,
    }
    out = []
    for line in TRITON.splitlines():
        if line.startswith("#") or not all(part in line for part in V3):
            out.append(line)
            continue
        head, value = line.rsplit(" ", 1)
        name = head.split("{", 1)[0]
        grow = increases.get(name, 100 if name == "nv_inference_request_failure" and "REJECTED" in head else 0)
        out.append(f"{head} {float(value) + grow * minutes!r}")
    return "\n".join(out) + "\n"


def test_a_triton_endpoint_page_shows_time_per_successful_request_and_failures(
    stack: Stack, admin_user: User, site_a: Site
) -> None:
    now = datetime.now(UTC)
    for minutes in range(6):
        ts = now - timedelta(minutes=5 - minutes)
        exposition = parse_exposition(_later(minutes), kind="triton", now=ts)
        store_exposition(exposition, site_id=site_a.pk, batch_key=f"triton-{minutes}")
    serving_rollups.roll_everything(now=now)
    bert = Endpoint.objects.get(site=site_a, name="bert_large")

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, admin_user.username, f"/serving/endpoints/{bert.pk}/", "/snapshot")
            wait_until(page, "document.querySelector(\"#triton-table [data-col='request_mean_ms-5m']\") !== null")
            assert page.text_content("#triton-table [data-col='request_mean_ms-5m']") == "31 ms"
            assert page.text_content("#triton-table [data-col='queue_mean_ms-5m']") == "4.0 ms"
            assert page.text_content("#triton-table [data-col='compute_mean_ms-range']") == "27 ms"
            assert page.text_content("#triton-table [data-col='failures']") == "500 rejected"
            assert page.evaluate("document.getElementById('chart-duration').data.length") == 3
            note = page.text_content("#coverage-note")
            assert "of data" in note and "30-day SLO window" in note, note
            assert page.is_visible("#coverage-note")

            page.goto(stack.base_url + "/serving/")
            wait_until(page, "document.querySelectorAll('.endpoint-card').length === 2")
            card = page.locator(f".endpoint-card[data-endpoint='{bert.pk}']")
            assert card.locator("[data-field='request']").text_content() == "31 ms"
            assert card.locator("[data-field='request-box']").is_visible()
            assert "30-day SLO window" in card.locator("[data-field='coverage']").text_content()
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
