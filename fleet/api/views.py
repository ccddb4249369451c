from __future__ import annotations

from django.conf import settings
from django.db.models import Count
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from kombu.exceptions import OperationalError as BrokerError
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.authentication import AgentTokenAuthentication
from console.permissions import IsAgent
from fleet.api.serializers import GpuSerializer, NodeSerializer, RackSerializer, SiteSerializer
from fleet.filtersets import GpuFilterSet, NodeFilterSet, RackFilterSet, SiteFilterSet
from fleet.models import Gpu, Node, Rack, Site
from fleet.services import dashboard
from fleet.services.ingest import IngestError, batch_key, check_site_scope, parse_gpu_batch
from fleet.tasks import ingest_gpu_batch


class SiteViewSet(viewsets.ModelViewSet):
    queryset = Site.objects.all()
    serializer_class = SiteSerializer
    filterset_class = SiteFilterSet


class RackViewSet(viewsets.ModelViewSet):
    queryset = Rack.objects.select_related("site")
    serializer_class = RackSerializer
    filterset_class = RackFilterSet


class NodeViewSet(viewsets.ModelViewSet):
    queryset = Node.objects.select_related("site").annotate(gpu_count=Count("gpus"))
    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet
    lookup_field = "hostname"
    lookup_value_regex = r"[A-Za-z0-9.-]+"


class GpuViewSet(viewsets.ModelViewSet):
    queryset = Gpu.objects.select_related("node__site", "state")
    serializer_class = GpuSerializer
    filterset_class = GpuFilterSet
    lookup_field = "uuid"
    lookup_value_regex = r"[A-Za-z0-9-]+"
    http_method_names = ["get", "patch", "delete", "head", "options"]  # GPUs are registered by ingest


class FleetOverviewView(APIView):
    """Totals, site cards, the GPU table and per-site series: the fleet page's snapshot."""

    @extend_schema(
        parameters=[
            OpenApiParameter("range", OpenApiTypes.STR, enum=list(dashboard.RANGES), default=dashboard.DEFAULT_RANGE),
            OpenApiParameter("site", OpenApiTypes.INT, required=False),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request) -> Response:
        range_key = request.query_params.get("range", dashboard.DEFAULT_RANGE)
        if range_key not in dashboard.RANGES:
            return Response({"range": f"Use one of {', '.join(dashboard.RANGES)}."}, status=400)
        site = request.query_params.get("site")
        if site is not None and not site.isdigit():
            return Response({"site": "Must be a site id."}, status=400)
        return Response(dashboard.overview_snapshot(range_key=range_key, site_id=int(site) if site else None))


class GpuSampleIngestView(APIView):
    """Accept a JSON batch of GPU samples from an agent; 202 once it is queued."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request=inline_serializer("GpuSampleBatch", {"samples": serializers.ListField(child=serializers.DictField())}),
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False)],
        responses={
            202: inline_serializer(
                "IngestAccepted", {"accepted": serializers.IntegerField(), "batch": serializers.CharField()}
            ),
            400: OpenApiResponse(description="Invalid batch; the body names the item and field"),
            401: OpenApiResponse(description="Missing or invalid agent token"),
            403: OpenApiResponse(description="The batch writes another site's GPUs"),
            413: OpenApiResponse(description="Too many samples or too many bytes"),
            503: OpenApiResponse(description="Queue unavailable; retry after Retry-After seconds"),
        },
    )
    def post(self, request: Request) -> Response:
        token = request.auth
        declared = request.META.get("CONTENT_LENGTH")
        try:
            if declared and declared.isdigit() and int(declared) > settings.INGEST_MAX_BYTES:
                raise IngestError(413, f"Body is {declared} bytes; the limit is {settings.INGEST_MAX_BYTES} bytes.")
            body = request.body
            batch = parse_gpu_batch(body)
            check_site_scope(batch, site_id=token.site_id)
            key = batch_key(site_id=token.site_id, body=body, idempotency_key=request.headers.get("Idempotency-Key"))
        except IngestError as exc:
            return Response(exc.as_dict(), status=exc.status)
        try:
            ingest_gpu_batch.apply_async(args=[token.site_id, key, body.decode()])
        except (BrokerError, ConnectionError, OSError) as exc:
            return _unavailable(f"The ingest queue is unavailable ({exc.__class__.__name__}); retry later.")
        return Response({"accepted": len(batch.samples), "batch": key}, status=202)


def _unavailable(message: str, retry_after: int = 5) -> Response:
    response = Response({"error": message}, status=503)
    response["Retry-After"] = str(retry_after)
    return response
