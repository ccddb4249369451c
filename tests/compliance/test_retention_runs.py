"""Retention enforcement on real rows: what expired is deleted, what is on hold is kept, every run
(dry runs too) is recorded with its counts, and the partition drops show as runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance.choices import AuditAction, DataClass
from compliance.models import AuditEntry, LegalHold, RetentionPolicy, RetentionRun
from compliance.services import retention
from compliance.tasks import apply_retention
from console import roles
from fleet.models import PartitionDrop
from fleet.telemetry import partitions
from incidents.choices import FindingStatus, IncidentState, Severity, TimelineKind
from incidents.models import ActionItem, Finding, Incident, TimelineEntry
from tests.conftest import _make_user

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def _incident(title: str, *, resolved_days_ago: int | None, tenant: str = "") -> Incident:
    """A real incident with a finding, two timeline entries and an action item; resolved
    ``resolved_days_ago`` before NOW (None: still open)."""
    started = NOW - timedelta(days=(resolved_days_ago or 0) + 1)
    incident = Incident.objects.create(
        title=title,
        severity=Severity.SEV3,
        group_key=title,
        labels={"tenant": tenant} if tenant else {},
        started_at=started,
        detected_at=started,
    )
    Finding.objects.create(
        fingerprint=f"fp-{title}",
        source="test",
        severity=Severity.SEV3,
        summary=title,
        incident=incident,
        started_at=started,
        status=FindingStatus.CLEARED,
    )
    for text in ("opened", "resolved"):
        TimelineEntry.objects.create(incident=incident, kind=TimelineKind.STATE, actor_label="system", text=text)
    ActionItem.objects.create(incident=incident, title=f"follow up {title}")
    if resolved_days_ago is not None:
        # The engine stamps resolved_at at resolution; age it the way time would have.
        Incident.objects.filter(pk=incident.pk).update(
            state=IncidentState.RESOLVED, resolved_at=NOW - timedelta(days=resolved_days_ago)
        )
    return incident


def _audit_entry(days_ago: int) -> AuditEntry:
    return AuditEntry.objects.create(
        at=NOW - timedelta(days=days_ago), actor="system", action=AuditAction.UPDATE, app_label="x", model="y"
    )


def _counts() -> dict[str, int]:
    return {
        "incidents": Incident.objects.count(),
        "timeline": TimelineEntry.objects.count(),
        "findings": Finding.objects.count(),
        "action_items": ActionItem.objects.count(),
        # The runs' own audit lines aside: those are the record of the run, not data it touched.
        "audit": AuditEntry.objects.exclude(model="retentionrun").count(),
    }


def _run_for(runs: list[RetentionRun], data_class: str, tenant: str = "") -> RetentionRun:
    (run,) = [r for r in runs if r.data_class == data_class and r.tenant == tenant]
    return run


@pytest.fixture
def fixture_rows(db: None) -> dict[str, Any]:
    """Incidents: "old" resolved 800 days ago (past the 730-day default), "held" resolved 900 days
    ago under a legal hold naming it, "recent" resolved 10 days ago, "open" never resolved. Audit:
    two entries 3000 days old (past the 2555-day default), one 10 days old."""
    rows = {
        "old": _incident("old", resolved_days_ago=800),
        "held": _incident("held", resolved_days_ago=900),
        "recent": _incident("recent", resolved_days_ago=10),
        "open": _incident("open", resolved_days_ago=None),
        "audit_old": [_audit_entry(3000), _audit_entry(3001)],
        "audit_new": _audit_entry(10),
    }
    rows["hold"] = LegalHold.objects.create(
        name="Litigation 2024-17",
        data_class=DataClass.INCIDENTS,
        incident_ids=[rows["held"].pk],
        reason="Claim by a customer",
    )
    return rows


def test_a_run_deletes_what_expired_keeps_what_is_held_and_records_counts(fixture_rows: dict[str, Any]) -> None:
    runs = retention.run_retention(now=NOW)

    assert set(Incident.objects.values_list("title", flat=True)) == {"held", "recent", "open"}
    old = fixture_rows["old"]
    assert not TimelineEntry.objects.filter(incident_id=old.pk).exists()
    assert not Finding.objects.filter(incident_id=old.pk).exists()
    assert not ActionItem.objects.filter(incident_id=old.pk).exists()
    assert TimelineEntry.objects.filter(incident=fixture_rows["held"]).count() == 2

    incidents = _run_for(runs, DataClass.INCIDENTS)
    assert (incidents.affected, incidents.held, incidents.dry_run) == (1, 1, False)
    assert (incidents.policy, incidents.policy_days) == (None, 730)
    assert incidents.cutoff == NOW - 730 * DAY
    assert incidents.detail["held_ids"] == [fixture_rows["held"].pk]
    assert incidents.detail["timeline_entries"] == 2

    audit_run = _run_for(runs, DataClass.AUDIT)
    assert (audit_run.affected, audit_run.held, audit_run.policy_days) == (2, 0, 2555)
    assert not AuditEntry.objects.filter(pk__in=[e.pk for e in fixture_rows["audit_old"]]).exists()
    assert AuditEntry.objects.filter(pk=fixture_rows["audit_new"].pk).exists()
    # Each run wrote its audit line.
    logged = AuditEntry.objects.filter(model="retentionrun", action=AuditAction.ACTION)
    assert set(logged.values_list("object_id", flat=True)) == {str(r.pk) for r in runs}
    assert {r.triggered_by for r in runs} == {"beat"}


def test_the_timeline_stays_append_only_outside_a_retention_run(fixture_rows: dict[str, Any]) -> None:
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError), transaction.atomic():
        TimelineEntry.objects.filter(incident=fixture_rows["old"]).delete()
    assert TimelineEntry.objects.filter(incident=fixture_rows["old"]).count() == 2


def test_a_dry_run_changes_nothing_and_is_recorded(fixture_rows: dict[str, Any]) -> None:
    before = _counts()
    runs = retention.run_retention(now=NOW, dry_run=True, triggered_by="cora")
    assert _counts() == before
    incidents = _run_for(runs, DataClass.INCIDENTS)
    assert (incidents.affected, incidents.held, incidents.dry_run, incidents.triggered_by) == (1, 1, True, "cora")
    assert _run_for(runs, DataClass.AUDIT).affected == 2
    assert RetentionRun.objects.filter(dry_run=True).count() == len(runs)
    assert RetentionRun.objects.filter(dry_run=False).count() == 0


def test_a_hold_on_audit_keeps_every_entry(fixture_rows: dict[str, Any]) -> None:
    LegalHold.objects.create(name="Regulator inquiry", data_class=DataClass.AUDIT, reason="Inquiry 9")
    runs = retention.run_retention(now=NOW)
    audit_run = _run_for(runs, DataClass.AUDIT)
    assert (audit_run.affected, audit_run.held) == (0, 2)
    assert "Regulator inquiry" in audit_run.detail["skipped"]
    assert AuditEntry.objects.filter(pk__in=[e.pk for e in fixture_rows["audit_old"]]).count() == 2


def test_a_released_hold_no_longer_blocks(fixture_rows: dict[str, Any], officer_client: Client) -> None:
    hold = fixture_rows["hold"]
    response = officer_client.post(f"/api/v1/compliance/retention/holds/{hold.pk}/release/")
    assert response.status_code == 200
    assert response.json()["active"] is False
    assert officer_client.post(f"/api/v1/compliance/retention/holds/{hold.pk}/release/").status_code == 409
    retention.run_retention(now=NOW)
    assert set(Incident.objects.values_list("title", flat=True)) == {"recent", "open"}


def test_zero_retention_deletes_every_resolved_incident(fixture_rows: dict[str, Any]) -> None:
    RetentionPolicy.objects.create(data_class=DataClass.INCIDENTS, days=0)
    runs = retention.run_retention(now=NOW)
    assert set(Incident.objects.values_list("title", flat=True)) == {"held", "open"}
    run = _run_for(runs, DataClass.INCIDENTS)
    assert (run.affected, run.held, run.policy_days, run.cutoff) == (2, 1, 0, NOW)


def test_a_tenant_policy_beats_the_default(db: None) -> None:
    acme = _incident("acme-100d", resolved_days_ago=100, tenant="acme")
    other = _incident("globex-100d", resolved_days_ago=100, tenant="globex")
    policy = RetentionPolicy.objects.create(data_class=DataClass.INCIDENTS, tenant="acme", days=30)
    runs = retention.run_retention(now=NOW)
    assert not Incident.objects.filter(pk=acme.pk).exists()
    assert Incident.objects.filter(pk=other.pk).exists()  # the default 730 days applies to globex
    acme_run = _run_for(runs, DataClass.INCIDENTS, "acme")
    assert (acme_run.policy, acme_run.policy_days, acme_run.affected) == (policy, 30, 1)
    assert _run_for(runs, DataClass.INCIDENTS).affected == 0


def test_a_merge_target_stays_while_a_held_incident_points_at_it(db: None) -> None:
    target = _incident("target", resolved_days_ago=800)
    source = _incident("source", resolved_days_ago=850)
    Incident.objects.filter(pk=source.pk).update(merged_into=target)
    LegalHold.objects.create(name="h", data_class=DataClass.INCIDENTS, incident_ids=[source.pk], reason="r")
    run = _run_for(retention.run_retention(now=NOW), DataClass.INCIDENTS)
    assert Incident.objects.filter(pk__in=[target.pk, source.pk]).count() == 2
    assert (run.affected, run.held, run.detail["kept_as_merge_targets"]) == (0, 2, [target.pk])


def _old_sample_partition() -> str:
    day = NOW - timedelta(days=40)
    partitions.forget_known_partitions()
    partitions.ensure_partitions(partitions.SAMPLES, day, day)
    return partitions.SAMPLES.partition_name(partitions.SAMPLES.start_of(day))


def _partition_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [name])
        return cursor.fetchone()[0] is not None


def test_a_telemetry_hold_skips_the_partition_drop_and_says_so(db: None) -> None:
    name = _old_sample_partition()
    LegalHold.objects.create(name="Outage review", data_class=DataClass.TELEMETRY, reason="RCA for a customer")
    runs = retention.run_retention(now=NOW)
    assert _partition_exists(name)
    telemetry = _run_for(runs, DataClass.TELEMETRY)
    assert "Outage review" in telemetry.detail["skipped"]
    assert name in telemetry.detail["partitions"]
    assert "Outage review" in _run_for(runs, DataClass.SERVING_SAMPLES).detail["skipped"]


def test_without_a_hold_the_run_drops_expired_partitions_and_names_them(db: None, settings: Any) -> None:
    name = _old_sample_partition()
    preview = _run_for(retention.run_retention(now=NOW, dry_run=True), DataClass.TELEMETRY)
    assert _partition_exists(name) and name in preview.detail["partitions"]
    telemetry = _run_for(retention.run_retention(now=NOW), DataClass.TELEMETRY)
    assert not _partition_exists(name)
    drop = PartitionDrop.objects.get(partition=name)
    assert drop.pk in telemetry.detail["partition_drop_ids"]
    assert telemetry.policy_days == settings.RAW_RETENTION_DAYS
    # Named by its run, the drop is not recorded a second time.
    assert not RetentionRun.objects.filter(triggered_by=retention.PARTITION_DROP).exists()


def test_existing_partition_drops_show_as_runs(officer_client: Client) -> None:
    drop = PartitionDrop.objects.create(
        table="fleet_gpusample",
        partition="fleet_gpusample_p20261001",
        range_start=datetime(2026, 10, 1, tzinfo=UTC),
        range_end=datetime(2026, 10, 2, tzinfo=UTC),
        rows=12345,
        bytes=4_000_000,
    )
    page = officer_client.get(reverse("compliance:retention")).content.decode()
    assert f'data-drop="{drop.pk}"' in page and "fleet_gpusample_p20261001" in page

    retention.run_retention(now=NOW)
    retention.run_retention(now=NOW)  # idempotent: one run per drop
    run = RetentionRun.objects.get(triggered_by=retention.PARTITION_DROP)
    assert (run.data_class, run.affected, run.detail["partition_drop_id"]) == (DataClass.TELEMETRY, 12345, drop.pk)
    page = officer_client.get(reverse("compliance:retention")).content.decode()
    assert f'data-run="{run.pk}"' in page and f'data-drop="{drop.pk}"' not in page
    listed = officer_client.get("/api/v1/compliance/retention/runs/?triggered_by=partition-drop").json()
    assert [r["id"] for r in listed["results"]] == [run.pk]


def test_attestation_reviews_go_overdue(officer_client: Client) -> None:
    today = timezone.localdate()
    late = RetentionPolicy.objects.create(
        data_class=DataClass.INFERENCE_CONTENT, days=30, owner="Serving lead", review_due=today - DAY
    )
    fine = RetentionPolicy.objects.create(
        data_class=DataClass.MODEL_WEIGHTS, days=3650, owner="Security", review_due=today + 90 * DAY
    )
    rows = {r["id"]: r for r in officer_client.get("/api/v1/compliance/retention/policies/").json()["results"]}
    assert (rows[late.pk]["review_overdue"], rows[late.pk]["enforced"]) == (True, False)
    assert rows[fine.pk]["review_overdue"] is False
    by_class = {a.data_class: a for a in retention.attestations(today)}
    assert by_class[DataClass.INFERENCE_CONTENT].overdue
    assert not by_class[DataClass.MODEL_WEIGHTS].overdue
    # No policy for training corpora: the default shows, overdue until an owner attests it.
    assert by_class[DataClass.TRAINING_CORPUS].policy is None and by_class[DataClass.TRAINING_CORPUS].overdue
    page = officer_client.get(reverse("compliance:retention")).content.decode()
    assert 'id="attestations-overdue">2<' in page


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"data_class": DataClass.INFERENCE_CONTENT, "days": 30, "review_due": "2027-01-01"}, "owner"),
        ({"data_class": DataClass.INFERENCE_CONTENT, "days": 30, "owner": "x"}, "review_due"),
        ({"data_class": DataClass.AUDIT, "days": 10, "tenant": "acme"}, "tenant"),
        ({"data_class": DataClass.TELEMETRY, "days": 99999}, "days"),
        ({"data_class": DataClass.INCIDENTS, "days": 10, "action": "anonymise"}, "action"),
        ({"data_class": DataClass.INCIDENTS, "days": -1}, "days"),
    ],
)
def test_a_policy_the_console_cannot_honour_is_a_400_naming_the_field(
    officer_client: Client, body: dict[str, Any], field: str
) -> None:
    response = officer_client.post("/api/v1/compliance/retention/policies/", body, content_type="application/json")
    assert response.status_code == 400
    assert field in response.json()
    assert not RetentionPolicy.objects.exists()


def test_the_preview_and_run_endpoints(fixture_rows: dict[str, Any], officer_client: Client) -> None:
    preview = officer_client.post("/api/v1/compliance/retention/preview/")
    assert preview.status_code == 200
    counts = {(r["data_class"], r["dry_run"]): (r["affected"], r["held"]) for r in preview.json()["runs"]}
    assert counts[(DataClass.INCIDENTS, True)] == (1, 1)
    assert Incident.objects.count() == 4
    run = officer_client.post("/api/v1/compliance/retention/run/")
    assert run.status_code == 200
    assert {r["triggered_by"] for r in run.json()["runs"]} == {"cora"}
    assert not Incident.objects.filter(pk=fixture_rows["old"].pk).exists()


def test_the_page_preview_shows_counts_and_deletes_nothing(
    fixture_rows: dict[str, Any], officer_client: Client
) -> None:
    before = Incident.objects.count()
    page = officer_client.post(reverse("compliance:retention"), {"action": "preview"}).content.decode()
    assert 'id="preview"' in page and 'data-preview="incidents"' in page
    assert Incident.objects.count() == before
    assert RetentionRun.objects.filter(dry_run=True, triggered_by="cora").exists()


def test_the_page_places_a_hold_and_refuses_a_bad_one(officer_client: Client) -> None:
    url = reverse("compliance:retention")
    bad = officer_client.post(
        url,
        {"action": "hold", "hold-name": "x", "hold-data_class": "audit", "hold-incident_ids": "4", "hold-reason": "r"},
    )
    assert bad.status_code == 400 and 'data-error-for="incident_ids"' in bad.content.decode()
    assert not LegalHold.objects.exists()
    ok = officer_client.post(
        url,
        {"action": "hold", "hold-name": "Case 5", "hold-data_class": "incidents", "hold-incident_ids": "4, 9",
         "hold-reason": "Litigation"},
    )  # fmt: skip
    assert ok.status_code == 302
    hold = LegalHold.objects.get()
    assert (hold.incident_ids, hold.placed_by.username, hold.released_at) == ([4, 9], "cora", None)


def test_the_beat_task_applies_retention(fixture_rows: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    result = apply_retention()
    assert not Incident.objects.filter(pk=fixture_rows["old"].pk).exists()
    assert result["affected"] >= 3 and result["held"] == 1
    assert RetentionRun.objects.filter(triggered_by="beat", dry_run=False, data_class=DataClass.INCIDENTS).exists()


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_get_403(request: pytest.FixtureRequest, persona: str, fixture_rows: dict) -> None:
    client: Client = request.getfixturevalue(persona)
    assert client.get(reverse("compliance:retention")).status_code == 403
    assert client.post(reverse("compliance:retention"), {"action": "run"}).status_code == 403
    assert client.post("/api/v1/compliance/retention/run/").status_code == 403
    assert client.post("/api/v1/compliance/retention/preview/").status_code == 403
    assert client.get("/api/v1/compliance/retention/runs/").status_code == 403
    assert client.get("/api/v1/compliance/retention/policies/").status_code == 403
    assert Incident.objects.count() == 4
    assert not RetentionRun.objects.exists()


def test_defaults_apply_where_no_policy_exists(db: None, settings: Any) -> None:
    days = {(e.data_class, e.tenant): (e.days, e.policy) for e in retention.effective_policies()}
    assert days[(DataClass.TELEMETRY, "")] == (settings.RAW_RETENTION_DAYS, None)
    assert days[(DataClass.SERVING_SAMPLES, "")] == (settings.RAW_RETENTION_DAYS, None)
    assert days[(DataClass.INCIDENTS, "")] == (730, None)
    assert days[(DataClass.AUDIT, "")] == (2555, None)
    assert retention.default_days(DataClass.INFERENCE_CONTENT) == 30


# --- issue 22, item 3: the audit log cannot be emptied through retention ------------------------


def test_an_audit_policy_below_the_floor_is_a_400_naming_days(officer_client: Client) -> None:
    """The attack of the issue, step 2: a 0-day audit policy. The floor (7 years) is a deployment
    setting, so no policy goes under it, at the API or on the page."""
    response = officer_client.post(
        "/api/v1/compliance/retention/policies/", {"data_class": "audit", "days": 0}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "At least 2555 days" in response.json()["days"][0]
    page = officer_client.post(
        reverse("compliance:retention"),
        {"action": "policy", "policy-data_class": "audit", "policy-days": "30", "policy-action": "delete"},
    )
    assert page.status_code == 400 and "GOODPUT_AUDIT_RETENTION_FLOOR_DAYS" in page.content.decode()
    assert not RetentionPolicy.objects.exists()


def test_releasing_an_audit_hold_takes_two_people_and_the_purge_waits_a_day(
    fixture_rows: dict[str, Any], officer_client: Client
) -> None:
    """The attack of the issue, step 1 and 3: one officer releases the hold and runs retention."""
    hold = LegalHold.objects.create(name="Regulator inquiry", data_class=DataClass.AUDIT, reason="Inquiry 9")
    release = f"/api/v1/compliance/retention/holds/{hold.pk}/release/"

    asked = officer_client.post(release)
    assert asked.status_code == 202
    assert (asked.json()["active"], asked.json()["release_requested_by"]) == (True, "cora")
    again = officer_client.post(release)
    assert again.status_code == 409 and "another compliance officer or an admin" in again.json()["error"]
    assert _run_for(retention.run_retention(now=NOW), DataClass.AUDIT).affected == 0  # still held

    second = Client()
    second.force_login(_make_user("cody", roles.COMPLIANCE_OFFICER))
    approved = second.post(release)
    assert approved.status_code == 200
    assert (approved.json()["active"], approved.json()["released_by"]) == (False, "cody")
    assert officer_client.post(release).status_code == 409  # released already

    now = timezone.now()
    waiting = _run_for(retention.run_retention(now=now), DataClass.AUDIT)
    assert (waiting.affected, waiting.held) == (0, 2)
    assert "was released" in waiting.detail["skipped"]
    hold.refresh_from_db()
    assert waiting.detail["waits_until"] == (hold.released_at + DAY).isoformat()
    assert AuditEntry.objects.filter(pk__in=[e.pk for e in fixture_rows["audit_old"]]).count() == 2

    after_a_day = _run_for(retention.run_retention(now=now + DAY + timedelta(minutes=1)), DataClass.AUDIT)
    assert after_a_day.affected == 2
    assert not AuditEntry.objects.filter(pk__in=[e.pk for e in fixture_rows["audit_old"]]).exists()
    purge = AuditEntry.objects.get(action=AuditAction.PURGE)
    assert purge.after["deleted"] == 2 and purge.actor == "beat"
    logged = AuditEntry.objects.filter(model="legalhold", object_id=str(hold.pk)).values_list("message", flat=True)
    assert any("release of legal hold requested" in m for m in logged)
    assert any(m.startswith("legal hold released") for m in logged)


def test_a_changed_audit_policy_also_makes_the_purge_wait_a_day(fixture_rows: dict[str, Any]) -> None:
    RetentionPolicy.objects.create(data_class=DataClass.AUDIT, days=2555)
    run = _run_for(retention.run_retention(now=timezone.now()), DataClass.AUDIT)
    assert (run.affected, run.held) == (0, 2) and "the audit policy (2555 days) was set" in run.detail["skipped"]


def test_the_page_asks_for_an_audit_holds_release_and_an_admin_approves(
    officer_client: Client, admin_client: Client
) -> None:
    hold = LegalHold.objects.create(name="Regulator inquiry", data_class=DataClass.AUDIT, reason="Inquiry 9")
    url = reverse("compliance:retention")
    assert 'data-action="release">Ask to release<' in officer_client.get(url).content.decode()

    assert officer_client.post(url, {"action": "release", "hold": hold.pk}).status_code == 302
    page = officer_client.get(url).content.decode()
    assert "release asked by cora" in page and "Release of Regulator inquiry requested" in page
    refused = officer_client.post(url, {"action": "release", "hold": hold.pk})
    assert refused.status_code == 409 and "another compliance officer or an admin approves" in refused.content.decode()
    assert LegalHold.objects.get().released_at is None

    assert admin_client.post(url, {"action": "release", "hold": hold.pk}).status_code == 302
    hold.refresh_from_db()
    assert hold.released_at is not None and hold.released_by.username == "ada"


def test_a_hold_on_other_data_is_still_released_by_one_person(officer_client: Client) -> None:
    hold = LegalHold.objects.create(name="Case 5", data_class=DataClass.INCIDENTS, reason="Litigation")
    response = officer_client.post(f"/api/v1/compliance/retention/holds/{hold.pk}/release/")
    assert response.status_code == 200 and response.json()["released_by"] == "cora"


def test_every_partitioned_table_has_a_retention_class() -> None:
    """A new partitioned table (the fabric read model, the scheduler series) is dropped with its
    class: one missing from the map would stop a retention run at its first expired partition."""
    from compliance.services import retention
    from fleet.telemetry import partitions

    assert {t.name for t in partitions.TABLES} <= set(retention._TABLE_CLASS)
