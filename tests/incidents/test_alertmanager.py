"""POST /api/v1/alertmanager with the real v4 webhook payload."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from incidents.api.alertmanager import namespaced
from incidents.models import Finding, Incident, TimelineEntry

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager-firing.json").read_text())
FP1, FP2 = "a41f0c2b9d7e6f13", "5be27d90c3a1f448"


@pytest.fixture(autouse=True)
def _accept_the_fixtures_times(settings) -> None:  # type: ignore[no-untyped-def]
    """The fixture's alerts started on 2026-11-29: keep them inside the accepted window whatever today is."""
    age = datetime.now(UTC) - datetime(2026, 11, 29, tzinfo=UTC)
    settings.ALERTMANAGER_MAX_AGE_SECONDS = max(settings.ALERTMANAGER_MAX_AGE_SECONDS, int(age.total_seconds()) + 86400)


def post(client, token, payload):  # type: ignore[no-untyped-def]
    body = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
    return client.post(
        "/api/v1/alertmanager", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def counts() -> tuple[int, int, int]:
    return Incident.objects.count(), Finding.objects.count(), TimelineEntry.objects.count()


def test_the_fixture_becomes_two_findings_grouped_into_one_incident(client, token_a, site_a) -> None:
    response = post(client, token_a, FIXTURE)
    assert response.status_code == 200 and response.json() == {"firing": 2, "resolved": 0}
    incident = Incident.objects.get()
    assert set(incident.findings.values_list("fingerprint", flat=True)) == {
        namespaced(site_a.pk, FP1),
        namespaced(site_a.pk, FP2),
    }
    assert incident.severity == "SEV2"  # severity="page" maps to SEV2
    assert incident.title == "XID 79 on gpu-a-001 GPU 1" and incident.category == "GPUFellOffBus"
    assert incident.labels == {
        "site": "ams-1",
        "alertname": "GPUFellOffBus",
        "severity": "page",
        "cluster": "train-eu-1",
    }
    finding = Finding.objects.get(fingerprint=namespaced(site_a.pk, FP1))
    assert finding.description.startswith("The GPU has fallen off the bus")
    assert finding.started_at.isoformat() == "2026-11-29T09:14:05.123000+00:00"
    assert incident.started_at == finding.started_at  # MTTD counts from the fault, not from our receipt


def test_alertmanager_repeats_change_nothing(client, token_a, site_a) -> None:
    post(client, token_a, FIXTURE)
    before = counts()
    for _ in range(5):
        assert post(client, token_a, FIXTURE).status_code == 200
    assert counts() == before
    assert Finding.objects.get(fingerprint=namespaced(site_a.pk, FP1)).times_seen == 6


def test_a_resolved_alert_clears_only_its_own_finding(client, token_a, site_a) -> None:
    post(client, token_a, FIXTURE)
    resolved = copy.deepcopy(FIXTURE)
    resolved["status"] = "resolved"
    resolved["alerts"] = [dict(resolved["alerts"][0], status="resolved", endsAt="2026-11-29T09:30:00Z")]
    assert post(client, token_a, resolved).json() == {"firing": 0, "resolved": 1}
    assert Finding.objects.get(fingerprint=namespaced(site_a.pk, FP1)).status == "cleared"
    assert Finding.objects.get(fingerprint=namespaced(site_a.pk, FP2)).status == "firing"
    incident = Incident.objects.get()
    assert incident.is_open and incident.auto_resolve_at is None


def test_the_severity_mapping_is_configurable(client, token_a, settings) -> None:
    settings.ALERTMANAGER_SEVERITY_MAP = {"page": "SEV1"}
    post(client, token_a, FIXTURE)
    assert Incident.objects.get().severity == "SEV1"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p.pop("alerts"), "alerts"),
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p["alerts"][1].pop("fingerprint"), "alerts[1].fingerprint"),
        (lambda p: p["alerts"][0].update(status="pending"), "alerts[0].status"),
        (lambda p: p["alerts"][1].update(startsAt="yesterday"), "alerts[1].startsAt"),
        (lambda p: p["alerts"][0]["labels"].update(gpu=1), "alerts[0].labels"),
        (lambda p: p["alerts"][0].update(labels={}), "alerts[0].labels"),
    ],
    ids=["no alerts", "wrong version", "no fingerprint", "bad status", "bad time", "non-string label", "no labels"],
)
def test_a_malformed_payload_gets_400_naming_the_field_and_nothing_is_written(client, token_a, mutate, field) -> None:
    payload = copy.deepcopy(FIXTURE)
    mutate(payload)
    response = post(client, token_a, payload)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field, response.json()
    assert counts() == (0, 0, 0)


def test_malformed_json_and_missing_tokens_are_refused(client, token_a) -> None:
    assert post(client, token_a, b"{not json").status_code == 400
    assert (
        client.post("/api/v1/alertmanager", data=json.dumps(FIXTURE), content_type="application/json").status_code
        == 401
    )
    assert post(client, "gp_bad_token", FIXTURE).status_code == 401
    assert counts() == (0, 0, 0)
