"""The storage page: a server-rendered shell whose figures come from the snapshot API
(fleet.storage.api) over the page's range and the ``storage`` topic's live pushes."""

from __future__ import annotations

from console.snapshots import RangeSnapshotPage
from fleet.storage import read


class StorageDashboardView(RangeSnapshotPage):
    template_name = "storage/dashboard.html"
    reads = read
    topic = "storage"
    snapshot_url_name = "api:storage-api:snapshot"
