"""The fabric page: a server-rendered shell whose figures come from the snapshot API
(fleet.fabric.api) over the page's range and the ``fabric`` topic's live pushes."""

from __future__ import annotations

from console.snapshots import RangeSnapshotPage
from fleet.fabric.read import health


class FabricDashboardView(RangeSnapshotPage):
    template_name = "fabric/dashboard.html"
    reads = health
    topic = "fabric"
    snapshot_url_name = "api:fabric-api:snapshot"
