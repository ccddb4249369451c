"""Celery tasks of the fleet app: thin wrappers that take ids and hand off to services."""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Task, shared_task

from console.queues import drop_payload, take_payload
from fleet.models import IngestBatch
from fleet.services import ingest_stream, partitions, push_queue, rollups

logger = logging.getLogger(__name__)


def _payload(batch_key: str, body: str | None) -> bytes | str | None:
    """The batch body: inline (eager mode) or from the stash (production)."""
    if body is not None:
        return body
    stashed = take_payload(batch_key)
    if stashed is None and not IngestBatch.objects.filter(key__startswith=batch_key).exists():
        logger.error("batch %s: its body is gone from the stash and it was never stored", batch_key)
    return stashed


@shared_task(ignore_result=True)
def drain_gpu_ingest(slot: int | None = None, token: str | None = None) -> int:
    """Write the queued GPU sample batches (see fleet.services.ingest_stream); ``slot`` and
    ``token`` name the drainer slot the API took to schedule it (none for the beat's run)."""
    return ingest_stream.drain(slot, token)


@shared_task(bind=True, ignore_result=True, max_retries=push_queue.MAX_RETRIES)
def ingest_prometheus_batch(
    self: Task, site_id: int, batch_key: str, body: str | None, options: dict, enqueued_at: str | None = None
) -> int:
    """Store a validated Prometheus exposition (GPU samples and serving series): retried through a
    database outage, dead-lettered on its own fault (fleet.services.push_queue)."""
    from fleet.services.prometheus import parse_exposition, store_exposition

    try:
        payload = _payload(batch_key, body)
        if payload is None:
            push_queue.done(batch_key)
            return 0
        text = payload.decode() if isinstance(payload, bytes) else payload
        exposition = parse_exposition(text, **options)
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


@shared_task(ignore_result=True, acks_late=False)
def update_rollups() -> dict[str, int]:
    """Fold newly dirtied minutes and hours into the rollups (every few seconds)."""
    return rollups.update_rollups()


@shared_task(ignore_result=True, acks_late=False)
def update_serving_rollups() -> dict[str, object]:
    """Fold newly dirtied serving minutes and hours into the serving rollups (every few seconds),
    then push the endpoints whose minutes changed to their live topics that a page follows."""
    from console import live
    from fleet.services import dashboard, serving_rollups

    result = serving_rollups.update_serving_rollups()
    if result["endpoints"]:
        topics = ["serving", *(f"endpoint.{e}" for e in result["endpoints"])]  # type: ignore[union-attr]
        live.request_push(*dashboard.watched(topics))
    return result


@shared_task(ignore_result=True, acks_late=False)
def maintain_partitions() -> dict[str, object]:
    """Make the next days' partitions ahead of time (hourly). Expired ones are dropped by the
    compliance retention task (daily), which a legal hold stops and which records each run."""
    return {"created": partitions.make_partitions_ahead()}


@shared_task(ignore_result=True, acks_late=False)
def schedule_scrapes() -> int:
    """Queue a scrape for each due target (every few seconds); returns how many were queued."""
    from fleet.services.scraping import claim_due_targets

    due = claim_due_targets()
    for target_id in due:
        scrape_target.delay(target_id)
    return len(due)


@shared_task(ignore_result=True)
def scrape_target(target_id: int) -> int:
    from fleet.services.scraping import scrape

    return scrape(target_id)


@shared_task(ignore_result=True, acks_late=False)
def refresh_training_accounts() -> int:
    """Recompute the goodput accounts of jobs with new events or still holding GPUs."""
    from fleet.services import goodput_accounts

    return goodput_accounts.refresh_job_accounts()


@shared_task(ignore_result=True, acks_late=False)
def advance_reservations() -> dict[str, int]:
    """Move reservations along: approved -> active at start, -> expired at end."""
    from fleet.services import capacity

    return capacity.advance_states()
