"""What reaches people: silences (Alertmanager-style label matchers) and notification channels."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.outbound import validate_url
from incidents.choices import MAINTENANCE_LABELS, ChannelKind, MaintenanceScope, NotificationStatus, Severity
from incidents.services.matchers import matches_all


class SilenceQuerySet(models.QuerySet["Silence"]):
    def active(self, at=None) -> SilenceQuerySet:  # type: ignore[no-untyped-def]
        at = at or timezone.now()
        return self.filter(starts_at__lte=at, ends_at__gt=at)


class Silence(models.Model):
    """Findings whose labels match every matcher are recorded but open no incident, notify no one.

    ``matchers``: a list of {"name", "op", "value"} with op one of =, !=, =~, !~ (regexes are
    anchored, as in Alertmanager).
    """

    matchers = models.JSONField()
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    comment = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SilenceQuerySet.as_manager()

    class Meta:
        ordering = ["-starts_at"]

    def __str__(self) -> str:
        return ", ".join(f"{m['name']}{m['op']}{m['value']!r}" for m in self.matchers)

    def matches(self, labels: dict[str, str]) -> bool:
        return matches_all(self.matchers, labels)


class NotificationChannel(models.Model):
    """Where incidents are announced, routed by minimum severity and label matchers."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    url = models.URLField(
        max_length=500, validators=[validate_url], help_text="Webhook URL (PagerDuty: the Events API v2 enqueue URL)"
    )
    routing_key = models.CharField(max_length=200, blank=True, help_text="PagerDuty integration key")
    min_severity = models.CharField(
        max_length=4, choices=Severity.choices, default=Severity.SEV4, help_text="Notify for this severity and worse"
    )
    matchers = models.JSONField(default=list, blank=True, help_text="Only incidents whose labels match all of these")
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"


class Notification(models.Model):
    """One announcement of one incident event on one channel, with its delivery attempts."""

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=16, help_text="triggered, acknowledged, resolved")
    status = models.CharField(max_length=8, choices=NotificationStatus.choices, default=NotificationStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["incident", "channel", "event"], name="notification_once_per_event")
        ]

    def __str__(self) -> str:
        return f"{self.incident_id} {self.event} -> {self.channel}"


class MaintenanceWindowQuerySet(models.QuerySet["MaintenanceWindow"]):
    def active(self, at=None) -> MaintenanceWindowQuerySet:  # type: ignore[no-untyped-def]
        at = at or timezone.now()
        return self.filter(starts_at__lte=at, ends_at__gt=at)


class MaintenanceWindow(models.Model):
    """Planned work on a node, rack or site. Findings about it are recorded and shown, marked
    "in maintenance", but open no incident and notify nobody while the window lasts."""

    scope = models.CharField(max_length=8, choices=MaintenanceScope.choices)
    value = models.CharField(max_length=200, help_text="The node's hostname, the rack's or the site's name")
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    comment = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = MaintenanceWindowQuerySet.as_manager()

    class Meta:
        ordering = ["-starts_at"]

    def __str__(self) -> str:
        return f"{self.get_scope_display()} {self.value}"

    def covers(self, labels: dict[str, Any]) -> bool:
        return any(str(labels.get(name, "")) == self.value for name in MAINTENANCE_LABELS[MaintenanceScope(self.scope)])
