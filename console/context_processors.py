"""What every page's layout reads: the navigation bar, grouped by what an SRE is doing, and the mode
the console runs in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.urls import reverse


@dataclass(frozen=True)
class NavLink:
    """A page in the bar: without ``permission``, every signed-in role sees it."""

    label: str
    url_name: str
    permission: str | None = None


# One group per task; a new page joins the group of the task it serves (on-call and status pages
# join Incidents). The bar holds the groups on one row at 1,440 px: keep their names short.
NAV_HOME = NavLink("Overview", "home")
NAV_GROUPS: list[tuple[str, list[NavLink]]] = [
    (
        "Fleet",
        [
            NavLink("Fleet", "fleet:dashboard"),
            NavLink("Scrape targets", "fleet:targets"),
            NavLink("Fabric", "fabric:dashboard"),
            NavLink("Storage", "storage:dashboard"),
            NavLink("Power", "power:dashboard"),
        ],
    ),
    ("Workloads", [NavLink("Training", "training:dashboard"), NavLink("Serving", "serving:dashboard")]),
    (
        "Capacity",
        [
            NavLink("Capacity plan", "capacity:plan"),
            NavLink("Scheduler queues", "scheduler:queues"),
            NavLink("Cost", "cost:dashboard"),
        ],
    ),
    (
        "Incidents",
        [
            NavLink("Incidents", "incidents:list"),
            NavLink("Metrics", "incidents:metrics"),
            NavLink("Silences", "incidents:silences"),
            NavLink("Maintenance", "incidents:maintenance"),
        ],
    ),
    (
        "Governance",
        [
            NavLink("Compliance", "compliance:home", "console.manage_compliance"),
            NavLink("Recovery", "recovery:register", "compliance.view_recoveryitem"),
            NavLink("People", "people", "auth.change_user"),  # console.views.PeopleView: Admins
        ],
    ),
]


def current_url(path: str, urls: list[str]) -> str | None:
    """The bar's URL for the page at ``path``: the longest that begins it (/fleet/targets/ is
    Scrape targets, /fleet/gpus/<uuid>/ is Fleet); the overview only for itself."""
    matches = [url for url in urls if path == url or (url != "/" and path.startswith(url))]
    return max(matches, key=len, default=None)


def navigation(request: HttpRequest) -> dict[str, Any]:
    """The bar for this user: the overview, then each group with the links the user's role may
    open (a group with none is left out); the current page's link and its group marked active."""
    user = request.user
    groups = []
    for label, links in NAV_GROUPS:
        shown = [link for link in links if link.permission is None or user.has_perm(link.permission)]
        if shown:
            links_shown = [{"label": link.label, "url": reverse(link.url_name)} for link in shown]
            groups.append({"label": label, "links": links_shown})
    home = {"label": NAV_HOME.label, "url": reverse(NAV_HOME.url_name)}
    current = current_url(request.path, [home["url"], *(link["url"] for g in groups for link in g["links"])])
    home["active"] = home["url"] == current
    for number, group in enumerate(groups):
        group["id"] = f"nav-group-{number}"
        for link in group["links"]:
            link["active"] = link["url"] == current
        group["active"] = any(link["active"] for link in group["links"])
    return {"home": home, "groups": groups}


def console(request: HttpRequest) -> dict[str, Any]:
    """The layout's context: the navigation bar (signed-in users only) and the run mode."""
    nav = navigation(request) if request.user.is_authenticated else {"home": None, "groups": []}
    return {"nav": nav, "run_mode": settings.RUN_MODE, "eager_tasks": settings.EAGER_TASKS}
