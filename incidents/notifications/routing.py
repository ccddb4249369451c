"""Which channels hear of an incident event, and one queued delivery for each."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from incidents.choices import SEVERITY_RANK, Severity
from incidents.models import Incident, Notification, NotificationChannel
from incidents.notifications.tasks import send_notification
from incidents.services.matchers import matches_all


def routed_channels(incident: Incident) -> list[NotificationChannel]:
    rank = SEVERITY_RANK[Severity(incident.severity)]
    return [
        channel
        for channel in NotificationChannel.objects.filter(enabled=True)
        if rank <= SEVERITY_RANK[Severity(channel.min_severity)] and matches_all(channel.matchers, incident.labels)
    ]


def notify(incident_id: int, event: str) -> list[int]:
    """Create one notification per routed channel for this event and queue its delivery."""
    incident = Incident.objects.get(pk=incident_id)
    created = []
    for channel in routed_channels(incident):
        try:
            with transaction.atomic():
                notification = Notification.objects.create(incident=incident, channel=channel, event=event)
        except IntegrityError:
            continue  # already announced on this channel
        created.append(notification.pk)
    for pk in created:
        # Each channel is its own task: one failing channel never holds up another.
        send_notification.delay(pk)
    return created
