"""The ingest room's Celery tasks: drain the GPU batch queue, store a Prometheus push. Their names
stay those they had in ``fleet.tasks`` (where they are re-exported), so tasks queued before a
deploy still run after it."""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Task, shared_task

from console.queues import drop_payload, take_payload
from fleet.ingest import push_queue
from fleet.ingest import stream as ingest_stream
from fleet.telemetry.models import IngestBatch

logger = logging.getLogger(__name__)


def _payload(batch_key: str, body: bytes | str | None) -> bytes | str | None:
    """The batch body: inline (eager mode) or from the stash (production)."""
    if body is not None:
        return body
    stashed = take_payload(batch_key)
    if stashed is None and not IngestBatch.objects.filter(key__startswith=batch_key).exists():
        logger.error("batch %s: its body is gone from the stash and it was never stored", batch_key)
    return stashed


@shared_task(name="fleet.tasks.drain_gpu_ingest", ignore_result=True)
def drain_gpu_ingest(slot: int | None = None, token: str | None = None) -> int:
    """Write the queued GPU sample batches (see fleet.ingest.stream); ``slot`` and
    ``token`` name the drainer slot the API took to schedule it (none for the beat's run)."""
    return ingest_stream.drain(slot, token)


@shared_task(
    name="fleet.tasks.ingest_prometheus_batch", bind=True, ignore_result=True, max_retries=push_queue.MAX_RETRIES
)
def ingest_prometheus_batch(
    self: Task, site_id: int, batch_key: str, body: bytes | str | None, options: dict, enqueued_at: str | None = None
) -> int:
    """Store a validated Prometheus exposition (GPU samples, serving, node and scheduler series),
    as the door parsed it (or a text body, parsed here): retried through a database outage,
    dead-lettered on its own fault (fleet.ingest.push_queue)."""
    from fleet.ingest.prometheus import store_exposition, unpacked

    try:
        payload = _payload(batch_key, body)
        if payload is None:
            push_queue.done(batch_key)
            return 0
        exposition = unpacked(payload, options)
        stored = store_exposition(
            exposition,
            site_id=site_id,
            batch_key=batch_key,
            enqueued_at=datetime.fromisoformat(enqueued_at) if enqueued_at else None,
        )
    except Exception as exc:
        if body is not None:
            raise  # eager mode: the request itself answers (503 for an outage)
        if ingest_stream.is_outage(exc) and self.request.retries < self.max_retries:
            logger.warning("Prometheus push %s not stored (%s); retrying", batch_key, exc.__class__.__name__)
            push_queue.keep_waiting(batch_key)  # the body outlives the outage
            raise self.retry(exc=exc, countdown=push_queue.retry_delay(self.request.retries)) from None
        push_queue.dead_letter(site_id=site_id, key=batch_key, body=payload, options=options, error=exc)
        return 0
    if body is None:
        drop_payload(batch_key)
        push_queue.done(batch_key)
    return stored
