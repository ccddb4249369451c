from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

NAV = [
    ("Fleet", "fleet:dashboard", "/fleet/"),
]


def console(request: HttpRequest) -> dict[str, Any]:
    return {"nav_items": NAV, "run_mode": settings.RUN_MODE, "eager_tasks": settings.EAGER_TASKS}
