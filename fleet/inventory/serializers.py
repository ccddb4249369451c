from __future__ import annotations

from rest_framework import serializers

from fleet.inventory.models import Node, Rack, Site


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
