"""Narrow node series (node_exporter's ports, mounts and disks): the writer the fabric and storage
rooms share, in the GPU samples' shape. Batch keys are claimed first, the values go in by binary
COPY into a day-partitioned table, and the 1-minute rollup of the series touched is recomputed
from raw in the same transaction: counters as increases between consecutive samples, as
Prometheus ``increase()`` counts them (a value below the previous one is a reset: the new value
counts from zero), gauges as their minimum, maximum and last value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from console import counters
from fleet.inventory import directory
from fleet.inventory.models import Node
from fleet.telemetry import partitions
from fleet.telemetry.store import claim_batch_keys

LOOKBACK = timedelta(minutes=10)  # how far back a minute's first sample looks for the one before it


@dataclass(frozen=True)
class NodePoint:
    """One node_exporter value as the door read it: which collector, the labels that name what it
    measures (``device``/``port`` for a port, ``device``/``mountpoint``/``fstype`` for a mount,
    ``device`` for a disk, ``device`` = the NFS export for a mount's mountstats), the quantity it
    maps to, and when."""

    hostname: str
    source: str  # infiniband, netdev, filesystem, mountstats, disk
    quantity: str
    ts: datetime
    value: float
    device: str = ""
    port: str = ""
    mountpoint: str = ""
    fstype: str = ""


@dataclass(frozen=True)
class SeriesTable:
    samples: partitions.PartitionedTable
    rollup: partitions.PartitionedTable
    keys: tuple[str, ...]  # the columns naming one series, before (ts, quantity, value)
    key_types: tuple[str, ...]
    counters: frozenset[str]  # the quantities that are counters (the rest are gauges)
    # Wraps the rollup upsert into the statement the writer runs (the ports: fleet.fabric.readmodel).
    wrap_rollup: Callable[[str], str] | None = None
    # Tables the wrapped statement writes into, partitioned by minute like the rollup.
    also_partitions: tuple[partitions.PartitionedTable, ...] = ()

    def rollup_sql(self) -> str:
        """Recompute the minutes from ``first`` to the one after ``last`` of the series whose first
        key is in ``ids``. A minute's first increase starts from the series' value before it:
        the raw sample before it within the span, or else the ``last`` of the series' latest
        minute before ``first`` (within ``lookback``), which is that sample's value: every write
        recomputes its minutes and the next. Reading that one rollup row a series, not its raw
        samples over the lookback, makes a push read a few rows a series instead of some forty."""
        keys = ", ".join(self.keys)
        using = ", ".join((*self.keys, "quantity"))
        return f"""
WITH s AS (
    SELECT {keys}, quantity, ts, value,
           lag(value) OVER (PARTITION BY {keys}, quantity ORDER BY ts) AS prev
    FROM {self.samples.name}
    WHERE {self.keys[0]} = ANY(%(ids)s) AND ts >= %(first)s AND ts < %(last)s + interval '2 minutes'
), before AS (
    SELECT DISTINCT ON ({using}) {using}, last AS prev
    FROM {self.rollup.name}
    WHERE {self.keys[0]} = ANY(%(ids)s) AND bucket >= %(first)s - %(lookback)s AND bucket < %(first)s
    ORDER BY {using}, bucket DESC
), v AS (
    SELECT s.{", s.".join(self.keys)}, s.quantity, s.ts, s.value, coalesce(s.prev, before.prev) AS prev
    FROM s LEFT JOIN before USING ({using})
)
INSERT INTO {self.rollup.name} ({keys}, quantity, bucket, samples, increase, min, max, last)
SELECT {keys}, quantity, date_trunc('minute', ts), count(*),
       CASE WHEN quantity = ANY(%(counters)s)
            THEN sum(CASE WHEN prev IS NULL THEN 0 WHEN value >= prev THEN value - prev ELSE value END) END,
       min(value), max(value), (array_agg(value ORDER BY ts DESC))[1]
FROM v
GROUP BY {keys}, quantity, date_trunc('minute', ts)
ON CONFLICT ({keys}, quantity, bucket) DO UPDATE SET samples = EXCLUDED.samples,
    increase = EXCLUDED.increase, min = EXCLUDED.min, max = EXCLUDED.max, last = EXCLUDED.last
"""


def site_nodes(site_id: int, hostnames: Iterable[str]) -> dict[str, int]:
    """hostname -> node id for this site's nodes, registering the unknown ones under the site (as
    the GPU writer does). A node of another site is left out: its series are not written."""
    wanted = sorted(set(hostnames))
    found = directory.nodes(wanted)
    missing = [h for h in wanted if h not in found]
    if missing:
        Node.objects.bulk_create([Node(site_id=site_id, hostname=h) for h in missing], ignore_conflicts=True)
        found.update(directory.nodes(missing, remember=False))
    return {h: node_id for h, (node_id, node_site) in found.items() if node_site == site_id}


def store_series(
    table: SeriesTable,
    *,
    site_id: int,
    batch_key: str,
    stamps: Sequence[datetime],
    rows: Callable[[], list[tuple]],
) -> int:
    """Claim ``batch_key``, then write the rows ``rows()`` builds in the same transaction (it
    registers what it names: nodes, interfaces, mounts) as ``(*keys, ts, quantity, value)``;
    return the rows written (0 for a redelivery)."""
    if not stamps:
        return 0
    first, last = min(stamps), max(stamps)
    for rollup in (table.rollup, *table.also_partitions):
        partitions.ensure_partitions(rollup, first, last + timedelta(minutes=1))

    def write() -> int:
        with transaction.atomic():
            if not claim_batch_keys([(batch_key, site_id, len(stamps), None)]):
                return 0
            values = rows()
            if not values:
                return 0
            _copy(table, values)
            _roll(table, values)
            return len(values)

    stored = partitions.write_with_partitions(table.samples, first, last, write)
    if stored:
        counters.increment("goodput_ingest_samples_stored_total", stored)
    return stored


def _copy(table: SeriesTable, values: list[tuple]) -> None:
    columns = ", ".join((*table.keys, "ts", "quantity", "value"))
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
        with raw.copy(f"COPY {table.samples.name} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types([*table.key_types, "timestamptz", "text", "float8"])
            for row in values:
                copy.write_row(row)


def _roll(table: SeriesTable, values: list[tuple]) -> None:
    """Recompute the minutes these rows fall in, and the minute after (its first increase starts
    from them when they came late), for the series they belong to."""
    n = len(table.keys)
    stamps = [row[n] for row in values]
    sql = table.rollup_sql()
    with connection.cursor() as cursor:
        cursor.execute(
            table.wrap_rollup(sql) if table.wrap_rollup else sql,
            {
                "ids": sorted({row[0] for row in values}),
                "first": min(stamps).replace(second=0, microsecond=0),
                "last": max(stamps).replace(second=0, microsecond=0),
                "lookback": LOOKBACK,
                "counters": sorted(table.counters),
            },
        )
