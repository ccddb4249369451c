"""One notification's delivery: build its channel's payload (generic JSON webhook, Slack incoming
webhook, PagerDuty Events API v2) and post it, one attempt per call, retried by
``incidents.notifications.tasks``. Every attempt goes on the incident's timeline with its outcome."""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.conf import settings
from django.utils import timezone

from console import outbound
from incidents.choices import ChannelKind, NotificationStatus, Severity, TimelineKind
from incidents.models import Incident, Notification, TimelineEntry

logger = logging.getLogger(__name__)

PAGERDUTY_ACTIONS = {"triggered": "trigger", "acknowledged": "acknowledge", "resolved": "resolve"}
PAGERDUTY_SEVERITY = {
    Severity.SEV1: "critical",
    Severity.SEV2: "error",
    Severity.SEV3: "warning",
    Severity.SEV4: "info",
}
MAX_ATTEMPTS = 5


def incident_url(incident: Incident) -> str:
    return settings.PUBLIC_URL.rstrip("/") + incident.get_absolute_url()


def payload(notification: Notification) -> dict[str, Any]:
    incident, channel, event = notification.incident, notification.channel, notification.event
    summary = f"[{incident.severity}] {incident.title}"
    if channel.kind == ChannelKind.PAGERDUTY:
        return {
            "routing_key": channel.routing_key,
            "event_action": PAGERDUTY_ACTIONS[event],
            "dedup_key": f"goodput-incident-{incident.pk}",
            "payload": {
                "summary": summary[:1024],
                "source": incident.labels.get("hostname") or incident.labels.get("site") or "goodput",
                "severity": PAGERDUTY_SEVERITY[Severity(incident.severity)],
                "component": incident.labels.get("gpu") or incident.labels.get("job") or "",
                "group": incident.labels.get("site", ""),
                "class": incident.category,
                "custom_details": {"labels": incident.labels, "state": incident.state},
            },
            "links": [{"href": incident_url(incident), "text": f"Incident #{incident.pk}"}],
        }
    if channel.kind == ChannelKind.SLACK:
        verb = {"triggered": "Triggered", "acknowledged": "Acknowledged", "resolved": "Resolved"}.get(event, event)
        labels = ", ".join(f"{k}={v}" for k, v in sorted(incident.labels.items()))
        return {"text": f"{verb}: {summary} <{incident_url(incident)}|#{incident.pk}>\n{labels}"}
    return {
        "event": event,
        "incident": {
            "id": incident.pk,
            "title": incident.title,
            "severity": incident.severity,
            "state": incident.state,
            "category": incident.category,
            "labels": incident.labels,
            "started_at": incident.started_at.isoformat(),
            "detected_at": incident.detected_at.isoformat(),
            "url": incident_url(incident),
        },
    }


def backoff_seconds(attempt: int) -> int:
    """Seconds before retry ``attempt`` (1-based): 2, 4, 8, 16 ... capped at 5 minutes."""
    return min(300, 2**attempt)


def deliver(notification_id: int) -> bool | int:
    """One delivery attempt. True: sent; False: given up; an int: retry after that many seconds."""
    notification = Notification.objects.select_related("incident", "channel").get(pk=notification_id)
    if notification.status != NotificationStatus.PENDING:
        return notification.status == NotificationStatus.SENT
    channel, incident = notification.channel, notification.incident
    attempt = notification.attempts + 1
    error = ""
    try:
        # Through the outbound guard: a channel URL is an address someone typed, and must not
        # reach the console's own network (console.outbound). No redirects are followed.
        with outbound.session() as session:
            response = session.post(
                channel.url,
                json=payload(notification),
                timeout=settings.NOTIFICATION_TIMEOUT_SECONDS,
                allow_redirects=False,
            )
        if response.status_code >= 300:
            error = f"HTTP {response.status_code}"  # the body is the far end's, never quoted back
        outcome = f"HTTP {response.status_code}"
    # What the timeline and the API show tells no port, protocol or timing apart (console.outbound);
    # the detail goes to the server log, by channel name (a webhook URL is a secret).
    except outbound.HostNotFound as exc:
        error = outcome = "unreachable"
        logger.warning("notification on channel %s failed: %s", channel.name, exc)
    except outbound.OutboundRefused as exc:
        error = outcome = f"unreachable (outside {outbound.SETTING_NAME})"
        logger.warning("notification on channel %s refused: %s", channel.name, exc)
    except requests.RequestException as exc:
        error = outcome = "unreachable"
        logger.warning("notification on channel %s failed: %s", channel.name, exc.__class__.__name__)
    now = timezone.now()
    if not error:
        Notification.objects.filter(pk=notification.pk).update(
            status=NotificationStatus.SENT, attempts=attempt, sent_at=now, last_error=""
        )
        _timeline(incident, f"Notified {channel.name} ({notification.event}): {outcome}", notification, attempt, "sent")
        return True
    if attempt >= MAX_ATTEMPTS:
        Notification.objects.filter(pk=notification.pk).update(
            status=NotificationStatus.FAILED, attempts=attempt, last_error=error
        )
        _timeline(
            incident,
            f"Notification to {channel.name} failed after {attempt} attempts: {error}",
            notification,
            attempt,
            "failed",
        )
        return False
    delay = backoff_seconds(attempt)
    Notification.objects.filter(pk=notification.pk).update(attempts=attempt, last_error=error)
    _timeline(
        incident,
        f"Notification to {channel.name} failed ({error}); retry {attempt + 1} in {delay} s",
        notification,
        attempt,
        "retry",
        retry_in=delay,
    )
    return delay


def _timeline(
    incident: Incident, text: str, notification: Notification, attempt: int, outcome: str, **extra: Any
) -> None:
    TimelineEntry.objects.create(
        incident=incident,
        kind=TimelineKind.NOTIFICATION,
        actor_label=f"notify:{notification.channel.kind}",
        text=text,
        data={
            "channel": notification.channel.name,
            "event": notification.event,
            "attempt": attempt,
            "outcome": outcome,
            **extra,
        },
    )
