"""The cost page's read API: the whole page (``/api/v1/cost/``), each figure on its own route, and
the monthly CSV by team, pool and cause. Any role reads (a session or a personal token); prices
are set in the admin (fleet.admin.PoolPriceAdmin: Admins and capacity approvers)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.ranges import WINDOW_PARAMETERS, RangeError
from fleet.capacity.power_budget import board_power_w
from fleet.cost import read as cost
from fleet.cost import store
from fleet.cost.models import PoolPrice
from fleet.cost.prices import CostError, hourly, rate
from fleet.cost.serializers import PART_ANSWERS, CostSnapshotAnswerSerializer, PriceHourlySerializer

RANGE_PARAMETERS = [
    OpenApiParameter("range", str, enum=list(cost.PRESETS), default=cost.DEFAULT_RANGE),
    *WINDOW_PARAMETERS,
]


class _CostView(APIView):
    queryset = PoolPrice.objects.all()  # reads need fleet.view_poolprice: every role


class CostSnapshotView(_CostView):
    @extend_schema(parameters=RANGE_PARAMETERS, responses=CostSnapshotAnswerSerializer)
    def get(self, request: Request) -> Response:
        try:
            win = cost.window(request.query_params)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        live.watch_topic("cost")
        return Response(cost.snapshot(win))


class CostPartSchema(AutoSchema):
    """One class serves every part's route (as_view(part=...)): each route's answer is its part's."""

    def get_response_serializers(self) -> Any:
        return PART_ANSWERS[self.view.part]


class CostPartView(_CostView):
    """One figure: training, idle, reserved, incidents, serving or own-or-rent."""

    part = ""
    schema = CostPartSchema()

    @extend_schema(parameters=RANGE_PARAMETERS)
    def get(self, request: Request) -> Response:
        try:
            win = cost.window(request.query_params)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        return Response(cost.part(self.part, win))


class CostCsvView(_CostView):
    @extend_schema(parameters=RANGE_PARAMETERS, responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        try:
            win = cost.window(request.query_params)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        response = HttpResponse(cost.export_csv(win), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="cost-{win.start:%Y%m%d}-{win.end:%Y%m%d}.csv"'
        return response


class PoolPriceSerializer(serializers.ModelSerializer):
    hourly = serializers.SerializerMethodField()

    class Meta:
        model = PoolPrice
        fields = [
            "id",
            "pool",
            "valid_from",
            "valid_to",
            "currency",
            "mode",
            "rate_per_gpu_hour",
            "purchase_price_per_gpu",
            "depreciation_months",
            "energy_price_per_kwh",
            "pue",
            "yearly_operations_per_gpu",
            "cloud_rate_per_gpu_hour",
            "note",
            "hourly",
        ]
        # The model's own checks (full_clean in store.save_price) judge the row whole.
        validators: list[Any] = []

    @extend_schema_field(PriceHourlySerializer(allow_null=True))
    def get_hourly(self, price: PoolPrice) -> dict[str, Any] | None:
        """The rate this price gives with the board power of the pool's GPUs, and how it is derived."""
        try:
            per_hour = hourly(price, watts_per_gpu=board_power_w(price.pool.gpu_model))
        except CostError:
            return None
        return {"total": str(rate(per_hour.total)), "derivation": list(per_hour.derivation)}

    def create(self, validated_data: dict[str, Any]) -> PoolPrice:
        return self._save(None, validated_data)

    def update(self, instance: PoolPrice, validated_data: dict[str, Any]) -> PoolPrice:
        return self._save(instance, validated_data)

    def _save(self, instance: PoolPrice | None, values: dict[str, Any]) -> PoolPrice:
        try:
            return store.save_price(instance, **values)
        except store.PriceRefused as exc:
            raise serializers.ValidationError(exc.errors) from None


class PoolPriceViewSet(viewsets.ModelViewSet):
    """Pool prices: every role reads; Admins and capacity approvers add and change them (audited)."""

    queryset = PoolPrice.objects.select_related("pool").order_by("pool_id", "valid_from")
    serializer_class = PoolPriceSerializer
    http_method_names = ["get", "post", "patch", "head", "options"]
    filterset_fields = ["pool", "mode"]
