"""Rendering a published summary's PDF in the background (queued by compliance.services.summary
when a version is published, and by a download that finds none stored)."""

from __future__ import annotations

from celery import shared_task

from compliance.services.summary import store_pdf


@shared_task(name="compliance.tasks_summary.render_summary_pdf", ignore_result=True)
def render_summary_pdf(summary_id: int) -> str:
    """Render and store version ``summary_id``'s PDF unless it has one; returns "stored", or "busy"
    when another render of it is running. Idempotent: a redelivered message finds it stored."""
    return "stored" if store_pdf(summary_id) is not None else "busy"
