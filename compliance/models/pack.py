"""A compliance pack: one zip (PDF, JSON, CSVs and a manifest of SHA-256 sums), built by a Celery
task that reports its progress on the row, and kept for download.

The zip is stored in the database (the web processes and the workers share nothing else) as
numbered chunks of at most ``CHUNK_BYTES``: the worker writes it a chunk at a time and a download
streams it a chunk at a time, so neither ever holds a whole pack (a year's audit extract runs to
hundreds of megabytes)."""

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


# One chunk of a stored zip: large enough that a download makes few queries, small enough that
# the worker and the web process each hold only one at a time.
CHUNK_BYTES = 1024 * 1024


class CompliancePackChunk(models.Model):
    """Bytes ``seq * CHUNK_BYTES`` onwards of a pack's zip; written with the pack marked done, in
    one transaction, so a done pack always has all of its chunks and any other has none."""

    pack = models.ForeignKey(CompliancePack, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pack", "seq"], name="compliancepackchunk_unique")]

    def __str__(self) -> str:
        return f"{self.pack_id} chunk {self.seq}"
