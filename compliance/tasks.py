"""Compliance background work: the daily retention run (CELERY_BEAT_SCHEDULE "apply-retention"),
the daily walk of the audit log's hash chain ("verify-audit-log"), the hourly head kept outside
the database ("keep-audit-head") and, from compliance.pack.tasks and compliance.summary.tasks
(imported here so a worker registers them, under the names they had as compliance.tasks_pack and
compliance.tasks_summary), building a compliance pack and rendering a published summary's PDF."""

from __future__ import annotations

import logging

from celery import shared_task

from compliance.pack.tasks import build_compliance_pack  # noqa: F401  (registered with the worker)
from compliance.services import audit_chain, audit_heads, retention
from compliance.summary.tasks import render_summary_pdf  # noqa: F401  (registered with the worker)


@shared_task(ignore_result=True, acks_late=False)
def apply_retention() -> dict[str, int]:
    """Apply every console-held retention policy; returns rows deleted and held, for the worker log.
    Idempotent: a second run the same day finds nothing more due."""
    runs = retention.run_retention(triggered_by="beat")
    return {"runs": len(runs), "affected": sum(r.affected for r in runs), "held": sum(r.held for r in runs)}


logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, acks_late=False)
def verify_audit_log() -> dict[str, object]:
    """Walk the audit chain against every kept head and record the result through the owner's
    function (the compliance home page shows the latest); a broken chain is logged as an error
    naming the first entry that does not match. A damaged heads file is a broken check too."""
    try:
        anchors = [head.anchor() for head in audit_heads.kept_heads()]
    except audit_heads.HeadsFileError as exc:
        logger.error("audit log heads file unreadable: %s", exc)
        anchors = []
    check = audit_chain.check_and_record(anchors, triggered_by="beat")
    if not check.ok:
        logger.error("audit log chain broken: %s", check.problem)
    return {"ok": check.ok, "entries": check.entries, "first_bad_entry": check.first_bad_entry}


@shared_task(ignore_result=True, acks_late=False)
def keep_audit_head() -> dict[str, object]:
    """Append the chain's head to the heads file (GOODPUT_AUDIT_HEADS_DIR) if it moved since the
    last one kept: an hourly head outside the database catches a chain rewritten to be consistent."""
    head = audit_chain.chain_head()
    return {"kept": audit_heads.keep_head(head, source="beat"), "seq": head.seq if head else None}
