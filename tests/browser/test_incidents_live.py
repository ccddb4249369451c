"""End to end: the incident list in headless Chromium follows incidents live.

A real XID 79 batch reaches uvicorn over the ingest API and is stored by a Celery worker process;
the critical-XID detector then runs in this (production-mode) test process, opens the incident,
and asks for a live push; the worker builds the `incidents` delta and channels-redis carries it
to the page's websocket, where incidents.js inserts the row and updates the open counts. Resolving
the incident takes the row out of the default (open-only) view the same way. Nothing reloads the
page or re-fetches the list in between.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connections

from fleet.models import GpuState, Site
from incidents.choices import IncidentState
from incidents.models import Finding, Incident
from tests.conftest import PASSWORD, make_sample, redis_url
from tests.stack import ROOT, Stack

pytestmark = [pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts"
LIVE_TIMEOUT_MS = 20_000
LIST_API_PATH = "/api/v1/incidents/"  # what incidents.js fetches to resync after a reconnect

GPU_UUID = "GPU-00000000-0000-4000-8000-000000000079"
HOSTNAME = "gpu-a-007"
GPU_INDEX = 3

JS_ROWS = "document.querySelectorAll('#incident-table tbody tr[data-id]').length"
JS_OPEN_SEV2 = "document.querySelector('[data-open=\"SEV2\"]').textContent.trim()"


@pytest.fixture
def stack(transactional_db: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A Celery worker and uvicorn on the (committed) test database and a flushed Redis.

    When the test fails, the worker's and the server's logs are copied to test-artifacts/.
    """
    log_dir = tmp_path / "stack-logs"
    log_dir.mkdir()
    stack = Stack(redis_url(), log_dir)
    stack.flush_redis()
    failed_before = request.session.testsfailed
    try:
        stack.start_worker()
        stack.start_server()
        yield stack
    finally:
        stack.stop()
        if request.session.testsfailed > failed_before:
            shutil.copytree(log_dir, ARTIFACTS / "stack-logs" / request.node.name, dirs_exist_ok=True)


class BrowserLog:
    """What the page did that the assertions need: errors, list re-fetches, websocket frames."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        self.list_fetches = 0
        self.frames: list[dict[str, Any]] = []
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("console", self._console)
        page.on("request", self._request)
        page.on("response", self._response)
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))

    def _console(self, msg: Any) -> None:
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {msg.text} at {msg.location.get('url')}")

    def _request(self, request: Any) -> None:
        if LIST_API_PATH in request.url:
            self.list_fetches += 1

    def _response(self, response: Any) -> None:
        if response.status >= 400 and not response.url.endswith("/favicon.ico"):
            self.errors.append(f"HTTP {response.status} {response.url}")

    def _frame(self, payload: str | bytes) -> None:
        try:
            self.frames.append(json.loads(payload))
        except ValueError:
            self.errors.append(f"websocket: a frame that is not JSON: {payload!r:.200}")

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("type") == kind]


def _wait_in_page(page: Any, check: Callable[[], bool], what: str) -> None:
    """Wait on state that Playwright's event handlers fill in; they run only while Playwright waits."""
    deadline = time.monotonic() + LIVE_TIMEOUT_MS / 1000
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {LIVE_TIMEOUT_MS / 1000} s waiting for {what}")
        page.wait_for_timeout(100)


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


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


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

    _wait_for(lambda: GpuState.objects.filter(gpu__uuid=GPU_UUID, xid=79).exists(), "the worker to store the XID batch")
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
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            log = BrowserLog(page)

            # --- a viewer signs in through the real login page and opens the incident list -------
            page.goto(stack.base_url + "/accounts/login/?next=/incidents/")
            page.fill("#id_username", username)
            page.fill("#id_password", PASSWORD)
            with page.expect_navigation():
                page.click("form button[type=submit]")
            assert page.url == stack.base_url + "/incidents/", f"signing in did not land on the list: {page.url}"
            assert page.locator("#incident-table tbody tr.empty").count() == 1
            assert page.evaluate(JS_OPEN_SEV2) == "0"
            _wait_in_page(page, lambda: bool(log.of_type("subscribed")), "the websocket subscription")
            assert log.of_type("subscribed")[-1]["topics"] == ["incidents"]
            assert page.get_attribute("#live-status", "class") == "live-dot on"
            page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

            # --- an XID 79 batch arrives over HTTP; the detector opens one SEV2 incident ----------
            _post_xid79(stack, token_a)
            incident_id = _off_the_loop(page, _detect_xid79, "the XID 79 incident")
            row = f"#incident-table tbody tr[data-id='{incident_id}']"

            # --- the page shows it without a reload ------------------------------------------
            page.wait_for_selector(row, timeout=LIVE_TIMEOUT_MS)
            page.wait_for_function(f"{JS_OPEN_SEV2} === '1'", timeout=LIVE_TIMEOUT_MS)
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
            page.wait_for_function(f"{JS_OPEN_SEV2} === '0'", timeout=LIVE_TIMEOUT_MS)
            assert page.evaluate(JS_ROWS) == 0

            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            assert log.list_fetches == 0, "the page re-fetched the list instead of applying deltas"
            assert len(log.of_type("incidents.delta")) >= 2
            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()

    incident = Incident.objects.get()
    assert incident.pk == incident_id
    assert incident.state == IncidentState.RESOLVED
    assert incident.timeline.filter(text__startswith=f"Resolved by {operator_user.username}").exists()
