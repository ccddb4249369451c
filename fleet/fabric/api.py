"""The fabric page's read API: port health per site and rack over a window (console.ranges), the
worst ports, the link-flap timeline and throughput per fabric, from the ports' minute rollups.
Any role reads it (a session or a personal token)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.ranges import WINDOW_PARAMETERS, RangeError
from fleet.fabric.read import health as fabric
from fleet.fabric.serializers import FabricSnapshotAnswerSerializer
from fleet.inventory.models import Rack


class FabricSnapshotView(APIView):
    queryset = Rack.objects.all()  # reads need fleet.view_rack

    @extend_schema(
        parameters=[
            OpenApiParameter("range", str, enum=list(fabric.PRESETS), default=fabric.DEFAULT_RANGE),
            *WINDOW_PARAMETERS,
        ],
        responses=FabricSnapshotAnswerSerializer,
    )
    def get(self, request: Request) -> Response:
        try:
            win = fabric.window(request.query_params)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        live.watch_topic("fabric")
        return Response(fabric.snapshot(win))
