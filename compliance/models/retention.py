"""Retention: policies per data class and tenant, legal holds that block deletion, and the record
of every enforcement run (the daily beat task, a dry-run preview, the partition drops)."""

from __future__ import annotations

from datetime import date

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from compliance.choices import CONSOLE_HELD, DataClass, RetentionAction


class RetentionPolicy(models.Model):
    """Keep a data class (for one tenant, or all when blank) for ``days``; 0 is zero retention.

    On a class the console holds (choices.CONSOLE_HELD) the retention task enforces it. On any
    other class it is an attestation: its owner reviews it by ``review_due``.
    """

    data_class = models.CharField(max_length=24, choices=DataClass.choices)
    tenant = models.CharField(max_length=100, blank=True, help_text="Blank: every tenant")
    days = models.PositiveIntegerField(help_text="Retention in days; 0 keeps nothing")
    action = models.CharField(max_length=16, choices=RetentionAction.choices, default=RetentionAction.DELETE)
    owner = models.CharField(max_length=200, blank=True, help_text="Who attests a store the console does not hold")
    review_due = models.DateField(null=True, blank=True)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["data_class", "tenant"]
        verbose_name_plural = "retention policies"
        constraints = [models.UniqueConstraint(fields=["data_class", "tenant"], name="retentionpolicy_unique")]

    def __str__(self) -> str:
        scope = self.tenant or "all tenants"
        return f"{self.get_data_class_display()} ({scope}): {self.days} d, {self.action}"

    @property
    def enforced(self) -> bool:
        return self.data_class in CONSOLE_HELD

    def review_overdue(self, today: date) -> bool:
        """An attestation whose review date has passed (or that has none)."""
        return not self.enforced and (self.review_due is None or self.review_due < today)


class LegalHoldQuerySet(models.QuerySet["LegalHold"]):
    def active(self) -> LegalHoldQuerySet:
        return self.filter(released_at__isnull=True)


class LegalHold(models.Model):
    """Blocks deletion of a data class (for one tenant, or all) while it is active.

    ``incident_ids`` narrows a hold on incidents to those incidents (empty: all of them). A hold on
    the audit log needs two people to release it (``release_requested_by``, then another officer
    or an admin as ``released_by``), and the audit purge waits a day after (services.retention).
    """

    name = models.CharField(max_length=200)
    data_class = models.CharField(max_length=24, choices=DataClass.choices)
    tenant = models.CharField(max_length=100, blank=True)
    incident_ids = models.JSONField(default=list, blank=True)
    reason = models.TextField()
    placed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    placed_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A hold on the audit log is released by two people: one asks, another approves.
    release_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    release_requested_at = models.DateTimeField(null=True, blank=True)

    objects = LegalHoldQuerySet.as_manager()

    class Meta:
        ordering = ["-placed_at"]

    def __str__(self) -> str:
        return self.name


class RetentionRun(models.Model):
    """One application of a policy: what, how many, when, under which policy."""

    data_class = models.CharField(max_length=24, choices=DataClass.choices)
    tenant = models.CharField(max_length=100, blank=True)
    policy = models.ForeignKey(RetentionPolicy, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    policy_days = models.PositiveIntegerField(null=True, blank=True, help_text="The policy as it was when it ran")
    action = models.CharField(max_length=16, choices=RetentionAction.choices, default=RetentionAction.DELETE)
    cutoff = models.DateTimeField(help_text="Data older than this was due")
    dry_run = models.BooleanField(default=False)
    affected = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)], help_text="Rows deleted or anonymised (or that would be)"
    )
    held = models.BigIntegerField(default=0, help_text="Rows due but kept by a legal hold")
    detail = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    triggered_by = models.CharField(max_length=100, help_text="beat, a user name, or partition-drop")

    class Meta:
        ordering = ["-started_at", "-pk"]
        indexes = [models.Index(fields=["data_class", "-started_at"], name="retentionrun_class_started")]
        constraints = [models.CheckConstraint(condition=Q(held__gte=0), name="retentionrun_held_nonnegative")]

    def __str__(self) -> str:
        kind = "dry run" if self.dry_run else "run"
        return f"{self.get_data_class_display()} {kind} {self.started_at:%Y-%m-%d %H:%M}: {self.affected}"
