from django.contrib import admin

from incidents.models import (
    ActionItem,
    Finding,
    Incident,
    MaintenanceWindow,
    NotificationChannel,
    RunbookLink,
    Silence,
    TimelineEntry,
)


class ReadOnlyTimeline(admin.TabularInline):
    model = TimelineEntry
    extra = 0
    can_delete = False
    fields = ["at", "kind", "actor_label", "text"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    """Read-only here: incidents move through the console's actions, which write the timeline."""

    list_display = ["id", "severity", "state", "title", "category", "detected_at", "resolved_at"]
    list_filter = ["state", "severity", "category"]
    search_fields = ["title", "group_key"]
    inlines = [ReadOnlyTimeline]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Finding)
class FindingAdmin(admin.ModelAdmin):
    list_display = ["fingerprint", "status", "severity", "summary", "source", "incident", "last_seen", "times_seen"]
    list_filter = ["status", "severity", "source"]
    search_fields = ["fingerprint", "summary"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "starts_at", "ends_at", "created_by", "comment"]


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "min_severity", "enabled"]
    list_filter = ["kind", "enabled"]


@admin.register(ActionItem)
class ActionItemAdmin(admin.ModelAdmin):
    list_display = ["title", "incident", "owner", "due_date", "state"]
    list_filter = ["state"]


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin):
    list_display = ["__str__", "starts_at", "ends_at", "created_by", "comment"]
    list_filter = ["scope"]


@admin.register(RunbookLink)
class RunbookLinkAdmin(admin.ModelAdmin):
    """Category -> runbook URL, shown on the incident page of that category."""

    list_display = ["category", "title", "url"]
    search_fields = ["category", "title"]
