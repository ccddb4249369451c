"""Building a compliance pack in the background (queued by compliance.services.pack.request_pack).

The row is the task's only state: claimed with a conditional UPDATE, told its progress with cheap
conditional UPDATEs (a pack someone else finished or failed is left alone), and always left
``done`` or ``failed``, never ``running``.
"""

from __future__ import annotations

import hashlib
import logging

from celery import shared_task
from django.utils import timezone

from compliance.choices import PackStatus
from compliance.models import CompliancePack
from compliance.services.pack import build_pack

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def build_compliance_pack(pack_id: int) -> str:
    """Build pack ``pack_id`` and store its zip; returns the final status.

    A queued pack is claimed; so is a running one, since only a worker lost mid-build (the message
    comes back with acks_late) leaves one running, and building it again is harmless.
    """
    claimed = CompliancePack.objects.filter(pk=pack_id, status__in=(PackStatus.QUEUED, PackStatus.RUNNING)).update(
        status=PackStatus.RUNNING, progress=0, step="Starting", error=""
    )
    if not claimed:
        return "skipped"  # done, failed or gone: a redelivered message has nothing to do
    running = CompliancePack.objects.filter(pk=pack_id, status=PackStatus.RUNNING)

    def progress(percent: int, step: str) -> None:
        running.filter(progress__lte=percent).update(progress=percent, step=step[:200])

    try:
        pack = CompliancePack.objects.defer("content").get(pk=pack_id)
        content = build_pack(pack, progress=progress)
    except Exception as exc:
        logger.exception("compliance pack %s failed", pack_id)
        running.update(
            status=PackStatus.FAILED,
            step="Failed",
            error=f"{exc.__class__.__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        return PackStatus.FAILED
    running.update(
        status=PackStatus.DONE,
        progress=100,
        step="Done",
        content=content,
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        finished_at=timezone.now(),
    )
    return PackStatus.DONE
