from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.timebounds import BoundedDatesSerializerMixin
from incidents.choices import IncidentRole, Severity
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
from incidents.services.cost import finding_cost
from incidents.services.matchers import OPS, MatcherError, validate_matchers

User = get_user_model()


class UsernameField(serializers.SlugRelatedField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(slug_field="username", queryset=User.objects.filter(is_active=True), **kwargs)


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class LabelsField(serializers.JSONField):
    """Labels as Alertmanager's: name -> value, both text (site, hostname, gpu, job, ...)."""


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "a label name"},
                "op": {"type": "string", "enum": list(OPS), "default": "="},
                "value": {"type": "string", "description": "a regular expression for =~ and !~"},
            },
            "required": ["name", "value"],
        },
    }
)
class MatchersField(serializers.JSONField):
    """Alertmanager-style label matchers: a list of {name, op, value}, validated whole."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            return validate_matchers(super().to_internal_value(data))
        except MatcherError as exc:
            raise serializers.ValidationError(str(exc)) from None


class FindingCostSerializer(serializers.Serializer):
    gpu_hours_lost = serializers.FloatField(allow_null=True, help_text="null where it reports none")
    gpu_hours_at_risk = serializers.FloatField(allow_null=True)
    gpus_out_of_service = serializers.IntegerField()


class FindingSerializer(serializers.ModelSerializer):
    labels = LabelsField(required=False)
    cost = serializers.SerializerMethodField(
        help_text="Its own part of the incident's cost: GPU-hours lost it reports, at risk, GPUs out of service"
    )

    class Meta:
        model = Finding
        fields = [
            "fingerprint",
            "source",
            "labels",
            "severity",
            "summary",
            "status",
            "started_at",
            "last_seen",
            "cleared_at",
            "times_seen",
            "in_maintenance",
            "impact",
            "cost",
        ]

    @extend_schema_field(FindingCostSerializer)
    def get_cost(self, finding: Finding) -> dict[str, Any]:
        return finding_cost(finding)


class IncidentSerializer(serializers.ModelSerializer):
    commander = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    scribe = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    communications = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    gpu_hours = serializers.SerializerMethodField(
        help_text="GPU-hours lost: gpu_hours_reported + gpu_hours_out_of_service"
    )
    gpu_hours_reported = serializers.FloatField(
        source="gpu_hours_lost", read_only=True, help_text="The sum of the GPU-hours lost its findings reported"
    )
    gpu_hours_out_of_service = serializers.SerializerMethodField(
        help_text="gpus_out_of_service x the incident's length, in hours"
    )
    gpu_hours_at_risk = serializers.SerializerMethodField(help_text="Work not yet checkpointed: at risk, not lost")
    runbook_url = serializers.SerializerMethodField()
    findings = FindingSerializer(many=True, read_only=True)
    labels = LabelsField(read_only=True, help_text="Affected resources: site, hostname, gpu, job, ...")

    class Meta:
        model = Incident
        fields = [
            "id",
            "title",
            "severity",
            "state",
            "category",
            "labels",
            "started_at",
            "detected_at",
            "acknowledged_at",
            "mitigated_at",
            "resolved_at",
            "auto_resolve_at",
            "commander",
            "scribe",
            "communications",
            "affected_gpus",
            "gpu_hours",
            "gpu_hours_reported",
            "gpus_out_of_service",
            "gpu_hours_out_of_service",
            "gpu_hours_at_risk",
            "error_budget_burned",
            "pm_summary",
            "pm_impact",
            "pm_root_cause",
            "pm_timeline",
            "pm_went_well",
            "pm_went_badly",
            "merged_into",
            "runbook_url",
            "findings",
        ]
        read_only_fields = fields

    def get_gpu_hours(self, incident: Incident) -> float:
        return round(incident.current_gpu_hours(), 3)

    def get_gpu_hours_out_of_service(self, incident: Incident) -> float:
        return round(incident.out_of_service_gpu_hours(), 3)

    def get_gpu_hours_at_risk(self, incident: Incident) -> float:
        return round(incident.current_gpu_hours_at_risk(), 3)

    def get_runbook_url(self, incident: Incident) -> str | None:
        # One query per response, not per incident: the links are few and shared by a whole list.
        runbooks = self.context.setdefault("_runbooks", None)
        if runbooks is None:
            runbooks = self.context["_runbooks"] = dict(RunbookLink.objects.values_list("category", "url"))
        return runbooks.get(incident.category)


class NoteSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=10_000)


class TransitionSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=2_000, required=False, allow_blank=True, default="")


class SeveritySerializer(serializers.Serializer):
    severity = serializers.ChoiceField(choices=Severity.choices)
    note = serializers.CharField(max_length=2_000, required=False, allow_blank=True, default="")


class MergeSerializer(serializers.Serializer):
    into = serializers.PrimaryKeyRelatedField(queryset=Incident.objects.all(), help_text="The incident that stays")


class SilenceFromIncidentSerializer(serializers.Serializer):
    """Matchers default to the incident's labels (see GET on the same route)."""

    matchers = serializers.JSONField(required=False)
    hours = serializers.FloatField(min_value=0.05, max_value=24 * 90, default=2)
    comment = serializers.CharField(max_length=2_000)

    def validate_matchers(self, value: Any) -> Any:
        try:
            return validate_matchers(value)
        except MatcherError as exc:
            raise serializers.ValidationError(str(exc)) from None


class SilencePreviewSerializer(serializers.Serializer):
    matchers = MatchersField(read_only=True)
    findings = FindingSerializer(many=True)


class RoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=IncidentRole.choices)
    username = UsernameField(allow_null=True)


class PostmortemSerializer(serializers.Serializer):
    pm_summary = serializers.CharField(required=False, allow_blank=True)
    pm_impact = serializers.CharField(required=False, allow_blank=True)
    pm_root_cause = serializers.CharField(required=False, allow_blank=True)
    pm_timeline = serializers.CharField(required=False, allow_blank=True)
    pm_went_well = serializers.CharField(required=False, allow_blank=True)
    pm_went_badly = serializers.CharField(required=False, allow_blank=True)


class TimelineEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = TimelineEntry
        fields = ["id", "incident", "at", "kind", "actor_label", "text", "data"]
        read_only_fields = fields


class ActionItemSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    owner = UsernameField(allow_null=True, required=False)

    class Meta:
        model = ActionItem
        fields = ["id", "incident", "title", "owner", "due_date", "state", "created_at", "overdue"]
        read_only_fields = ["created_at", "overdue"]

    overdue = serializers.BooleanField(source="is_overdue", read_only=True)


class SilenceSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    matchers = MatchersField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Silence
        fields = ["id", "matchers", "starts_at", "ends_at", "comment", "created_by", "created_at"]
        read_only_fields = ["created_by", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        starts = attrs.get("starts_at", getattr(self.instance, "starts_at", None))
        ends = attrs.get("ends_at", getattr(self.instance, "ends_at", None))
        if starts and ends and ends <= starts:
            raise serializers.ValidationError({"ends_at": "Must be after starts_at."})
        return attrs


class MaintenanceWindowSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = MaintenanceWindow
        fields = ["id", "scope", "value", "starts_at", "ends_at", "comment", "created_by", "created_at"]
        read_only_fields = ["created_by", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        starts = attrs.get("starts_at", getattr(self.instance, "starts_at", None))
        ends = attrs.get("ends_at", getattr(self.instance, "ends_at", None))
        if starts and ends and ends <= starts:
            raise serializers.ValidationError({"ends_at": "Must be after starts_at."})
        return attrs


class NotificationChannelSerializer(serializers.ModelSerializer):
    matchers = MatchersField(required=False)

    class Meta:
        model = NotificationChannel
        fields = ["id", "name", "kind", "url", "routing_key", "min_severity", "matchers", "enabled"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        key = attrs.get("routing_key", getattr(self.instance, "routing_key", ""))
        if kind == "pagerduty" and not key:
            raise serializers.ValidationError({"routing_key": "PagerDuty channels need the integration key."})
        return attrs
