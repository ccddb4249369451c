"""Scheduler queues and their series: what Kueue, a Slurm exporter and kube-state-metrics report
per queue, raw (partitioned by day, written by COPY) and rolled up per minute
(fleet.telemetry.series)."""

from __future__ import annotations

from typing import Any

from django.db import models

from fleet.choices import TEAM_ONLY_KINDS, QueueKind, QueueScheduler
from fleet.inventory.models import Site
from fleet.telemetry.models import CounterRollupColumns

# What a scheduler's queue is when its exporter does not say otherwise (``kind`` left blank).
PRIMARY_KIND = {
    QueueScheduler.KUEUE: QueueKind.CLUSTER_QUEUE,
    QueueScheduler.SLURM: QueueKind.PARTITION,
    QueueScheduler.KUBERNETES: QueueKind.NAMESPACE,
}
# A LocalQueue's row is named ``namespace/name``: a namespace (63) and an object name (253).
QUEUE_NAME_MAX = 63 + 1 + 253


def queue_kind(scheduler: str, name: str, kind: str = "") -> str:
    """The kind of a queue: ``kind`` where given, else the scheduler's own queue (a ClusterQueue,
    a partition, a namespace), ``cluster`` for the blank name."""
    if kind:
        return kind
    return PRIMARY_KIND[scheduler] if name else QueueKind.CLUSTER  # type: ignore[index]


class SchedulerQueue(models.Model):
    """A queue one scheduler admits work through, registered on first sighting by the ingest door:
    a Kueue ClusterQueue or LocalQueue, a Slurm partition or account, a Kubernetes namespace. The
    blank name is the cluster's own series, those no queue labels (Slurm's node and GPU counts, the
    nodes' allocatable GPUs). A LocalQueue or an account maps to a team only (``takes_pool``)."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="scheduler_queues")
    scheduler = models.CharField(max_length=16, choices=QueueScheduler.choices)
    kind = models.CharField(
        max_length=16,
        choices=QueueKind.choices,
        help_text="ClusterQueue, LocalQueue, partition, account, namespace, or the cluster's own series",
    )
    name = models.CharField(
        max_length=QUEUE_NAME_MAX,
        blank=True,
        help_text="The ClusterQueue, partition, account or namespace; a LocalQueue as namespace/name; "
        "blank: the cluster's own series (nodes, GPUs)",
    )
    cohort = models.CharField(max_length=253, blank=True, help_text="Kueue's cohort, as its metrics label it")
    pool = models.ForeignKey(
        "fleet.Pool",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="scheduler_queues",
        help_text="The capacity pool whose GPUs this queue admits work onto",
    )
    team = models.ForeignKey(
        "fleet.Team",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="scheduler_queues",
        help_text="The team whose work this queue admits (a Kueue ClusterQueue or LocalQueue, a Slurm account)",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__name", "scheduler", "kind", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["site", "scheduler", "kind", "name"], name="scheduler_queue_unique_per_site"
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_scheduler_display()} {self.name or '(cluster)'}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A queue made by hand (the simulator, the admin, tests) is the scheduler's own kind unless
        # told otherwise; the ingest door always says.
        self.kind = queue_kind(self.scheduler, self.name, self.kind)
        super().save(*args, **kwargs)

    @property
    def takes_pool(self) -> bool:
        """Whether a pool can be set: not on a LocalQueue (its ClusterQueue's pool holds its work)
        nor on a Slurm account (its jobs run on any partition)."""
        return self.kind not in TEAM_ONLY_KINDS


class SchedulerSample(models.Model):
    """One raw value of one queue quantity; ``series`` holds the labels that tell its series apart
    within the queue (a flavor and resource, an eviction reason, a histogram's ``le``), as
    canonical Prometheus label text."""

    pk = models.CompositePrimaryKey("queue", "series", "quantity", "ts")
    queue = models.ForeignKey(SchedulerQueue, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    series = models.CharField(max_length=1024)
    ts = models.DateTimeField()
    quantity = models.CharField(max_length=32)
    value = models.FloatField()

    class Meta:
        db_table = "fleet_schedulersample"

    def __str__(self) -> str:
        return f"queue {self.queue_id} {self.quantity}{{{self.series}}} {self.ts:%Y-%m-%d %H:%M:%S} {self.value}"


class SchedulerRollup1m(CounterRollupColumns):
    """One queue series over one minute (the columns: CounterRollupColumns)."""

    pk = models.CompositePrimaryKey("queue", "series", "quantity", "bucket")
    queue = models.ForeignKey(SchedulerQueue, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    series = models.CharField(max_length=1024)

    class Meta:
        db_table = "fleet_schedulerrollup_1m"

    def __str__(self) -> str:
        return f"queue {self.queue_id} {self.quantity}{{{self.series}}} {self.bucket:%Y-%m-%d %H:%M} {self.last}"


class SchedulerCounterHour(models.Model):
    """One queue counter's 1-minute increases added up over one settled clock hour, so the capacity
    page reads a day of Kueue's histogram as 23 rows a series rather than 1,380 (bench/scheduler.py).

    Filled on read (fleet.scheduler.read.counter_windows) once the hour has been over for a few
    minutes, never by the ingest path; the writer drops a queue's hour when a late value lands in it
    (fleet.scheduler.store), and the next read sums it again. A row with a blank ``quantity`` marks
    the queue's hour as summed, counters or not."""

    pk = models.CompositePrimaryKey("queue", "hour", "quantity", "series")
    queue = models.ForeignKey(SchedulerQueue, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    hour = models.DateTimeField()
    quantity = models.CharField(max_length=32, blank=True)
    series = models.CharField(max_length=1024, blank=True)
    increase = models.FloatField()

    class Meta:
        db_table = "fleet_schedulercounterhour"

    def __str__(self) -> str:
        return f"queue {self.queue_id} {self.quantity}{{{self.series}}} {self.hour:%Y-%m-%d %H}:00 +{self.increase}"
