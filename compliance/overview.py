"""The compliance tile on the overview (/), shown to compliance officers and admins only."""

from __future__ import annotations

from typing import Any

from compliance.permissions import COMPLIANCE_PERMISSION


def overview_tile(request: Any) -> dict[str, Any]:
    from django.conf import settings

    from compliance.services.status import compliance_status

    return {"status": compliance_status(), "review_days": settings.EXPORT_CONTROL_REVIEW_DAYS}


def register() -> None:
    from console import overview

    overview.register_section(
        overview.Section(
            name="compliance",
            template="compliance/_overview.html",
            context=overview_tile,
            order=60,
            permission=COMPLIANCE_PERMISSION,
        )
    )
