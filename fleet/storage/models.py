"""Storage series: file system values per mount and disk counters per block device, raw
(partitioned by day, written by COPY) and rolled up per minute (fleet.telemetry.series)."""

from __future__ import annotations

from django.db import models

from fleet.telemetry.models import CounterRollupColumns


class MountSample(models.Model):
    pk = models.CompositePrimaryKey("mount", "quantity", "ts")
    mount = models.ForeignKey("fleet.NodeMount", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    ts = models.DateTimeField()
    quantity = models.CharField(max_length=32)
    value = models.FloatField()

    class Meta:
        db_table = "fleet_mountsample"

    def __str__(self) -> str:
        return f"mount {self.mount_id} {self.quantity} {self.ts:%Y-%m-%d %H:%M:%S} {self.value}"


class MountRollup1m(CounterRollupColumns):
    pk = models.CompositePrimaryKey("mount", "quantity", "bucket")
    mount = models.ForeignKey("fleet.NodeMount", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")

    class Meta:
        db_table = "fleet_mountrollup_1m"

    def __str__(self) -> str:
        return f"mount {self.mount_id} {self.quantity} {self.bucket:%Y-%m-%d %H:%M} {self.last}"


class DiskSample(models.Model):
    """A block device's counter as node_exporter's diskstats collector exports it (``device``)."""

    pk = models.CompositePrimaryKey("node", "device", "quantity", "ts")
    node = models.ForeignKey("fleet.Node", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    device = models.CharField(max_length=128)
    ts = models.DateTimeField()
    quantity = models.CharField(max_length=32)
    value = models.FloatField()

    class Meta:
        db_table = "fleet_disksample"

    def __str__(self) -> str:
        return f"node {self.node_id} {self.device} {self.quantity} {self.ts:%Y-%m-%d %H:%M:%S} {self.value}"


class DiskRollup1m(CounterRollupColumns):
    pk = models.CompositePrimaryKey("node", "device", "quantity", "bucket")
    node = models.ForeignKey("fleet.Node", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    device = models.CharField(max_length=128)

    class Meta:
        db_table = "fleet_diskrollup_1m"

    def __str__(self) -> str:
        return f"node {self.node_id} {self.device} {self.quantity} {self.bucket:%Y-%m-%d %H:%M} +{self.increase}"
