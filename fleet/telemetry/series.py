"""Narrow series (node_exporter's ports, mounts and disks; scheduler queues): the writer the
fabric, storage and scheduler rooms share, in the GPU samples' shape. Batch keys are claimed
first, the values go in by binary COPY into a day-partitioned table, and the 1-minute rollups are
recomputed from raw: counters as increases between consecutive samples, as Prometheus
``increase()`` counts them (a value below the previous one is a reset: the new value counts from
zero), gauges as their minimum, maximum and last value.

Where the rollups are recomputed depends on the table's volume. The node tables (a few hundred
values a node a scrape) queue the minutes they wrote (``fleet_noderollupdirty``, as the GPU
samples queue theirs) and ``update_node_rollups``, a beat task every few seconds, folds each
queued minute once for every series in it: one statement a table and run of minutes, instead of
one a push recomputing each minute again at every scrape. The scheduler's queues (a few series a
cluster) roll the minutes they wrote in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec
from django.db import connection, transaction
from django.utils import timezone

from console import counters
from fleet.choices import ClaimKind
from fleet.inventory import claims, directory
from fleet.inventory.models import Node
from fleet.telemetry import partitions
from fleet.telemetry.store import claim_batch_keys

logger = logging.getLogger(__name__)

LOOKBACK = timedelta(minutes=10)  # how far back a minute's first sample looks for the one before it
NODE_LOCK_KEY = 0x60_0D_9C_8  # advisory lock: one node rollup run at a time across workers


class NodeSeries(NamedTuple):
    """How one node_exporter series maps (the spec of a fleet.exporters NODE entry: fabric's and
    storage's mappings.py)."""

    collector: str  # infiniband, netdev, filesystem, mountstats, disk
    quantity: str  # what it is stored as
    counter: bool


class NodePoint(msgspec.Struct, frozen=True):
    """One node_exporter value as the door read it: which collector, the labels that name what it
    measures (``device``/``port`` for a port, ``device``/``mountpoint``/``fstype`` for a mount,
    ``device`` for a disk, ``device`` = the NFS export for a mount's mountstats), the quantity it
    maps to, and when. A msgspec Struct: the door makes hundreds a push, and the queue carries
    them (fleet.ingest.prometheus.packed)."""

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
    # Wraps the rollup upsert into the statement the writer runs (the ports: fleet.fabric.read.summaries).
    wrap_rollup: Callable[[str, str], str] | None = None
    # Tables the wrapped statement writes into, partitioned by minute like the rollup.
    also_partitions: tuple[partitions.PartitionedTable, ...] = ()
    # The dirty-minute queue its rollups are folded from (update_node_rollups), with the live
    # topic that follows them; None: rolled in the writer's transaction.
    queue: str | None = None
    topic: str = ""

    def rollup_sql(self, scope: str) -> str:
        """Recompute the minutes from ``first`` to the one after ``last`` of the series ``scope``
        selects (``series_scope``). A minute's first increase starts from the series' value before it:
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
    WHERE {scope} AND ts >= %(first)s AND ts < %(last)s + interval '2 minutes'
), before AS (
    SELECT DISTINCT ON ({using}) {using}, last AS prev
    FROM {self.rollup.name}
    WHERE {scope} AND bucket >= %(first)s - %(lookback)s AND bucket < %(first)s
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

    def series_scope(self) -> str:
        """The series a rollup statement recomputes: those the write touched (``ids``), or every
        series with samples in the span for a queued table."""
        return "true" if self.queue else f"{self.keys[0]} = ANY(%(ids)s)"


def site_nodes(site_id: int, hostnames: Iterable[str]) -> dict[str, int]:
    """hostname -> node id for this site's nodes, registering the unknown ones under the site (as
    the GPU writer does). A node of another site is left out: its series are not written (the
    sighting is a claim, recorded once a push by store_parts: claim_foreign_nodes)."""
    wanted = sorted(set(hostnames))
    found = directory.nodes(wanted)
    missing = [h for h in wanted if h not in found]
    if missing:
        Node.objects.bulk_create([Node(site_id=site_id, hostname=h) for h in missing], ignore_conflicts=True)
        found.update(directory.nodes(missing, remember=False))
    return {h: node_id for h, (node_id, node_site) in found.items() if node_site == site_id}


def claim_foreign_nodes(site_id: int, hostnames: Iterable[str]) -> dict[str, claims.Held]:
    """Record this site's sightings of hostnames registered under another site as claims
    (fleet.inventory.claims), exactly as the GPU samples' door records them, and return those
    hostnames with why each is held: their series are held back (site_nodes leaves them out),
    the rest of the push is written, and an Admin keeps the node with its owner or moves it here.

    The ingest door calls it first (fleet.ingest.prometheus.check_node_scope: it takes the
    series out and says so); the writer again, for a node registered elsewhere meanwhile."""
    found = directory.nodes(set(hostnames))
    foreign = {h for h, (_, node_site) in found.items() if node_site != site_id}
    if not foreign:
        return {}
    directory.forget(hostnames=foreign)  # cached: read them again, in case they moved here since
    owners = {h: node_site for h, (_, node_site) in directory.nodes(foreign).items() if node_site != site_id}
    held = claims.sighted(site_id, [claims.Sighting(ClaimKind.HOSTNAME, h, owner) for h, owner in owners.items()])
    return {value: why for (_, value), why in held.items()}


@dataclass
class Part:
    """One table's share of a push: the rows ``rows()`` builds (in the write's transaction: it
    registers what it names, nodes, interfaces, mounts) as ``(*keys, ts, quantity, value)``,
    under its own batch key; ``after`` runs once they are committed."""

    table: SeriesTable
    batch_key: str
    stamps: Sequence[datetime]
    rows: Callable[[], list[tuple]]
    after: Callable[[], None] | None = None
    hostnames: frozenset[str] = frozenset()  # the nodes its rows name: another site's are claims


def store_series(
    table: SeriesTable,
    *,
    site_id: int,
    batch_key: str,
    stamps: Sequence[datetime],
    rows: Callable[[], list[tuple]],
) -> int:
    """Claim ``batch_key``, then write the rows ``rows()`` builds in the same transaction; return
    the rows written (0 for a redelivery)."""
    return store_parts(site_id=site_id, parts=[Part(table, batch_key, stamps, rows)])


def store_parts(*, site_id: int, parts: Sequence[Part]) -> int:
    """Write several tables' parts (of one push, or of a fold of pushes) in one transaction: claim
    their keys in one statement, record the fresh parts' sightings of other sites' nodes as claims
    (claim_foreign_nodes), then COPY the fresh parts' rows, one statement a table, and queue or
    roll their minutes. A part whose key is taken (a redelivery) is skipped; return the rows
    written."""
    parts = [p for p in parts if p.stamps]
    if not parts:
        return 0
    spans = [(p.table.samples, min(p.stamps), max(p.stamps)) for p in parts]
    for part, (_, first, last) in zip(parts, spans, strict=True):
        if not part.table.queue:
            for rollup in (part.table.rollup, *part.table.also_partitions):
                partitions.ensure_partitions(rollup, first, last + timedelta(minutes=1))

    def write() -> tuple[int, list[Part]]:
        with transaction.atomic():
            fresh = claim_batch_keys([(p.batch_key, site_id, len(p.stamps), None) for p in parts])
            written = [p for p in parts if p.batch_key in fresh]
            # Once a fold (not once a part, nor again on a redelivery): another site's hostnames.
            claim_foreign_nodes(site_id, {h for p in written for h in p.hostnames})
            # One COPY a table for every fresh part (a fold of pushes holds several a table).
            by_table: dict[str, tuple[SeriesTable, list[tuple]]] = {}
            for part in written:
                by_table.setdefault(part.table.samples.name, (part.table, []))[1].extend(part.rows())
            total = 0
            queued: dict[str, set[datetime]] = {}
            for table, values in by_table.values():
                if not values:
                    continue
                _copy(table, values)
                if table.queue:
                    n = len(table.keys)
                    queued.setdefault(table.queue, set()).update(row[n] for row in values)
                else:
                    _roll(table, values)
                total += len(values)
            if queued:
                _mark_minutes(queued)
            return total, written

    stored, written = partitions.write_with_partitions_of(spans, write)
    for part in written:
        if part.after:
            part.after()
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
    _roll_span(
        table,
        min(stamps).replace(second=0, microsecond=0),
        max(stamps).replace(second=0, microsecond=0),
        ids=sorted({row[0] for row in values}),
    )


def _roll_span(table: SeriesTable, first: datetime, last: datetime, *, ids: list[int] | None = None) -> None:
    sql = table.rollup_sql(table.series_scope())
    if table.wrap_rollup:
        sql = table.wrap_rollup(sql, table.series_scope())
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {"ids": ids, "first": first, "last": last, "lookback": LOOKBACK, "counters": sorted(table.counters)},
        )


# --- the queued tables' rollups ------------------------------------------------------------------

QUEUED: dict[str, SeriesTable] = {}


def queued(table: SeriesTable) -> SeriesTable:
    """Register a table whose rollups update_node_rollups folds (its module calls this once)."""
    assert table.queue, table
    QUEUED[table.queue] = table
    return table


def _mark_minutes(stamps: dict[str, set[datetime]]) -> None:
    """Queue the minutes these rows fall in (queue -> their times), in one statement; last in the
    write's transaction, so the rollup task cannot claim a minute between our write and our
    commit and miss our rows (the upsert holds the minute's row until we commit). In key order:
    two writers marking the same minutes never wait on each other in a cycle."""
    pairs = sorted({(queue, ts.replace(second=0, microsecond=0)) for queue, times in stamps.items() for ts in times})
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_noderollupdirty (series, bucket, dirtied_at) "
            "SELECT s, b, now() FROM unnest(%s::text[], %s::timestamptz[]) AS m(s, b) "
            "ON CONFLICT (series, bucket) DO UPDATE SET dirtied_at = EXCLUDED.dirtied_at",
            [[q for q, _ in pairs], [b for _, b in pairs]],
        )


def _runs(minutes: list[datetime]) -> list[tuple[datetime, datetime]]:
    """Sorted minutes as runs of consecutive ones: (first, last) each."""
    runs: list[tuple[datetime, datetime]] = []
    for minute in minutes:
        if runs and minute - runs[-1][1] <= timedelta(minutes=1):
            runs[-1] = (runs[-1][0], minute)
        else:
            runs.append((minute, minute))
    return runs


def update_node_rollups(*, now: datetime | None = None) -> dict[str, int]:
    """Fold every queued minute of every queued table into its 1-minute rollups (and what the
    table's statement keeps beside them: the fabric page's read model); return the minutes folded
    per table. Each table in its own transaction: a failure leaves its minutes queued."""
    from console import live

    done: dict[str, int] = {}
    for name, table in QUEUED.items():
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", [NODE_LOCK_KEY, name])
                if not cursor.fetchone()[0]:
                    continue  # another worker is folding this table right now
                cursor.execute("DELETE FROM fleet_noderollupdirty WHERE series = %s RETURNING bucket", [name])
                minutes = sorted(row[0] for row in cursor.fetchall())
            at = now or timezone.now()
            kept = [m for m in minutes if at - table.rollup.retention <= m <= at + timedelta(days=1)]
            if len(kept) < len(minutes):
                skipped = len(minutes) - len(kept)
                logger.warning("node rollups: %d %s minute(s) outside retention or ahead skipped", skipped, name)
            for first, last in _runs(kept):
                for rollup in (table.rollup, *table.also_partitions):
                    partitions.ensure_partitions(rollup, first, last + timedelta(minutes=1))
                _roll_span(table, first, last)
            if kept and table.topic:
                topic = table.topic
                transaction.on_commit(lambda topic=topic: live.request_push(*live.watched([topic])))
        done[name] = len(kept)
    return done
