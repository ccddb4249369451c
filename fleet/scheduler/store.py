"""Writing scheduler series: Kueue's ClusterQueue and LocalQueue metrics, a Slurm exporter's
partition, account and node counts, kube-state-metrics' pods, GPUs and quotas per namespace. A
queue is registered on first sighting under the site that pushed it (SchedulerQueue, unique per
site, scheduler, kind and name); its cohort follows what Kueue reports. The values go through the node series' writer
(fleet.telemetry.series): batch key claimed first, COPY, 1-minute rollup in the same
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from console import live
from fleet.scheduler.models import SchedulerCounterHour, SchedulerQueue, queue_kind
from fleet.telemetry import partitions
from fleet.telemetry.series import SeriesTable, store_series

# The quantities that are counters (rolled up as increases); the rest are gauges.
# The capacity page's queue panel's live topic (fleet.scheduler.read builds its pushes).
TOPIC = "scheduler"
QUEUE_COUNTERS = frozenset(
    {
        "admitted_workloads",
        "evicted_workloads",
        "preempted_workloads",
        "admission_wait_bucket",
        "admission_wait_count",
        "admission_wait_sum",
        "container_restarts",
    }
)
QUEUES = SeriesTable(
    partitions.SCHEDULER_SAMPLES,
    partitions.SCHEDULER_ROLLUP_1M,
    ("queue_id", "series"),
    ("int8", "text"),
    QUEUE_COUNTERS,
)


@dataclass(frozen=True)
class QueuePoint:
    """One value of one queue series as the door read it. ``queue`` is blank for the cluster's own
    series; ``cohort`` is None where the exporter did not say (only Kueue's resource gauges do);
    ``kind`` is blank for the scheduler's own queue (a ClusterQueue, a partition, a namespace)."""

    scheduler: str  # fleet.choices.QueueScheduler
    queue: str
    quantity: str
    series: str  # canonical label text of the labels kept for this quantity
    ts: datetime
    value: float
    cohort: str | None = None
    kind: str = ""  # fleet.choices.QueueKind; blank in what the door queued before it said


QueueKey = tuple[str, str, str]  # scheduler, kind, name


def queue_key(point: QueuePoint) -> QueueKey:
    return (point.scheduler, queue_kind(point.scheduler, point.queue, point.kind), point.queue)


def store_queue_points(*, site_id: int, batch_key: str, points: Sequence[QueuePoint]) -> int:
    """Store queue values under a batch key; return the rows written (0: a redelivery)."""

    late: set[tuple[int, datetime]] = set()

    def rows() -> list[tuple]:
        ids = resolve_queues(site_id, points)
        current = timezone.now().replace(minute=0, second=0, microsecond=0)
        for p in points:  # a value in an hour already over (or in its last minute, which the next
            # minute's increase starts from): that hour's sums are dropped below
            if p.quantity in QUEUE_COUNTERS:
                for moment in (p.ts, p.ts + timedelta(minutes=1)):
                    if (hour := moment.replace(minute=0, second=0, microsecond=0)) < current:
                        late.add((ids[queue_key(p)], hour))
        return [(ids[queue_key(p)], p.series, p.ts, p.quantity, p.value) for p in points]

    stored = store_series(QUEUES, site_id=site_id, batch_key=batch_key, stamps=[p.ts for p in points], rows=rows)
    if stored and late:
        forget_counter_hours(late)
    if stored:  # the capacity page's queue panel follows them while someone watches it
        transaction.on_commit(lambda: live.request_push(*live.watched([TOPIC])))
    return stored


def forget_counter_hours(late: set[tuple[int, datetime]]) -> None:
    """Drop the summed hours (SchedulerCounterHour) that counter values just landed in, markers
    included: the next read of the capacity page sums them again from the 1-minute rollups."""
    queues = sorted({q for q, _ in late})
    hours = sorted({h for _, h in late})
    SchedulerCounterHour.objects.filter(queue_id__in=queues, hour__in=hours).delete()


def resolve_queues(site_id: int, points: Sequence[QueuePoint]) -> dict[QueueKey, int]:
    """(scheduler, kind, name) -> queue id for this site, registering the new ones; a cohort the
    scheduler now reports differently is updated (a ClusterQueue moved to another cohort)."""
    wanted: dict[QueueKey, str | None] = {}
    for p in points:
        key = queue_key(p)
        if p.cohort is not None or key not in wanted:
            wanted[key] = p.cohort

    def existing() -> dict[QueueKey, SchedulerQueue]:
        found = SchedulerQueue.objects.filter(
            site_id=site_id, scheduler__in={s for s, _, _ in wanted}, name__in={n for _, _, n in wanted}
        ).only("id", "scheduler", "kind", "name", "cohort")
        return {(q.scheduler, q.kind, q.name): q for q in found}

    known = existing()
    new = [
        SchedulerQueue(site_id=site_id, scheduler=scheduler, kind=kind, name=name, cohort=cohort or "")
        for (scheduler, kind, name), cohort in sorted(wanted.items(), key=lambda item: item[0])
        if (scheduler, kind, name) not in known
    ]
    if new:
        SchedulerQueue.objects.bulk_create(new, ignore_conflicts=True)
        known = existing()
    for key, cohort in wanted.items():
        queue = known[key]
        if cohort is not None and queue.cohort != cohort:
            SchedulerQueue.objects.filter(pk=queue.pk).update(cohort=cohort)
    return {key: known[key].pk for key in wanted}
