"""The incident actions SREs expect (issue 10, item 6): reopen, change severity, merge, silence
from an incident with a preview, a detector label on every detector finding, no duplicate
silences, maintenance windows, runbook links, a postmortem drafted from the timeline, and overdue
action items. Each is tried through the API by an operator, and refused to a viewer."""

from __future__ import annotations

from datetime import date, timedelta
from types import ModuleType

import pytest
from django.utils import timezone

from incidents import detectors
from incidents.choices import FindingStatus, IncidentState
from incidents.detectors import FindingSpec, run_detectors
from incidents.models import ActionItem, Finding, Incident, MaintenanceWindow, RunbookLink, Silence
from incidents.services.engine import Actor, raise_finding, resolve_incident

pytestmark = pytest.mark.django_db

JSON = "application/json"


def _raise(fingerprint: str, hostname: str, severity: str = "SEV3", **labels: str) -> Incident:
    finding = raise_finding(
        fingerprint,
        {"site": "ams-1", "hostname": hostname, **labels},
        severity,
        f"fault {fingerprint} on {hostname}",
        impact={"gpus": 1, "unit": f"gpu:{fingerprint}"},
        source="detector:test",
        category="gpu-health",
    )
    return finding.incident


@pytest.fixture
def incident(db) -> Incident:  # type: ignore[no-untyped-def]
    return _raise("xid:GPU-1", "gpu-a-001", "SEV2", gpu="GPU-1")


@pytest.fixture
def other(db) -> Incident:  # type: ignore[no-untyped-def]
    return _raise("thermal:GPU-9", "gpu-b-009", "SEV3", gpu="GPU-9")


def _url(incident: Incident, action: str) -> str:
    return f"/api/v1/incidents/{incident.pk}/{action}/"


# --- reopen ---------------------------------------------------------------------------------------


def test_an_operator_reopens_a_resolved_incident(operator_client, operator_user, incident) -> None:
    resolve_incident(incident, actor=Actor.person(operator_user))
    response = operator_client.post(_url(incident, "reopen"), {"note": "came back"}, content_type=JSON)
    assert response.status_code == 200, response.content
    incident.refresh_from_db()
    assert incident.state == IncidentState.TRIGGERED
    assert incident.resolved_at is None
    assert incident.timeline.filter(text="Reopened by oscar: came back").exists()


def test_reopening_an_open_incident_is_a_conflict(operator_client, incident) -> None:
    response = operator_client.post(_url(incident, "reopen"), {}, content_type=JSON)
    assert response.status_code == 409
    assert not incident.timeline.filter(text__startswith="Reopened").exists()


# --- severity -----------------------------------------------------------------------------------------


def test_an_operator_changes_severity_and_the_timeline_says_so(operator_client, incident) -> None:
    response = operator_client.post(_url(incident, "severity"), {"severity": "SEV1"}, content_type=JSON)
    assert response.status_code == 200, response.content
    assert response.json()["severity"] == "SEV1"
    entry = incident.timeline.get(text__startswith="Severity changed")
    assert entry.text == "Severity changed from SEV2 to SEV1 by oscar"
    assert entry.data["severity_from"] == "SEV2" and entry.data["severity_to"] == "SEV1"


def test_an_unknown_or_unchanged_severity_is_refused(operator_client, incident) -> None:
    assert operator_client.post(_url(incident, "severity"), {"severity": "SEV9"}, content_type=JSON).status_code == 400
    assert operator_client.post(_url(incident, "severity"), {"severity": "SEV2"}, content_type=JSON).status_code == 400
    assert not incident.timeline.filter(text__startswith="Severity changed").exists()


# --- merge ------------------------------------------------------------------------------------------------


def test_merging_moves_findings_items_and_timeline_and_closes_the_source(operator_client, incident, other) -> None:
    ActionItem.objects.create(incident=other, title="check the fans")
    response = operator_client.post(_url(other, "merge"), {"into": incident.pk}, content_type=JSON)
    assert response.status_code == 200, response.content
    assert response.json()["id"] == incident.pk
    other.refresh_from_db()
    incident.refresh_from_db()
    assert other.state == IncidentState.RESOLVED and other.merged_into_id == incident.pk
    assert Finding.objects.get(fingerprint="thermal:GPU-9").incident_id == incident.pk
    assert incident.action_items.filter(title="check the fans").exists()
    assert incident.timeline.filter(text__startswith=f"[from #{other.pk}] Triggered (SEV3)").exists()
    assert incident.timeline.filter(text__startswith=f"Incident #{other.pk} ").exists()
    assert other.timeline.filter(text__startswith=f"Merged into #{incident.pk}").exists()
    assert incident.affected_gpus == 2
    assert incident.labels == {"site": "ams-1"}  # what both share


def test_merging_twice_or_into_itself_is_refused(operator_client, incident, other) -> None:
    assert operator_client.post(_url(other, "merge"), {"into": incident.pk}, content_type=JSON).status_code == 200
    assert operator_client.post(_url(other, "merge"), {"into": incident.pk}, content_type=JSON).status_code == 409
    assert operator_client.post(_url(incident, "merge"), {"into": other.pk}, content_type=JSON).status_code == 409
    assert operator_client.post(_url(incident, "merge"), {"into": incident.pk}, content_type=JSON).status_code == 400
    assert operator_client.post(_url(incident, "reopen"), {}, content_type=JSON).status_code == 409


# --- silence this incident ------------------------------------------------------------------------------


def test_silence_form_prefills_matchers_from_labels_and_previews_what_fires(viewer_client, incident, other) -> None:
    raise_finding("xid:GPU-2", {"site": "ams-1", "hostname": "gpu-a-002", "gpu": "GPU-2"}, "SEV3", "another")
    response = viewer_client.get(_url(incident, "silence"))
    assert response.status_code == 200
    body = response.json()
    assert body["matchers"] == [
        {"name": "gpu", "op": "=", "value": "GPU-1"},
        {"name": "hostname", "op": "=", "value": "gpu-a-001"},
        {"name": "site", "op": "=", "value": "ams-1"},
    ]
    assert [f["fingerprint"] for f in body["findings"]] == ["xid:GPU-1"]


def test_an_operator_silences_an_incident_and_the_timeline_says_so(operator_client, incident) -> None:
    response = operator_client.post(_url(incident, "silence"), {"comment": "RMA", "hours": 1}, content_type=JSON)
    assert response.status_code == 201, response.content
    silence = Silence.objects.get()
    assert {m["name"] for m in silence.matchers} == {"gpu", "hostname", "site"}
    assert incident.timeline.filter(text__startswith="Silenced ").exists()
    again = operator_client.post(_url(incident, "silence"), {"comment": "RMA", "hours": 1}, content_type=JSON)
    assert again.status_code == 409
    assert Silence.objects.count() == 1


# --- duplicate silences ------------------------------------------------------------------------------------


def _silence_body(hours_from: float, hours_to: float, matchers: list[dict[str, str]] | None = None) -> dict:
    now = timezone.now()
    return {
        "matchers": matchers or [{"name": "hostname", "op": "=", "value": "gpu-a-001"}, {"name": "site", "value": "x"}],
        "starts_at": (now + timedelta(hours=hours_from)).isoformat(),
        "ends_at": (now + timedelta(hours=hours_to)).isoformat(),
        "comment": "maintenance",
    }


def test_a_duplicate_silence_is_refused_with_409(operator_client) -> None:
    assert operator_client.post("/api/v1/silences/", _silence_body(0, 2), content_type=JSON).status_code == 201
    reordered = [{"name": "site", "op": "=", "value": "x"}, {"name": "hostname", "op": "=", "value": "gpu-a-001"}]
    response = operator_client.post("/api/v1/silences/", _silence_body(1, 3, reordered), content_type=JSON)
    assert response.status_code == 409
    assert "already silences" in response.json()["detail"]
    # not overlapping in time, or other matchers: fine
    assert operator_client.post("/api/v1/silences/", _silence_body(2, 4), content_type=JSON).status_code == 201
    other = [{"name": "hostname", "op": "=", "value": "gpu-a-002"}]
    assert operator_client.post("/api/v1/silences/", _silence_body(0, 2, other), content_type=JSON).status_code == 201
    assert Silence.objects.count() == 3


def test_the_silence_page_refuses_a_duplicate_with_a_form_error(operator_client) -> None:
    form = {"matchers": 'hostname="gpu-a-001"', "hours": "2", "comment": "RMA"}
    assert operator_client.post("/incidents/silences/", form).status_code == 302
    response = operator_client.post("/incidents/silences/", form)
    assert response.status_code == 200
    assert "already silences" in response.content.decode()
    assert Silence.objects.count() == 1


# --- detector label ----------------------------------------------------------------------------------------


def test_every_detector_finding_carries_its_detector_label_and_one_silence_mutes_one_detector(
    operator_client,
) -> None:
    def hot(now):  # type: ignore[no-untyped-def]
        return [FindingSpec("hot:GPU-1", {"hostname": "gpu-a-001"}, "SEV3", "hot")]

    def slow(now):  # type: ignore[no-untyped-def]
        return [FindingSpec("slow:GPU-1", {"hostname": "gpu-a-002"}, "SEV3", "slow")]

    # A detector module as a room's plugins.py registers one: functions marked @detector.
    module = ModuleType("tests_incident_detectors")
    for name, fn in (("test-hot", hot), ("test-slow", slow)):
        fn.__module__ = module.__name__
        setattr(module, fn.__name__, detectors.detector(name)(fn))
    saved = dict(detectors._detectors)
    try:
        detectors.register_detectors(module)
        body = _silence_body(-0.1, 2, [{"name": "detector", "op": "=", "value": "test-hot"}])
        assert operator_client.post("/api/v1/silences/", body, content_type=JSON).status_code == 201
        run_detectors(only=["test-hot", "test-slow"])
    finally:
        detectors._detectors.clear()
        detectors._detectors.update(saved)
    hot_finding, slow_finding = (
        Finding.objects.get(fingerprint="hot:GPU-1"),
        Finding.objects.get(fingerprint="slow:GPU-1"),
    )
    assert hot_finding.labels["detector"] == "test-hot" and slow_finding.labels["detector"] == "test-slow"
    assert hot_finding.silenced_by is not None and hot_finding.incident is None
    assert slow_finding.incident is not None


# --- maintenance windows -------------------------------------------------------------------------------------


def test_a_maintenance_window_records_findings_but_opens_no_incident(operator_client) -> None:
    now = timezone.now()
    body = {
        "scope": "node",
        "value": "gpu-a-001",
        "starts_at": (now - timedelta(minutes=1)).isoformat(),
        "ends_at": (now + timedelta(hours=2)).isoformat(),
        "comment": "firmware upgrade",
    }
    response = operator_client.post("/api/v1/maintenance-windows/", body, content_type=JSON)
    assert response.status_code == 201, response.content
    window = MaintenanceWindow.objects.get()
    finding = raise_finding("xid:GPU-1", {"site": "ams-1", "hostname": "gpu-a-001"}, "SEV1", "XID 79")
    assert finding.status == FindingStatus.FIRING and finding.in_maintenance == window and finding.incident is None
    assert not Incident.objects.exists()
    # another node of the same site is not in maintenance
    assert raise_finding("xid:GPU-2", {"site": "ams-1", "hostname": "gpu-a-002"}, "SEV1", "XID 79").incident
    # a site window covers every node of the site
    MaintenanceWindow.objects.create(scope="site", value="fra-2", ends_at=now + timedelta(hours=1), comment="x")
    assert raise_finding("xid:GPU-3", {"site": "fra-2", "hostname": "gpu-f-001"}, "SEV1", "XID 79").incident is None


def test_findings_in_maintenance_are_shown_on_the_maintenance_page(viewer_client) -> None:
    now = timezone.now()
    MaintenanceWindow.objects.create(scope="rack", value="r-07", ends_at=now + timedelta(hours=1), comment="PDU swap")
    raise_finding("psu:r-07", {"site": "ams-1", "rack": "r-07"}, "SEV2", "PSU lost on r-07")
    page = viewer_client.get("/incidents/maintenance/").content.decode()
    assert "PDU swap" in page and "PSU lost on r-07" in page and "in maintenance" in page


# --- runbook links ---------------------------------------------------------------------------------------


def test_the_incident_shows_its_categorys_runbook(viewer_client, incident) -> None:
    RunbookLink.objects.create(category="gpu-health", url="https://wiki.example/runbooks/gpu-health")
    assert viewer_client.get(f"/api/v1/incidents/{incident.pk}/").json()["runbook_url"] == (
        "https://wiki.example/runbooks/gpu-health"
    )
    assert (
        'href="https://wiki.example/runbooks/gpu-health"'
        in viewer_client.get(incident.get_absolute_url()).content.decode()
    )


# --- postmortem template -----------------------------------------------------------------------------------


def test_the_postmortem_is_drafted_from_the_timeline_without_overwriting(operator_client, incident) -> None:
    Incident.objects.filter(pk=incident.pk).update(pm_root_cause="a loose riser card")
    response = operator_client.post(_url(incident, "postmortem-draft"), {}, content_type=JSON)
    assert response.status_code == 200, response.content
    incident.refresh_from_db()
    assert incident.pm_root_cause == "a loose riser card"
    assert "Triggered (SEV2) by detector:test" in incident.pm_timeline
    assert incident.pm_summary.startswith("SEV2 fault xid:GPU-1 on gpu-a-001.")
    assert "1 GPU(s) affected" in incident.pm_impact
    assert incident.timeline.filter(text__startswith="Postmortem drafted from the timeline").exists()


# --- action items --------------------------------------------------------------------------------------------


def test_action_items_past_their_due_date_are_overdue(operator_client, viewer_client, incident) -> None:
    yesterday = (timezone.localdate() - timedelta(days=1)).isoformat()
    body = {"incident": incident.pk, "title": "RMA", "owner": "oscar", "due_date": yesterday}
    response = operator_client.post("/api/v1/action-items/", body, content_type=JSON)
    assert response.status_code == 201 and response.json()["overdue"] is True
    item = ActionItem.objects.get()
    assert ActionItem(incident=incident, title="x", due_date=date.max).is_overdue is False
    page = viewer_client.get(incident.get_absolute_url()).content.decode()
    assert "overdue" in page
    done = operator_client.patch(f"/api/v1/action-items/{item.pk}/", {"state": "done"}, content_type=JSON)
    assert done.json()["overdue"] is False


# --- viewers -------------------------------------------------------------------------------------------------


def test_viewers_get_403_on_every_new_action(viewer_client, operator_user, incident, other) -> None:
    resolve_incident(other, actor=Actor.person(operator_user))
    now = timezone.now()
    changes = [
        (_url(other, "reopen"), {}),
        (_url(incident, "severity"), {"severity": "SEV1"}),
        (_url(incident, "merge"), {"into": other.pk}),
        (_url(incident, "silence"), {"comment": "x"}),
        (_url(incident, "postmortem-draft"), {}),
        ("/api/v1/silences/", _silence_body(0, 1)),
        (
            "/api/v1/maintenance-windows/",
            {"scope": "node", "value": "n", "ends_at": (now + timedelta(hours=1)).isoformat(), "comment": "x"},
        ),
    ]
    for url, body in changes:
        assert viewer_client.post(url, body, content_type=JSON).status_code == 403, url
    for action in ("reopen", "severity", "merge", "postmortem_draft"):
        response = viewer_client.post(f"/incidents/{incident.pk}/act/", {"action": action, "severity": "SEV1"})
        assert response.status_code == 403, action
    assert viewer_client.post("/incidents/maintenance/", {"scope": "node", "value": "n"}).status_code == 403
    incident.refresh_from_db()
    assert incident.severity == "SEV2" and incident.merged_into is None and not incident.pm_summary
    assert not Silence.objects.exists() and not MaintenanceWindow.objects.exists()


# --- review findings: held findings page once released; merges; silences ------------------------------------


def test_a_finding_held_by_maintenance_pages_when_it_fires_after_the_window_ends(viewer_client) -> None:
    now = timezone.now()
    window = MaintenanceWindow.objects.create(
        scope="node", value="gpu-a-001", ends_at=now + timedelta(hours=1), comment="fw"
    )
    labels = {"site": "ams-1", "hostname": "gpu-a-001"}
    held = raise_finding("xid:GPU-1", labels, "SEV1", "XID 79 on gpu-a-001")
    assert held.in_maintenance == window and held.incident is None
    assert raise_finding("xid:GPU-1", labels, "SEV1", "XID 79 on gpu-a-001").incident is None  # still in the window
    MaintenanceWindow.objects.filter(pk=window.pk).update(ends_at=timezone.now())
    page = viewer_client.get("/incidents/maintenance/").content.decode()
    assert "XID 79 on gpu-a-001" not in page  # no longer held by anything
    finding = raise_finding("xid:GPU-1", labels, "SEV1", "XID 79 on gpu-a-001")
    assert finding.incident is not None and finding.in_maintenance is None
    assert finding.incident.severity == "SEV1" and finding.incident.is_open
    assert finding.incident.timeline.filter(text__startswith="Triggered (SEV1)").exists()


def test_a_finding_held_by_a_silence_pages_when_it_fires_after_the_silence_expires() -> None:
    now = timezone.now()
    silence = Silence.objects.create(
        matchers=[{"name": "hostname", "op": "=", "value": "gpu-a-001"}], ends_at=now + timedelta(hours=1), comment="x"
    )
    labels = {"site": "ams-1", "hostname": "gpu-a-001"}
    assert raise_finding("xid:GPU-1", labels, "SEV2", "XID 48").silenced_by == silence
    Silence.objects.filter(pk=silence.pk).update(ends_at=timezone.now())
    finding = raise_finding("xid:GPU-1", labels, "SEV2", "XID 48")
    assert finding.incident is not None and finding.silenced_by is None
    # and it joins the open incident of its node, like any other finding of that node
    assert raise_finding("ecc:GPU-2", labels, "SEV3", "ECC").incident == finding.incident


def test_merging_live_findings_into_a_resolved_incident_is_refused(operator_client, operator_user, incident, other):
    resolve_incident(incident, actor=Actor.person(operator_user))
    response = operator_client.post(_url(other, "merge"), {"into": incident.pk}, content_type=JSON)
    assert response.status_code == 409
    assert "firing" in response.json()["detail"]
    other.refresh_from_db()
    assert other.merged_into is None and other.is_open
    assert Finding.objects.get(fingerprint="thermal:GPU-9").incident_id == other.pk


def test_a_merged_incident_keeps_its_resolution_time_and_is_left_out_of_the_metrics(
    operator_client, operator_user, incident, other
) -> None:
    from incidents.services.engine import clear_finding
    from incidents.services.views_data import by_category, gpu_hours_by_month, mttx_by_severity_and_month

    Incident.objects.filter(pk=other.pk).update(gpu_hours_lost=5.0)
    Incident.objects.filter(pk=incident.pk).update(gpu_hours_lost=1.0)
    clear_finding("thermal:GPU-9")
    resolve_incident(other, actor=Actor.person(operator_user))
    other.refresh_from_db()
    resolved_at = other.resolved_at
    response = operator_client.post(_url(other, "merge"), {"into": incident.pk}, content_type=JSON)
    assert response.status_code == 200, response.content
    other.refresh_from_db()
    assert other.resolved_at == resolved_at
    since = timezone.now() - timedelta(days=1)
    assert sum(row["count"] for row in mttx_by_severity_and_month(since)) == 1
    assert by_category(since) == [{"category": "gpu-health", "count": 1}]
    incident.refresh_from_db()
    assert sum(row["gpu_hours"] for row in gpu_hours_by_month(since)) == round(incident.current_gpu_hours(), 2)


def test_silencing_a_merged_incident_by_its_shared_labels_alone_is_refused(operator_client, incident, other) -> None:
    assert operator_client.post(_url(other, "merge"), {"into": incident.pk}, content_type=JSON).status_code == 200
    response = operator_client.post(_url(incident, "silence"), {"comment": "x", "hours": 1}, content_type=JSON)
    assert response.status_code == 400
    assert "explicitly" in response.json()["matchers"][0]
    assert not Silence.objects.exists()
    explicit = {"comment": "x", "hours": 1, "matchers": [{"name": "hostname", "op": "=", "value": "gpu-a-001"}]}
    assert operator_client.post(_url(incident, "silence"), explicit, content_type=JSON).status_code == 201


def test_silencing_from_an_incident_needs_the_silence_permission(incident) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from console import roles

    roles.sync_roles(__import__("django.apps", fromlist=["apps"]).apps)
    user = User.objects.create_user(username="ivan")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_incident", "change_incident", "view_dashboards"])
    )
    client = Client()
    client.force_login(user)
    assert client.post(_url(incident, "acknowledge"), {}, content_type=JSON).status_code == 200  # may act on it
    response = client.post(_url(incident, "silence"), {"comment": "x", "hours": 1}, content_type=JSON)
    assert response.status_code == 403
    assert not Silence.objects.exists()


def test_a_silence_and_its_timeline_note_are_created_together(operator_user, incident, monkeypatch) -> None:
    from incidents.services import actions

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("timeline write failed")

    matchers = [{"name": "gpu", "op": "=", "value": "GPU-1"}]
    monkeypatch.setattr(actions, "_record", broken)
    with pytest.raises(RuntimeError):
        actions.silence_incident(incident, matchers=matchers, hours=1, comment="x", actor=Actor.person(operator_user))
    assert not Silence.objects.exists()
    monkeypatch.undo()
    silence = actions.silence_incident(
        incident, matchers=matchers, hours=2, comment="RMA", actor=Actor.person(operator_user)
    )
    assert silence.created_by == operator_user and silence.ends_at - silence.starts_at == timedelta(hours=2)
    assert incident.timeline.get(text__startswith="Silenced ").data["silence"] == silence.pk


def test_editing_a_silence_takes_the_duplicate_lock(operator_client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert operator_client.post("/api/v1/silences/", _silence_body(0, 2), content_type=JSON).status_code == 201
    silence = Silence.objects.get()
    with CaptureQueriesContext(connection) as queries:
        response = operator_client.patch(f"/api/v1/silences/{silence.pk}/", {"comment": "longer"}, content_type=JSON)
    assert response.status_code == 200, response.content
    assert any("pg_advisory_xact_lock" in q["sql"] for q in queries.captured_queries)
