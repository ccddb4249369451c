"""X-Forwarded-For counts only behind a proxy, and only from the proxies listed: otherwise a
forged header would change the address in the audit log and sidestep the sign-in lock-out by
address. X-Forwarded-Proto likewise decides which Origin scheme a websocket must come from.
Tried on real uvicorn servers started as the console starts them (console.processes)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import requests
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from compliance.choices import AuditAction
from compliance.models import AuditEntry
from tests.conftest import redis_url
from tests.stack import Stack

pytestmark = pytest.mark.django_db(transaction=True)

FORGED = "203.0.113.7"


@pytest.fixture
def serve(tmp_path) -> Iterator:  # type: ignore[no-untyped-def]
    stacks: list[Stack] = []

    def start(**env: str) -> Stack:
        log_dir = tmp_path / str(len(stacks))
        log_dir.mkdir()
        stack = Stack(redis_url(), log_dir, GOODPUT_SECURE_COOKIES="false", **env)  # plain http here
        stacks.append(stack)
        stack.start_server()
        return stack

    yield start
    for stack in stacks:
        stack.stop()


def _fail_sign_in(stack: Stack, username: str, forwarded_for: str) -> requests.Response:
    session = requests.Session()
    page = session.get(f"{stack.base_url}/accounts/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    return session.post(
        f"{stack.base_url}/accounts/login/",
        data={"username": username, "password": "wrong", "csrfmiddlewaretoken": token},
        headers={"X-Forwarded-For": forwarded_for, "Referer": f"{stack.base_url}/accounts/login/"},
        timeout=10,
    )


def _recorded_addresses(username: str) -> tuple[set[str], set[str]]:
    """The addresses django-axes and the audit log recorded for ``username``'s failed sign-ins."""
    axes = set(AccessAttempt.objects.filter(username=username).values_list("ip_address", flat=True))
    audit = set(
        AuditEntry.objects.filter(action=AuditAction.SIGN_IN_FAILED, actor=username).values_list(
            "remote_addr", flat=True
        )
    )
    return axes, audit


def test_without_a_proxy_a_forged_header_changes_neither_the_audit_nor_the_lockout(serve, settings) -> None:
    stack = serve(GOODPUT_BEHIND_PROXY="false")
    assert _fail_sign_in(stack, "mallory", FORGED).status_code == 200
    assert _recorded_addresses("mallory") == ({"127.0.0.1"}, {"127.0.0.1"})
    # A new forged address for every try: the address lock-out still counts them all as one.
    for n in range(1, settings.AXES_FAILURE_LIMIT):
        _fail_sign_in(stack, f"guess-{n}", f"198.51.100.{n}")
    assert _fail_sign_in(stack, "guess-last", "198.51.100.99").status_code == 429


def test_behind_a_trusted_proxy_the_forwarded_client_is_the_address(serve) -> None:
    stack = serve(GOODPUT_BEHIND_PROXY="true", GOODPUT_TRUSTED_PROXIES="127.0.0.1")
    # The proxy appends the client it saw; anything the client put in front is not believed.
    assert _fail_sign_in(stack, "mallory", f"10.9.9.9, {FORGED}").status_code == 200
    assert _recorded_addresses("mallory") == ({FORGED}, {FORGED})


def test_behind_a_proxy_a_peer_not_listed_is_not_believed(serve) -> None:
    stack = serve(GOODPUT_BEHIND_PROXY="true", GOODPUT_TRUSTED_PROXIES="10.0.0.0/8")
    assert _fail_sign_in(stack, "mallory", FORGED).status_code == 200
    assert _recorded_addresses("mallory") == ({"127.0.0.1"}, {"127.0.0.1"})


def test_a_trusted_proxy_list_that_is_not_addresses_stops_start_up(monkeypatch) -> None:
    import subprocess
    import sys

    from tests.stack import ROOT, stack_env

    env = {**stack_env(redis_url()), "GOODPUT_BEHIND_PROXY": "true", "GOODPUT_TRUSTED_PROXIES": "nginx.internal"}
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0 and "GOODPUT_TRUSTED_PROXIES: 'nginx.internal'" in result.stderr


def _socket_opens(stack: Stack, user: User, origin_scheme: str, forwarded_proto: str) -> bool:
    """Open /ws/live/ as the user, from a page of ``origin_scheme`` on the server's host:port,
    through a proxy (this test) that says the client's scheme was ``forwarded_proto``."""
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    host = stack.base_url.removeprefix("http://")
    headers = {"Cookie": cookie, "Origin": f"{origin_scheme}://{host}", "X-Forwarded-Proto": forwarded_proto}
    try:
        with connect(f"ws://{host}/ws/live/", additional_headers=headers, open_timeout=10):
            return True
    except InvalidStatus as refused:
        assert refused.response.status_code == 403
        return False


def test_a_websockets_origin_must_have_the_scheme_the_trusted_proxy_forwarded(serve, viewer_user) -> None:
    """Issue 37, item 10: behind a TLS proxy the console is https, so an http:// page of its own
    host and port (anyone on the path can write into it) may not open a socket with the cookie."""
    stack = serve(GOODPUT_BEHIND_PROXY="true", GOODPUT_TRUSTED_PROXIES="127.0.0.1")
    assert _socket_opens(stack, viewer_user, "https", forwarded_proto="https")
    assert not _socket_opens(stack, viewer_user, "http", forwarded_proto="https")
    assert _socket_opens(stack, viewer_user, "http", forwarded_proto="http")


def test_without_a_proxy_a_forged_forwarded_scheme_changes_nothing(serve, viewer_user) -> None:
    stack = serve(GOODPUT_BEHIND_PROXY="false")  # plain http here: X-Forwarded-Proto is not believed
    assert _socket_opens(stack, viewer_user, "http", forwarded_proto="https")
    assert not _socket_opens(stack, viewer_user, "https", forwarded_proto="https")
