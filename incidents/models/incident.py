"""Incidents, the findings that feed them, their append-only timeline and their action items.

Incidents refer to what they affect by labels (site, node/hostname, gpu, job, endpoint, ...), the
way Alertmanager alerts do, so internal detectors and external alerts share one path and this
app knows no fleet model.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.urls import reverse
from django.utils import timezone

from incidents.choices import (
    OPEN_STATES,
    ActionItemState,
    FindingStatus,
    IncidentState,
    Severity,
    TimelineKind,
)
from incidents.services.cost import at_risk_gpu_hours
from incidents.services.links import resource_links


class IncidentQuerySet(models.QuerySet["Incident"]):
    def update(self, **kwargs: Any) -> int:
        # State changes are conditional UPDATEs, which skip auto_now: stamp updated_at here so
        # "what changed since" (the live list's deltas) sees every one of them.
        kwargs.setdefault("updated_at", timezone.now())
        return super().update(**kwargs)

    def open(self) -> IncidentQuerySet:
        return self.filter(state__in=OPEN_STATES)

    def resolved(self) -> IncidentQuerySet:
        return self.filter(state=IncidentState.RESOLVED)


class Incident(models.Model):
    title = models.CharField(max_length=300)
    severity = models.CharField(max_length=4, choices=Severity.choices, db_index=True)
    state = models.CharField(
        max_length=16, choices=IncidentState.choices, default=IncidentState.TRIGGERED, db_index=True
    )
    category = models.CharField(max_length=64, blank=True, help_text="e.g. gpu-health, alertmanager")
    group_key = models.CharField(max_length=500, db_index=True, help_text="Findings with this key join this incident")
    labels = models.JSONField(default=dict, blank=True, help_text="Affected resources: site, hostname, gpu, job, ...")
    # Times: when the fault began (earliest finding), when we opened the incident, and each state.
    started_at = models.DateTimeField(help_text="When the fault began, as its first finding says")
    detected_at = models.DateTimeField(default=timezone.now, help_text="When the console opened the incident")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    mitigated_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Set while every finding is cleared and nobody has taken the incident: resolve at this time.
    auto_resolve_at = models.DateTimeField(null=True, blank=True, db_index=True)
    commander = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    scribe = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    communications = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Impact, filled by detectors: GPUs affected, GPU-hours lost, SLO error budget burned.
    affected_gpus = models.PositiveIntegerField(default=0)
    gpu_hours_lost = models.FloatField(
        default=0, help_text="The GPU-hours lost its findings reported, summed (incidents.services.cost)"
    )
    gpus_out_of_service = models.PositiveIntegerField(
        default=0, help_text="GPUs its findings take out of service outside any job, each once"
    )
    error_budget_burned = models.FloatField(default=0, help_text="Fraction of the SLO's error budget (0-1)")
    # Postmortem.
    pm_summary = models.TextField(blank=True)
    pm_impact = models.TextField(blank=True)
    pm_root_cause = models.TextField(blank=True)
    pm_timeline = models.TextField(blank=True)
    pm_went_well = models.TextField(blank=True)
    pm_went_badly = models.TextField(blank=True)
    # Set when a person merged this incident into another: its findings, action items and a copy of
    # its timeline went there, and it is closed (resolved) with this link.
    merged_into = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="merged_from")
    updated_at = models.DateTimeField(auto_now=True)

    objects = IncidentQuerySet.as_manager()

    class Meta:
        ordering = ["-detected_at"]
        indexes = [models.Index(fields=["state", "group_key"], name="incident_state_group")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    def get_absolute_url(self) -> str:
        return reverse("incidents:detail", args=[self.pk])

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def flapping(self) -> bool:
        """A finding of it is held firing because it fires and clears too often."""
        return self.findings.firing().filter(flapping_since__isnull=False).exists()

    @property
    def duration(self) -> timedelta:
        return (self.resolved_at or timezone.now()) - self.started_at

    def current_gpu_hours(self) -> float:
        """GPU-hours lost so far (incidents.services.cost): the sum of the figures its findings
        reported (gpu_hours_lost), plus its GPUs out of service for the incident's length."""
        return self.gpu_hours_lost + self.out_of_service_gpu_hours()

    def out_of_service_gpu_hours(self) -> float:
        """GPUs out of service outside any job x the incident's length."""
        return self.gpus_out_of_service * self.duration.total_seconds() / 3600

    def current_gpu_hours_at_risk(self) -> float:
        """GPU-hours at risk now (work not yet checkpointed of its jobs), never counted as lost."""
        return at_risk_gpu_hours(self.findings.all())

    def links(self) -> list[dict[str, Any]]:
        """Affected resources with links to their pages where the console has one."""
        return resource_links(self.labels)


class FindingQuerySet(models.QuerySet["Finding"]):
    def firing(self) -> FindingQuerySet:
        return self.filter(status=FindingStatus.FIRING)


class Finding(models.Model):
    """One fault as a detector or Alertmanager reports it, deduplicated by fingerprint."""

    fingerprint = models.CharField(max_length=300, unique=True)
    source = models.CharField(max_length=64, help_text="detector name, or alertmanager")
    labels = models.JSONField(default=dict)
    severity = models.CharField(max_length=4, choices=Severity.choices)
    summary = models.CharField(max_length=500)
    description = models.TextField(blank=True)
    impact = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=8, choices=FindingStatus.choices, default=FindingStatus.FIRING)
    incident = models.ForeignKey(Incident, null=True, blank=True, on_delete=models.PROTECT, related_name="findings")
    silenced_by = models.ForeignKey(
        "incidents.Silence", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Recorded and shown, but held out of incidents and notifications by a maintenance window.
    in_maintenance = models.ForeignKey(
        "incidents.MaintenanceWindow", null=True, blank=True, on_delete=models.SET_NULL, related_name="findings"
    )
    started_at = models.DateTimeField()
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    cleared_at = models.DateTimeField(null=True, blank=True)
    times_seen = models.PositiveIntegerField(default=1)
    # Flapping (engine.clear_finding): when it cleared within the flap window, and since when it
    # is held firing because it cleared too often.
    flap_clears = ArrayField(models.DateTimeField(), default=list, blank=True)
    flapping_since = models.DateTimeField(null=True, blank=True)

    objects = FindingQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen"]

    def __str__(self) -> str:
        return f"{self.fingerprint} ({self.status})"


class TimelineEntry(models.Model):
    """Append-only: entries are added, never changed or deleted (a database trigger enforces it)."""

    incident = models.ForeignKey(Incident, on_delete=models.PROTECT, related_name="timeline")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=TimelineKind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Room for "alertmanager (token <100 chars>, site <64 chars>)".
    actor_label = models.CharField(max_length=200, help_text="Who acted: a username, a detector, alertmanager, system")
    text = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name_plural = "timeline entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label}: {self.text[:60]}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("Timeline entries are append-only.")
        super().save(*args, **kwargs)


class ActionItem(models.Model):
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="action_items")
    title = models.CharField(max_length=300)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    due_date = models.DateField(null=True, blank=True)
    state = models.CharField(max_length=8, choices=ActionItemState.choices, default=ActionItemState.OPEN)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["state", "due_date", "id"]

    def __str__(self) -> str:
        return self.title

    @property
    def is_overdue(self) -> bool:
        """Still open after its due date (in the console's time zone)."""
        return self.state == ActionItemState.OPEN and self.due_date is not None and self.due_date < timezone.localdate()


class RunbookLink(models.Model):
    """Where the runbook for a category of incident lives (an incident's category: a detector's
    name, an Alertmanager alertname). Shown on the incident page; managed in the admin."""

    category = models.CharField(max_length=64, unique=True)
    url = models.URLField(max_length=500)
    title = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["category"]

    def __str__(self) -> str:
        return f"{self.category} -> {self.url}"
