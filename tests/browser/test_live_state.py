"""An open dashboard says what state it is in when the console restarts (static/js/live.js).

The server is stopped and started again on the same port under an open /fleet/ page: while it is
down the page says "Live updates paused since HH:MM:SS UTC" and comes back live by itself; when it
comes back with the page's session gone, the handshake is refused, and the page says plainly that
the session has ended, links to sign in, and stops knocking.

A rolling restart is not an outage: behind a balancer, the stopping process closes the page's
socket with 1012 (console.drain) and the page moves to the other process within a second, without
ever showing the banner.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import connections

from console.processes import healthy, uvicorn_command
from tests.browser.support import launch, sign_in, wait_until
from tests.stack import Stack, TcpProxy, free_port

pytestmark = [pytest.mark.browser]

JS_DOT = "document.getElementById('live-status').className"
JS_BANNER = "document.getElementById('live-banner')"


def _uvicorn(stack: Stack) -> subprocess.Popen[bytes]:
    return next(p for p in stack.procs if "uvicorn" in p.args and p.poll() is None)  # type: ignore[operator]


def _stop_server(stack: Stack) -> None:
    proc = _uvicorn(stack)
    proc.kill()  # a crash, or a restart that does not wait: the page sees the socket drop
    proc.wait(timeout=10)


def _start_server_again(stack: Stack) -> None:
    """uvicorn on the same port as before, so the open page can find it again."""
    port = stack.base_url.rsplit(":", 1)[1]
    args = [sys.executable, "-m", "uvicorn", "goodput.asgi:application", "--host", "127.0.0.1", "--port", port]
    proc = stack._spawn(f"uvicorn-{len(stack.procs)}", [*args, "--lifespan", "off", "--log-level", "warning"])
    stack._wait(lambda: requests.get(stack.base_url + "/healthz", timeout=1).ok, "uvicorn", proc)


def _delete_sessions() -> None:
    """Outside Playwright's event loop, where Django refuses queries (see test_incidents_live)."""

    def work() -> None:
        try:
            Session.objects.all().delete()
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)


def _banner(page: Any) -> dict[str, Any]:
    return page.evaluate(
        f"""(() => {{ const b = {JS_BANNER}; const a = b.querySelector('a');
            return {{hidden: b.hidden, cls: b.className, text: b.textContent,
                     href: a && a.getAttribute('href')}}; }})()"""
    )


def test_a_restart_pauses_the_page_and_a_lost_session_says_sign_in(stack: Stack, viewer_user: User) -> None:
    username = viewer_user.username

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, username, "/fleet/", "/api/v1/fleet/overview/")
            wait_until(page, f"{JS_DOT} === 'live-dot on'")
            assert _banner(page)["hidden"] is True
            page.evaluate("window.__sameDocument = true")

            # --- the console goes down: the page says since when it is paused -------------------
            _stop_server(stack)
            wait_until(page, f"!{JS_BANNER}.hidden")
            banner = _banner(page)
            assert re.fullmatch(
                r"Live updates paused since \d\d:\d\d:\d\d UTC: what you see is as of then\. Reconnecting…",
                banner["text"],
            ), banner
            assert page.evaluate(JS_DOT) == "live-dot off"

            # --- it comes back: the page reconnects by itself and says nothing more --------------
            _start_server_again(stack)
            wait_until(page, f"{JS_DOT} === 'live-dot on'")
            assert _banner(page)["hidden"] is True
            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"

            # --- it comes back, but the session is gone: say so, link to sign in, stop ---------
            _stop_server(stack)
            wait_until(page, f"!{JS_BANNER}.hidden")
            _delete_sessions()
            _start_server_again(stack)
            wait_until(page, f"{JS_BANNER}.className.includes('gone')")
            banner = _banner(page)
            assert banner["text"].startswith("Your session has ended"), banner
            assert banner["href"] == "/accounts/login/?next=%2Ffleet%2F"
            opened = log.sockets_opened
            page.wait_for_timeout(4_000)  # longer than two backoff steps
            assert log.sockets_opened == opened, "the page kept knocking with a dead session"

            page.click("#live-banner a")
            page.wait_for_load_state()
            assert page.url.startswith(stack.base_url + "/accounts/login/")
        finally:
            browser.close()


def test_a_page_past_the_socket_limit_says_so_and_waits_rather_than_knocking(stack: Stack, viewer_user: User) -> None:
    """The user already holds their 20 sockets (other tabs, other web processes): the page's
    socket is closed with 4429, the banner says why, and it does not reconnect at once."""
    from django.conf import settings

    from console import socket_slots

    for n in range(settings.WS_MAX_PER_USER):
        socket_slots._take(viewer_user.pk, f"another-tab.{n}", 600)

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer_user.username, "/fleet/", "/api/v1/fleet/overview/")
            wait_until(page, f"{JS_BANNER} && {JS_BANNER}.className.includes('limited')")
            banner = _banner(page)
            assert banner["hidden"] is False
            assert banner["text"].startswith("Live updates paused: you have too many live pages open (At most 20"), (
                banner
            )
            assert "tries again in about a minute" in banner["text"]
            assert page.evaluate(JS_DOT) == "live-dot off"
            opened = log.sockets_opened
            page.wait_for_timeout(4_000)  # several of the usual backoff steps
            assert log.sockets_opened == opened, "the page kept knocking past the socket limit"
        finally:
            browser.close()


def _poll(page: Any, check: Any, what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        page.wait_for_timeout(50)


JS_WATCH_BANNER = """(() => {
  window.__bannerShown = false;
  const seen = () => { const b = document.getElementById('live-banner');
                       if (b && !b.hidden) window.__bannerShown = true; };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, attributes: true});
})()"""


def test_a_rolling_restart_moves_the_page_to_the_other_process_without_a_banner(
    stack: Stack, viewer_user: User
) -> None:
    """Two web processes behind a balancer (a TCP proxy that sends new connections to the one
    started last); the process holding the page's socket gets SIGTERM."""
    first = _uvicorn(stack)
    balancer = TcpProxy("127.0.0.1", int(stack.base_url.rsplit(":", 1)[1]))
    direct_url, stack.base_url = stack.base_url, f"http://127.0.0.1:{balancer.port}"

    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = launch(pw)
            try:
                page, log = sign_in(browser, stack, viewer_user.username, "/fleet/", "/api/v1/fleet/overview/")
                wait_until(page, f"{JS_DOT} === 'live-dot on'")
                page.evaluate("window.__sameDocument = true")
                page.evaluate(JS_WATCH_BANNER)

                # A second process; the balancer sends new connections to it from now on.
                port = free_port()
                second = stack._spawn("uvicorn-second", uvicorn_command(port))
                stack._wait(lambda: healthy(port, timeout=1), "the second uvicorn", second)
                balancer.target = ("127.0.0.1", port)
                opened, fetches = log.sockets_opened, log.fetches

                signalled = time.monotonic()
                first.send_signal(signal.SIGTERM)
                _poll(page, lambda: log.sockets_opened > opened, "the page to reconnect")
                moved_s = time.monotonic() - signalled
                first.wait(timeout=15)
                # Back on the other process, subscribed, with a fresh snapshot, and never paused.
                wait_until(page, f"{JS_DOT} === 'live-dot on'")
                _poll(page, lambda: log.fetches > fetches, "the snapshot after the move")
                # The first try is within a second (the page's jitter) of the close, sent at once.
                assert moved_s < 2.5, moved_s
                assert log.of_type("subscribed"), log.frames[-3:]
                assert page.evaluate("window.__bannerShown") is False, _banner(page)
                assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
                assert not log.errors, log.errors
            finally:
                browser.close()
    finally:
        stack.base_url = direct_url
        balancer.close()
