from __future__ import annotations

from rest_framework import serializers

from fleet.models import Endpoint, Gpu, GpuState, Node, Rack, ScrapeTarget, Site
from fleet.telemetry_fields import METRIC_NAMES


class SiteSerializer(serializers.ModelSerializer):
    class Meta:
        model = Site
        fields = ["id", "name", "region", "contracted_power_kw"]


class RackSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())

    class Meta:
        model = Rack
        fields = ["id", "site", "name", "power_budget_kw"]


class NodeSerializer(serializers.ModelSerializer):
    site = serializers.SlugRelatedField(slug_field="name", queryset=Site.objects.all())
    rack = serializers.PrimaryKeyRelatedField(queryset=Rack.objects.all(), allow_null=True, required=False)
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "site", "rack", "hostname", "instance_type", "interconnect", "gpu_count", "created_at"]

    def validate(self, attrs: dict) -> dict:
        rack, site = attrs.get("rack"), attrs.get("site")
        if rack is not None and site is not None and rack.site_id != site.id:
            raise serializers.ValidationError({"rack": "The rack belongs to another site."})
        return attrs


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


class EndpointSerializer(serializers.ModelSerializer):
    """An endpoint and what SREs set on it: where it serves from and its SLOs (targets in percent)."""

    site = serializers.SlugRelatedField(slug_field="name", read_only=True)
    gpus = serializers.SlugRelatedField(
        slug_field="uuid",
        many=True,
        required=False,
        queryset=Gpu.objects.select_related("node"),
        help_text="UUIDs of its GPUs",
    )
    scrape_targets = serializers.PrimaryKeyRelatedField(
        many=True, required=False, queryset=ScrapeTarget.objects.all(), help_text="Ids of its scrape targets"
    )

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "site",
            "name",
            "framework",
            "model_name",
            "version",
            "region",
            "replicas",
            "gpus",
            "scrape_targets",
            "ttft_threshold_ms",
            "ttft_target_pct",
            "itl_threshold_ms",
            "itl_target_pct",
            "availability_target_pct",
            "slo_window_days",
            "created_at",
        ]
        # Registered by the metrics it reports: its identity (site, name) is not edited here.
        read_only_fields = ["name", "created_at"]

    def validate(self, attrs: dict) -> dict:
        site_id = self.instance.site_id if self.instance is not None else None
        if site_id is not None:
            foreign = sorted(g.uuid for g in attrs.get("gpus", []) if g.node.site_id != site_id)
            if foreign:
                raise serializers.ValidationError({"gpus": f"GPUs of another site: {', '.join(foreign[:5])}."})
            foreign_targets = sorted(t.pk for t in attrs.get("scrape_targets", []) if t.site_id != site_id)
            if foreign_targets:
                raise serializers.ValidationError(
                    {"scrape_targets": f"Scrape targets of another site: {', '.join(map(str, foreign_targets[:5]))}."}
                )
        return attrs


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
