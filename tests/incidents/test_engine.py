"""The incident engine: dedupe by fingerprint, grouping, hold-down, atomic transitions, timeline."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone

from incidents.models import Finding, Incident, TimelineEntry
from incidents.services.engine import (
    Actor,
    TransitionError,
    acknowledge_incident,
    auto_resolve_due,
    clear_finding,
    mitigate_incident,
    raise_finding,
    resolve_incident,
)

NODE_A = {"site": "ams-1", "hostname": "gpu-a-001"}
NODE_B = {"site": "ams-1", "hostname": "gpu-a-002"}


def xid(gpu: str, labels: dict = NODE_A, severity: str = "SEV2") -> Finding:
    return raise_finding(
        f"xid:{gpu}", {**labels, "gpu": gpu}, severity, f"XID 79 on {gpu}", impact={"gpus": 1}, source="detector:test"
    )


@pytest.mark.django_db
def test_the_same_fingerprint_updates_the_same_finding_and_incident() -> None:
    for _ in range(5):
        finding = xid("GPU-1")
    assert Incident.objects.count() == 1 and Finding.objects.count() == 1
    assert finding.times_seen == 5
    assert TimelineEntry.objects.count() == 1  # repeats add nothing to the timeline


@pytest.mark.django_db
def test_findings_of_one_node_group_into_one_incident_and_others_do_not() -> None:
    xid("GPU-1")
    xid("GPU-2", severity="SEV1")
    xid("GPU-9", labels=NODE_B)
    a, b = Incident.objects.order_by("pk")
    assert a.findings.count() == 2 and b.findings.count() == 1
    assert a.severity == "SEV1"  # raised by the worse finding
    assert a.labels == NODE_A  # labels common to its findings
    assert a.affected_gpus == 2
    assert "severity raised to SEV1" in a.timeline.last().text


@pytest.mark.django_db
def test_a_finding_joining_an_incident_brings_its_gpu_hours_at_once() -> None:
    job = {"site": "ams-1", "job": "7"}
    raise_finding("job-failed:7", job, "SEV3", "job 7 failed", impact={"gpu_hours": 1.5}, source="detector:test")
    raise_finding(
        "xid:GPU-9", {**job, "gpu": "GPU-9"}, "SEV2", "XID 79", impact={"gpu_hours": 4.0}, source="detector:test"
    )
    incident = Incident.objects.get()
    assert incident.findings.count() == 2
    # Its own cost adds to the incident's on its first raise (no second cycle needed): the sum of
    # the findings' figures, not the larger one (incidents.services.cost).
    assert incident.gpu_hours_lost == 1.5 + 4.0


@pytest.mark.django_db
def test_an_incident_opened_by_a_symptom_takes_the_title_of_the_first_cause_that_joins() -> None:
    endpoint = {"site": "ams-1", "endpoint": "3"}

    def burn(slo: str) -> Finding:
        summary = f"Error budget burn on llama: {slo} SLO burning 15x over 1h"
        impact = {"error_budget": 0.02, "symptom": True}
        return raise_finding(f"burn:{slo}", {**endpoint, "slo": slo}, "SEV2", summary, impact=impact, source="d:b")

    burn("ttft")
    burn("itl")  # a second symptom changes nothing
    incident = Incident.objects.get()
    assert incident.title.startswith("Error budget burn on llama: ttft")
    raise_finding("collapse:3", endpoint, "SEV2", "Queueing collapse on llama", source="d:q")
    raise_finding("cold:3", endpoint, "SEV3", "Cold start on llama", source="d:c")  # the cause is already named
    incident.refresh_from_db()
    assert incident.title == "Queueing collapse on llama"
    assert incident.findings.count() == 4
    [retitled] = incident.timeline.filter(text__contains="retitled")
    assert "Queueing collapse on llama" in retitled.text


@pytest.mark.django_db
def test_a_symptom_joining_an_incident_opened_by_a_cause_leaves_its_title() -> None:
    endpoint = {"site": "ams-1", "endpoint": "4"}
    raise_finding("collapse:4", endpoint, "SEV2", "Queueing collapse on qwen", source="d:q")
    raise_finding("burn:4", endpoint, "SEV2", "Error budget burn on qwen", impact={"symptom": True}, source="d:b")
    assert Incident.objects.get().title == "Queueing collapse on qwen"


@pytest.mark.django_db
def test_grouping_only_within_the_window(settings) -> None:
    settings.INCIDENT_GROUP_WINDOW_SECONDS = 60
    xid("GPU-1")
    Incident.objects.update(detected_at=timezone.now() - timedelta(minutes=5))
    xid("GPU-2")
    assert Incident.objects.count() == 2


@pytest.mark.django_db
def test_cleared_findings_resolve_an_untouched_incident_after_the_hold_down(settings) -> None:
    settings.INCIDENT_HOLD_DOWN_SECONDS = 120
    xid("GPU-1")
    xid("GPU-2")
    clear_finding("xid:GPU-1")
    incident = Incident.objects.get()
    assert incident.auto_resolve_at is None  # one finding still fires
    clear_finding("xid:GPU-2")
    incident.refresh_from_db()
    assert incident.auto_resolve_at is not None
    assert auto_resolve_due() == []  # not yet: the hold-down has not passed
    assert auto_resolve_due(now=timezone.now() + timedelta(seconds=121)) == [incident.pk]
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.resolved_at is not None
    assert "Auto-resolved" in incident.timeline.last().text and incident.timeline.last().actor_label == "system"


@pytest.mark.django_db
def test_a_finding_that_fires_again_cancels_auto_resolution(settings) -> None:
    xid("GPU-1")
    clear_finding("xid:GPU-1")
    xid("GPU-1")
    incident = Incident.objects.get()
    assert incident.auto_resolve_at is None and incident.findings.firing().count() == 1
    assert auto_resolve_due(now=timezone.now() + timedelta(hours=1)) == []
    assert "auto-resolution cancelled" in incident.timeline.last().text


@pytest.mark.django_db
def test_an_acknowledged_incident_is_resolved_by_people_not_by_the_hold_down(operator_user) -> None:
    xid("GPU-1")
    incident = acknowledge_incident(Incident.objects.get(), actor=Actor.person(operator_user))
    clear_finding("xid:GPU-1")
    incident.refresh_from_db()
    assert incident.auto_resolve_at is None
    assert auto_resolve_due(now=timezone.now() + timedelta(hours=1)) == []
    assert "until a person resolves it" in incident.timeline.last().text
    resolve_incident(incident, actor=Actor.person(operator_user), note="GPU reseated")
    incident.refresh_from_db()
    assert incident.state == "resolved"
    last = incident.timeline.last()
    assert (last.actor, last.actor_label, last.text) == (operator_user, "oscar", "Resolved by oscar: GPU reseated")


@pytest.mark.django_db
def test_transitions_are_atomic_claims(operator_user) -> None:
    xid("GPU-1")
    incident = Incident.objects.get()
    actor = Actor.person(operator_user)
    stale_copy = Incident.objects.get()
    acknowledge_incident(incident, actor=actor)
    with pytest.raises(TransitionError, match="from acknowledged to acknowledged"):
        acknowledge_incident(stale_copy, actor=actor)  # a second operator, a moment later
    mitigate_incident(incident, actor=actor)
    resolve_incident(incident, actor=actor)
    with pytest.raises(TransitionError):
        mitigate_incident(incident, actor=actor)
    incident.refresh_from_db()
    assert incident.acknowledged_at <= incident.mitigated_at <= incident.resolved_at
    assert [e.text.split(" by ")[0] for e in incident.timeline.filter(kind="state")][1:] == [
        "Acknowledged",
        "Mitigated",
        "Resolved",
    ]


@pytest.mark.django_db
def test_resolving_directly_still_records_an_acknowledgement_time(operator_user) -> None:
    xid("GPU-1")
    incident = resolve_incident(Incident.objects.get(), actor=Actor.person(operator_user))
    assert incident.acknowledged_at == incident.resolved_at


@pytest.mark.django_db
def test_after_resolution_a_new_finding_opens_a_new_incident(operator_user) -> None:
    xid("GPU-1")
    resolve_incident(Incident.objects.get(), actor=Actor.person(operator_user))
    clear_finding("xid:GPU-1")
    xid("GPU-1")
    assert Incident.objects.count() == 2
    assert Incident.objects.open().count() == 1


@pytest.mark.django_db
def test_the_timeline_is_append_only_in_the_database() -> None:
    xid("GPU-1")
    entry = TimelineEntry.objects.get()
    with pytest.raises(ValueError, match="append-only"):
        entry.save()
    for attempt in (
        lambda: TimelineEntry.objects.filter(pk=entry.pk).update(text="rewritten"),
        lambda: TimelineEntry.objects.filter(pk=entry.pk).delete(),
    ):
        # The trigger refuses; as the console's own role (the embedded suite), the missing privilege first.
        with pytest.raises(DatabaseError, match=r"append-only|permission denied for table"), transaction.atomic():
            attempt()
    assert TimelineEntry.objects.get().text.startswith("Triggered")


@pytest.mark.django_db
def test_every_change_moves_updated_at_so_live_lists_see_older_incidents(operator_user) -> None:
    """The live list sends incidents changed since its last push: a conditional UPDATE must count."""
    from incidents.services.views_data import build_incidents_delta

    xid("GPU-1")
    xid("GPU-9", labels=NODE_B)
    older, _newer = Incident.objects.order_by("pk")
    _, watermark = build_incidents_delta("incidents", None)
    acknowledge_incident(older, actor=Actor.person(operator_user))
    payload, _ = build_incidents_delta("incidents", watermark)
    # (rows changed just before the watermark are sent again on purpose: duplicates are harmless)
    assert (older.pk, "acknowledged") in [(i["id"], i["state"]) for i in payload["incidents"]]


@pytest.mark.django_db
def test_affected_gpus_count_each_gpu_or_drained_node_once() -> None:
    node = {"gpus": 8, "unit": "node:gpu-a-001"}
    raise_finding("xid:a", {**NODE_A, "gpu": "a"}, "SEV2", "XID 79 on a", impact=node)
    raise_finding("xid:b", {**NODE_A, "gpu": "b"}, "SEV2", "XID 79 on b", impact=node)  # same node, drained once
    raise_finding("ecc:c", {**NODE_A, "gpu": "c"}, "SEV2", "ECC on c", impact={"gpus": 1, "unit": "gpu:c"})
    raise_finding("temp:c", {**NODE_A, "gpu": "c"}, "SEV3", "hot c", impact={"gpus": 1, "unit": "gpu:c"})
    assert Incident.objects.get().affected_gpus == 9


@pytest.mark.django_db
def test_affected_gpus_count_the_union_of_the_gpus_findings_name() -> None:
    drain = {"gpus": 2, "unit": "node:gpu-a-001", "gpu_uuids": ["GPU-a", "GPU-b"]}
    on_b = {"gpus": 1, "unit": "gpu:GPU-b", "gpu_uuids": ["GPU-b"]}
    raise_finding("xid:GPU-a:79", {**NODE_A, "gpu": "GPU-a"}, "SEV2", "XID 79 on a", impact=drain)
    raise_finding("thermal:GPU-b", {**NODE_A, "gpu": "GPU-b"}, "SEV3", "hot b", impact=on_b)
    assert Incident.objects.get().affected_gpus == 2  # b is in the drained node: counted once
    # Findings that name no GPUs (from Alertmanager, or raised before findings named them) count
    # by their unit, unless a finding that names its GPUs already covers that unit.
    raise_finding("old:GPU-b", {**NODE_A, "gpu": "GPU-b"}, "SEV3", "old b", impact={"gpus": 1, "unit": "gpu:GPU-b"})
    raise_finding("old:GPU-c", {**NODE_A, "gpu": "GPU-c"}, "SEV3", "old c", impact={"gpus": 1, "unit": "gpu:GPU-c"})
    raise_finding("cap:GPU-a", {**NODE_A, "gpu": "GPU-a"}, "SEV4", "capped a", impact={})
    assert Incident.objects.get().affected_gpus == 3
