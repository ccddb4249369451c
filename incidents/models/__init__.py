from incidents.models.incident import ActionItem, Finding, Incident, TimelineEntry
from incidents.models.routing import Notification, NotificationChannel, Silence

__all__ = ["ActionItem", "Finding", "Incident", "Notification", "NotificationChannel", "Silence", "TimelineEntry"]
