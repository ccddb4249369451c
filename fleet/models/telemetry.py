"""GPU telemetry: raw samples, each GPU's latest state, and the batch keys that make ingest idempotent."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from fleet.telemetry_fields import GPU_SAMPLE_FIELDS


def _metric_columns() -> dict[str, Any]:
    return {
        f.name: (models.FloatField if f.kind is float else models.BigIntegerField)(
            null=True, blank=True, help_text=f"{f.help} ({f.unit})" if f.unit else f.help
        )
        for f in GPU_SAMPLE_FIELDS
    }


# One abstract base carries a column per field of fleet.telemetry_fields, so the sample table,
# the latest-state table and the ingest schema cannot drift apart.
GpuMetrics = type(
    "GpuMetrics",
    (models.Model,),
    {"__module__": __name__, "Meta": type("Meta", (), {"abstract": True}), **_metric_columns()},
)


class GpuSample(GpuMetrics):  # type: ignore[misc, valid-type]
    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.CASCADE, related_name="samples", db_index=False)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["gpu", "ts"], name="gpusample_gpu_ts")]


class GpuStateQuerySet(models.QuerySet["GpuState"]):
    def fresh(self) -> GpuStateQuerySet:
        """States reported within the staleness window."""
        cutoff = timezone.now() - timezone.timedelta(seconds=settings.FLEET_STALE_SECONDS)
        return self.filter(ts__gte=cutoff)

    def with_errors(self) -> GpuStateQuerySet:
        return self.filter(models.Q(xid__gt=0) | models.Q(ecc_dbe_total__gt=0))


class GpuState(GpuMetrics):  # type: ignore[misc, valid-type]
    """The latest sample of each GPU: what the dashboard table and the totals read."""

    gpu = models.OneToOneField("fleet.Gpu", on_delete=models.CASCADE, primary_key=True, related_name="state")
    ts = models.DateTimeField()
    updated_at = models.DateTimeField(db_index=True)

    objects = GpuStateQuerySet.as_manager()


class IngestBatch(models.Model):
    """A batch key recorded in the same transaction as its samples: a redelivery writes nothing."""

    key = models.CharField(max_length=255, primary_key=True)
    site = models.ForeignKey("fleet.Site", on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField()
    received_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.key
