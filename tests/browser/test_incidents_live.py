"""End to end: the incident list in headless Chromium follows incidents live.

A real XID 79 batch reaches uvicorn over the ingest API and is stored by a Celery worker process;
the critical-XID detector then runs in this (production-mode) test process, opens the incident,
and asks for a live push; the worker builds the `incidents` delta and channels-redis carries it
to the page's websocket, where incidents.js inserts the row and updates the open counts. Resolving
the incident takes the row out of the default (open-only) view the same way. Nothing reloads the
page or re-fetches the list in between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connections

from fleet.models import GpuState, Site
from incidents.choices import IncidentState
from incidents.models import Finding, Incident
from tests.browser.support import ARTIFACTS, LIVE_TIMEOUT_MS, launch, sign_in, wait_for, wait_in_page, wait_until
from tests.conftest import make_sample
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

LIST_API_PATH = "/api/v1/incidents/"  # what incidents.js fetches to resync after a reconnect

GPU_UUID = "GPU-00000000-0000-4000-8000-000000000079"
HOSTNAME = "gpu-a-007"
GPU_INDEX = 3

JS_ROWS = "document.querySelectorAll('#incident-table tbody tr[data-id]').length"
JS_OPEN_SEV2 = "document.querySelector('[data-open=\"SEV2\"]').textContent.trim()"


def _off_the_loop(page: Any, work: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """Run database work while Playwright is open.

    Playwright's sync API runs an event loop in this thread, where Django refuses queries (and its
    greenlets would open a second connection that outlives the test). A plain thread, which closes
    its own connection when done, does the work; the page keeps being served in the meantime.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed back to the test thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name=f"db: {what}")
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        if time.monotonic() > deadline:
            thread.join(5)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        page.wait_for_timeout(100)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _post_xid79(stack: Stack, token: str) -> None:
    sample = make_sample(gpu_uuid=GPU_UUID, hostname=HOSTNAME, gpu_index=GPU_INDEX, xid=79, gpu_util=0.0)
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": [sample]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    assert response.json()["accepted"] == 1


def _detect_xid79() -> int:
    """Wait for the worker to store the batch, then run the detector (twice: a repeat must not
    open a second incident). Returns the incident's id."""
    from incidents.detectors import run_detectors

    wait_for(lambda: GpuState.objects.filter(gpu__uuid=GPU_UUID, xid=79).exists(), "the worker to store the XID batch")
    assert run_detectors(only=["critical-xid"]) == {"critical-xid": {"firing": 1}}
    assert run_detectors(only=["critical-xid"]) == {"critical-xid": {"firing": 1}}
    incident = Incident.objects.get()
    assert Finding.objects.get(fingerprint=f"xid:{GPU_UUID}:79").incident_id == incident.pk
    return incident.pk


def test_incident_list_follows_incidents_live(
    stack: Stack, viewer_user: User, operator_user: User, site_a: Site, token_a: str
) -> None:
    assert not Incident.objects.exists()
    username = viewer_user.username

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            # --- a viewer signs in through the real login page and opens the incident list -------
            page, log = sign_in(browser, stack, username, "/incidents/", LIST_API_PATH)
            wait_in_page(page, lambda: log.fetches == 1, "the list's first snapshot")
            assert page.locator("#incident-table tbody tr.empty").count() == 1
            assert page.evaluate(JS_OPEN_SEV2) == "0"
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription")
            assert log.of_type("subscribed")[-1]["topics"] == ["incidents"]
            assert page.get_attribute("#live-status", "class") == "live-dot on"
            page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

            # --- an XID 79 batch arrives over HTTP; the detector opens one SEV2 incident ----------
            _post_xid79(stack, token_a)
            incident_id = _off_the_loop(page, _detect_xid79, "the XID 79 incident")
            row = f"#incident-table tbody tr[data-id='{incident_id}']"

            # --- the page shows it without a reload ------------------------------------------
            page.wait_for_selector(row, timeout=LIVE_TIMEOUT_MS)
            wait_until(page, f"{JS_OPEN_SEV2} === '1'")
            assert page.evaluate(JS_ROWS) == 1
            assert page.text_content(f"{row} .sev") == "SEV2"
            assert page.get_attribute(f"{row} .sev", "class") == "sev sev-SEV2"
            assert page.text_content(f"{row} .state") == "Triggered"
            title = page.text_content(f"{row} td:nth-child(4)")
            assert title.startswith("XID 79 (") and f"on {HOSTNAME} GPU {GPU_INDEX}" in title, title
            assert page.text_content(f"{row} td:nth-child(5)") == site_a.name
            assert page.get_attribute(f"{row} td:first-child a", "href") == f"/incidents/{incident_id}/"
            assert page.locator("#incident-table tbody tr.empty").count() == 0
            assert page.evaluate(JS_OPEN_SEV2) == "1"
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "incidents-live.png"), full_page=True)

            # --- an operator resolves it: the row leaves the open-only view live ---------------
            def resolve() -> None:
                from incidents.services.engine import Actor, resolve_incident

                resolve_incident(Incident.objects.get(pk=incident_id), actor=Actor.person(operator_user))

            _off_the_loop(page, resolve, "resolving the incident")
            page.wait_for_selector(row, state="detached", timeout=LIVE_TIMEOUT_MS)
            wait_until(page, f"{JS_OPEN_SEV2} === '0'")
            assert page.evaluate(JS_ROWS) == 0

            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            assert log.fetches == 1, "the page re-fetched the list instead of applying deltas"
            assert len(log.of_type("incidents.delta")) >= 2
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()

    incident = Incident.objects.get()
    assert incident.pk == incident_id
    assert incident.state == IncidentState.RESOLVED
    assert incident.timeline.filter(text__startswith=f"Resolved by {operator_user.username}").exists()


def test_the_incident_page_shows_changes_made_elsewhere(
    stack: Stack, viewer_user: User, operator_user: User, site_a: Site, token_a: str
) -> None:
    """An operator acknowledges the incident while a viewer has its page open: the page follows."""
    from incidents.services.engine import Actor, acknowledge_incident, raise_finding

    raise_finding(
        "xid:live-page",
        {"site": "ams-1", "hostname": HOSTNAME},
        "SEV2",
        "XID 79 on the live page",
        source="detector:critical-xid",
    )
    incident_id = Incident.objects.get().pk
    username = viewer_user.username

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, f"/incidents/{incident_id}/", LIST_API_PATH)
            assert page.text_content(".page-head .state") == "Triggered"
            wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription")

            def acknowledge() -> None:
                acknowledge_incident(
                    Incident.objects.get(pk=incident_id),
                    actor=Actor.person(operator_user),
                    note="on it from the other screen",
                )

            _off_the_loop(page, acknowledge, "acknowledging the incident")
            wait_until(page, "document.querySelector('.page-head .state').textContent === 'Acknowledged'")
            assert "on it from the other screen" in page.text_content(".timeline")
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()
