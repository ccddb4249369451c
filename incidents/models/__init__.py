from incidents.models.incident import ActionItem, Finding, Incident, RunbookLink, TimelineEntry
from incidents.models.routing import MaintenanceWindow, Notification, NotificationChannel, Silence

__all__ = [
    "ActionItem",
    "Finding",
    "Incident",
    "MaintenanceWindow",
    "Notification",
    "NotificationChannel",
    "RunbookLink",
    "Silence",
    "TimelineEntry",
]
