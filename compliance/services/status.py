"""Where the compliance records stand, for the compliance home page and the overview tile: the
figures an officer looks at first (what is overdue, what is open), in a few COUNT queries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from compliance.choices import CONSOLE_HELD
from compliance.models import (
    AuditEntry,
    DataAsset,
    Dataset,
    GpaiModel,
    LegalHold,
    RetentionPolicy,
    RetentionRun,
    SubjectRequest,
    SummaryVersion,
)
from compliance.services import audit_chain


def compliance_status() -> dict[str, Any]:
    now = timezone.now()
    today = timezone.localdate(now)
    review_cutoff = today - timedelta(days=settings.EXPORT_CONTROL_REVIEW_DAYS)
    models = GpaiModel.objects.all()
    return {
        "models": models.count(),
        "systemic_risk_models": models.filter(training_compute_flop__gt=10**25).count(),
        "export_checks_overdue": models.filter(
            Q(export_control_checked_on__isnull=True) | Q(export_control_checked_on__lt=review_cutoff)
        ).count(),
        "models_without_summary": models.filter(summaries__isnull=True).count(),
        "summaries": SummaryVersion.objects.count(),
        "datasets": Dataset.objects.count(),
        "records_of_processing": DataAsset.objects.count(),
        "open_requests": SubjectRequest.objects.open().count(),
        "overdue_requests": SubjectRequest.objects.overdue(today).count(),
        "policies": RetentionPolicy.objects.count(),
        "attestations_overdue": RetentionPolicy.objects.exclude(data_class__in=CONSOLE_HELD)
        .filter(Q(review_due__isnull=True) | Q(review_due__lt=today))
        .count(),
        "active_holds": LegalHold.objects.active().count(),
        "last_run": RetentionRun.objects.filter(dry_run=False).order_by("-started_at").first(),
        "audit_24h": AuditEntry.objects.filter(at__gte=now - timedelta(hours=24)).count(),
        # The latest walk of the audit chain (verify_audit_log or the daily task); None: never.
        "audit_chain_check": audit_chain.last_check(),
    }
