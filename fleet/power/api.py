"""The power page's read API: per site and rack the live draw against budget and contracted power,
headroom, idle GPUs and GPUs beyond the power budget, energy over 24 h and 7 d, and the last hour's per-minute draw.
Any role reads it (a session or a personal token); the page fetches it on load and after a
reconnect, and the ``power`` topic's pushes move it forward."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from fleet.inventory.models import Rack
from fleet.power import read as power
from fleet.power.serializers import PowerSnapshotAnswerSerializer


class PowerSnapshotView(APIView):
    """Power against budget per site and rack, now (see fleet.power.read.snapshot)."""

    queryset = Rack.objects.all()  # reads need fleet.view_rack

    @extend_schema(responses=PowerSnapshotAnswerSerializer)
    def get(self, request: Request) -> Response:
        live.watch_topic("power")
        return Response(power.snapshot())
