"""The storage page's read model, its API, its live pushes and its overview tile, read from the
mounts' and disks' 1-minute rollups (never raw samples).

* A mount's free space: its latest ``avail_bytes`` of ``size_bytes``.
* A mount's throughput and I/O time: a local mount's from its block device's disk counters (a
  mount on ``/dev/nvme0n1p2`` reads disk ``nvme0n1``), read and written bytes per second and the
  share of the window the disk was busy (``io_time_seconds``). A network file system has no block
  device on the node: an NFS mount's throughput is its mountstats' bytes read from and written to
  the server (``nfs_read_bytes``, ``nfs_write_bytes``) per second, with its READs' mean response
  time (``read_seconds_per_op``), and no I/O time; a network mount without mountstats (Lustre,
  WEKA) shows none, its traffic counted in the node's storage-fabric receive bytes below.
* Jobs reading from a mount: the jobs holding GPUs on the mount's node now, from
  fleet.telemetry.placement, the one locator the storage detectors read too (storage does not
  import training: training registers it). Fabric's storage-fabric receive bytes come in through
  register_fabric_reads, wired by fleet.apps.
* A GPU server's read throughput: per minute its disks' read bytes plus its storage-fabric
  ports' received bytes, per second (not its NFS mounts' mountstats: that traffic arrives through
  the storage-fabric ports, and would count twice); its peak minute and its average against the
  NEED_BYTES_PER_SECOND a training server needs (10-20 GB/s), so an under-provisioned tier shows:
  a training server (one that mounts a datasets file system, or holds a training job now) that
  read but never reached 10 GB/s in a minute is below need. An idle one is not, and an inference
  server (reading its model cache) is not judged against a training server's need.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from console.ranges import Window, window_from_query
from fleet.choices import MountPurpose
from fleet.inventory.models import Gpu, NodeMount
from fleet.storage.store import MOUNT_COUNTERS
from fleet.telemetry.placement import jobs_on_hosts

PRESETS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24)}
DEFAULT_RANGE = "1h"
NEED_BYTES_PER_SECOND = (10e9, 20e9)  # what a training server reads, low and high
LOW_FREE_PCT = 10.0

# (start, end) -> {node id: {minute: bytes}}: storage-fabric bytes received (fleet.apps).
FabricReads = Callable[[datetime, datetime], dict[int, dict[datetime, float]]]
_fabric_reads: FabricReads = lambda start, end: {}  # noqa: E731


def jobs_by_node(hostnames: dict[int, str]) -> dict[int, list[dict[str, Any]]]:
    """{node id: hostname} -> {node id: [{"id", "name", "team"}]}: the jobs holding GPUs on each
    now (fleet.telemetry.placement, as the storage detectors name them)."""
    placed = jobs_on_hosts(timezone.now(), hostnames.values())
    return {
        node_id: [{"id": j.pk, "name": j.name, "team": j.team} for j in sorted(placed[h], key=lambda j: (j.name, j.pk))]
        for node_id, h in hostnames.items()
        if placed.get(h)
    }


def register_fabric_reads(reads: FabricReads) -> None:
    global _fabric_reads
    _fabric_reads = reads


def window(params: Any, *, now: datetime | None = None) -> Window:
    return window_from_query(params, presets=PRESETS, default=DEFAULT_RANGE, now=now)


def default_window() -> Window:
    return window({})


def disk_of(device: str, disks: Iterable[str]) -> str | None:
    """The block device a mount's device sits on: ``/dev/nvme0n1p2`` -> ``nvme0n1``,
    ``/dev/sda1`` -> ``sda``; None for a network file system or an unknown disk."""
    name = device.rsplit("/", 1)[-1] if device.startswith("/dev/") else None
    if not name:
        return None
    for disk in sorted(disks, key=len, reverse=True):
        if name == disk or (name.startswith(disk) and re.fullmatch(r"p?\d+", name[len(disk) :])):
            return disk
    return None


def _mount_figures(start: datetime, end: datetime, ids: list[int]) -> dict[int, dict[str, float]]:
    """mount id -> {quantity: the latest value (a gauge) or the increase over the window (a
    mountstats counter)}, and ``_seen``: its latest minute."""
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT mount_id, quantity, (array_agg(last ORDER BY bucket DESC))[1], max(bucket),
                   coalesce(sum(increase), 0)
            FROM fleet_mountrollup_1m
            WHERE mount_id = ANY(%s) AND bucket >= %s AND bucket < %s
            GROUP BY mount_id, quantity
            """,
            [ids, start, end],
        )
        out: dict[int, dict[str, Any]] = defaultdict(dict)
        for mount_id, quantity, last, latest, increase in cursor.fetchall():
            out[mount_id][quantity] = increase if quantity in MOUNT_COUNTERS else last
            out[mount_id]["_seen"] = max(latest, out[mount_id].get("_seen", latest))
        return out


def _disk_minutes(start: datetime, end: datetime, node_ids: list[int] | None) -> list[tuple]:
    """(node id, device, minute, quantity, increase) over the window."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT node_id, device, bucket, quantity, coalesce(increase, 0)
            FROM fleet_diskrollup_1m
            WHERE bucket >= %s AND bucket < %s AND (%s::int8[] IS NULL OR node_id = ANY(%s::int8[]))
            """,
            [start, end, node_ids, node_ids],
        )
        return cursor.fetchall()


def mounts(
    win: Window, *, node_id: int | None = None, node_ids: list[int] | None = None, purposes: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Every mount (of one node, of these nodes, or all; of these purposes, or any) with free space,
    its throughput over the window (a local mount's disk, with its I/O time; an NFS mount's
    mountstats, with its READs' mean response time), and the running jobs on its node."""
    rows = NodeMount.objects.values(
        "id", "mountpoint", "fstype", "device", "purpose", "node_id", "node__hostname", "node__site__name"
    ).order_by("node__hostname", "mountpoint")
    if node_id is not None:
        rows = rows.filter(node_id=node_id)
    elif node_ids is not None:
        rows = rows.filter(node_id__in=node_ids)
    if purposes:
        rows = rows.filter(purpose__in=list(purposes))
    rows = list(rows)
    node_ids = sorted({r["node_id"] for r in rows})
    gauges = _mount_figures(win.start, win.end, [r["id"] for r in rows])
    disks: dict[tuple[int, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for node, device, _, quantity, increase in _disk_minutes(win.start, win.end, node_ids):
        disks[(node, device)][quantity] += increase
    per_node_disks: dict[int, set[str]] = defaultdict(set)
    for node, device in disks:
        per_node_disks[node].add(device)
    jobs = jobs_by_node({r["node_id"]: r["node__hostname"] for r in rows})
    seconds = win.span.total_seconds()
    out = []
    for r in rows:
        g = gauges.get(r["id"], {})
        size, avail = g.get("size_bytes"), g.get("avail_bytes")
        disk = disk_of(r["device"], per_node_disks[r["node_id"]])
        d = disks.get((r["node_id"], disk)) if disk else None
        nfs = "nfs_read_bytes" in g or "nfs_write_bytes" in g
        if d is None and nfs:
            d = {
                "read_bytes": g.get("nfs_read_bytes", 0.0),
                "written_bytes": g.get("nfs_write_bytes", 0.0),
                "io_time_seconds": None,
            }
        reads = g.get("nfs_read_ops")
        out.append(
            {
                "id": r["id"],
                "hostname": r["node__hostname"],
                "site": r["node__site__name"],
                "mountpoint": r["mountpoint"],
                "fstype": r["fstype"],
                "device": r["device"],
                "purpose": r["purpose"],
                "disk": disk,
                "size_bytes": size,
                "avail_bytes": avail,
                "free_pct": round(100 * avail / size, 1) if size and avail is not None else None,
                "read_bytes_per_second": d["read_bytes"] / seconds if d else None,
                "written_bytes_per_second": d["written_bytes"] / seconds if d else None,
                "io_busy_pct": round(100 * d["io_time_seconds"] / seconds, 1)
                if d and d["io_time_seconds"] is not None
                else None,
                "read_seconds_per_op": g.get("nfs_read_response_seconds", 0.0) / reads if reads else None,
                "last_seen": g["_seen"].isoformat() if "_seen" in g else None,
                "jobs": jobs.get(r["node_id"], []),
            }
        )
    return out


def servers(win: Window) -> list[dict[str, Any]]:
    """Per GPU server: read bytes per second (disks plus storage-fabric receive), its average and
    peak minute over the window, against what a training server needs."""
    gpu_nodes = dict(
        Gpu.objects.physical().values_list("node_id", "node__hostname").distinct().order_by("node__hostname")
    )
    per_minute: dict[int, dict[datetime, float]] = defaultdict(lambda: defaultdict(float))
    for node, _, bucket, quantity, increase in _disk_minutes(win.start, win.end, list(gpu_nodes)):
        if quantity == "read_bytes":
            per_minute[node][bucket] += increase
    for node, minutes in _fabric_reads(win.start, win.end).items():
        if node in gpu_nodes:
            for bucket, received in minutes.items():
                per_minute[node][bucket] += received
    seconds = win.span.total_seconds()
    jobs = jobs_by_node(gpu_nodes)
    datasets = set(
        NodeMount.objects.filter(node_id__in=list(gpu_nodes), purpose=MountPurpose.DATASETS).values_list(
            "node_id", flat=True
        )
    )
    out = []
    for node_id, hostname in sorted(gpu_nodes.items(), key=lambda kv: kv[1]):
        minutes = per_minute.get(node_id, {})
        peak = max(minutes.values(), default=0.0) / 60
        average = sum(minutes.values()) / seconds
        out.append(
            {
                "hostname": hostname,
                "average_read_bytes_per_second": average,
                "peak_read_bytes_per_second": peak,
                "need_bytes_per_second": NEED_BYTES_PER_SECOND[0],
                "training": (training := node_id in datasets or bool(jobs.get(node_id))),
                # An idle server says nothing about its tier: only a training server that read,
                # and never faster than the need in its busiest minute, is below it.
                "below_need": training and 0 < peak < NEED_BYTES_PER_SECOND[0],
                "reported": bool(minutes),
                "jobs": jobs.get(node_id, []),
            }
        )
    return out


def snapshot(win: Window | None = None) -> dict[str, Any]:
    win = win or default_window()
    every = mounts(win)
    per_server = servers(win)
    return {
        "ts": timezone.now().isoformat(),
        "window": win.as_json(),
        "need_bytes_per_second": list(NEED_BYTES_PER_SECOND),
        "totals": {
            "mounts": len(every),
            "low_free": sum(1 for m in every if m["free_pct"] is not None and m["free_pct"] < LOW_FREE_PCT),
            "servers": len(per_server),
            "training_servers": sum(s["training"] for s in per_server),
            "servers_below_need": sum(s["below_need"] for s in per_server),
        },
        "mounts": every,
        "servers": per_server,
    }


def build_storage_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``storage`` topic's push: the default window's figures when they changed."""
    snap = snapshot()
    figures = {"totals": snap["totals"], "mounts": snap["mounts"], "servers": snap["servers"]}
    if watermark == figures:
        return None, watermark
    return {"type": "storage.delta", "topic": topic, "ts": snap["ts"], **figures}, figures


def overview_tile(request: Any) -> dict[str, Any]:
    snap = snapshot()
    low = [m for m in snap["mounts"] if m["free_pct"] is not None and m["free_pct"] < LOW_FREE_PCT]
    return {"has_mounts": bool(snap["mounts"]), **snap["totals"], "low": low[:3]}


def forget_mount(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A deleted mount leaves the writer's cache of its node (this process's; others' expire)."""
    from fleet.inventory import directory

    directory.forget_node_parts("mount", [instance.node_id])


def node_section(node: Any) -> dict[str, Any]:
    """The node page's mounts: each with its latest free space and its disk's figures over the last hour."""
    win = default_window()
    return {"mounts": mounts(win, node_id=node.pk), "window": win}
