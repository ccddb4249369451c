"""The power page's read-model answer (fleet.power.read.snapshot), described for the API
schema; the view answers with the read model's dict. Power in kW, energy in kWh."""

from __future__ import annotations

from rest_framework import serializers


class DrawSerializer(serializers.Serializer):
    """A draw and what it is made of: the GPUs' latest power and the assumed node overhead."""

    gpu_draw_kw = serializers.FloatField()
    node_overhead_kw = serializers.FloatField()
    draw_kw = serializers.FloatField()
    utilisation_pct = serializers.FloatField(allow_null=True, help_text="of the budget (rack) or contract (site)")
    gpus = serializers.IntegerField()
    reporting = serializers.IntegerField()
    idle_gpus = serializers.IntegerField()
    beyond_budget_gpus = serializers.IntegerField(help_text="GPUs the budget cannot run at full load")
    energy_kwh_24h = serializers.FloatField()
    energy_kwh_7d = serializers.FloatField()


class RackPowerSerializer(DrawSerializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    budget_kw = serializers.FloatField(allow_null=True)
    headroom_kw = serializers.FloatField(allow_null=True)
    nodes = serializers.IntegerField()
    nodes_energisable = serializers.IntegerField(help_text="whole nodes the budget runs at full load")


class SitePowerSerializer(DrawSerializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    region = serializers.CharField(allow_blank=True)
    contracted_kw = serializers.FloatField(allow_null=True)
    budget_kw = serializers.FloatField(allow_null=True, help_text="its racks' budgets summed")
    headroom_kw = serializers.FloatField(allow_null=True)
    headroom_limited_by = serializers.ChoiceField(choices=["contract", "racks"], allow_null=True)
    rack_headroom_kw = serializers.FloatField(allow_null=True)
    racks = RackPowerSerializer(many=True)


class DrawSeriesSerializer(serializers.Serializer):
    ts = serializers.ListField(child=serializers.DateTimeField())
    draw_kw = serializers.ListField(child=serializers.FloatField())


class PowerSeriesSerializer(serializers.Serializer):
    """The last hour's draw per minute, by site id and by rack id."""

    sites = serializers.DictField(child=DrawSeriesSerializer())
    racks = serializers.DictField(child=DrawSeriesSerializer())


class PowerSnapshotAnswerSerializer(serializers.Serializer):
    """GET /api/v1/power/."""

    ts = serializers.DateTimeField()
    draw_includes = serializers.CharField()
    node_overhead_w = serializers.FloatField()
    node_overhead_measured = serializers.BooleanField()
    idle_util_pct = serializers.FloatField()
    sites = SitePowerSerializer(many=True)
    series = PowerSeriesSerializer()
