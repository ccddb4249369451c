"""The storage page's read API: mounts with free space, throughput, I/O time and the jobs on their nodes, and per GPU
server its read throughput against what training needs, from the minute rollups.
Any role reads it (a session or a personal token)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.ranges import WINDOW_PARAMETERS, RangeError
from fleet.inventory.models import Rack
from fleet.storage import read as storage
from fleet.storage.serializers import StorageSnapshotAnswerSerializer


class StorageSnapshotView(APIView):
    queryset = Rack.objects.all()  # reads need fleet.view_rack

    @extend_schema(
        parameters=[
            OpenApiParameter("range", str, enum=list(storage.PRESETS), default=storage.DEFAULT_RANGE),
            *WINDOW_PARAMETERS,
        ],
        responses=StorageSnapshotAnswerSerializer,
    )
    def get(self, request: Request) -> Response:
        try:
            win = storage.window(request.query_params)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        live.watch_topic("storage")
        return Response(storage.snapshot(win))
