from __future__ import annotations

from datetime import datetime

from celery import shared_task

from console import counters
from fleet.services.ingest import decode_trusted_batch
from fleet.services.telemetry import store_gpu_samples


@shared_task(ignore_result=True)
def ingest_gpu_batch(site_id: int, batch_key: str, body: str, enqueued_at: str | None = None) -> int:
    """Store a validated GPU sample batch. Idempotent per batch key, so redelivery is safe."""
    batch = decode_trusted_batch(body)
    stored = store_gpu_samples(
        site_id=site_id,
        batch_key=batch_key,
        samples=batch.samples,
        enqueued_at=datetime.fromisoformat(enqueued_at) if enqueued_at else None,
    )
    counters.increment("goodput_ingest_samples_stored_total", stored)
    return stored
