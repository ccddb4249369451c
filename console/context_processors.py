from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.urls import reverse

# Sections appear here as they land (Training, Serving, Incidents, Capacity, Power, Compliance).
# An entry may name the permission it needs; without it, every signed-in role sees the entry.
NAV: list[tuple[str, ...]] = [
    ("Overview", "home"),
    ("Fleet", "fleet:dashboard"),
    ("Targets", "fleet:targets"),
    ("Training", "training:dashboard"),
    ("Serving", "serving:dashboard"),
    ("Capacity", "capacity:plan"),
    ("Power", "power:dashboard"),
    ("Fabric", "fabric:dashboard"),
    ("Storage", "storage:dashboard"),
    ("Cost", "cost:dashboard"),
    ("Incidents", "incidents:list"),
    ("Recovery", "recovery:register", "compliance.view_recoveryitem"),
    ("Compliance", "compliance:home", "console.manage_compliance"),
    ("People", "people", "auth.change_user"),  # console.views.PeopleView: Admins
]


def console(request: HttpRequest) -> dict[str, Any]:
    nav = []
    for label, url_name, *permission in NAV:
        if permission and not request.user.has_perm(permission[0]):
            continue  # a section the user's role cannot open is not offered
        url = reverse(url_name)
        active = request.path == url if url in ("/", "/fleet/") else request.path.startswith(url)
        nav.append({"label": label, "url": url, "active": active})
    return {"nav_items": nav, "run_mode": settings.RUN_MODE, "eager_tasks": settings.EAGER_TASKS}
