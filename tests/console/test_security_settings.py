"""Security settings that hold for every page: login throttling (django-axes), a role for the API
schema and its docs, a Content-Security-Policy, HSTS behind HTTPS, and a clean check --deploy
(which warns while outbound requests, closed by default in production, may reach nothing)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

from tests.conftest import PASSWORD

ROOT = Path(__file__).resolve().parents[2]


def attempt(client: Client, username: str, password: str, address: str = "10.0.0.7"):  # type: ignore[no-untyped-def]
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


# --- item 5: logins are throttled, per account and per address, and logged ----------------------


def test_an_account_is_locked_after_repeated_failures_with_a_clear_message(viewer_user, settings) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, viewer_user.username, "wrong").status_code == 200  # the form again
    locked = attempt(client, viewer_user.username, "wrong")
    assert locked.status_code == 429
    assert b"Too many failed sign-ins" in locked.content
    # Even the right password waits out the lockout, from another address too.
    elsewhere = Client()
    again = attempt(elsewhere, viewer_user.username, PASSWORD, address="10.0.0.8")
    assert again.status_code == 429 and "_auth_user_id" not in elsewhere.session


def test_an_address_is_locked_after_failures_across_accounts(viewer_user, operator_user, settings) -> None:
    client = Client()
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, f"nobody-{n}", "wrong", address="10.9.9.9")
    assert attempt(client, operator_user.username, PASSWORD, address="10.9.9.9").status_code == 429
    assert attempt(Client(), operator_user.username, PASSWORD, address="10.1.1.1").status_code == 302


def test_failed_and_successful_logins_are_logged(viewer_user, caplog) -> None:
    from axes.models import AccessAttempt, AccessLog

    with caplog.at_level(logging.INFO, logger="axes"):
        attempt(Client(), viewer_user.username, "wrong")
        assert AccessAttempt.objects.filter(username=viewer_user.username).exists()  # the failure, recorded
        assert attempt(Client(), viewer_user.username, PASSWORD).status_code == 302
    assert AccessLog.objects.filter(username=viewer_user.username).exists()  # the success, logged
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "failed" in messages.lower() and "successful" in messages.lower()


# --- item 7: the schema and its docs need a role --------------------------------------------------


@pytest.mark.parametrize("url", ["/api/schema/", "/api/docs/"])
def test_the_api_schema_and_docs_need_a_role(norole_client, viewer_client, url) -> None:
    assert norole_client.get(url).status_code == 403
    assert viewer_client.get(url).status_code == 200


def test_the_api_docs_load_nothing_from_outside(viewer_client) -> None:
    page = viewer_client.get("/api/docs/").content.decode()
    assert "cdn" not in page.lower() and "https://" not in page
    assert "<script>" not in page  # the split view's script is a file: nothing inline for CSP to allow


# --- item 8: Content-Security-Policy and HSTS ----------------------------------------------------


@pytest.mark.parametrize("url", ["/", "/fleet/", "/incidents/", "/accounts/login/"])
def test_every_page_has_a_content_security_policy_without_inline_scripts(admin_client, url) -> None:
    policy = admin_client.get(url)["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"


def test_hsts_is_sent_when_it_is_turned_on(viewer_client) -> None:
    with override_settings(SECURE_HSTS_SECONDS=31536000, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")):
        response = viewer_client.get("/fleet/", HTTP_X_FORWARDED_PROTO="https")
    assert response["Strict-Transport-Security"] == "max-age=31536000"


# --- item 12: manage.py check --deploy is clean under the documented production settings ---------


# The documented production settings: the exporters' networks and, for SaaS webhooks, the public internet.
PRODUCTION = {
    "DATABASE_URL": "postgres://goodput@db.internal:5432/goodput",
    # No DATABASE_OWNER_URL: only the migrate step has it (goodput.W101, test_audit_roles.py).
    "REDIS_URL": "redis://redis.internal:6379/0",
    "SECRET_KEY": "x7Qm2-Lk9vRt4_Zp8Wc1Ys6Hn3Jd5Fb0Ge2Ua7Io4Pl9Kq1Mr6Nt8Sv3Xw5Yz0Ab",
    "ALLOWED_HOSTS": "goodput.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://goodput.example.com",
    "GOODPUT_BEHIND_PROXY": "true",
    "GOODPUT_OUTBOUND_ALLOWED_NETWORKS": "10.20.0.0/16,fd00:20::/48,0.0.0.0/0,::/0",
}


def _check_deploy(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_under_production_settings_prints_no_warnings() -> None:
    result = _check_deploy(PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNINGS" not in result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_reaches_nothing_outside_until_networks_are_listed_and_check_deploy_says_so() -> None:
    unlisted = {k: v for k, v in PRODUCTION.items() if k != "GOODPUT_OUTBOUND_ALLOWED_NETWORKS"}
    result = _check_deploy(unlisted)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "goodput.W104" in output, output
    assert "GOODPUT_OUTBOUND_ALLOWED_NETWORKS lists no network" in output


@pytest.mark.parametrize(
    "address", ["::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::1", "fd00:ec2::254", "100.100.100.200", "192.0.0.192"]
)
def test_wrapped_loopback_and_cloud_metadata_addresses_are_refused_by_a_catch_all(address) -> None:
    import ipaddress

    from console import outbound

    networks = [ipaddress.ip_network(n) for n in ("0.0.0.0/0", "::/0")]
    assert not outbound.is_allowed_address(ipaddress.ip_address(address), networks)


def test_an_empty_boolean_in_an_env_file_means_the_default(monkeypatch) -> None:
    from console.env import envbool

    monkeypatch.setenv("GOODPUT_SECURE_COOKIES", "")
    assert envbool("GOODPUT_SECURE_COOKIES", True) is True
