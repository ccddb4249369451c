"""Personal API tokens: a person's scripts use the API with that person's role, and nothing more."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from console import roles
from console.models import PersonalToken
from incidents.models import ActionItem, Incident, Silence
from incidents.services.engine import raise_finding
from tests.conftest import make_sample, post_batch, redis_url
from tests.stack import Stack


def _incident() -> Incident:
    raise_finding(
        "tokens:xid", {"site": "ams-1", "hostname": "gpu-a-001"}, "SEV3", "XID 79 on gpu-a-001", source="test"
    )
    return Incident.objects.get()


def _call(method: str, path: str, token: str, body: Any = None, client: Client | None = None) -> Any:
    client = client or Client()
    data = json.dumps(body if body is not None else {})
    return client.generic(method, path, data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


def _curl(url: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The real curl binary, as docs/people.md shows it: no cookie, no CSRF token."""
    args = ["curl", "-sS", "-X", "POST", url, "-H", f"Authorization: Bearer {token}"]
    args += ["-H", "Content-Type: application/json", "-d", json.dumps(body), "-w", "\n%{http_code}"]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    payload, _, code = done.stdout.rpartition("\n")
    return int(code), json.loads(payload)


# --- the acceptance test, against a real server ------------------------------------------------------


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_personal_token_acknowledges_an_incident_with_curl_and_stops_working_once_revoked(
    tmp_path: Path, operator_user: User, viewer_user: User
) -> None:
    incident = _incident()
    token, plain = PersonalToken.issue(user=operator_user, name="ack script")
    _, viewer_plain = PersonalToken.issue(user=viewer_user, name="viewer script")
    stack = Stack(redis_url(), tmp_path)
    stack.flush_redis()
    try:
        stack.start_server()
        url = f"{stack.base_url}/api/v1/incidents/{incident.pk}/acknowledge/"

        code, body = _curl(url, viewer_plain, {"note": "viewer tries"})
        assert code == 403, body
        incident.refresh_from_db()
        assert incident.state == "triggered"

        code, body = _curl(url, plain, {"note": "on it, from a script"})
        assert code == 200, body
        assert body["state"] == "acknowledged"
        incident.refresh_from_db()
        assert incident.state == "acknowledged" and incident.acknowledged_at is not None
        entry = incident.timeline.order_by("-pk").first()
        assert entry is not None and entry.actor == operator_user and "on it, from a script" in entry.text
        token.refresh_from_db()
        assert token.last_used_at is not None

        assert token.revoke(actor=operator_user)
        code, body = _curl(f"{stack.base_url}/api/v1/incidents/{incident.pk}/notes/", plain, {"text": "after revoke"})
        assert code == 401, body  # at once: personal tokens are not cached
        assert "revoked" in body["detail"]
        assert not incident.timeline.filter(text__contains="after revoke").exists()
    finally:
        stack.stop()
        stack.flush_redis()


# --- what a token may do -------------------------------------------------------------------------------


def test_a_personal_token_acts_as_its_user_without_a_csrf_token(operator_user: User) -> None:
    incident = _incident()
    _, plain = PersonalToken.issue(user=operator_user, name="notes")
    strict = Client(enforce_csrf_checks=True)
    response = _call("POST", f"/api/v1/incidents/{incident.pk}/notes/", plain, {"text": "from cron"}, client=strict)
    assert response.status_code == 201, response.content
    assert incident.timeline.get(text="from cron").actor == operator_user


def test_a_viewers_token_reads_but_cannot_change_anything(viewer_user: User, site_a: Any) -> None:
    incident = _incident()
    item = ActionItem.objects.create(incident=incident, title="RMA the GPU")
    _, plain = PersonalToken.issue(user=viewer_user, name="read only")
    assert _call("GET", "/api/v1/incidents/", plain).status_code == 200
    assert _call("GET", "/api/v1/fleet/gpus/", plain).status_code == 200
    writes = [
        ("POST", f"/api/v1/incidents/{incident.pk}/acknowledge/", {"note": "x"}),
        ("POST", f"/api/v1/incidents/{incident.pk}/mitigate/", {"note": "x"}),
        ("POST", f"/api/v1/incidents/{incident.pk}/resolve/", {"note": "x"}),
        ("POST", f"/api/v1/incidents/{incident.pk}/notes/", {"text": "x"}),
        ("POST", f"/api/v1/incidents/{incident.pk}/roles/", {"role": "commander", "username": "vera"}),
        ("PATCH", f"/api/v1/incidents/{incident.pk}/postmortem/", {"pm_summary": "x"}),
        ("POST", "/api/v1/action-items/", {"incident": incident.pk, "title": "x"}),
        ("PATCH", f"/api/v1/action-items/{item.pk}/", {"title": "changed"}),
        ("POST", "/api/v1/silences/", {"matchers": [{"name": "hostname", "op": "=", "value": "x"}], "comment": "x"}),
        ("POST", "/api/v1/fleet/scrape-targets/", {"site": site_a.pk, "name": "x", "url": "http://127.0.0.1:9/"}),
        ("PATCH", f"/api/v1/fleet/sites/{site_a.pk}/", {"name": "renamed"}),
        ("DELETE", f"/api/v1/fleet/sites/{site_a.pk}/", None),
    ]
    for method, path, body in writes:
        response = _call(method, path, plain, body)
        assert response.status_code == 403, f"{method} {path}: {response.status_code}"
    incident.refresh_from_db()
    item.refresh_from_db()
    site_a.refresh_from_db()
    assert incident.state == "triggered" and incident.timeline.count() == 1
    assert item.title == "RMA the GPU" and not Silence.objects.exists() and site_a.name == "ams-1"


def test_a_role_taken_away_applies_to_the_token_at_once(operator_user: User) -> None:
    incident = _incident()
    _, plain = PersonalToken.issue(user=operator_user, name="ack")
    operator_user.groups.set([Group.objects.get(name=roles.VIEWER)])
    assert _call("POST", f"/api/v1/incidents/{incident.pk}/acknowledge/", plain, {}).status_code == 403
    operator_user.is_active = False
    operator_user.save()
    assert _call("GET", "/api/v1/incidents/", plain).status_code == 401


def test_a_revoked_or_wrong_token_gets_401_at_once(operator_user: User) -> None:
    token, plain = PersonalToken.issue(user=operator_user, name="rotating")
    assert _call("GET", "/api/v1/incidents/", plain).status_code == 200
    wrong = plain[:-3] + ("xyz" if not plain.endswith("xyz") else "abc")
    response = _call("GET", "/api/v1/incidents/", wrong)
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer realm="goodput"'
    assert token.revoke(actor=operator_user)
    assert not token.revoke(actor=operator_user)  # a second revocation records nothing
    assert _call("GET", "/api/v1/incidents/", plain).status_code == 401


def test_a_personal_token_is_refused_by_the_agent_doors(operator_user: User, site_a: Any) -> None:
    _, plain = PersonalToken.issue(user=operator_user, name="not an agent")
    assert post_batch(Client(), plain, {"samples": [make_sample()]}).status_code == 401
    assert _call("POST", "/api/v1/alertmanager", plain, {"alerts": []}).status_code == 401


def test_a_personal_token_on_an_agent_door_is_told_the_door_takes_an_agent_token(
    operator_user: User, site_a: Any
) -> None:
    _, plain = PersonalToken.issue(user=operator_user, name="not an agent")
    for response in (
        post_batch(Client(), plain, {"samples": [make_sample()]}),
        _call("POST", "/api/v1/alertmanager", plain, {"alerts": []}),
    ):
        detail = response.json()["detail"]
        assert response.status_code == 401
        assert "takes an agent token" in detail and "not a personal API token" in detail
        assert "Invalid or revoked" not in detail


def test_an_agent_token_is_refused_by_the_rest_of_the_api(token_a: str) -> None:
    response = _call("GET", "/api/v1/incidents/", token_a)
    assert response.status_code == 401
    assert "agent tokens are accepted only by the ingest routes" in response.json()["detail"]


def test_a_token_opens_no_page(operator_user: User) -> None:
    _, plain = PersonalToken.issue(user=operator_user, name="pages")
    response = Client().get("/incidents/", HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_last_used_is_written_at_most_once_a_minute(operator_user: User) -> None:
    token, plain = PersonalToken.issue(user=operator_user, name="busy")
    assert token.last_used_at is None
    _call("GET", "/api/v1/incidents/", plain)
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    recent = timezone.now() - timedelta(seconds=30)
    PersonalToken.objects.filter(pk=token.pk).update(last_used_at=recent)
    _call("GET", "/api/v1/incidents/", plain)
    token.refresh_from_db()
    assert token.last_used_at == recent
    stale = timezone.now() - timedelta(minutes=2)
    PersonalToken.objects.filter(pk=token.pk).update(last_used_at=stale)
    _call("GET", "/api/v1/incidents/", plain)
    token.refresh_from_db()
    assert token.last_used_at is not None and token.last_used_at > stale + timedelta(minutes=1)


# --- the page --------------------------------------------------------------------------------------------


def test_the_page_shows_a_new_token_once_and_stores_only_its_hash(viewer_client: Client, viewer_user: User) -> None:
    response = viewer_client.post("/accounts/tokens/", {"name": "grafana export"})
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0") and "no-store" in response["Cache-Control"]
    token = PersonalToken.objects.get(user=viewer_user)
    plain = response.context["plain"]
    assert plain.startswith(f"gpt_{token.key_id}_") and plain in response.content.decode()
    secret = plain.split("_", 2)[2]
    assert secret not in token.secret_hash and len(token.secret_hash) == 64
    assert _call("GET", "/api/v1/incidents/", plain).status_code == 200
    page = viewer_client.get("/accounts/tokens/").content.decode()
    assert "grafana export" in page and f"gpt_{token.key_id}_" in page and secret not in page
    assert "never" not in page  # last used is shown
    history = LogEntry.objects.get(object_id=str(token.pk))
    assert history.action_flag == ADDITION and history.user == viewer_user


def test_the_page_refuses_a_token_without_a_name(viewer_client: Client) -> None:
    response = viewer_client.post("/accounts/tokens/", {"name": ""})
    assert response.status_code == 200 and "plain" not in response.context
    assert not PersonalToken.objects.exists()


def test_a_person_lists_and_revokes_only_their_own_tokens(
    viewer_client: Client, viewer_user: User, operator_user: User
) -> None:
    mine, _ = PersonalToken.issue(user=viewer_user, name="mine")
    theirs, _ = PersonalToken.issue(user=operator_user, name="theirs")
    page = viewer_client.get("/accounts/tokens/").content.decode()
    assert "mine" in page and "theirs" not in page
    assert viewer_client.post(f"/accounts/tokens/{theirs.pk}/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.is_active
    response = viewer_client.post(f"/accounts/tokens/{mine.pk}/revoke/")
    assert response.status_code == 302 and response["Location"] == "/accounts/tokens/"
    mine.refresh_from_db()
    assert not mine.is_active and mine.revoked_by == viewer_user
    history = LogEntry.objects.get(object_id=str(mine.pk), action_flag=CHANGE)
    assert history.user == viewer_user and "Revoked" in history.get_change_message()


def test_a_person_without_a_role_cannot_make_a_token(norole_client: Client) -> None:
    assert norole_client.get("/accounts/tokens/").status_code == 403
    assert norole_client.post("/accounts/tokens/", {"name": "x"}).status_code == 403
    assert not PersonalToken.objects.exists()


def test_the_navigation_links_to_the_token_page(viewer_client: Client) -> None:
    assert 'href="/accounts/tokens/"' in viewer_client.get("/").content.decode()


# --- the admin -------------------------------------------------------------------------------------------


def test_an_admin_revokes_anyones_token_but_makes_none(
    admin_client: Client, admin_user: User, operator_user: User
) -> None:
    token, plain = PersonalToken.issue(user=operator_user, name="leaked")
    changelist = admin_client.get("/admin/console/personaltoken/").content.decode()
    assert "leaked" in changelist and token.secret_hash not in changelist
    change = admin_client.get(f"/admin/console/personaltoken/{token.pk}/change/")
    assert change.status_code == 200 and token.key_id in change.content.decode()
    assert token.secret_hash not in change.content.decode()
    response = admin_client.post(
        "/admin/console/personaltoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True
    )
    assert response.status_code == 200
    token.refresh_from_db()
    assert not token.is_active and token.revoked_by == admin_user
    assert LogEntry.objects.filter(object_id=str(token.pk), action_flag=CHANGE, user=admin_user).exists()
    assert _call("GET", "/api/v1/incidents/", plain).status_code == 401
    assert admin_client.get("/admin/console/personaltoken/add/").status_code == 403


def test_operators_cannot_see_tokens_in_the_admin(operator_client: Client, viewer_user: User) -> None:
    PersonalToken.issue(user=viewer_user, name="x")
    assert operator_client.get("/admin/console/personaltoken/").status_code in (302, 403)
