from __future__ import annotations

from rest_framework import serializers

from fleet.inventory.models import Node, NodeInterface, NodeMount, Rack, Site


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


class NodeInterfaceSerializer(serializers.ModelSerializer):
    """A port: created by the ingest door; an Operator sets its kind (node_exporter cannot tell RoCE
    from Ethernet) and its fabric (blank: the kind's default, fleet.choices.DEFAULT_FABRIC)."""

    node = serializers.SlugRelatedField(slug_field="hostname", read_only=True)

    class Meta:
        model = NodeInterface
        fields = ["id", "node", "name", "kind", "fabric", "rate_bytes_per_second", "created_at"]
        read_only_fields = ["name", "rate_bytes_per_second", "created_at"]


class NodeMountSerializer(serializers.ModelSerializer):
    """A mount: created by the ingest door; an Operator sets its purpose (datasets, checkpoints),
    which decides which storage detectors judge it."""

    node = serializers.SlugRelatedField(slug_field="hostname", read_only=True)

    class Meta:
        model = NodeMount
        fields = ["id", "node", "mountpoint", "fstype", "device", "purpose", "created_at"]
        read_only_fields = ["mountpoint", "fstype", "device", "created_at"]
