"""Viewers get 403 on every change; operators act; every action lands on the timeline with actor
and time. The pages render for every role that may read them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import ActionItem, Incident, Silence
from incidents.services.engine import raise_finding


@pytest.fixture
def incident(db) -> Incident:  # type: ignore[no-untyped-def]
    raise_finding(
        "xid:GPU-1",
        {"site": "ams-1", "hostname": "gpu-a-001", "gpu": "GPU-1"},
        "SEV2",
        "XID 79 on gpu-a-001",
        impact={"gpus": 8},
        source="detector:critical-xid",
    )
    return Incident.objects.get()


def api_changes(incident: Incident, owner: str) -> list[tuple[str, str, dict]]:
    base = f"/api/v1/incidents/{incident.pk}"
    return [
        ("post", f"{base}/acknowledge/", {"note": "on it"}),
        ("post", f"{base}/notes/", {"text": "drained gpu-a-001"}),
        ("post", f"{base}/roles/", {"role": "commander", "username": owner}),
        ("patch", f"{base}/postmortem/", {"pm_root_cause": "GPU fell off the bus"}),
        ("post", "/api/v1/action-items/", {"incident": incident.pk, "title": "RMA the GPU", "owner": owner}),
        (
            "post",
            "/api/v1/silences/",
            {
                "matchers": [{"name": "hostname", "op": "=", "value": "gpu-a-001"}],
                "ends_at": (timezone.now() + timedelta(hours=1)).isoformat(),
                "comment": "RMA",
            },
        ),
        ("post", f"{base}/mitigate/", {}),
        ("post", f"{base}/resolve/", {"note": "replaced"}),
    ]


def test_viewers_get_403_on_every_change(viewer_client, viewer_user, incident) -> None:
    for method, url, body in api_changes(incident, "vera"):
        response = getattr(viewer_client, method)(url, body, content_type="application/json")
        assert response.status_code == 403, (url, response.status_code)
    for action in ("acknowledge", "resolve", "note", "role", "postmortem", "add_item"):
        response = viewer_client.post(f"/incidents/{incident.pk}/act/", {"action": action, "text": "x", "title": "x"})
        assert response.status_code == 403, action
    assert (
        viewer_client.post(
            "/incidents/silences/", {"matchers": 'site="ams-1"', "hours": "1", "comment": "x"}
        ).status_code
        == 403
    )
    incident.refresh_from_db()
    assert incident.state == "triggered" and incident.timeline.count() == 1
    assert not ActionItem.objects.exists() and not Silence.objects.exists()


def test_operators_act_and_every_action_is_on_the_timeline_with_actor_and_time(
    operator_client, operator_user, incident
) -> None:
    for method, url, body in api_changes(incident, "oscar"):
        response = getattr(operator_client, method)(url, body, content_type="application/json")
        assert response.status_code in (200, 201), (url, response.content)
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.commander == operator_user
    assert incident.pm_root_cause == "GPU fell off the bus"
    people = incident.timeline.exclude(actor_label__startswith="detector").exclude(kind="notification")
    assert [e.kind for e in people] == ["state", "note", "role", "postmortem", "action_item", "state", "state"]
    assert all(e.actor == operator_user and e.actor_label == "oscar" and e.at for e in people)
    assert Silence.objects.get().created_by == operator_user
    # A second acknowledge of a resolved incident is a conflict, not a silent success.
    again = operator_client.post(f"/api/v1/incidents/{incident.pk}/acknowledge/", {}, content_type="application/json")
    assert again.status_code == 409 and "from resolved" in again.json()["error"]


def test_the_detail_page_forms_work_for_operators(operator_client, incident) -> None:
    url = f"/incidents/{incident.pk}/act/"
    assert operator_client.post(url, {"action": "acknowledge", "note": "looking"}).status_code == 302
    operator_client.post(url, {"action": "note", "text": "node drained"})
    operator_client.post(
        url, {"action": "add_item", "title": "Add XID 79 runbook", "owner": "oscar", "due_date": "2026-12-15"}
    )
    item = ActionItem.objects.get()
    operator_client.post(url, {"action": "item_state", "item": item.pk, "state": "done"})
    operator_client.post(url, {"action": "postmortem", "pm_summary": "One GPU lost", "pm_went_well": "Fast drain"})
    page = operator_client.get(incident.get_absolute_url()).content.decode()
    for text in (
        "Acknowledged by oscar: looking",
        "node drained",
        "Add XID 79 runbook",
        "Fast drain",
        "Save postmortem",
    ):
        assert text in page, text
    item.refresh_from_db()
    assert item.state == "done" and str(item.due_date) == "2026-12-15"
    assert 'href="/fleet/nodes/gpu-a-001/?from=' in page  # affected resources link to their pages, at its window
    # Bad input is refused with a message, not a 500.
    response = operator_client.post(url, {"action": "add_item", "title": "x", "due_date": "not-a-date"}, follow=True)
    assert response.status_code == 200 and "Invalid input" in response.content.decode()


def test_the_incident_pages_render_for_viewers(viewer_client, incident) -> None:
    listing = viewer_client.get("/incidents/").content.decode()
    assert "XID 79 on gpu-a-001" in listing and "Triggered" in listing
    detail = viewer_client.get(incident.get_absolute_url()).content.decode()
    assert "XID 79 on gpu-a-001" in detail and 'value="acknowledge"' not in detail
    metrics = viewer_client.get("/incidents/metrics/")
    assert metrics.status_code == 200 and b"chart-mttr" in metrics.content
    assert viewer_client.get("/incidents/silences/").status_code == 200
    resolved = viewer_client.get("/incidents/", {"state": "resolved"}).content.decode()
    assert "XID 79 on gpu-a-001" not in resolved


def test_the_list_filters_by_state_severity_and_site(viewer_client, incident) -> None:
    raise_finding("other", {"site": "iad-2", "hostname": "gpu-b-001"}, "SEV4", "PCIe replays on gpu-b-001", source="t")
    body = viewer_client.get("/api/v1/incidents/", {"site": "iad-2"}).json()
    assert [i["title"] for i in body["results"]] == ["PCIe replays on gpu-b-001"]
    body = viewer_client.get("/api/v1/incidents/", {"severity": ["SEV1", "SEV2"]}).json()
    assert [i["title"] for i in body["results"]] == ["XID 79 on gpu-a-001"]
    page = viewer_client.get("/incidents/", {"severity": "SEV4"}).content.decode()
    assert "PCIe replays" in page and "XID 79 on gpu-a-001" not in page


def test_silences_from_the_page_use_amtool_syntax(operator_client) -> None:
    response = operator_client.post(
        "/incidents/silences/",
        {"matchers": 'hostname="gpu-a-001", alertname=~"GPU.*"', "hours": "2", "comment": "RMA in progress"},
    )
    assert response.status_code == 302
    silence = Silence.objects.get()
    assert silence.matchers == [
        {"name": "hostname", "op": "=", "value": "gpu-a-001"},
        {"name": "alertname", "op": "=~", "value": "GPU.*"},
    ]
    bad = operator_client.post("/incidents/silences/", {"matchers": "hostname~=x(", "hours": "2", "comment": "c"})
    assert bad.status_code == 200 and Silence.objects.count() == 1


def test_silence_api_names_the_bad_field(operator_client) -> None:
    response = operator_client.post(
        "/api/v1/silences/",
        {
            "matchers": [{"name": "hostname", "op": "=~", "value": "gpu-a-00["}],
            "ends_at": timezone.now().isoformat(),
            "starts_at": (timezone.now() + timedelta(hours=1)).isoformat(),
            "comment": "x",
        },
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "matchers[0].value" in response.json()["matchers"][0]
