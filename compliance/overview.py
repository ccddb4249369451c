"""The compliance tile on the overview (/), shown to compliance officers and admins only, and the
recovery register's tile, shown to the roles that read it (compliance.permissions.RECOVERY_VIEW)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from compliance.services import recovery
from compliance.services.status import compliance_status


def overview_tile(request: Any) -> dict[str, Any]:
    return {"status": compliance_status(), "review_days": settings.EXPORT_CONTROL_REVIEW_DAYS}


def recovery_tile(request: Any) -> dict[str, Any]:
    """The recovery register at a glance: the same counts as the /recovery/ page's header."""
    now = timezone.now()
    return {"counts": recovery.summary(recovery.item_states(), now)}
