"""The capacity plan's answer (fleet.capacity.read.planning.plan, with the parts the rooms above add),
described for the API schema; the view answers with the read model's dict."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers

from fleet.choices import PriorityTier


class PlanTiersSerializer(serializers.Serializer):
    """Reserved demand by tier: the peak of concurrent approved and active GPUs over the month.
    The tiers' names ("on-demand") are no Python names, hence declared in get_fields."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {tier.value: serializers.IntegerField() for tier in PriorityTier}


class PlanMonthSerializer(serializers.Serializer):
    month = serializers.CharField(help_text="YYYY-MM")
    installed = serializers.IntegerField(help_text="on the month's first day")
    energised = serializers.IntegerField()
    healthy = serializers.IntegerField(allow_null=True, help_text="the current month only")
    reserved = PlanTiersSerializer()
    conflict = serializers.BooleanField(help_text="non-preemptible demand exceeds energised supply")
    curtailed = serializers.IntegerField(help_text="GPUs the site's power leaves dark")
    curtailed_why = serializers.CharField(allow_null=True, help_text="the site's power rule in figures")


class PlanPoolSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    site = serializers.CharField()
    gpu_model = serializers.CharField()
    months = PlanMonthSerializer(many=True)


# Parts the rooms above capacity add to the plan's answer: key -> the serializer describing it
# (fleet.capacity.api.register_capacity_part).
plan_part_serializers: dict[str, serializers.Field] = {}


class PlanAnswerSerializer(serializers.Serializer):
    """GET /api/v1/capacity/plan: supply against reserved demand per pool and in total, per month."""

    start = serializers.DateField()
    months = serializers.IntegerField()
    pools = PlanPoolSerializer(many=True)
    total = PlanMonthSerializer(many=True)

    def get_fields(self) -> dict[str, Any]:
        # The parts registered from above (at start-up, before any schema is generated).
        return {**super().get_fields(), **copy.deepcopy(plan_part_serializers)}
