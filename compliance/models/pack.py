"""A compliance pack: one zip (PDF, JSON, CSVs and a manifest of SHA-256 sums), built by a Celery
task that reports its progress on the row, and kept for download."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models
from django.db.models import F, Q

from compliance.choices import PackStatus


class CompliancePack(models.Model):
    period_start = models.DateField(help_text="First day of the audit extract")
    period_end = models.DateField(help_text="Last day of the audit extract")
    status = models.CharField(max_length=8, choices=PackStatus.choices, default=PackStatus.QUEUED)
    progress = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    step = models.CharField(max_length=200, blank=True, help_text="What the task is doing now")
    error = models.TextField(blank=True)
    content = models.BinaryField(null=True, blank=True, editable=False)
    sha256 = models.CharField(max_length=64, blank=True)
    size = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.CheckConstraint(condition=Q(period_end__gte=F("period_start")), name="compliancepack_period_ordered")
        ]

    def __str__(self) -> str:
        return f"Compliance pack {self.period_start}..{self.period_end} ({self.status})"

    @property
    def filename(self) -> str:
        return f"goodput-compliance-pack-{self.pk}-{self.period_start:%Y%m%d}-{self.period_end:%Y%m%d}.zip"
