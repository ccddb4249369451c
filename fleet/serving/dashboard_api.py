"""The serving pages' read APIs: the SLO overview and one endpoint's snapshot over a range. Any
role reads them (a session or a personal token); the pages fetch them on load and after a
reconnect, and the live pushes move them forward."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.ranges import WINDOW_PARAMETERS, RangeError, window_from_query
from fleet.serving import read as serving_read
from fleet.serving.models import Endpoint
from fleet.serving.serializers import EndpointSnapshotAnswerSerializer, ServingOverviewAnswerSerializer


class ServingOverviewView(APIView):
    """Per endpoint: its SLOs, TTFT and ITL p50 / p99 over the last five minutes, request and token
    rates, queue depth, running requests and KV-cache usage, the error budget left and the burn
    rate over 5 m, 30 m, 1 h, 6 h and 3 d per SLO with the multi-window alerts firing, and the last
    hour's per-minute points. Read from the serving rollups."""

    queryset = Endpoint.objects.all()  # reads need fleet.view_endpoint

    @extend_schema(responses=ServingOverviewAnswerSerializer)
    def get(self, request: Request) -> Response:
        live.watch_topic("serving")
        return Response(serving_read.current_overview())


class EndpointSnapshotView(APIView):
    """An endpoint's page over a range ending now: the chart series, the SLO table, the figures
    since each server started, change events and evals (chart markers), and the prompt-length
    distribution against the 7 days before the range."""

    queryset = Endpoint.objects.all()  # reads need fleet.view_endpoint

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "range",
                OpenApiTypes.STR,
                enum=list(serving_read.RANGES),
                default=serving_read.DEFAULT_RANGE,
            ),
            *WINDOW_PARAMETERS,
        ],
        responses=EndpointSnapshotAnswerSerializer,
    )
    def get(self, request: Request, pk: int) -> Response:
        try:
            window = window_from_query(
                request.query_params, presets=serving_read.RANGES, default=serving_read.DEFAULT_RANGE
            )
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        endpoint = get_object_or_404(Endpoint.objects.select_related("site"), pk=pk)
        live.watch_topic(f"endpoint.{endpoint.pk}")
        range_key = window.preset or serving_read.DEFAULT_RANGE
        return Response(serving_read.endpoint_snapshot(endpoint, range_key, window=window))
