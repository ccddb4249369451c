"""Durations as the recovery pages show them: minutes under an hour, hours under two days, then days."""

from __future__ import annotations

from datetime import timedelta

from django import template

register = template.Library()


@register.filter
def span(value: timedelta | None) -> str:
    if value is None:
        return "–"
    seconds = value.total_seconds()
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


STATE_CLASS = {
    "ok": "badge-up",
    "failing": "badge-down",
    "rpo_breached": "badge-down",
    "same_site": "badge-warn",
    "rto_unproven": "badge-warn",
}
STATE_LABEL = {
    "ok": "OK",
    "failing": "Failing",
    "rpo_breached": "RPO breached",
    "same_site": "Same site",
    "rto_unproven": "RTO unproven",
}


@register.inclusion_tag("recovery/_state.html")
def state_badge(state: str) -> dict[str, str]:
    return {"css": STATE_CLASS.get(state, "badge-unknown"), "label": STATE_LABEL.get(state, state), "state": state}


@register.filter
def took(record: object) -> str:
    """A backup report's or restore test's duration (finished - started)."""
    return span(record.finished - record.started)  # type: ignore[attr-defined]
