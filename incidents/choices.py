from django.db import models


class Severity(models.TextChoices):
    SEV1 = "SEV1", "SEV1 · critical"
    SEV2 = "SEV2", "SEV2 · major"
    SEV3 = "SEV3", "SEV3 · minor"
    SEV4 = "SEV4", "SEV4 · low"


SEVERITY_RANK = {Severity.SEV1: 1, Severity.SEV2: 2, Severity.SEV3: 3, Severity.SEV4: 4}


class IncidentState(models.TextChoices):
    TRIGGERED = "triggered", "Triggered"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    MITIGATED = "mitigated", "Mitigated"
    RESOLVED = "resolved", "Resolved"


OPEN_STATES = (IncidentState.TRIGGERED, IncidentState.ACKNOWLEDGED, IncidentState.MITIGATED)


class FindingStatus(models.TextChoices):
    FIRING = "firing", "Firing"
    CLEARED = "cleared", "Cleared"


class TimelineKind(models.TextChoices):
    STATE = "state", "State change"
    FINDING = "finding", "Finding"
    NOTE = "note", "Note"
    ROLE = "role", "Role"
    NOTIFICATION = "notification", "Notification"
    POSTMORTEM = "postmortem", "Postmortem"
    ACTION_ITEM = "action_item", "Action item"


class IncidentRole(models.TextChoices):
    COMMANDER = "commander", "Incident commander"
    SCRIBE = "scribe", "Scribe"
    COMMUNICATIONS = "communications", "Communications liaison"


class ActionItemState(models.TextChoices):
    OPEN = "open", "Open"
    DONE = "done", "Done"
    WONT_DO = "wont_do", "Won't do"


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "Generic JSON webhook"
    SLACK = "slack", "Slack-compatible incoming webhook"
    PAGERDUTY = "pagerduty", "PagerDuty Events API v2"


class NotificationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class MatchOp(models.TextChoices):
    EQ = "=", "equals"
    NEQ = "!=", "does not equal"
    RE = "=~", "matches regex"
    NRE = "!~", "does not match regex"


class MaintenanceScope(models.TextChoices):
    """What a maintenance window covers, and the finding label it matches."""

    NODE = "node", "Node"
    RACK = "rack", "Rack"
    SITE = "site", "Site"


# The finding labels that name each scope (a node is "hostname" on GPU findings, "node" elsewhere).
MAINTENANCE_LABELS = {
    MaintenanceScope.NODE: ("hostname", "node"),
    MaintenanceScope.RACK: ("rack",),
    MaintenanceScope.SITE: ("site",),
}
