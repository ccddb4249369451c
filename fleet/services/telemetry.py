"""Writing GPU telemetry. ``store_gpu_samples`` is the one writer: every door (JSON batch, and later
Prometheus pushes and scrapes) ends here, so its insides can change without touching the doors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from console import live
from fleet.models import Gpu, GpuSample, IngestBatch, Node
from fleet.telemetry_fields import METRIC_NAMES

SAMPLE_COLUMNS = ("gpu_id", "ts", *METRIC_NAMES)


def store_gpu_samples(*, site_id: int, batch_key: str, samples: Sequence[Any]) -> int:
    """Store one validated batch atomically; return the number of samples written.

    1. Claim the batch key (a redelivered batch stops here and writes nothing).
    2. Register nodes and GPUs the site has not reported before.
    3. COPY the samples into the sample table.
    4. Upsert each GPU's latest state (never moving it backwards in time).
    5. After commit, ask the live hub to push deltas to the dashboards.
    """
    with transaction.atomic():
        if not _claim_batch(batch_key, site_id=site_id, count=len(samples)):
            return 0
        gpu_ids = _resolve_gpus(site_id=site_id, samples=samples)
        _copy_samples(gpu_ids, samples)
        _upsert_latest_state(gpu_ids, samples)
        transaction.on_commit(lambda: live.request_push("fleet", f"site.{site_id}"))
    return len(samples)


def _claim_batch(key: str, *, site_id: int, count: int) -> bool:
    """Record the batch key; False when it was already there (a redelivery)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {IngestBatch._meta.db_table} (key, site_id, samples, received_at) "
            "VALUES (%s, %s, %s, now()) ON CONFLICT (key) DO NOTHING RETURNING key",
            [key, site_id, count],
        )
        return cursor.fetchone() is not None


def _resolve_gpus(*, site_id: int, samples: Iterable[Any]) -> dict[str, int]:
    """Map GPU UUIDs to ids, registering unknown nodes and GPUs under the token's site."""
    by_uuid: dict[str, Any] = {}
    for sample in samples:
        by_uuid.setdefault(sample.gpu_uuid, sample)
    known = dict(Gpu.objects.filter(uuid__in=by_uuid).values_list("uuid", "id"))
    missing = [s for u, s in by_uuid.items() if u not in known]
    if not missing:
        return known
    hostnames = {s.hostname for s in missing}
    Node.objects.bulk_create([Node(site_id=site_id, hostname=h) for h in sorted(hostnames)], ignore_conflicts=True)
    node_ids = dict(Node.objects.filter(hostname__in=hostnames, site_id=site_id).values_list("hostname", "id"))
    new_gpus = []
    for sample in missing:
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
            )
        )
    # Sorted inserts keep lock order stable when two workers register overlapping GPUs.
    Gpu.objects.bulk_create(sorted(new_gpus, key=lambda g: g.uuid), ignore_conflicts=True)
    known.update(Gpu.objects.filter(uuid__in=[g.uuid for g in new_gpus]).values_list("uuid", "id"))
    return known


def _copy_samples(gpu_ids: dict[str, int], samples: Sequence[Any]) -> None:
    table = GpuSample._meta.db_table
    columns = ", ".join(SAMPLE_COLUMNS)
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
        with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for sample in samples:
                gpu_id = gpu_ids.get(sample.gpu_uuid)
                if gpu_id is None:
                    continue
                copy.write_row((gpu_id, sample.ts, *[getattr(sample, name) for name in METRIC_NAMES]))


def _upsert_latest_state(gpu_ids: dict[str, int], samples: Sequence[Any]) -> None:
    latest: dict[int, Any] = {}
    for sample in samples:
        gpu_id = gpu_ids.get(sample.gpu_uuid)
        if gpu_id is not None and (gpu_id not in latest or sample.ts >= latest[gpu_id].ts):
            latest[gpu_id] = sample
    if not latest:
        return
    now = timezone.now()
    columns = ("gpu_id", "ts", *METRIC_NAMES, "updated_at")
    placeholders = "(" + ", ".join(["%s"] * len(columns)) + ")"
    values: list[Any] = []
    for gpu_id in sorted(latest):  # stable lock order across concurrent workers
        sample = latest[gpu_id]
        values.extend((gpu_id, sample.ts, *[getattr(sample, n) for n in METRIC_NAMES], now))
    assignments = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns[1:])
    sql = (
        f"INSERT INTO fleet_gpustate ({', '.join(columns)}) VALUES "
        + ", ".join([placeholders] * len(latest))
        + f" ON CONFLICT (gpu_id) DO UPDATE SET {assignments} WHERE fleet_gpustate.ts <= EXCLUDED.ts"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
