"""The cost page's read-model answers (fleet.cost.read), described for the API schema; the
views answer with the read model's dicts. Amounts are decimals as text, in ``currency``."""

from __future__ import annotations

from rest_framework import serializers

from console.schema import CustomWindowSerializer


def _amount(help_text: str = "decimal, as text") -> serializers.CharField:
    return serializers.CharField(help_text=help_text)


class CostAnswerSerializer(serializers.Serializer):
    window = CustomWindowSerializer()
    currency = serializers.CharField()


class CostShareSerializer(serializers.Serializer):
    gpu_hours = serializers.FloatField()
    amount = _amount()


class CostByKindSerializer(CostShareSerializer):
    kind = serializers.CharField(help_text="training, idle, reserved or incident")
    label = serializers.CharField()


class CostByCauseSerializer(CostByKindSerializer):
    cause = serializers.CharField()


class CostByTeamSerializer(CostShareSerializer):
    team = serializers.CharField()


class CostByPoolSerializer(CostShareSerializer):
    pool_id = serializers.IntegerField(allow_null=True)
    site = serializers.CharField(help_text='"" for GPU-hours in no pool')
    pool = serializers.CharField()


class CostByMonthSerializer(CostShareSerializer):
    month = serializers.CharField(help_text="YYYY-MM")


class CostJobSerializer(CostShareSerializer):
    job_id = serializers.IntegerField()
    name = serializers.CharField()


class ServingCostWindowSerializer(serializers.Serializer):
    tokens = serializers.IntegerField(help_text="generated tokens")
    amount = serializers.CharField(allow_null=True, help_text="the GPUs' cost; null without GPUs or a price")
    per_million_tokens = serializers.CharField(allow_null=True)


class ServingCostSerializer(serializers.Serializer):
    """An endpoint's GPUs, and per window (1h, 24h, 30d) their cost and the cost per million tokens."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    site = serializers.CharField()
    gpus = serializers.IntegerField()
    pool_id = serializers.IntegerField(allow_null=True)
    windows = serializers.DictField(child=ServingCostWindowSerializer())


class OwnOrRentPeriodSerializer(serializers.Serializer):
    days = serializers.IntegerField()
    utilisation_pct = serializers.FloatField()
    cheaper = serializers.ChoiceField(choices=["owning", "renting"], allow_null=True, help_text="null: equal")
    sentence = serializers.CharField()


class OwnOrRentSerializer(serializers.Serializer):
    """A priced pool: its hourly cost now and how it is derived, against renting."""

    pool_id = serializers.IntegerField()
    site = serializers.CharField()
    pool = serializers.CharField()
    mode = serializers.CharField(help_text="owned or rate")
    currency = serializers.CharField()
    hourly = _amount("per GPU-hour, decimal as text")
    derivation = serializers.ListField(child=serializers.CharField())
    cloud_rate = serializers.CharField(allow_null=True)
    break_even_pct = serializers.FloatField(allow_null=True, help_text="owned pools with a cloud rate")
    periods = OwnOrRentPeriodSerializer(many=True)


class CostItemSerializer(CostShareSerializer):
    """GPU-hours of one kind and cause, for one team, pool and month (and job or incident)."""

    month = serializers.CharField()
    team = serializers.CharField()
    site = serializers.CharField()
    pool = serializers.CharField()
    kind = serializers.CharField()
    cause = serializers.CharField()
    unpriced_gpu_hours = serializers.FloatField()
    job_id = serializers.IntegerField(required=False)
    incident_id = serializers.IntegerField(required=False)


class CostSnapshotAnswerSerializer(CostAnswerSerializer):
    """GET /api/v1/cost/: the whole page."""

    ts = serializers.DateTimeField()
    total = _amount()
    gpu_hours = serializers.FloatField()
    unpriced_gpu_hours = serializers.FloatField(help_text="on days no price of the pool covers")
    has_prices = serializers.BooleanField()
    by_kind = CostByKindSerializer(many=True)
    by_cause = CostByCauseSerializer(many=True)
    by_team = CostByTeamSerializer(many=True)
    by_pool = CostByPoolSerializer(many=True)
    by_month = CostByMonthSerializer(many=True)
    top_jobs = CostJobSerializer(many=True)
    serving = ServingCostSerializer(many=True)
    own_or_rent = OwnOrRentSerializer(many=True)


class CostItemsAnswerSerializer(CostAnswerSerializer):
    """GET /api/v1/cost/{training,idle,reserved,incidents}/: one figure's rows."""

    total = _amount()
    gpu_hours = serializers.FloatField()
    rows = CostItemSerializer(many=True)


class ServingCostAnswerSerializer(CostAnswerSerializer):
    """GET /api/v1/cost/serving/."""

    endpoints = ServingCostSerializer(many=True)


class OwnOrRentAnswerSerializer(CostAnswerSerializer):
    """GET /api/v1/cost/own-or-rent/."""

    pools = OwnOrRentSerializer(many=True)


# Each part's route (fleet.cost.api_urls) -> its answer.
PART_ANSWERS: dict[str, type[serializers.Serializer]] = {
    "training": CostItemsAnswerSerializer,
    "idle": CostItemsAnswerSerializer,
    "reserved": CostItemsAnswerSerializer,
    "incidents": CostItemsAnswerSerializer,
    "serving": ServingCostAnswerSerializer,
    "own-or-rent": OwnOrRentAnswerSerializer,
}


class PriceHourlySerializer(serializers.Serializer):
    """The rate a price gives with the board power of its pool's GPUs, and how it is derived."""

    total = _amount("per GPU-hour, decimal as text")
    derivation = serializers.ListField(child=serializers.CharField())
