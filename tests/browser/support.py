"""What the browser tests share: Chromium's launch, signing in, waiting, and a log of what the
page did (errors, fetches of one API path, websocket frames)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.conftest import PASSWORD
from tests.stack import ROOT, Stack

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps calling out of this closed network.
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


def launch(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_in_page(page: Any, check: Callable[[], bool], what: str) -> None:
    """Wait on state that Playwright's event handlers fill in; they run only while Playwright waits."""
    deadline = time.monotonic() + LIVE_TIMEOUT_MS / 1000
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {LIVE_TIMEOUT_MS / 1000} s waiting for {what}")
        page.wait_for_timeout(100)


def wait_until(page: Any, expression: str, timeout: float = LIVE_TIMEOUT_MS) -> None:
    """Wait until a JavaScript expression is truthy in the page.

    Polled from here with page.evaluate, which runs over the DevTools protocol: Playwright's
    wait_for_function evaluates its string inside the page, which the console's
    Content-Security-Policy (no 'unsafe-eval') rightly refuses.
    """
    deadline = time.monotonic() + timeout / 1000
    while not _evaluate_across_reloads(page, expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout / 1000} s waiting for {expression}")
        page.wait_for_timeout(100)


def _evaluate_across_reloads(page: Any, expression: str) -> Any:
    """page.evaluate, where a page that reloads itself (the incident page does, on a change made
    elsewhere) counts as "not yet" instead of failing on the torn-down context."""
    from playwright.sync_api import Error

    try:
        return page.evaluate(expression)
    except Error as exc:
        if "Execution context was destroyed" not in str(exc):
            raise
        page.wait_for_load_state()
        return False


class BrowserLog:
    """What the page did that the assertions need: errors, fetches of ``counted_path``, frames."""

    def __init__(self, page: Any, counted_path: str) -> None:
        self.counted_path = counted_path
        self.errors: list[str] = []
        self.fetches = 0
        self.frames: list[dict[str, Any]] = []
        self.sockets_opened = 0
        self.sockets_closed = 0
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("console", self._console)
        page.on("request", self._request)
        page.on("response", self._response)
        page.on("websocket", self._websocket)

    def _console(self, msg: Any) -> None:
        # A failed load is logged here and as a response; the response names the URL.
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {msg.text} at {msg.location.get('url')}")

    def _request(self, request: Any) -> None:
        if self.counted_path in request.url:
            self.fetches += 1

    def _response(self, response: Any) -> None:
        if response.status >= 400:
            self.errors.append(f"HTTP {response.status} {response.url}")

    def _websocket(self, ws: Any) -> None:
        self.sockets_opened += 1
        ws.on("framereceived", self._frame)
        ws.on("close", lambda _ws: setattr(self, "sockets_closed", self.sockets_closed + 1))

    def _frame(self, payload: str | bytes) -> None:
        try:
            self.frames.append(json.loads(payload))
        except ValueError:
            self.errors.append(f"websocket: a frame that is not JSON: {payload!r:.200}")

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("type") == kind]


def sign_in(browser: Any, stack: Stack, username: str, path: str, counted_path: str) -> tuple[Any, BrowserLog]:
    """Sign in through the real login page and land on ``path``."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    log = BrowserLog(page, counted_path)
    page.goto(f"{stack.base_url}/accounts/login/?next={path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.click("form button[type=submit]")
    assert page.url == stack.base_url + path, f"signing in did not land on {path}: {page.url}"
    return page, log
