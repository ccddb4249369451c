"""Template filters for time windows: an incident's pages at its window (console.ranges)."""

from __future__ import annotations

from typing import Any

from django import template

from console.ranges import incident_window

register = template.Library()


@register.filter
def incident_window_query(incident: Any) -> str:
    """``from=...&to=...``: the query that opens a fleet, node, GPU, job or endpoint page at the
    incident's window (incident_window: from before its fault began to after it resolved)."""
    return incident_window(incident.started_at, incident.resolved_at).query()
