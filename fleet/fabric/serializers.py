"""The fabric page's read-model answer (fleet.fabric.read.health.snapshot), described for the API
schema; the view answers with the read model's dict."""

from __future__ import annotations

from rest_framework import serializers

from console.schema import CustomWindowSerializer


class PortCountsSerializer(serializers.Serializer):
    ports = serializers.IntegerField()
    up = serializers.IntegerField()
    flapping = serializers.IntegerField()
    degraded = serializers.IntegerField()


class FabricRackSerializer(PortCountsSerializer):
    name = serializers.CharField(help_text='"(no rack)" for nodes without one')


class FabricSiteSerializer(PortCountsSerializer):
    name = serializers.CharField()
    racks = FabricRackSerializer(many=True)


class FabricPortSerializer(serializers.Serializer):
    """One port over the window: its state, flaps, errors and rate against its rated speed."""

    id = serializers.IntegerField()
    hostname = serializers.CharField()
    name = serializers.CharField()
    kind = serializers.CharField(help_text="infiniband or ethernet")
    fabric = serializers.CharField(help_text="compute, storage or management")
    site = serializers.CharField()
    rack = serializers.CharField()
    reported = serializers.BooleanField()
    up = serializers.BooleanField()
    state = serializers.FloatField(allow_null=True, help_text="InfiniBand port state id (4: Active)")
    flaps = serializers.FloatField()
    flapping = serializers.BooleanField()
    symbol_errors = serializers.FloatField()
    errors = serializers.FloatField()
    errors_per_hour = serializers.FloatField(allow_null=True)
    rate_bytes_per_second = serializers.FloatField(allow_null=True)
    rated_bytes_per_second = serializers.FloatField(allow_null=True)
    below_rate = serializers.BooleanField()
    degraded = serializers.BooleanField()
    receive_bytes = serializers.FloatField()
    transmit_bytes = serializers.FloatField()
    last_seen = serializers.DateTimeField(allow_null=True)


class FlapSerializer(serializers.Serializer):
    """A minute a port's link went down or its carrier changed."""

    ts = serializers.DateTimeField()
    hostname = serializers.CharField()
    interface = serializers.CharField()
    flaps = serializers.FloatField()


class FabricThroughputSerializer(serializers.Serializer):
    ts = serializers.ListField(child=serializers.DateTimeField())
    bytes_per_second = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="received plus transmitted, per fabric (compute, storage, management), one value per ts",
    )


class FabricSnapshotAnswerSerializer(serializers.Serializer):
    """GET /api/v1/fabric/: port health per site and rack, the worst ports, the flaps and throughput."""

    ts = serializers.DateTimeField()
    window = CustomWindowSerializer()
    totals = PortCountsSerializer()
    sites = FabricSiteSerializer(many=True)
    worst_ports = FabricPortSerializer(many=True)
    flaps = FlapSerializer(many=True)
    throughput = FabricThroughputSerializer()
