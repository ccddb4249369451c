"""Port series: raw node_exporter values per interface (partitioned by day, written by COPY) and
their 1-minute rollups (fleet.telemetry.series)."""

from __future__ import annotations

from django.db import models

from fleet.telemetry.models import CounterRollupColumns


class PortSample(models.Model):
    """One raw value of one port quantity (a counter as exported, cumulative)."""

    pk = models.CompositePrimaryKey("interface", "quantity", "ts")
    interface = models.ForeignKey(
        "fleet.NodeInterface", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    ts = models.DateTimeField()
    quantity = models.CharField(max_length=32)
    value = models.FloatField()

    class Meta:
        db_table = "fleet_portsample"

    def __str__(self) -> str:
        return f"interface {self.interface_id} {self.quantity} {self.ts:%Y-%m-%d %H:%M:%S} {self.value}"


class PortRollup1m(CounterRollupColumns):
    """One port quantity over one minute (the columns: CounterRollupColumns)."""

    pk = models.CompositePrimaryKey("interface", "quantity", "bucket")
    interface = models.ForeignKey(
        "fleet.NodeInterface", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )

    class Meta:
        db_table = "fleet_portrollup_1m"

    def __str__(self) -> str:
        return f"interface {self.interface_id} {self.quantity} {self.bucket:%Y-%m-%d %H:%M} +{self.increase}"
