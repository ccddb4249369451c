"""The ingest room's Celery tasks: drain the GPU batch and Prometheus push queues. Their names
stay those they had in ``fleet.tasks`` (where they are re-exported), so tasks queued before a
deploy still run after it."""

from __future__ import annotations

import logging
from datetime import datetime

from celery import shared_task
from django.utils import timezone

from console.queues import drop_payload, take_payload
from fleet.ingest import push_queue
from fleet.ingest import stream as ingest_stream
from fleet.telemetry.models import IngestBatch

logger = logging.getLogger(__name__)


def _stashed(batch_key: str) -> bytes | None:
    """The body a task queued before pushes had their stream left in the stash."""
    stashed = take_payload(batch_key)
    if stashed is None and not IngestBatch.objects.filter(key__startswith=batch_key).exists():
        logger.error("batch %s: its body is gone from the stash and it was never stored", batch_key)
    return stashed


@shared_task(name="fleet.tasks.drain_gpu_ingest", ignore_result=True)
def drain_gpu_ingest(slot: int | None = None, token: str | None = None) -> int:
    """Write the queued GPU sample batches (see fleet.ingest.stream); ``slot`` and
    ``token`` name the drainer slot the API took to schedule it (none for the beat's run)."""
    return ingest_stream.drain(slot, token)


@shared_task(name="fleet.tasks.drain_prometheus_ingest", ignore_result=True)
def drain_prometheus_ingest(slot: int | None = None, token: str | None = None) -> int:
    """Write the queued Prometheus pushes (fleet.ingest.push_queue), as drain_gpu_ingest does
    the GPU batches."""
    return push_queue.drain(slot, token)


@shared_task(name="fleet.tasks.ingest_prometheus_batch", ignore_result=True)
def ingest_prometheus_batch(
    site_id: int, batch_key: str, body: bytes | str | None, options: dict, enqueued_at: str | None = None
) -> int:
    """Store a validated Prometheus exposition handed over inline (embedded mode: the request
    itself answers for a failure, 503 for an outage). A task without its body is one queued before
    pushes travelled on their stream: its stashed body joins the stream, and is stored from there."""
    from fleet.ingest.prometheus import store_exposition, unpacked

    received = datetime.fromisoformat(enqueued_at) if enqueued_at else None
    if body is None:
        payload = _stashed(batch_key)
        if payload is not None:
            push_queue.enqueue(
                site_id=site_id,
                key=batch_key,
                payload=payload,
                options=options,
                samples=0,
                enqueued_at=received or timezone.now(),
            )
            drop_payload(batch_key)
        return 0
    return store_exposition(unpacked(body, options), site_id=site_id, batch_key=batch_key, enqueued_at=received)
