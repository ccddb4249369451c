"""Writing storage series: node_exporter's filesystem collector (per mount: ``device``,
``mountpoint``, ``fstype``) and its diskstats collector (per block ``device``). A mount is
registered on first sighting under its node (fleet.inventory.models.NodeMount)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from console import live
from fleet.inventory.models import NodeMount, purpose_of_mountpoint
from fleet.telemetry import partitions
from fleet.telemetry.series import NodePoint, SeriesTable, site_nodes, store_series

MOUNT_GAUGES = frozenset({"avail_bytes", "size_bytes"})
DISK_COUNTERS = frozenset({"io_time_seconds", "read_bytes", "written_bytes", "reads", "writes"})
MOUNTS = SeriesTable(partitions.MOUNT_SAMPLES, partitions.MOUNT_ROLLUP_1M, ("mount_id",), ("int8",), frozenset())
DISKS = SeriesTable(
    partitions.DISK_SAMPLES, partitions.DISK_ROLLUP_1M, ("node_id", "device"), ("int8", "text"), DISK_COUNTERS
)


def store_storage_points(*, site_id: int, batch_key: str, points: Sequence[NodePoint]) -> int:
    """Store file system and disk values under a batch key (one key per table); return the rows
    written (0: a redelivery)."""
    mounts = [p for p in points if p.source == "filesystem"]
    disks = [p for p in points if p.source == "disk"]
    stored = 0

    def mount_rows() -> list[tuple]:
        ids = _resolve_mounts(site_id, mounts)
        return [(ids[key], p.ts, p.quantity, p.value) for p in mounts if (key := (p.hostname, p.mountpoint)) in ids]

    def disk_rows() -> list[tuple]:
        nodes = site_nodes(site_id, (p.hostname for p in disks))
        return [(nodes[p.hostname], p.device, p.ts, p.quantity, p.value) for p in disks if p.hostname in nodes]

    if mounts:
        stored += store_series(
            MOUNTS, site_id=site_id, batch_key=f"{batch_key}:mount", stamps=[p.ts for p in mounts], rows=mount_rows
        )
    if disks:
        stored += store_series(
            DISKS, site_id=site_id, batch_key=f"{batch_key}:disk", stamps=[p.ts for p in disks], rows=disk_rows
        )
    if stored:  # the storage page follows the mounts while someone watches it
        transaction.on_commit(lambda: live.request_push(*live.watched(["storage"])))
    return stored


def _resolve_mounts(site_id: int, points: Sequence[NodePoint]) -> dict[tuple[str, str], int]:
    """(hostname, mount point) -> mount id, registering the new ones."""
    nodes = site_nodes(site_id, (p.hostname for p in points))
    wanted = {(p.hostname, p.mountpoint): p for p in points if p.hostname in nodes}
    if not wanted:
        return {}
    hostnames = {node_id: h for h, node_id in nodes.items()}

    def existing() -> dict[tuple[str, str], int]:
        found = NodeMount.objects.filter(node_id__in={nodes[h] for h, _ in wanted}).values_list(
            "id", "node_id", "mountpoint"
        )
        return {(hostnames[node_id], mountpoint): pk for pk, node_id, mountpoint in found}

    known = existing()
    new = [
        NodeMount(
            node_id=nodes[h],
            mountpoint=mountpoint,
            fstype=p.fstype,
            device=p.device,
            purpose=purpose_of_mountpoint(mountpoint),
        )
        for (h, mountpoint), p in sorted(wanted.items())
        if (h, mountpoint) not in known
    ]
    if new:
        NodeMount.objects.bulk_create(new, ignore_conflicts=True)
        known = existing()
    return {key: known[key] for key in wanted if key in known}
