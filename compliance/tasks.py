"""Compliance background work: the daily retention run (CELERY_BEAT_SCHEDULE "apply-retention")
and, from tasks_pack (imported here so a worker registers it), building a compliance pack."""

from __future__ import annotations

from celery import shared_task

from compliance.services import retention
from compliance.tasks_pack import build_compliance_pack  # noqa: F401  (registered with the worker)


@shared_task(ignore_result=True, acks_late=False)
def apply_retention() -> dict[str, int]:
    """Apply every console-held retention policy; returns rows deleted and held, for the worker log.
    Idempotent: a second run the same day finds nothing more due."""
    runs = retention.run_retention(triggered_by="beat")
    return {"runs": len(runs), "affected": sum(r.affected for r in runs), "held": sum(r.held for r in runs)}
