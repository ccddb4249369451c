"""The audit log page, its CSV export and the read-only API: filters, pages, diffs, who may see
them, and that the export is itself audited."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from compliance.choices import AuditAction
from compliance.models import AuditEntry, GpaiModel
from compliance.services.audit import record
from tests.compliance.test_audit_log import audit_middleware  # noqa: F401  (autouse)

API = "/api/v1/compliance/audit/"


@pytest.fixture
def changed_model(gpai_model: GpaiModel) -> GpaiModel:
    """The fixture model with its provider contact changed (outside a request: by "system")."""
    gpai_model.provider_contact = "legal@goodput.example"
    gpai_model.save()
    return gpai_model


def csv_rows(response) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_the_page_shows_each_change_as_a_diff_of_the_changed_fields(
    officer_client: Client, changed_model: GpaiModel
) -> None:
    response = officer_client.get("/compliance/audit/", {"model": "gpaimodel", "action": "update"})
    assert response.status_code == 200
    (entry,) = response.context["page"].object_list
    # The unchanged fields stay out (the auto_now stamp did change).
    assert {name for name, _, _ in entry.diff} == {"provider_contact", "updated_at"}
    html = response.content.decode()
    assert "<del>ai-office@goodput.example</del>" in html and "<ins>legal@goodput.example</ins>" in html


def test_the_page_filters_by_actor_action_type_object_and_date(
    officer_client: Client, officer_user: User, changed_model: GpaiModel
) -> None:
    record(AuditAction.ACTION, obj=changed_model, message="published", actor=officer_user)
    old = record(AuditAction.ACTION, message="long ago", actor="system")

    def ids(**params: str) -> set[int]:
        response = officer_client.get("/compliance/audit/", params)
        assert response.status_code == 200
        return {e.pk for e in response.context["page"].object_list}

    mine = ids(actor="cora")
    assert mine and all(AuditEntry.objects.get(pk=pk).actor == "cora" for pk in mine)
    assert ids(action="action", object_id=str(changed_model.pk), model="gpaimodel") == {
        AuditEntry.objects.get(message="published").pk
    }
    today = timezone.localdate()
    assert old.pk in ids(since=today.isoformat(), until=today.isoformat())
    assert ids(until=(today - timedelta(days=1)).isoformat()) == set()
    assert ids(since=(today + timedelta(days=1)).isoformat()) == set()


def test_the_page_is_paginated_fifty_at_a_time_newest_first(officer_client: Client, officer_user: User) -> None:
    for n in range(60):
        record(AuditAction.ACTION, message=f"step {n}", actor="pager")
    first = officer_client.get("/compliance/audit/", {"actor": "pager"}).context["page"]
    second = officer_client.get("/compliance/audit/", {"actor": "pager", "page": 2}).context["page"]
    assert len(first.object_list) == 50 and len(second.object_list) == 10
    assert first.object_list[0].message == "step 59" and second.object_list[-1].message == "step 0"


def test_a_bad_date_is_named_on_the_page_and_refused_by_the_export(officer_client: Client) -> None:
    page = officer_client.get("/compliance/audit/", {"since": "yesterday"})
    assert page.status_code == 200 and "since: Enter a valid date." in page.content.decode()
    export = officer_client.get("/compliance/audit.csv", {"since": "yesterday"})
    assert export.status_code == 400 and b"since" in export.content


def test_the_csv_export_streams_the_filtered_set_and_is_itself_audited(
    officer_client: Client, changed_model: GpaiModel
) -> None:
    response = officer_client.get("/compliance/audit.csv", {"model": "gpaimodel"})
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    assert response.streaming and "attachment" in response["Content-Disposition"]
    rows = csv_rows(response)
    assert [r["action"] for r in rows] == ["update", "create"]  # newest first
    assert json.loads(rows[0]["after"])["provider_contact"] == "legal@goodput.example"
    export = AuditEntry.objects.get(action=AuditAction.EXPORT)
    assert export.actor == "cora" and export.message == "audit CSV exported (model=gpaimodel)"


def test_the_api_lists_filters_and_shows_an_entry(officer_client: Client, changed_model: GpaiModel) -> None:
    listed = officer_client.get(API, {"model": "gpaimodel", "action": "update"}).json()
    assert listed["count"] == 1
    (entry,) = listed["results"]
    assert entry["before"]["provider_contact"] == "ai-office@goodput.example"
    detail = officer_client.get(f"{API}{entry['id']}/").json()
    assert detail["after"]["provider_contact"] == "legal@goodput.example" and detail["actor"] == "system"


def test_the_api_has_no_way_to_change_or_delete_an_entry(officer_client: Client, changed_model: GpaiModel) -> None:
    entry = AuditEntry.objects.filter(model="gpaimodel").latest("pk")
    url = f"{API}{entry.pk}/"
    body = json.dumps({"message": "rewritten"})
    assert officer_client.put(url, body, content_type="application/json").status_code == 405
    assert officer_client.patch(url, body, content_type="application/json").status_code == 405
    assert officer_client.delete(url).status_code == 405
    assert officer_client.post(API, body, content_type="application/json").status_code == 405
    assert AuditEntry.objects.get(pk=entry.pk).message == ""


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_get_403_on_the_page_the_export_and_the_api(
    persona: str, request, changed_model: GpaiModel
) -> None:  # type: ignore[no-untyped-def]
    client = request.getfixturevalue(persona)
    entry = AuditEntry.objects.latest("pk")
    for url in ("/compliance/audit/", "/compliance/audit.csv", API, f"{API}{entry.pk}/"):
        assert client.get(url).status_code == 403, url
    assert not AuditEntry.objects.filter(action=AuditAction.EXPORT).exists()
