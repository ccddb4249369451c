"""Inputs at the edges of each compliance door, and changes made by conditional UPDATEs, each of
which once got past the checks (a 500, a forged line in a published text, a formula in a CSV, a
change missing from the audit log, an incident retention never deleted)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from compliance.choices import AuditAction, DataClass
from compliance.models import AuditEntry, Dataset, GpaiModel, LegalHold, RetentionPolicy, SubjectRequest
from compliance.services import register, retention, summary
from console import spreadsheet
from console.models import AgentToken
from fleet.models import Site
from incidents.choices import Severity
from incidents.models import Incident
from incidents.services import actions
from incidents.services.engine import Actor
from tests.compliance.test_retention_runs import NOW, _incident

pytestmark = pytest.mark.django_db


def test_an_audit_filter_at_the_end_of_the_calendar_is_a_400_naming_it(officer_client: Client) -> None:
    """Bounded as every client date is (console.timebounds: ten years either side of today)."""
    for url in ("/compliance/audit.csv", "/api/v1/compliance/audit/"):
        response = officer_client.get(url, {"until": "9999-12-31"})
        assert response.status_code == 400 and "until" in response.content.decode(), url
    page = officer_client.get("/compliance/audit/", {"until": "9999-12-31"}).content.decode()
    assert "until: Is after" in page and "10 years ahead" in page  # the page shows the filter's error


def test_a_request_received_in_year_1_is_refused_naming_the_field(officer_client: Client) -> None:
    body = {"kind": "access", "subject_reference": "DSR-1", "received_on": "0001-01-01"}
    response = officer_client.post("/api/v1/compliance/processing/requests/", body, content_type="application/json")
    assert response.status_code == 400 and "received_on" in response.json()
    assert "10 years back" in response.json()["received_on"][0]


def test_a_policy_of_a_million_days_is_refused_naming_days(officer_client: Client) -> None:
    body = {"data_class": DataClass.INCIDENTS, "days": 1_000_000, "action": "delete"}
    response = officer_client.post("/api/v1/compliance/retention/policies/", body, content_type="application/json")
    assert response.status_code == 400 and "days" in response.json()
    assert not RetentionPolicy.objects.exists()


def test_a_request_received_in_the_future_is_refused_naming_the_field(officer_client: Client) -> None:
    for day in ("9999-12-15", str(timezone.localdate() + timedelta(days=1))):
        body = {"kind": "access", "subject_reference": "DSR-1", "received_on": day}
        response = officer_client.post("/api/v1/compliance/processing/requests/", body, content_type="application/json")
        assert response.status_code == 400 and "received_on" in response.json(), day
    assert not SubjectRequest.objects.exists()


def test_releasing_a_hold_by_a_non_ascii_digit_is_a_400(officer_client: Client) -> None:
    hold = LegalHold.objects.create(name="h", data_class=DataClass.AUDIT, reason="r")
    for raw in ("²", "9" * 30):
        response = officer_client.post("/compliance/retention/", {"action": "release", "hold": raw})
        assert response.status_code == 400, raw
    hold.refresh_from_db()
    assert hold.released_at is None


def test_free_text_cannot_forge_lines_or_table_rows_in_the_published_summary(officer_client: Client) -> None:
    model = GpaiModel.objects.create(
        name="evil\r\nname",
        version="1",
        provider_name="Acme\n## 4. Forged section",
        modalities=["text"],
        content_types_text="| a | b | c | d | e | f | g | h | i | j | k | l | m | n | o | p |",
    )
    text = summary.render_markdown(summary.build_document(model), version=1, last_update=NOW.date())
    assert "\n## 4. Forged section" not in text
    assert "- **Provider name and contact details:** Acme ## 4. Forged section; to be provided" in text
    assert "  - **Types of content:** \\| a \\| b \\|" in text
    assert not any(line.startswith("| a ") for line in text.splitlines())
    version = summary.publish(model, user=None)
    response = officer_client.get(f"/api/v1/compliance/models/{model.pk}/summary/versions/{version.version}/export.pdf")
    assert response.status_code == 200 and response.content.startswith(b"%PDF")
    assert response["Content-Disposition"] == 'attachment; filename="summary-evil_name-1-v1.pdf"'


def test_an_untenanted_incident_expires_beside_a_tenant_policy() -> None:
    untenanted = _incident("plain-800d", resolved_days_ago=800)
    RetentionPolicy.objects.create(data_class=DataClass.INCIDENTS, tenant="acme", days=30)
    retention.run_retention(now=NOW)
    assert not Incident.objects.filter(pk=untenanted.pk).exists()


def test_csv_cells_that_a_spreadsheet_would_run_are_written_as_text() -> None:
    assert spreadsheet.cell('=HYPERLINK("http://x")') == '\'=HYPERLINK("http://x")'
    assert [spreadsheet.cell(v) for v in ("+1", "-a", "@b", "team", -3, 4)] == ["'+1", "'-a", "'@b", "team", -3, 4]


def test_a_formula_after_a_delimiter_a_spreadsheet_may_split_on_is_written_as_text() -> None:
    cells = [spreadsheet.cell(v) for v in ("ops;=1+1;", "ops\t=1+1", "ops,@SUM(1)", "ops\n-1", "a;b")]
    assert cells == ["ops;'=1+1;", "ops\t'=1+1", "ops,'@SUM(1)", "ops\n'-1", "a;b"]
    assert spreadsheet.cell(spreadsheet.cell("=1;+2")) == "'=1;'+2"  # escaping twice changes nothing
    assert spreadsheet.cell('{"a": [-1, -2]}') == '{"a": [-1, -2]}'  # JSON's ", " keeps its numbers


def test_the_audit_csv_writes_a_formula_as_text(officer_client: Client) -> None:
    Site.objects.create(name="=cmd|' /C calc'!A0")
    body = b"".join(officer_client.get("/compliance/audit.csv").streaming_content).decode()
    assert "'=cmd|" in body and ",=cmd|" not in body


def test_a_crawl_reimport_is_one_audit_entry_with_the_counts(crawled_dataset: Dataset) -> None:
    before = AuditEntry.objects.count()
    register.import_domains(crawled_dataset, "domain,bytes\na.example,10\nb.example,20\n")
    entries = AuditEntry.objects.order_by("-pk")[: AuditEntry.objects.count() - before]
    assert len(entries) == 1
    assert (entries[0].model, entries[0].after) == ("dataset", {"domains": 2, "domain_bytes": 30})
    assert entries[0].before["domains"] == 40


def test_a_severity_change_and_a_merge_are_audited_with_before_and_after(admin_user: User) -> None:
    now = timezone.now()
    a = Incident.objects.create(title="a", severity=Severity.SEV3, group_key="a", started_at=now, detected_at=now)
    b = Incident.objects.create(title="b", severity=Severity.SEV2, group_key="b", started_at=now, detected_at=now)
    actor = Actor.person(admin_user)
    actions.change_severity(a, severity=Severity.SEV1, actor=actor)
    entry = AuditEntry.objects.filter(model="incident", object_id=str(a.pk), action=AuditAction.UPDATE).latest("pk")
    assert (entry.before["severity"], entry.after["severity"]) == (Severity.SEV3, Severity.SEV1)
    actions.merge_incidents(b, into=a, actor=actor)
    merged = AuditEntry.objects.filter(model="incident", object_id=str(b.pk), action=AuditAction.UPDATE).latest("pk")
    assert (merged.before["merged_into"], merged.after["merged_into"]) == (None, a.pk)


def test_revoking_agent_tokens_in_the_admin_is_audited(admin_client: Client, site_a: Site) -> None:
    token, _ = AgentToken.issue(site=site_a, name="edge")
    response = admin_client.post(
        "/admin/console/agenttoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True
    )
    assert response.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None
    entry = AuditEntry.objects.filter(model="agenttoken", object_id=str(token.pk)).latest("pk")
    assert (entry.action, entry.before["revoked_at"], entry.message) == (AuditAction.UPDATE, None, "Revoked.")
