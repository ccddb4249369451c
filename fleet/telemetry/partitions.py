"""Time partitions: made ahead by a beat task and on demand by writers; dropped whole on expiry.

Retention never runs a bulk DELETE: an expired partition is dropped in one statement, which
frees its space at once and leaves no dead rows for vacuum.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class PartitionedTable:
    name: str
    interval: str  # "day" or "month"
    retention_setting: str  # name of the settings attribute holding the retention in days

    @property
    def retention(self) -> timedelta:
        return timedelta(days=getattr(settings, self.retention_setting))

    def start_of(self, moment: datetime) -> datetime:
        moment = moment.astimezone(UTC)
        if self.interval == "day":
            return datetime(moment.year, moment.month, moment.day, tzinfo=UTC)
        return datetime(moment.year, moment.month, 1, tzinfo=UTC)

    def next_start(self, start: datetime) -> datetime:
        if self.interval == "day":
            return start + timedelta(days=1)
        return datetime(start.year + (start.month == 12), start.month % 12 + 1, 1, tzinfo=UTC)

    def partition_name(self, start: datetime) -> str:
        suffix = start.strftime("%Y%m%d" if self.interval == "day" else "%Y%m")
        return f"{self.name}_p{suffix}"


SAMPLES = PartitionedTable("fleet_gpusample", "day", "RAW_RETENTION_DAYS")
SERVING_SAMPLES = PartitionedTable("fleet_servingsample", "day", "RAW_RETENTION_DAYS")
GPU_ROLLUP_1M = PartitionedTable("fleet_gpurollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
GROUP_ROLLUP_1M = PartitionedTable("fleet_grouprollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
GPU_ROLLUP_1H = PartitionedTable("fleet_gpurollup_1h", "month", "ROLLUP_1H_RETENTION_DAYS")
GROUP_ROLLUP_1H = PartitionedTable("fleet_grouprollup_1h", "month", "ROLLUP_1H_RETENTION_DAYS")
SERVING_ROLLUP_1M = PartitionedTable("fleet_servingrollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
SERVING_ROLLUP_1H = PartitionedTable("fleet_servingrollup_1h", "month", "ROLLUP_1H_RETENTION_DAYS")
# node_exporter series: ports (fleet.fabric), mounts and disks (fleet.storage); see fleet.telemetry.series.
PORT_SAMPLES = PartitionedTable("fleet_portsample", "day", "RAW_RETENTION_DAYS")
PORT_ROLLUP_1M = PartitionedTable("fleet_portrollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
# The fabric page's throughput per site, fabric and minute (fleet.fabric.read.summaries), kept as long
# as the port rollups it is made from.
FABRIC_ROLLUP_1M = PartitionedTable("fleet_fabricrollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
MOUNT_SAMPLES = PartitionedTable("fleet_mountsample", "day", "RAW_RETENTION_DAYS")
MOUNT_ROLLUP_1M = PartitionedTable("fleet_mountrollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
DISK_SAMPLES = PartitionedTable("fleet_disksample", "day", "RAW_RETENTION_DAYS")
DISK_ROLLUP_1M = PartitionedTable("fleet_diskrollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
# Scheduler queues' series (fleet.scheduler): Kueue, Slurm and kube-state-metrics per queue.
SCHEDULER_SAMPLES = PartitionedTable("fleet_schedulersample", "day", "RAW_RETENTION_DAYS")
SCHEDULER_ROLLUP_1M = PartitionedTable("fleet_schedulerrollup_1m", "day", "ROLLUP_1M_RETENTION_DAYS")
# More than any valid write needs at once: a week of days ahead of the beat's three, plus late
# samples within the ingest window and rollups within their retention are made day by day.
MAX_NEW_PARTITIONS = 45
TABLES = (
    SAMPLES,
    SERVING_SAMPLES,
    GPU_ROLLUP_1M,
    GROUP_ROLLUP_1M,
    GPU_ROLLUP_1H,
    GROUP_ROLLUP_1H,
    SERVING_ROLLUP_1M,
    SERVING_ROLLUP_1H,
    PORT_SAMPLES,
    PORT_ROLLUP_1M,
    FABRIC_ROLLUP_1M,
    MOUNT_SAMPLES,
    MOUNT_ROLLUP_1M,
    DISK_SAMPLES,
    DISK_ROLLUP_1M,
    SCHEDULER_SAMPLES,
    SCHEDULER_ROLLUP_1M,
)

# Partitions this process has seen exist. Only a hint: a writer that hits a missing partition
# forgets the hint and makes it (see is_missing_partition).
_known: set[str] = set()


def existing_partitions(table: PartitionedTable) -> dict[str, tuple[datetime, datetime]]:
    """Partition name -> (start, end) as PostgreSQL has them."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = %s::regclass
            """,
            [table.name],
        )
        rows = cursor.fetchall()
    bounds = {}
    for name, expr in rows:
        # FOR VALUES FROM ('2026-11-29 00:00:00+00') TO ('2026-11-30 00:00:00+00')
        lo, hi = (part.split("'")[1] for part in expr.split(" TO "))
        bounds[name] = (datetime.fromisoformat(lo), datetime.fromisoformat(hi))
    return bounds


class TooManyPartitions(ValueError):
    """A write would create more partitions at once than any valid data needs: the data's fault
    (a timestamp far outside the window), never an outage to retry."""


def ensure_partitions(table: PartitionedTable, first: datetime, last: datetime) -> list[str]:
    """Make sure partitions cover [first, last]; return the names created.

    Bounded: a span that would need more than MAX_NEW_PARTITIONS new partitions is refused
    before anything is created. Valid data never needs that many (the ingest doors accept a
    bounded window of time); a bad timestamp must not create a partition per day since 1970,
    which in one transaction exhausts PostgreSQL's shared lock table for every database on the
    server.
    """
    starts = []
    start = table.start_of(first)
    while start <= last:
        if table.partition_name(start) not in _known:
            starts.append(start)
            if len(starts) > MAX_NEW_PARTITIONS:
                raise TooManyPartitions(
                    f"{table.name}: {first.isoformat()} to {last.isoformat()} needs more than "
                    f"{MAX_NEW_PARTITIONS} new partitions; refused"
                )
        start = table.next_start(start)
    return _create_partitions(table, starts)


def ensure_partitions_for(table: PartitionedTable, moments: Iterable[datetime]) -> list[str]:
    """Make sure the partitions holding these moments exist (and no others between them)."""
    starts = sorted({table.start_of(m) for m in moments})
    starts = [s for s in starts if table.partition_name(s) not in _known]
    if len(starts) > MAX_NEW_PARTITIONS:
        raise TooManyPartitions(f"{table.name}: {len(starts)} new partitions needed at once; refused")
    return _create_partitions(table, starts)


def _create_partitions(table: PartitionedTable, starts: list[datetime]) -> list[str]:
    created = []
    for start in starts:
        name = table.partition_name(start)
        if name not in _known:
            # The owner's function makes it (fleet migration 0024): the console's role owns no
            # table and may create nothing in the schema.
            with connection.cursor() as cursor:
                cursor.execute("SELECT goodput_create_partition(%s, %s, %s)", [table.name, table.interval, start])
                if cursor.fetchone()[0]:
                    created.append(name)
            _known.add(name)
    if created:
        logger.info("created partitions %s", ", ".join(created))
    return created


def forget_known_partitions() -> None:
    _known.clear()


def is_missing_partition(exc: BaseException) -> bool:
    """True for PostgreSQL's 'no partition of relation ... found for row'."""
    return "no partition of relation" in str(exc)


def write_with_partitions(table: PartitionedTable, first: datetime, last: datetime, write: Callable[[], T]) -> T:
    """Make the partitions [first, last] needs (outside the write's transaction: creating one
    locks the parent table), then write. If another process (retention, a test's rollback)
    removed a partition this process believed in, forget what it believed and try once more."""
    return write_with_partitions_of([(table, first, last)], write)


def write_with_partitions_of(spans: Sequence[tuple[PartitionedTable, datetime, datetime]], write: Callable[[], T]) -> T:
    """write_with_partitions for a write into several tables: each (table, first, last)."""
    from fleet.inventory import directory

    for attempt in (1, 2):
        for table, first, last in spans:
            ensure_partitions(table, first, last)
        try:
            return write()
        except (DatabaseError, psycopg.Error) as exc:  # COPY runs on the raw psycopg cursor
            if attempt == 2 or not is_missing_partition(exc):
                raise
            forget_known_partitions()
            directory.clear()  # ids cached during the rolled-back attempt may not exist
    raise AssertionError("unreachable")


def make_partitions_ahead(*, days: int = 3, now: datetime | None = None) -> list[str]:
    """Create today's and the next ``days`` days' partitions of every table (the beat task)."""
    now = now or datetime.now(UTC)
    forget_known_partitions()  # check the database itself, not this process's memory of it
    created: list[str] = []
    for table in TABLES:
        created += ensure_partitions(table, now, now + timedelta(days=days))
    return created


def drop_expired_partitions(*, now: datetime | None = None) -> list[dict[str, object]]:
    """Drop every partition whose whole range is older than its table's retention; record each drop."""
    from fleet.telemetry.models import PartitionDrop

    now = now or datetime.now(UTC)
    dropped = []
    for table in TABLES:
        cutoff = now - table.retention
        for name, (start, end) in sorted(existing_partitions(table).items()):
            if end > cutoff:
                continue
            with transaction.atomic(), connection.cursor() as cursor:
                # The owner's function counts, sizes and drops it (fleet migration 0024).
                cursor.execute("SELECT dropped_rows, dropped_bytes FROM goodput_drop_partition(%s)", [name])
                rows, size = cursor.fetchone()
                record = PartitionDrop.objects.create(
                    table=table.name,
                    partition=name,
                    range_start=start,
                    range_end=end,
                    rows=rows,
                    bytes=size,
                )
            _known.discard(name)
            logger.info("retention dropped %s (%s to %s, %d rows)", name, start.date(), end.date(), rows)
            dropped.append({"partition": record.partition, "rows": record.rows})
    return dropped
