"""Writing storage series: node_exporter's filesystem collector (per mount: ``device``,
``mountpoint``, ``fstype``), its mountstats collector (per NFS ``export``) and its diskstats
collector (per block ``device``). A mount is registered on first sighting under its node
(fleet.inventory.models.NodeMount) from its filesystem series.

mountstats names no mount point, only the export (``10.0.4.20:/datasets``), which is the
filesystem collector's ``device`` of that mount: its values go to the node's mounts of that device
(node_exporter prints one export's figures once per node, however many times it is mounted: the
kernel shares them between mounts of one export, so each of its mounts carries them). An export
with no mount known on its node (its filesystem series not seen yet, or never: a mount the
filesystem collector excludes) registers nothing, since it names no mount point: its values are not
written, and are counted in ``goodput_ingest_ignored_total{door="node_mountstats"}`` (as are those
of another site's node). One export reached over two transports or server addresses (two series
differing in ``protocol`` or ``mountaddr``) is summed into its mounts' values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from console import counters
from fleet.inventory import directory
from fleet.inventory.models import NodeMount, purpose_of_mountpoint
from fleet.telemetry import partitions
from fleet.telemetry.series import NodePoint, Part, SeriesTable, queued, site_nodes, store_parts

MOUNT_GAUGES = frozenset({"avail_bytes", "size_bytes"})
# mountstats (NFS), per export: bytes from and to the server, READ operations and their summed RTT.
MOUNT_COUNTERS = frozenset({"nfs_read_bytes", "nfs_write_bytes", "nfs_read_ops", "nfs_read_response_seconds"})
DISK_COUNTERS = frozenset({"io_time_seconds", "read_bytes", "written_bytes", "reads", "writes"})
# Queued minutes, folded by update_node_rollups, which then updates the storage page.
MOUNTS = queued(
    SeriesTable(
        partitions.MOUNT_SAMPLES,
        partitions.MOUNT_ROLLUP_1M,
        ("mount_id",),
        ("int8",),
        MOUNT_COUNTERS,
        queue="mount",
        topic="storage",
    )
)
DISKS = queued(
    SeriesTable(
        partitions.DISK_SAMPLES,
        partitions.DISK_ROLLUP_1M,
        ("node_id", "device"),
        ("int8", "text"),
        DISK_COUNTERS,
        queue="disk",
        topic="storage",
    )
)


def store_storage_points(*, site_id: int, batch_key: str, points: Sequence[NodePoint]) -> int:
    """Store file system, mountstats and disk values under a batch key (one key per table); return
    the rows written (0: a redelivery)."""
    return store_parts(site_id=site_id, parts=storage_parts(site_id=site_id, batch_key=batch_key, points=points))


def storage_parts(*, site_id: int, batch_key: str, points: Sequence[NodePoint]) -> list[Part]:
    """The mounts' and disks' shares of a push, for series.store_parts."""
    mounts = [p for p in points if p.source in ("filesystem", "mountstats")]
    disks = [p for p in points if p.source == "disk"]
    unmounted = 0

    def mount_rows() -> list[tuple]:
        nonlocal unmounted
        # The filesystem series first: a mount seen for the first time in this push is registered
        # before its export's mountstats look for it.
        ids = _resolve_mounts(site_id, [p for p in mounts if p.source == "filesystem"])
        rows = [
            (ids[key], p.ts, p.quantity, p.value)
            for p in mounts
            if p.source == "filesystem" and (key := (p.hostname, p.mountpoint)) in ids
        ]
        nfs = [p for p in mounts if p.source == "mountstats"]
        exports = _resolve_exports(site_id, nfs)
        unmounted = 0
        # One export reached over two transports or addresses is two series of one mount: summed.
        summed: dict[tuple, float] = defaultdict(float)
        for p in nfs:
            targets = exports.get((p.hostname, p.device), [])
            unmounted += not targets
            for pk in targets:
                summed[(pk, p.ts, p.quantity)] += p.value
        return rows + [(pk, ts, quantity, value) for (pk, ts, quantity), value in summed.items()]

    def count_unmounted() -> None:
        if unmounted:
            counters.increment("goodput_ingest_ignored_total", unmounted, door="node_mountstats")

    def disk_rows() -> list[tuple]:
        nodes = site_nodes(site_id, (p.hostname for p in disks))
        return [(nodes[p.hostname], p.device, p.ts, p.quantity, p.value) for p in disks if p.hostname in nodes]

    parts = []
    if mounts:
        hosts = frozenset(p.hostname for p in mounts)
        parts.append(Part(MOUNTS, f"{batch_key}:mount", [p.ts for p in mounts], mount_rows, count_unmounted, hosts))
    if disks:
        hosts = frozenset(p.hostname for p in disks)
        parts.append(Part(DISKS, f"{batch_key}:disk", [p.ts for p in disks], disk_rows, hostnames=hosts))
    return parts


def _node_mounts(node_ids: set[int]) -> dict[int, dict[str, tuple[int, str]]]:
    """node id -> {mount point: (mount id, device)}: from the directory's cache, else read (and
    cached once this transaction commits)."""
    cached, misses = directory.node_parts("mount", node_ids)
    if misses:
        read: dict[int, dict[str, tuple[int, str]]] = {n: {} for n in misses}
        found = NodeMount.objects.filter(node_id__in=misses).values_list("id", "node_id", "mountpoint", "device")
        for pk, node_id, mountpoint, device in found.order_by("id"):
            read[node_id][mountpoint] = (pk, device)
        directory.remember_node_parts("mount", read)
        cached.update(read)
    return cached


def _resolve_exports(site_id: int, points: Sequence[NodePoint]) -> dict[tuple[str, str], list[int]]:
    """(hostname, export) -> the ids of the node's mounts of that device (none registered here)."""
    if not points:
        return {}
    nodes = site_nodes(site_id, (p.hostname for p in points))
    wanted = {(p.hostname, p.device) for p in points if p.hostname in nodes}
    mounts = _node_mounts({nodes[h] for h, _ in wanted})
    out: dict[tuple[str, str], list[int]] = defaultdict(list)
    for h, device in wanted:
        out[(h, device)] = sorted(pk for pk, d in mounts[nodes[h]].values() if d == device)
    return {key: ids for key, ids in out.items() if ids}


def _resolve_mounts(site_id: int, points: Sequence[NodePoint]) -> dict[tuple[str, str], int]:
    """(hostname, mount point) -> mount id, registering the new ones."""
    if not points:
        return {}
    nodes = site_nodes(site_id, (p.hostname for p in points))
    wanted = {(p.hostname, p.mountpoint): p for p in points if p.hostname in nodes}
    if not wanted:
        return {}
    node_ids = {nodes[h] for h, _ in wanted}
    known = _node_mounts(node_ids)
    new = [
        NodeMount(
            node_id=nodes[h],
            mountpoint=mountpoint,
            fstype=p.fstype,
            device=p.device,
            purpose=purpose_of_mountpoint(mountpoint),
        )
        for (h, mountpoint), p in sorted(wanted.items())
        if mountpoint not in known[nodes[h]]
    ]
    if new:
        NodeMount.objects.bulk_create(new, ignore_conflicts=True)
        directory.forget_node_parts("mount", node_ids)
        known = _node_mounts(node_ids)  # read again: cached, with the new ones, once committed
    return {(h, m): known[nodes[h]][m][0] for h, m in wanted if m in known[nodes[h]]}
