from __future__ import annotations

from rest_framework import serializers

from fleet.inventory.models import Gpu
from fleet.serving.models import Endpoint
from fleet.telemetry.models import ScrapeTarget


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
