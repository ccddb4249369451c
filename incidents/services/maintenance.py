"""Maintenance windows: planned work on a node, rack or site. A finding about it is recorded (and
shown, marked "in maintenance") but opens no incident and notifies nobody."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from incidents.models import MaintenanceWindow


def active_maintenance(labels: dict[str, Any], at: datetime | None = None) -> MaintenanceWindow | None:
    """The active window that covers these labels, if any (site, rack, or the node's hostname)."""
    for window in MaintenanceWindow.objects.active(at):
        if window.covers(labels):
            return window
    return None
