"""Silences stop incidents and notifications for what they match, and only that; notifications
reach webhooks, Slack and PagerDuty in their formats, with retries recorded on the timeline."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Finding, Incident, Notification, NotificationChannel, Silence
from incidents.services.engine import Actor, acknowledge_incident, raise_finding

pytestmark = pytest.mark.django_db(transaction=True)  # notifications go out after commit


def fire(fp: str, hostname: str = "gpu-a-001", severity: str = "SEV2", **labels: str) -> Finding:
    return raise_finding(
        fp,
        {"site": "ams-1", "hostname": hostname, **labels},
        severity,
        f"fault {fp} on {hostname}",
        source="detector:test",
    )


def test_a_silence_stops_incidents_and_notifications_for_what_it_matches_only(receiver) -> None:
    NotificationChannel.objects.create(name="hook", kind="webhook", url=receiver.url())
    Silence.objects.create(
        matchers=[{"name": "hostname", "op": "=~", "value": "gpu-a-00[12]"}],
        ends_at=timezone.now() + timedelta(hours=1),
        comment="maintenance",
    )
    silenced = fire("f1", "gpu-a-001")
    loud = fire("f2", "gpu-a-003")
    assert silenced.incident is None and silenced.silenced_by is not None
    assert Finding.objects.filter(fingerprint="f1").exists()  # recorded all the same
    assert loud.incident is not None
    assert Incident.objects.count() == 1
    assert [r["json"]["incident"]["labels"]["hostname"] for r in receiver.requests] == ["gpu-a-003"]


@pytest.mark.parametrize(
    ("matcher", "silenced"),
    [
        ({"name": "hostname", "op": "=", "value": "gpu-a-001"}, True),
        ({"name": "hostname", "op": "!=", "value": "gpu-a-001"}, False),
        ({"name": "hostname", "op": "=~", "value": "gpu-a"}, False),  # regexes are anchored
        ({"name": "hostname", "op": "!~", "value": "gpu-b-.*"}, True),
        ({"name": "team", "op": "=", "value": ""}, True),  # a missing label matches the empty string
    ],
)
def test_matchers_follow_alertmanager(matcher, silenced) -> None:
    Silence.objects.create(matchers=[matcher], ends_at=timezone.now() + timedelta(hours=1), comment="c")
    assert (fire("f", "gpu-a-001").incident is None) is silenced


def test_an_expired_or_future_silence_silences_nothing() -> None:
    now = timezone.now()
    Silence.objects.create(
        matchers=[{"name": "site", "op": "=", "value": "ams-1"}],
        starts_at=now - timedelta(hours=2),
        ends_at=now - timedelta(hours=1),
        comment="past",
    )
    Silence.objects.create(
        matchers=[{"name": "site", "op": "=", "value": "ams-1"}],
        starts_at=now + timedelta(hours=1),
        ends_at=now + timedelta(hours=2),
        comment="future",
    )
    assert fire("f").incident is not None


def test_channels_are_routed_by_severity_and_labels_in_their_formats(receiver, operator_user) -> None:
    NotificationChannel.objects.create(name="hook", kind="webhook", url=receiver.url("/hook"), min_severity="SEV4")
    NotificationChannel.objects.create(name="slack", kind="slack", url=receiver.url("/slack"), min_severity="SEV2")
    NotificationChannel.objects.create(
        name="pd",
        kind="pagerduty",
        url=receiver.url("/pd"),
        routing_key="R0UT1NG",
        min_severity="SEV1",
        matchers=[{"name": "site", "op": "=", "value": "ams-1"}],
    )
    NotificationChannel.objects.create(
        name="other-site",
        kind="webhook",
        url=receiver.url("/other"),
        matchers=[{"name": "site", "op": "=", "value": "iad-2"}],
    )
    fire("minor", "gpu-a-009", severity="SEV3")
    assert [r["path"] for r in receiver.requests] == ["/hook"]
    finding = fire("major", "gpu-a-001", severity="SEV1")
    paths = sorted(r["path"] for r in receiver.requests[1:])
    assert paths == ["/hook", "/pd", "/slack"]
    by_path = {r["path"]: r["json"] for r in receiver.requests[1:]}
    pd = by_path["/pd"]
    assert pd["routing_key"] == "R0UT1NG" and pd["event_action"] == "trigger"
    assert pd["dedup_key"] == f"goodput-incident-{finding.incident_id}"
    assert pd["payload"]["severity"] == "critical" and pd["payload"]["source"] == "gpu-a-001"
    assert pd["payload"]["summary"].startswith("[SEV1] fault major")
    assert by_path["/slack"]["text"].startswith("Triggered: [SEV1] fault major")
    hook = by_path["/hook"]
    assert hook["event"] == "triggered" and hook["incident"]["id"] == finding.incident_id
    assert hook["incident"]["url"].endswith(f"/incidents/{finding.incident_id}/")
    # Acknowledging tells PagerDuty too, under the same dedup key.
    acknowledge_incident(finding.incident, actor=Actor.person(operator_user))
    acks = [r["json"] for r in receiver.requests if r["path"] == "/pd"][1:]
    assert acks[0]["event_action"] == "acknowledge" and acks[0]["dedup_key"] == pd["dedup_key"]
    entries = finding.incident.timeline.filter(kind="notification")
    assert {e.data["channel"] for e in entries} == {"hook", "slack", "pd"}
    assert all(e.data["outcome"] == "sent" and "HTTP 200" in e.text for e in entries)


def test_a_failing_webhook_is_retried_with_backoff_and_every_attempt_recorded(receiver) -> None:
    NotificationChannel.objects.create(name="flaky", kind="webhook", url=receiver.url("/flaky"))
    NotificationChannel.objects.create(name="steady", kind="webhook", url=receiver.url("/steady"))
    receiver.script = [500, 500]  # the first two requests fail (whichever channel goes first gets them)
    finding = fire("f")
    notifications = {n.channel.name: n for n in Notification.objects.select_related("channel")}
    assert {n.status for n in notifications.values()} == {"sent"}
    assert sum(n.attempts for n in notifications.values()) == 4
    entries = list(finding.incident.timeline.filter(kind="notification").order_by("id"))
    retries = [e for e in entries if e.data["outcome"] == "retry"]
    assert [e.data["retry_in"] for e in retries] == [2, 4] or [e.data["retry_in"] for e in retries] == [2, 2]
    assert all("HTTP 500" in e.text for e in retries)
    assert sorted(e.data["channel"] for e in entries if e.data["outcome"] == "sent") == ["flaky", "steady"]


def test_a_channel_that_never_answers_is_given_up_and_recorded(receiver) -> None:
    NotificationChannel.objects.create(name="dead", kind="webhook", url="http://127.0.0.1:9/hook")
    NotificationChannel.objects.create(name="alive", kind="webhook", url=receiver.url("/alive"))
    finding = fire("f")
    dead = Notification.objects.get(channel__name="dead")
    assert (dead.status, dead.attempts, dead.last_error) == ("failed", 5, "unreachable")  # not which way
    assert Notification.objects.get(channel__name="alive").status == "sent"  # one failing channel blocks no other
    texts = [e.text for e in finding.incident.timeline.filter(kind="notification")]
    assert any("failed after 5 attempts" in t for t in texts)
    assert [
        e.data.get("retry_in")
        for e in finding.incident.timeline.filter(kind="notification", data__outcome="retry", data__channel="dead")
    ] == [2, 4, 8, 16]
