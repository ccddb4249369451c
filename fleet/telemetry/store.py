"""Writing GPU telemetry. ``store_gpu_batches`` is the one writer: every door (JSON batches through
the ingest stream, Prometheus pushes, scrapes through ``store_gpu_samples``) ends here, so its
insides can change without touching the doors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, repeat
from typing import Any

from django.db import connection, transaction

from console import counters, live
from console.pgcopy import copy_formatted
from fleet.inventory import directory
from fleet.inventory.models import Gpu, Node
from fleet.telemetry import copyrows, partitions
from fleet.telemetry.copyrows import SAMPLE_COLUMNS, SampleRows
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS, hostname_of, parent_of, ts_of, uuid_of
from fleet.telemetry.models import IngestBatch
from fleet.telemetry.read import figures

_COPY_SAMPLES = f"COPY {partitions.SAMPLES.name} ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)"


@dataclass(frozen=True)
class PendingBatch:
    """One validated batch on its way into the database: its site, idempotency key, and either
    its samples (GpuSampleIn or GpuSampleRow structs: same field names, same order) or, from the
    JSON door, the same samples already formatted as COPY rows of registered GPUs (copyrows)."""

    site_id: int
    key: str
    samples: Sequence[Any] = ()
    enqueued_at: datetime | None = None
    rows: SampleRows | None = None

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.samples)

    def stamps(self) -> Sequence[datetime]:
        return self.rows.index.stamps if self.rows is not None else list(map(ts_of, self.samples))


def store_gpu_samples(
    *, site_id: int, batch_key: str, samples: Sequence[Any], enqueued_at: datetime | None = None
) -> int:
    """Store one validated batch atomically; return the number of samples written (0: a redelivery)."""
    return store_gpu_batches([PendingBatch(site_id, batch_key, samples, enqueued_at)])


def store_gpu_batches(batches: Sequence[PendingBatch]) -> int:
    """Store several validated batches in one transaction; return the samples written.

    A batch whose key is already recorded (a redelivery) is skipped and the others are written.
    Folding batches is what makes the queue cheap: one commit, one state upsert per GPU and one
    dirty-minute upsert for the lot, instead of one of each per batch.
    """
    unique: dict[str, PendingBatch] = {}
    for batch in batches:  # two copies of one batch (a retry queued beside the first): write one
        if len(batch):
            unique.setdefault(batch.key, batch)
    batches = list(unique.values())
    if not batches:
        return 0
    stamps: set[datetime] = set().union(*(b.stamps() for b in batches))  # a batch is a few ticks
    stored = partitions.write_with_partitions(
        partitions.SAMPLES, min(stamps), max(stamps), lambda: _store(batches, stamps)
    )
    if stored:
        counters.increment("goodput_ingest_samples_stored_total", stored)
    return stored


def _store(batches: list[PendingBatch], stamps: set[datetime]) -> int:
    """1. claim the batch keys, 2. rows of this site's GPUs only (registering new GPUs of batches
    that come as samples), 3. COPY, 4. latest state, 5. dirty rollup buckets."""
    with transaction.atomic():
        fresh = _claim_batches(batches)
        batches = [b for b in batches if b.key in fresh]
        formatted = _own_rows([b for b in batches if b.rows is not None])
        formatted.update(_format_samples(_own_samples([b for b in batches if b.rows is None])))
        rows = [formatted[b.key] for b in batches if len(formatted.get(b.key, ()))]  # in queue order
        if not rows:
            return 0
        with connection.cursor() as cursor:
            _copy_samples(cursor.cursor, rows)  # the psycopg cursor under Django's
            _upsert_latest_state(cursor.cursor, rows)
        mark_dirty_minutes(stamps)  # of every batch: a redelivery's minutes are marked again, harmlessly
        # The fleet page always; a GPU's or node's page only while one is watching (one cache read).
        topics = ["fleet", *live.watched(["power"])]  # the power page too, while one follows it
        gpu_ids = set(chain.from_iterable(r.index.gpu_ids for r in rows))
        transaction.on_commit(lambda: live.request_push(*topics, *figures.watched_topics(gpu_ids)))
    return sum(map(len, rows))


def _own_rows(batches: list[PendingBatch]) -> dict[str, SampleRows]:
    """Each batch's rows (by key) of GPUs its site still holds. The door checked the site of each GPU
    before formatting its rows; a GPU moved to another site or deleted since is read here, in
    one query a site, and its rows are dropped."""
    wanted: dict[int, set[int]] = {}
    for batch in batches:
        wanted.setdefault(batch.site_id, set()).update(batch.rows.index.gpu_ids)  # type: ignore[union-attr]
    gone: dict[int, set[int]] = {}
    with connection.cursor() as cursor:
        for site_id, ids in wanted.items():
            cursor.execute(
                f"SELECT g.id FROM {Gpu._meta.db_table} g JOIN {Node._meta.db_table} n ON n.id = g.node_id "
                "WHERE g.id = ANY(%s) AND n.site_id = %s",
                [list(ids), site_id],
            )
            held = {row[0] for row in cursor.fetchall()}
            if len(held) < len(ids):
                gone[site_id] = ids - held
    return {
        b.key: copyrows.without(b.rows, gone[b.site_id]) if b.site_id in gone else b.rows  # type: ignore[misc]
        for b in batches
    }


def _format_samples(batches: list[PendingBatch]) -> dict[str, SampleRows]:
    """Batches that came as samples, as rows (by key): their GPUs resolved to ids (registered if new)."""
    if not batches:
        return {}
    gpu_ids = _resolve_gpus(batches)
    formatted = {}
    for batch in batches:
        ids = list(map(gpu_ids.get, map(uuid_of, batch.samples)))
        samples = batch.samples
        if None in ids:  # samples of GPUs without an id (another site's, raced at the edge)
            kept = [(gpu_id, sample) for gpu_id, sample in zip(ids, samples, strict=True) if gpu_id is not None]
            ids, samples = [gpu_id for gpu_id, _ in kept], [sample for _, sample in kept]
        formatted[batch.key] = copyrows.format_samples(ids, samples)  # type: ignore[arg-type]
    return formatted


def _own_samples(batches: list[PendingBatch]) -> list[PendingBatch]:
    """Each batch with only the samples its site may write. The doors hold back another site's
    GPUs and nodes (fleet.inventory.claims); this catches what they cannot: a Prometheus push
    parsed again by the worker, and a node or GPU moved between the check and the write."""
    gpus: dict[str, tuple[int, int]] = {}
    nodes: dict[str, tuple[int, int]] = {}

    def foreign(batch: PendingBatch) -> tuple[set[str], set[str]]:
        site = batch.site_id
        uuids = {*map(uuid_of, batch.samples), *map(parent_of, batch.samples)}
        uuids.discard(None)
        hostnames = set(map(hostname_of, batch.samples))
        gpus.update(directory.gpus(uuids - gpus.keys()))
        nodes.update(directory.nodes(hostnames - nodes.keys()))
        return {u for u in uuids if u in gpus and gpus[u][1] != site}, {
            h for h in hostnames if h in nodes and nodes[h][1] != site
        }

    found = [foreign(b) for b in batches]
    if not any(u or h for u, h in found):
        return batches
    # Cached entries may predate a move: read the foreign ones again before dropping anything.
    stale_uuids = set().union(*(u for u, _ in found))
    stale_hosts = set().union(*(h for _, h in found))
    directory.forget(uuids=stale_uuids, hostnames=stale_hosts)
    for key in stale_uuids:
        gpus.pop(key, None)
    for key in stale_hosts:
        nodes.pop(key, None)
    out = []
    for batch in batches:
        uuids, hostnames = foreign(batch)
        kept = [
            s
            for s in batch.samples
            if s.gpu_uuid not in uuids and s.parent_uuid not in uuids and s.hostname not in hostnames
        ]
        if kept:
            out.append(batch if len(kept) == len(batch.samples) else dataclasses.replace(batch, samples=kept))
    return out


def _claim_batches(batches: Sequence[PendingBatch]) -> set[str]:
    return claim_batch_keys([(b.key, b.site_id, len(b), b.enqueued_at) for b in batches])


def claim_batch_keys(claims: Sequence[tuple[str, int, int, datetime | None]]) -> set[str]:
    """Record (key, site id, samples, enqueued at) rows in one statement, in the caller's
    transaction; return the keys that were new (the others are redeliveries).

    Two writers folding the same batch (a redelivery racing its first run) meet on the key's
    unique index: the second waits for the first to commit, then finds the key taken.
    """
    keys, sites, counts, enqueued = zip(*claims, strict=True) if claims else ((), (), (), ())
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {IngestBatch._meta.db_table} (key, site_id, samples, enqueued_at, received_at) "
            "SELECT k, s, n, e, now() FROM unnest(%s::text[], %s::int8[], %s::int4[], %s::timestamptz[]) "
            "AS b(k, s, n, e) ORDER BY k ON CONFLICT (key) DO NOTHING RETURNING key",
            [list(keys), list(sites), list(counts), list(enqueued)],
        )
        return {row[0] for row in cursor.fetchall()}


def _resolve_gpus(batches: Sequence[PendingBatch]) -> dict[str, int]:
    """Map GPU UUIDs to ids, registering unknown nodes and GPUs under their batch's site.

    The lookup runs before this transaction registers anything, so the directory cache only ever
    remembers committed rows; what is registered here is looked up with remember=False (a
    rollback would leave the cache pointing at ids that never existed).
    """
    uuids = set().union(*(map(uuid_of, batch.samples) for batch in batches))
    known = {u: gpu_id for u, (gpu_id, _) in directory.gpus(uuids).items()}
    if len(known) == len(uuids):  # the usual fold: every GPU registered
        return known
    by_uuid: dict[str, tuple[int, Any]] = {}
    for batch in reversed(batches):  # backwards, so each UUID keeps its first sample
        samples = batch.samples[::-1]
        by_uuid.update(zip(map(uuid_of, samples), zip(repeat(batch.site_id), samples), strict=True))
    missing = [(site_id, s) for u, (site_id, s) in by_uuid.items() if u not in known]
    for site_id in sorted({site_id for site_id, _ in missing}):
        known.update(_register_site_gpus(site_id, [s for site, s in missing if site == site_id]))
    return known


def _register_site_gpus(site_id: int, missing: list[Any]) -> dict[str, int]:
    hostnames = sorted({s.hostname for s in missing})
    Node.objects.bulk_create([Node(site_id=site_id, hostname=h) for h in hostnames], ignore_conflicts=True)
    created_nodes = directory.nodes(hostnames, remember=False)
    node_ids = {h: node_id for h, (node_id, node_site) in created_nodes.items() if node_site == site_id}
    registered: dict[str, int] = {}
    # Physical GPUs first, so the MIG instances in the same batch find their parent.
    for group in ([s for s in missing if not s.parent_uuid], [s for s in missing if s.parent_uuid]):
        if group:
            registered.update(_register_gpus(group, node_ids))
    return registered


def _register_gpus(samples: list[Any], node_ids: dict[str, int]) -> dict[str, int]:
    parents = {s.parent_uuid for s in samples if s.parent_uuid}
    parent_ids = {u: gpu_id for u, (gpu_id, _) in directory.gpus(parents, remember=False).items()}
    new_gpus = []
    for sample in samples:
        node_id = node_ids.get(sample.hostname)
        if node_id is None:  # the hostname belongs to another site (checked at the edge; raced here)
            continue
        hbm = None
        if sample.fb_used_mib is not None and sample.fb_free_mib is not None:
            hbm = round((sample.fb_used_mib + sample.fb_free_mib) / 1024)
        new_gpus.append(
            Gpu(
                node_id=node_id,
                uuid=sample.gpu_uuid,
                index=sample.gpu_index or 0,
                model=sample.model or "",
                hbm_gib=hbm,
                parent_id=parent_ids.get(sample.parent_uuid or ""),
                mig_profile=sample.mig_profile or "",
                mig_instance_id=sample.mig_instance_id,
            )
        )
    # Sorted inserts keep lock order stable when two workers register overlapping GPUs.
    Gpu.objects.bulk_create(sorted(new_gpus, key=lambda g: g.uuid), ignore_conflicts=True)
    created = directory.gpus((g.uuid for g in new_gpus), remember=False)
    return {u: gpu_id for u, (gpu_id, _) in created.items()}


def _copy_samples(cursor: Any, rows: Sequence[SampleRows]) -> None:
    """Binary COPY, the fastest way into PostgreSQL and the reason there is no ORM here, of rows
    formatted before (copyrows): no Python step a sample."""
    copy_formatted(cursor, _COPY_SAMPLES, [r.data for r in rows])


# The state table's floats are double precision; its rows come as the sample table's reals. Each
# goes through its shortest text form (PostgreSQL's float4 output), so 71.3 sent is 71.3 in the
# state, not 71.30000305175781, and the state is the newest sample as stored.
_STATE_VALUES = ", ".join(
    ["gpu_id", "ts", *(f"{f.name}::text::float8" if f.kind is float else f.name for f in GPU_SAMPLE_FIELDS)]
)


def _upsert_latest_state(cursor: Any, rows: Sequence[SampleRows]) -> None:
    """Each GPU's newest row becomes its state, never moving the state back in time.

    The rows go by binary COPY into a temporary table, then one INSERT ... ON CONFLICT: binding a
    thousand rows of 28 columns as parameters costs more than the COPY of the samples themselves.
    """
    newest = copyrows.newest_rows(rows)  # sorted by GPU id: concurrent writers lock in one order
    if not newest:
        return
    columns = ", ".join(SAMPLE_COLUMNS)
    assignments = ", ".join(f"{c} = EXCLUDED.{c}" for c in SAMPLE_COLUMNS[1:])
    # One per connection (pooled connections keep it), emptied before each use. TRUNCATE, not
    # DELETE: autovacuum never visits temporary tables, so deleted rows would pile up.
    cursor.execute(
        "CREATE TEMP TABLE IF NOT EXISTS goodput_state_rows AS "
        f"SELECT {columns} FROM {partitions.SAMPLES.name} WITH NO DATA"
    )
    cursor.execute("TRUNCATE goodput_state_rows")
    copy_formatted(cursor, f"COPY goodput_state_rows ({columns}) FROM STDIN (FORMAT BINARY)", [b"".join(newest)])
    cursor.execute(
        f"INSERT INTO fleet_gpustate ({columns}, updated_at) "
        f"SELECT {_STATE_VALUES}, now() FROM goodput_state_rows ORDER BY gpu_id "
        f"ON CONFLICT (gpu_id) DO UPDATE SET {assignments}, updated_at = EXCLUDED.updated_at "
        "WHERE fleet_gpustate.ts <= EXCLUDED.ts"
    )


def mark_dirty_minutes(timestamps: Any) -> None:
    """Queue the minutes these samples fall in for the rollup task.

    Run last in the batch's transaction: the upsert locks the bucket's row until commit, so the
    rollup task cannot claim the bucket between our write and our commit and miss our samples.
    """
    minutes = sorted({ts.replace(second=0, microsecond=0) for ts in set(timestamps)})
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_rollupdirty (resolution, bucket, dirtied_at) "
            "SELECT '1m', b, now() FROM unnest(%s::timestamptz[]) AS b "
            "ON CONFLICT (resolution, bucket) DO UPDATE SET dirtied_at = EXCLUDED.dirtied_at",
            [minutes],
        )
