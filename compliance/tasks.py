"""Compliance background work: the daily retention run (CELERY_BEAT_SCHEDULE "apply-retention"),
the daily walk of the audit log's hash chain ("verify-audit-log") and, from tasks_pack and
tasks_summary (imported here so a worker registers them), building a compliance pack and
rendering a published summary's PDF."""

from __future__ import annotations

import logging

from celery import shared_task

from compliance.services import audit_chain, retention
from compliance.tasks_pack import build_compliance_pack  # noqa: F401  (registered with the worker)
from compliance.tasks_summary import render_summary_pdf  # noqa: F401  (registered with the worker)


@shared_task(ignore_result=True, acks_late=False)
def apply_retention() -> dict[str, int]:
    """Apply every console-held retention policy; returns rows deleted and held, for the worker log.
    Idempotent: a second run the same day finds nothing more due."""
    runs = retention.run_retention(triggered_by="beat")
    return {"runs": len(runs), "affected": sum(r.affected for r in runs), "held": sum(r.held for r in runs)}


logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, acks_late=False)
def verify_audit_log() -> dict[str, object]:
    """Walk the audit chain and record the result (the compliance home page shows the latest); a
    broken chain is logged as an error naming the first entry that does not match."""
    report = audit_chain.verify_chain()
    audit_chain.record_check(report, triggered_by="beat")
    if not report.ok:
        logger.error("audit log chain broken: %s", report.problem)
    return {"ok": report.ok, "entries": report.entries, "first_bad_entry": report.first_bad_entry}
