"""Celery tasks of the fleet app: thin wrappers that take ids and hand off to the rooms' services.
The ingest room's own tasks live beside its queue (fleet.ingest.tasks) under their names here."""

from __future__ import annotations

from celery import shared_task

from fleet.ingest.tasks import drain_gpu_ingest, drain_prometheus_ingest, ingest_prometheus_batch
from fleet.telemetry import partitions, rollups

# registered by this module's import
__all__ = ["drain_gpu_ingest", "drain_prometheus_ingest", "ingest_prometheus_batch"]


@shared_task(ignore_result=True, acks_late=False)
def update_rollups() -> dict[str, int]:
    """Fold newly dirtied minutes and hours into the rollups (every few seconds)."""
    return rollups.update_rollups()


@shared_task(ignore_result=True, acks_late=False)
def update_node_rollups() -> dict[str, int]:
    """Fold the node series' queued minutes (ports, mounts, disks) into their rollups and the
    fabric page's read model (every few seconds); the pages that follow them are pushed."""
    import fleet.fabric.store
    import fleet.storage.store  # noqa: F401  (each registers its tables' queues)
    from fleet.telemetry import series

    return series.update_node_rollups()


@shared_task(ignore_result=True, acks_late=False)
def update_serving_rollups() -> dict[str, object]:
    """Fold newly dirtied serving minutes and hours into the serving rollups (every few seconds),
    then push the endpoints whose minutes changed to their live topics that a page follows."""
    from console import live
    from fleet.serving import rollups as serving_rollups

    result = serving_rollups.update_serving_rollups()
    if result["endpoints"]:
        topics = ["serving", *(f"endpoint.{e}" for e in result["endpoints"])]  # type: ignore[union-attr]
        live.request_push(*live.watched(topics))
    return result


@shared_task(ignore_result=True, acks_late=False)
def maintain_partitions() -> dict[str, object]:
    """Make the next days' partitions ahead of time (hourly). Expired ones are dropped by the
    compliance retention task (daily), which a legal hold stops and which records each run."""
    return {"created": partitions.make_partitions_ahead()}


@shared_task(ignore_result=True, acks_late=False)
def schedule_scrapes() -> int:
    """Queue a scrape for each due target (every few seconds); returns how many were queued."""
    from fleet.ingest.scraping import claim_due_targets

    due = claim_due_targets()
    for target_id in due:
        scrape_target.delay(target_id)
    return len(due)


@shared_task(ignore_result=True)
def scrape_target(target_id: int) -> int:
    from fleet.ingest.scraping import scrape

    return scrape(target_id)


@shared_task(ignore_result=True, acks_late=False)
def refresh_training_accounts() -> int:
    """Recompute the goodput accounts of jobs with new events or still holding GPUs."""
    from console import live
    from fleet.training import accounts as goodput_accounts

    refreshed = goodput_accounts.refresh_job_accounts()
    if refreshed:  # the cost page prices these accounts: push it while a page watches it
        live.request_push(*live.watched(["cost"]))
    return refreshed


@shared_task(ignore_result=True, acks_late=False)
def advance_reservations() -> dict[str, int]:
    """Move reservations along: approved -> active at start, -> expired at end."""
    from fleet.capacity.actions import reservations

    return reservations.advance_states()
