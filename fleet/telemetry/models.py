"""GPU telemetry: raw samples, rollups, each GPU's latest state, batch keys, retention records, and the
scrape targets (/metrics URLs of dcgm-exporter, vLLM, Triton, TGI) the console pulls on a schedule.

The sample and rollup tables are range-partitioned by time in PostgreSQL (see
fleet/migrations/0002 and fleet.telemetry.partitions): Django's models describe their columns for
queries and for the test runner's flush, while the tables themselves are created by SQL.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, URLValidator
from django.db import models
from django.utils import timezone

from console.outbound import validate_url
from fleet.choices import ScrapeHealth, ScrapeKind
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS


def _metric_columns() -> dict[str, Any]:
    return {
        f.name: (models.FloatField if f.kind is float else models.BigIntegerField)(
            null=True, blank=True, help_text=f"{f.help} ({f.unit})" if f.unit else f.help
        )
        for f in GPU_SAMPLE_FIELDS
    }


# One abstract base carries a column per field of fleet.telemetry.fields, so the sample table,
# the latest-state table and the ingest schema cannot drift apart.
GpuMetrics = type(
    "GpuMetrics",
    (models.Model,),
    {"__module__": __name__, "Meta": type("Meta", (), {"abstract": True}), **_metric_columns()},
)


class GpuSample(GpuMetrics):  # type: ignore[misc, valid-type]
    """One raw sample. Partitioned by day on ``ts``; written only by binary COPY."""

    pk = models.CompositePrimaryKey("gpu", "ts")
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    ts = models.DateTimeField()

    class Meta:
        db_table = "fleet_gpusample"


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
    # Not indexed, on purpose: every batch rewrites thousands of these rows, and without an index
    # on a changing column (and with free space left in each page, see migration 0003) PostgreSQL
    # updates them in place (HOT). The live delta's scan of this one-row-per-GPU table is cheap.
    updated_at = models.DateTimeField()

    objects = GpuStateQuerySet.as_manager()


class IngestBatch(models.Model):
    """A batch key recorded in the same transaction as its samples: a redelivery writes nothing."""

    key = models.CharField(max_length=255, primary_key=True)
    site = models.ForeignKey("fleet.Site", on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField()
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="When the API accepted the batch")
    received_at = models.DateTimeField(default=timezone.now, db_index=True, help_text="When it was stored")

    def __str__(self) -> str:
        return self.key


class RollupColumns(models.Model):
    """Aggregates of GPU samples over a bucket (one minute or one hour)."""

    bucket = models.DateTimeField()
    samples = models.IntegerField()
    util_mean = models.FloatField(null=True)
    util_max = models.FloatField(null=True)
    temp_mean = models.FloatField(null=True)
    temp_max = models.FloatField(null=True)
    power_mean = models.FloatField(null=True, help_text="Mean power draw (W)")
    power_max = models.FloatField(null=True)
    energy_j = models.FloatField(null=True, help_text="Mean power x bucket length (J)")
    xid_max = models.IntegerField(null=True)
    error_samples = models.IntegerField(default=0, help_text="Samples with an XID or double-bit ECC errors")
    throttled_samples = models.IntegerField(default=0, help_text="Samples clocked down by power or thermal limits")

    class Meta:
        abstract = True


class GpuRollup1m(RollupColumns):
    pk = models.CompositePrimaryKey("gpu", "bucket")
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")

    class Meta:
        db_table = "fleet_gpurollup_1m"

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} {self.bucket:%Y-%m-%d %H:%M}"


class GpuRollup1h(RollupColumns):
    pk = models.CompositePrimaryKey("gpu", "bucket")
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")

    class Meta:
        db_table = "fleet_gpurollup_1h"

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} {self.bucket:%Y-%m-%d %H:00}"


class GroupRollupColumns(models.Model):
    """Aggregates over the GPUs of a node, rack, site or the whole fleet (scope_id 0)."""

    scope = models.CharField(max_length=8)  # node, rack, site, fleet
    scope_id = models.BigIntegerField()
    bucket = models.DateTimeField()
    gpus = models.IntegerField(help_text="GPUs that reported in the bucket")
    util_mean = models.FloatField(null=True)
    util_max = models.FloatField(null=True)
    temp_mean = models.FloatField(null=True)
    temp_max = models.FloatField(null=True)
    power_mean = models.FloatField(null=True, help_text="Mean power per GPU (W)")
    power_sum = models.FloatField(null=True, help_text="Summed mean power of the GPUs (W)")
    energy_j = models.FloatField(null=True)
    error_gpus = models.IntegerField(default=0)
    throttled_gpus = models.IntegerField(default=0)

    class Meta:
        abstract = True


class GroupRollup1m(GroupRollupColumns):
    pk = models.CompositePrimaryKey("scope", "scope_id", "bucket")

    class Meta:
        db_table = "fleet_grouprollup_1m"

    def __str__(self) -> str:
        return f"{self.scope} {self.scope_id} {self.bucket:%Y-%m-%d %H:%M}"


class GroupRollup1h(GroupRollupColumns):
    pk = models.CompositePrimaryKey("scope", "scope_id", "bucket")

    class Meta:
        db_table = "fleet_grouprollup_1h"

    def __str__(self) -> str:
        return f"{self.scope} {self.scope_id} {self.bucket:%Y-%m-%d %H:00}"


class RollupDirty(models.Model):
    """Buckets whose rollups must be (re)computed: written by ingest, claimed by the rollup task.

    A queue of buckets rather than a single time watermark, because samples arrive late (an agent
    drains its spool after an outage) and must re-roll the old buckets they land in.
    """

    pk = models.CompositePrimaryKey("resolution", "bucket")
    resolution = models.CharField(max_length=2)  # 1m or 1h
    bucket = models.DateTimeField()
    dirtied_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.resolution} {self.bucket:%Y-%m-%d %H:%M}"


class NodeRollupDirty(models.Model):
    """Minutes of a node series table (ports, mounts, disks) whose 1-minute rollups must be
    (re)computed: written by the node writer, claimed by ``update_node_rollups``
    (fleet.telemetry.series), as RollupDirty is for the GPU rollups."""

    pk = models.CompositePrimaryKey("series", "bucket")
    series = models.CharField(max_length=16)  # the SeriesTable's queue: port, mount, disk
    bucket = models.DateTimeField()
    dirtied_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.series} {self.bucket:%Y-%m-%d %H:%M}"


class CounterRollupColumns(models.Model):
    """One node or queue quantity over one minute (fleet.telemetry.series writes every table of
    these): ``increase`` for a counter (resets counted as Prometheus ``increase()`` does),
    ``min``/``max``/``last`` for every quantity. A concrete table adds its key columns and its
    composite primary key; the columns here keep the names and types the migrations gave them."""

    quantity = models.CharField(max_length=32)
    bucket = models.DateTimeField()
    samples = models.IntegerField()
    increase = models.FloatField(null=True)
    min = models.FloatField()
    max = models.FloatField()
    last = models.FloatField()

    class Meta:
        abstract = True


class PartitionDrop(models.Model):
    """A record of each expired partition dropped by retention."""

    table = models.CharField(max_length=63)
    partition = models.CharField(max_length=63)
    range_start = models.DateTimeField()
    range_end = models.DateTimeField()
    rows = models.BigIntegerField()
    bytes = models.BigIntegerField()
    dropped_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-dropped_at"]

    def __str__(self) -> str:
        return f"{self.partition} ({self.range_start:%Y-%m-%d} – {self.range_end:%Y-%m-%d})"


# --- scrape targets ---------------------------------------------------------------------------


class ScrapeTargetQuerySet(models.QuerySet["ScrapeTarget"]):
    def due(self) -> ScrapeTargetQuerySet:
        return self.filter(enabled=True, next_scrape_at__lte=timezone.now())


class ScrapeTarget(models.Model):
    site = models.ForeignKey("fleet.Site", on_delete=models.CASCADE, related_name="scrape_targets")
    name = models.CharField(max_length=100)
    url = models.CharField(max_length=500, validators=[URLValidator(schemes=["http", "https"]), validate_url])
    kind = models.CharField(max_length=16, choices=ScrapeKind.choices, default=ScrapeKind.AUTO)
    endpoint_name = models.CharField(
        max_length=200, blank=True, help_text="Serving endpoint to file metrics under (default: the model label)"
    )
    hostname = models.CharField(max_length=253, blank=True, help_text="Host for GPU metrics without a hostname label")
    interval_seconds = models.PositiveIntegerField(
        default=15, validators=[MinValueValidator(5), MaxValueValidator(3600)]
    )
    timeout_seconds = models.FloatField(default=5, validators=[MinValueValidator(0.5), MaxValueValidator(60)])
    enabled = models.BooleanField(default=True)
    next_scrape_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_scrape_at = models.DateTimeField(null=True, blank=True)
    last_duration_ms = models.FloatField(null=True, blank=True)
    last_samples = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    health = models.CharField(max_length=8, choices=ScrapeHealth.choices, default=ScrapeHealth.UNKNOWN)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ScrapeTargetQuerySet.as_manager()

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="scrapetarget_unique_per_site")]

    def __str__(self) -> str:
        return f"{self.name} ({self.url})"

    def clean(self) -> None:
        """The form, the admin and the API (ScrapeTargetSerializer) refuse what could never be
        scraped into an endpoint, naming the field."""
        super().clean()
        if message := endpoint_name_missing(self.kind, self.endpoint_name):
            raise ValidationError({"endpoint_name": message})


def endpoint_name_missing(kind: str, endpoint_name: str) -> str | None:
    """Why a target of this kind needs an endpoint name it lacks, or None. TGI's metrics carry no
    model label, so nothing in a TGI scrape says which endpoint it is: without a name every scrape
    would fail."""
    if kind == ScrapeKind.TGI and not (endpoint_name or "").strip():
        return "A TGI target needs an endpoint name: TGI's metrics carry no model label to name one."
    return None
