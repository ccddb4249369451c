"""The fabric page's read API: port health per site and rack over a window (console.ranges), the
worst ports, the link-flap timeline and throughput per fabric, from the ports' minute rollups.
Any role reads it (a session or a personal token)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view

from console.snapshots import RangeSnapshotView, range_parameters
from fleet.fabric.read import health as fabric
from fleet.fabric.serializers import FabricSnapshotAnswerSerializer
from fleet.inventory.models import Rack


@extend_schema_view(get=extend_schema(parameters=range_parameters(fabric), responses=FabricSnapshotAnswerSerializer))
class FabricSnapshotView(RangeSnapshotView):
    queryset = Rack.objects.all()  # reads need fleet.view_rack
    reads = fabric
    topic = "fabric"
