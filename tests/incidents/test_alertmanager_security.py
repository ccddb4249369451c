"""POST /api/v1/alertmanager as an attacker or a broken Alertmanager would use it: one site's token
must not touch another site's incidents, and no payload may leave a write behind a 500 or take the
incident pages down."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from console.models import AgentToken
from fleet.models import Site
from incidents.models import Finding, Incident, TimelineEntry

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager-firing.json").read_text())
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt while an alert fires


def payload(**overrides: Any) -> dict[str, Any]:
    """The fixture with times a few minutes old (inside the accepted window whatever today is)."""
    body = copy.deepcopy(FIXTURE)
    for index, alert in enumerate(body["alerts"]):
        alert["startsAt"] = (datetime.now(UTC) - timedelta(minutes=10 - index)).isoformat()
    body.update(overrides)
    return body


def resolved(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["status"] = "resolved"
    body["alerts"] = [dict(body["alerts"][index], status="resolved", endsAt=datetime.now(UTC).isoformat())]
    return body


def post(token: str, body: Any) -> Any:
    """Post as Alertmanager does, getting a 500 back as a response rather than an exception."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return Client(raise_request_exception=False).post(
        "/api/v1/alertmanager", data=data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def counts() -> tuple[int, int, int]:
    return Incident.objects.count(), Finding.objects.count(), TimelineEntry.objects.count()


# --- one site's token acts only on its own site's alerts -----------------------------------------


def test_a_resolve_from_another_site_never_clears_a_sites_finding(token_a, token_b, settings) -> None:
    settings.ALERTMANAGER_SEVERITY_MAP = {"page": "SEV1"}
    body = payload()
    assert post(token_b, body).status_code == 200
    assert post(token_a, resolved(body)).json() == {"firing": 0, "resolved": 1}
    incident = Incident.objects.get()
    assert incident.labels["site"] == "iad-2" and incident.severity == "SEV1"
    assert set(incident.findings.values_list("status", flat=True)) == {"firing"}
    assert incident.is_open and incident.auto_resolve_at is None
    assert not incident.timeline.filter(text__startswith="Finding cleared").exists()


def test_the_same_fingerprint_from_two_sites_is_two_findings_in_two_incidents(token_a, token_b) -> None:
    body = payload()
    assert post(token_a, body).status_code == 200
    assert post(token_b, body).status_code == 200
    assert Finding.objects.count() == 4
    assert sorted(Incident.objects.values_list("labels__site", flat=True)) == ["ams-1", "iad-2"]
    for incident in Incident.objects.all():
        assert {f.labels["site"] for f in incident.findings.all()} == {incident.labels["site"]}
    # Each site resolves its own: A's resolve clears A's finding only.
    post(token_a, resolved(body))
    cleared = Finding.objects.get(status="cleared")
    assert cleared.labels["site"] == "ams-1"


def test_an_alert_naming_another_site_stays_in_the_tokens_site(token_a, token_b) -> None:
    assert post(token_b, payload()).status_code == 200
    victim = Incident.objects.get()
    forged = payload()
    forged["alerts"] = [dict(forged["alerts"][0], fingerprint="ffff000011112222")]
    forged["alerts"][0]["labels"] = dict(forged["alerts"][0]["labels"], site="iad-2")
    assert post(token_a, forged).status_code == 200
    assert victim.findings.count() == 2  # nothing joined site B's incident
    finding = Finding.objects.get(labels__site="ams-1")
    assert finding.labels["alert_site"] == "iad-2"  # what the payload said, kept under another name
    assert finding.incident != victim and finding.incident.labels["site"] == "ams-1"


def test_the_timeline_names_the_token_and_its_site(token_a) -> None:
    token = AgentToken.objects.get(name="agent-a")
    body = payload()
    post(token_a, body)
    post(token_a, resolved(body))
    label = "alertmanager (token agent-a, site ams-1)"
    entries = TimelineEntry.objects.order_by("id")
    assert [e.actor_label for e in entries] == [label, label, label]
    assert entries[0].text.startswith(f"Triggered (SEV2) by {label}: ")
    assert all(e.data["actor_ref"] == f"agent-token:{token.key_id}" for e in entries)


def test_the_longest_token_and_site_names_fit_the_timeline(db) -> None:
    site = Site.objects.create(name="s" * 64, region="eu-west", contracted_power_kw=1)
    plain = AgentToken.issue(site=site, name="n" * 100)[1]
    assert post(plain, payload()).status_code == 200
    assert TimelineEntry.objects.filter(actor_label__contains="n" * 100).count() == 2


# --- times: a window, and Alertmanager's zero time ---------------------------------------------


def _alert(index: int, **changes: str):  # type: ignore[no-untyped-def]
    def mutate(body: dict[str, Any]) -> None:
        body["alerts"][index].update(changes)

    return mutate


@pytest.mark.parametrize(
    ("mutate", "item", "field"),
    [
        (_alert(0, startsAt="0001-01-01T00:00:00+14:00"), 0, "startsAt"),
        (_alert(1, startsAt="9999-12-31T23:59:59-14:00"), 1, "startsAt"),
        (_alert(1, startsAt=(datetime.now(UTC) + timedelta(hours=1)).isoformat()), 1, "startsAt"),
        (_alert(0, startsAt=(datetime.now(UTC) - timedelta(days=400)).isoformat()), 0, "startsAt"),
        (_alert(1, startsAt="2026-11-29T09:14:05"), 1, "startsAt"),
        (_alert(1, endsAt="9999-12-31T23:59:59-14:00"), 1, "endsAt"),
        (_alert(0, status="resolved", endsAt="0001-01-01T00:00:00+14:00"), 0, "endsAt"),
        (_alert(1, status="resolved", endsAt="1970-01-01T00:00:00Z"), 1, "endsAt"),
    ],
    ids=[
        "start year 1",
        "start year 9999",
        "start in an hour",
        "start over a year ago",
        "start without offset",
        "end year 9999",
        "end year 1 not zero",
        "end 1970",
    ],
)
def test_a_time_outside_the_window_gets_400_naming_the_alert_and_field(token_a, mutate, item, field) -> None:
    body = payload()
    mutate(body)
    response = post(token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["item"] == item and response.json()["field"] == f"alerts[{item}].{field}", response.json()
    assert counts() == (0, 0, 0)  # the whole payload is checked before anything is written


def test_an_alert_firing_for_weeks_is_still_taken(token_a) -> None:
    """Alertmanager re-sends a firing alert with its original startsAt."""
    body = payload()
    body["alerts"][0]["startsAt"] = (datetime.now(UTC) - timedelta(days=30)).isoformat()
    assert post(token_a, body).status_code == 200


def test_the_zero_end_time_means_no_end(token_a) -> None:
    body = payload()
    assert all(alert["endsAt"] == ZERO_TIME for alert in body["alerts"])
    assert post(token_a, body).status_code == 200
    gone = resolved(body)
    gone["alerts"][0]["endsAt"] = ZERO_TIME
    before = datetime.now(UTC)
    assert post(token_a, gone).json() == {"firing": 0, "resolved": 1}
    assert Finding.objects.get(status="cleared").cleared_at >= before  # cleared now, not in year 1


def test_edge_times_leave_every_incident_page_up_for_viewers(token_a, viewer_client) -> None:
    for moment in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        body = payload()
        body["alerts"][1]["startsAt"] = moment
        assert post(token_a, body).status_code == 400
    for url in ("/", "/incidents/", "/incidents/metrics/", "/api/v1/incidents/"):
        assert viewer_client.get(url).status_code == 200, url


@pytest.mark.django_db(transaction=True)
def test_a_failure_late_in_processing_commits_nothing(token_a, monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away after the first alert")

    # The second alert joins the incident the first one opened: fail there, after real writes.
    monkeypatch.setattr("incidents.services.engine._join", broken)
    assert post(token_a, payload()).status_code == 500
    assert counts() == (0, 0, 0)


# --- strings that land in bounded columns ------------------------------------------------------


def test_an_overlong_fingerprint_gets_400_naming_the_alert(token_a) -> None:
    body = payload()
    body["alerts"][1]["fingerprint"] = "f" * 320
    response = post(token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["item"] == 1 and response.json()["field"] == "alerts[1].fingerprint"
    assert counts() == (0, 0, 0)


def test_an_overlong_alertname_gets_400_naming_the_alert(token_a) -> None:
    body = payload()
    body["alerts"][1]["labels"]["alertname"] = "A" * 65
    response = post(token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["item"] == 1 and response.json()["field"] == "alerts[1].labels.alertname"
    assert counts() == (0, 0, 0)


def test_a_nul_character_gets_400_naming_the_alert(token_a) -> None:
    body = payload()
    body["alerts"][0]["annotations"]["summary"] = "before\u0000after"
    response = post(token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["item"] == 0 and response.json()["field"] == "alerts[0].annotations.summary"
    assert counts() == (0, 0, 0)


def test_a_body_that_is_not_utf8_gets_400(token_a) -> None:
    body = json.dumps(payload()).replace("XID 79", "XID \udcff").encode("utf-8", "surrogateescape")
    response = post(token_a, body)
    assert response.status_code == 400, response.content
    assert response.json()["error"].startswith("Malformed JSON")
    assert counts() == (0, 0, 0)


def test_a_long_group_key_still_groups_and_a_long_summary_is_cut(token_a) -> None:
    """group_by: ['...'] puts every label in the group key: it may be longer than the column,
    and is kept whole as a digest rather than refused or cut."""
    long_key = "{}:{" + ", ".join(f'label{i}="{"v" * 40}"' for i in range(20)) + "}"

    def fresh(group_key: str, tag: str) -> dict[str, Any]:
        body = payload(groupKey=group_key)
        for alert in body["alerts"]:
            alert["fingerprint"] = tag + alert["fingerprint"]
        return body

    first = payload(groupKey=long_key)
    first["alerts"][0]["annotations"]["summary"] = "S" * 2000
    assert post(token_a, first).status_code == 200
    assert len(Finding.objects.get(summary__startswith="S").summary) == 500
    # Keys that differ only past the column's length stay apart; the same key joins.
    assert post(token_a, fresh(long_key[:-2] + 'x"}', "b")).status_code == 200
    assert post(token_a, fresh(long_key, "c")).status_code == 200
    assert sorted(i.findings.count() for i in Incident.objects.all()) == [2, 4]


@pytest.mark.parametrize("depth", [900, 1_000, 100_000])
@pytest.mark.parametrize("where", ["receiver_extra", "alert_labels"])
def test_a_payload_nested_past_the_limit_is_a_400_at_any_depth(token_a, depth, where) -> None:
    """msgspec skips an unknown field by recursing into it: past about 1,000 levels that was a
    RecursionError (500). The depth is refused before any decoding (console.parsers.too_deep)."""
    body = json.dumps(payload())
    nested = "[" * depth + "]" * depth
    if where == "receiver_extra":  # an unknown top-level field, which msgspec skips
        data = body[:-1] + f', "extra": {nested}}}'
    else:
        data = body.replace('"labels": {', f'"labels": {{"deep": {nested}, ', 1)
    response = post(token_a, data)
    assert response.status_code == 400, response.content[:200]
    assert "nested deeper than" in response.json()["error"]
    assert counts() == (0, 0, 0)


def test_a_payload_with_brackets_inside_its_strings_is_not_too_deep(token_a) -> None:
    body = payload()
    body["alerts"][0]["annotations"]["description"] = "[" * 5_000 + '\\"{' * 100
    response = post(token_a, body)
    assert response.status_code == 200, response.content[:300]
