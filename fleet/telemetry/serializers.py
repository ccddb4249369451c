from __future__ import annotations

from rest_framework import serializers

from fleet.inventory.models import Gpu, Site
from fleet.telemetry.fields import METRIC_NAMES
from fleet.telemetry.models import GpuState, ScrapeTarget, endpoint_name_missing


class GpuStateSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuState
        fields = ["ts", *METRIC_NAMES]


class MigInstanceSerializer(serializers.ModelSerializer):
    """A MIG instance as listed under its physical GPU."""

    class Meta:
        model = Gpu
        fields = ["uuid", "mig_profile", "mig_instance_id"]


class GpuSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    site = serializers.CharField(source="node.site.name", read_only=True)
    state = GpuStateSerializer(read_only=True, allow_null=True)
    parent = serializers.SlugRelatedField(
        slug_field="uuid", read_only=True, help_text="The physical GPU of a MIG instance"
    )
    mig_instances = MigInstanceSerializer(many=True, read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "uuid",
            "index",
            "model",
            "hbm_gib",
            "node",
            "hostname",
            "site",
            "parent",
            "mig_profile",
            "mig_instance_id",
            "mig_instances",
            "state",
            "created_at",
        ]
        read_only_fields = ["uuid", "mig_profile", "mig_instance_id", "created_at"]


class ScrapeTargetSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())

    class Meta:
        model = ScrapeTarget
        fields = [
            "id",
            "site",
            "name",
            "url",
            "kind",
            "endpoint_name",
            "hostname",
            "interval_seconds",
            "timeout_seconds",
            "enabled",
            "health",
            "last_scrape_at",
            "last_duration_ms",
            "last_samples",
            "last_error",
            "next_scrape_at",
        ]
        read_only_fields = [
            "health",
            "last_scrape_at",
            "last_duration_ms",
            "last_samples",
            "last_error",
            "next_scrape_at",
        ]

    def validate(self, attrs: dict) -> dict:
        """The model's rule (ScrapeTarget.clean), on the values the save would leave: a PATCH of
        the kind alone is judged with the endpoint name already stored."""
        instance = self.instance
        kind = attrs.get("kind", instance.kind if instance else ScrapeTarget._meta.get_field("kind").default)
        name = attrs.get("endpoint_name", instance.endpoint_name if instance else "")
        if message := endpoint_name_missing(kind, name):
            raise serializers.ValidationError({"endpoint_name": message})
        return attrs
