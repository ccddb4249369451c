"""The fleet API's telemetry side: nodes and GPUs with their series, scrape targets, and the fleet
page's snapshot (sites and racks are in fleet.inventory.api, endpoints in fleet.serving.api)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.ranges import WINDOW_PARAMETERS, RangeError, Window, window_from_query
from fleet.inventory.filtersets import GpuFilterSet, NodeFilterSet
from fleet.inventory.models import Gpu, Node
from fleet.inventory.serializers import NodeSerializer
from fleet.telemetry.filtersets import ScrapeTargetFilterSet
from fleet.telemetry.models import ScrapeTarget
from fleet.telemetry.read import figures, fleet_summary, gpu_list
from fleet.telemetry.serializers import (
    FleetOverviewAnswerSerializer,
    GpuSerializer,
    GpuSeriesAnswerSerializer,
    GpuTableAnswerSerializer,
    NodeSeriesAnswerSerializer,
    ScrapeTargetSerializer,
)

RANGE_PARAMETER = OpenApiParameter("range", OpenApiTypes.STR, enum=list(figures.RANGES), default=figures.DEFAULT_RANGE)
PRESETS = {key: timedelta(seconds=seconds) for key, seconds in figures.RANGES.items()}


def _window(request: Request) -> Window:
    """The preset (``range``) or custom window (``from`` / ``to``) asked for; RangeError names the
    parameter at fault."""
    return window_from_query(request.query_params, presets=PRESETS, default=figures.DEFAULT_RANGE)


def _bad_range(exc: RangeError) -> Response:
    return Response(exc.as_dict(), status=400)


class NodeViewSet(viewsets.ModelViewSet):
    # Physical GPUs: a node with one GPU split into three MIG instances has one GPU.
    queryset = Node.objects.select_related("site").annotate(
        gpu_count=Count("gpus", filter=Q(gpus__parent__isnull=True))
    )
    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet
    lookup_field = "hostname"
    lookup_value_regex = r"[A-Za-z0-9.-]+"

    @extend_schema(parameters=[RANGE_PARAMETER, *WINDOW_PARAMETERS], responses=NodeSeriesAnswerSerializer)
    @action(detail=True, methods=["get"])
    def series(self, request: Request, hostname: str | None = None, format: str | None = None) -> Response:
        """The node page's snapshot: one series per physical GPU over the range or from / to."""
        try:
            window = _window(request)
        except RangeError as exc:
            return _bad_range(exc)
        node = self.get_object()
        live.watch_topic(f"node.{node.pk}")
        return Response(figures.node_series(node, range_key=window.preset or figures.DEFAULT_RANGE, window=window))


class GpuViewSet(viewsets.ModelViewSet):
    queryset = Gpu.objects.select_related("node__site", "state", "parent").prefetch_related("mig_instances")
    serializer_class = GpuSerializer
    filterset_class = GpuFilterSet
    lookup_field = "uuid"
    lookup_value_regex = r"[A-Za-z0-9-]+"
    http_method_names = ["get", "patch", "delete", "head", "options"]  # GPUs are registered by ingest

    @extend_schema(parameters=[RANGE_PARAMETER, *WINDOW_PARAMETERS], responses=GpuSeriesAnswerSerializer)
    @action(detail=True, methods=["get"])
    def series(self, request: Request, uuid: str | None = None, format: str | None = None) -> Response:
        """The GPU page's snapshot: the GPU's series over the range (raw for 15 m, rollups beyond)
        or from / to."""
        try:
            window = _window(request)
        except RangeError as exc:
            return _bad_range(exc)
        gpu = self.get_object()
        live.watch_topic(f"gpu.{gpu.pk}")
        return Response(figures.gpu_series(gpu, range_key=window.preset or figures.DEFAULT_RANGE, window=window))


class ScrapeTargetViewSet(viewsets.ModelViewSet):
    queryset = ScrapeTarget.objects.select_related("site")
    serializer_class = ScrapeTargetSerializer
    filterset_class = ScrapeTargetFilterSet


TABLE_PARAMETERS = [
    OpenApiParameter("site", OpenApiTypes.STR, required=False, description="site name"),
    OpenApiParameter("site_id", OpenApiTypes.INT, required=False),
    OpenApiParameter("hostname", OpenApiTypes.STR, required=False, description="contains"),
    OpenApiParameter("model", OpenApiTypes.STR, required=False, description="contains"),
    OpenApiParameter("q", OpenApiTypes.STR, required=False, description="host, UUID or model contains"),
    OpenApiParameter("state", OpenApiTypes.STR, enum=list(gpu_list.STATES), required=False),
    OpenApiParameter("sort", OpenApiTypes.STR, enum=[*gpu_list.SORTS, *(f"-{k}" for k in gpu_list.SORTS)]),
    OpenApiParameter("page", OpenApiTypes.INT, default=1),
    OpenApiParameter("size", OpenApiTypes.INT, default=gpu_list.DEFAULT_SIZE),
]


class FleetOverviewView(APIView):
    """Totals, site rows, the worst GPUs, one page of the GPU table and per-site series: the fleet
    page's snapshot. ``site`` (an id) scopes it to one site; the table's filters, sort and paging
    are those of /api/v1/fleet/gpu-table/ (its ``site`` by name is ``site_id`` here)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("range", OpenApiTypes.STR, enum=list(figures.RANGES), default=figures.DEFAULT_RANGE),
            *WINDOW_PARAMETERS,
            OpenApiParameter("site", OpenApiTypes.INT, required=False),
            *[p for p in TABLE_PARAMETERS if p.name not in ("site", "site_id")],
        ],
        responses=FleetOverviewAnswerSerializer,
    )
    def get(self, request: Request) -> Response:
        try:
            window = _window(request)
        except RangeError as exc:
            return _bad_range(exc)
        params = request.query_params.copy()
        site = params.pop("site", [None])[-1]
        if site is not None and not (site.isdigit() and len(site) <= 12):
            return Response({"site": "Must be a site id."}, status=400)
        try:
            query = gpu_list.parse_query(params, allowed_extra=("range", "from", "to", "format"))
        except gpu_list.TableQueryError as exc:
            return Response(exc.errors, status=400)
        return Response(
            fleet_summary.overview_snapshot(
                range_key=window.preset or figures.DEFAULT_RANGE,
                site_id=int(site) if site else None,
                window=window,
                query=query,
            )
        )


class GpuTableView(APIView):
    """One page of the fleet's GPU table, filtered and sorted on the server (the same filters as
    the fleet page's HTML view), with ``topic``: the live topic whose pushes carry this page's rows."""

    @extend_schema(parameters=TABLE_PARAMETERS, responses=GpuTableAnswerSerializer)
    def get(self, request: Request) -> Response:
        try:
            query = gpu_list.parse_query(request.query_params, allowed_extra=("format",))
        except gpu_list.TableQueryError as exc:
            return Response(exc.errors, status=400)
        return Response(fleet_summary.table_snapshot(query))
