"""The storage page's read API: mounts with free space, throughput, I/O time and the jobs on their nodes, and per GPU
server its read throughput against what training needs, from the minute rollups.
Any role reads it (a session or a personal token)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view

from console.snapshots import RangeSnapshotView, range_parameters
from fleet.inventory.models import Rack
from fleet.storage import read as storage
from fleet.storage.serializers import StorageSnapshotAnswerSerializer


@extend_schema_view(get=extend_schema(parameters=range_parameters(storage), responses=StorageSnapshotAnswerSerializer))
class StorageSnapshotView(RangeSnapshotView):
    queryset = Rack.objects.all()  # reads need fleet.view_rack
    reads = storage
    topic = "storage"
