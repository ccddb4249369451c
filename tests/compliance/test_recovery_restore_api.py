"""POST /api/v1/recovery/restore-tests/: people with the register's role and agent tokens of the
item's site record restore tests; idempotent on ``key``; a 4xx names the field at fault and
nothing is written."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from compliance.models import AuditEntry, RestoreTest
from console.models import PersonalToken
from fleet.models import Site
from tests.compliance.recovery_support import backup, make_item

pytestmark = pytest.mark.django_db

URL = "/api/v1/recovery/restore-tests/"
NOW = timezone.now()


def body(**overrides: Any) -> dict[str, Any]:
    return {
        "item": "c4-en",
        "key": "drill-2026-q4",
        "into": "scratch-bucket",
        "started": (NOW - timedelta(hours=3)).isoformat(),
        "finished": (NOW - timedelta(hours=2)).isoformat(),
        "verified": True,
        "verification": "sha256 of every shard matched",
        **overrides,
    }


def post(client: Client, data: dict[str, Any], token: str | None = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(URL, json.dumps(data), content_type="application/json", **headers)


def test_an_operator_records_a_restore_test_of_a_backup(operator_client: Client, site_a: Site) -> None:
    item = make_item(site_a)
    run = backup(item, timedelta(hours=5), external_id="velero-c4-1")
    response = post(operator_client, body(backup="velero-c4-1"))
    assert response.status_code == 201, response.content
    answer = response.json()
    assert (answer["item"], answer["backup"], answer["by"], answer["duration_seconds"]) == (
        "c4-en",
        "velero-c4-1",
        "oscar",
        3600.0,
    )
    test = RestoreTest.objects.get()
    assert (test.backup, test.verified, test.external_id) == (run, True, "drill-2026-q4")
    assert AuditEntry.objects.filter(model="restoretest", action="create", actor="oscar").exists()


def test_a_repeat_with_the_same_key_is_the_same_test(operator_client: Client, site_a: Site) -> None:
    make_item(site_a)
    first, again = post(operator_client, body()), post(operator_client, body())
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["record"] == again.json()["record"]
    assert RestoreTest.objects.count() == 1


def test_a_repeated_key_with_other_figures_is_a_409_naming_them(operator_client: Client, site_a: Site) -> None:
    make_item(site_a)
    assert post(operator_client, body()).status_code == 201
    response = post(operator_client, body(verified=False, into="elsewhere"))
    assert response.status_code == 409
    assert response.json()["fields"] == ["into", "verified"]
    assert RestoreTest.objects.get().verified is True


def test_without_a_key_each_post_is_a_test_of_its_own(officer: Client, site_a: Site) -> None:
    make_item(site_a)
    assert post(officer, body(key="")).status_code == 201
    assert post(officer, body(key="")).status_code == 201
    assert RestoreTest.objects.count() == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"item": "no-such-item"}, "item"),
        ({"backup": "no-such-run"}, "backup"),
        ({"into": ""}, "into"),
        ({"verified": "perhaps"}, "verified"),
        ({"started": "yesterday"}, "started"),
        ({"finished": (NOW - timedelta(days=1)).isoformat()}, "finished"),  # before started
        ({"finished": (NOW + timedelta(hours=1)).isoformat()}, "finished"),  # not ended yet
        ({"started": "1900-01-01T00:00:00Z"}, "started"),
        ({"duration": 3600}, "duration"),  # a field the API does not take
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    operator_client: Client, site_a: Site, overrides: dict[str, Any], field: str
) -> None:
    make_item(site_a)
    response = post(operator_client, body(**overrides))
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not RestoreTest.objects.exists()


def test_an_agent_token_records_for_its_own_sites_items_only(
    client: Client, site_a: Site, site_b: Site, token_a: str, token_b: str
) -> None:
    make_item(site_a)
    # Issue 37, item 10: answered as a name nobody has (it was a 403 naming the item's site).
    theirs, nobody = post(client, body(), token_b), post(client, body(item="no-such-item"), token_b)
    assert (theirs.status_code, nobody.status_code) == (400, 400)
    assert theirs.content.decode().replace("c4-en", "no-such-item") == nobody.content.decode()
    assert "ams-1" not in theirs.content.decode()
    response = post(client, body(by="restore-drill cronjob"), token_a)
    assert response.status_code == 201, response.content
    assert response.json()["by"] == "restore-drill cronjob"
    assert RestoreTest.objects.get().by_user is None


def test_viewers_anonymous_callers_and_viewers_tokens_are_refused(
    client: Client, viewer_client: Client, viewer_user: User, operator_user: User, site_a: Site
) -> None:
    make_item(site_a)
    assert post(client, body()).status_code == 401
    assert post(viewer_client, body()).status_code == 403
    assert post(client, body(), PersonalToken.issue(user=viewer_user, name="s")[1]).status_code == 403
    assert not RestoreTest.objects.exists()
    assert post(client, body(), PersonalToken.issue(user=operator_user, name="s")[1]).status_code == 201


@pytest.fixture
def officer(db: None) -> Client:
    from console import roles
    from tests.conftest import _client_for, _make_user

    return _client_for(_make_user("cora", roles.COMPLIANCE_OFFICER))
