from __future__ import annotations

from celery import shared_task

from fleet.services.ingest import decode_trusted_batch
from fleet.services.telemetry import store_gpu_samples


@shared_task(ignore_result=True)
def ingest_gpu_batch(site_id: int, batch_key: str, body: str) -> int:
    """Store a validated GPU sample batch. Idempotent per batch key, so redelivery is safe."""
    batch = decode_trusted_batch(body)
    return store_gpu_samples(site_id=site_id, batch_key=batch_key, samples=batch.samples)
