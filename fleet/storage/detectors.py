"""Storage detectors: functions from mounts' and disks' recent series (fleet.storage.models) and
the jobs on their nodes to the findings present now, registered with the incident engine like the
GPU-health and training detectors.

* storage-starvation: jobs reading a datasets mount stall on input data while the file system's
  backing disk saturates, its NFS READs slow down, or its read throughput falls: one finding per
  file system naming them;
* storage-checkpoint-full: a checkpoints mount under the free-space threshold (setting
  ``STORAGE_CHECKPOINT_FREE_FRACTION``, default 10 %), or projected to fill within a day.

Which jobs read which mount: a job reads the ``datasets`` mounts (``NodeMount.purpose``) of the
nodes it holds GPUs on, and writes its checkpoints to their ``checkpoints`` mounts (jobs declare no
dataset path). The storage room may not import training, so the jobs on a node come from
fleet.telemetry.placement (a locator training registers at start-up), and a job's data-wait
figure from its firing ``training-data-stall`` finding (the incidents layer): a job counts as
stalling when that finding fires (its data-wait fraction >= 0.3 of its step time, the training
detector's own line) when the file system starves. The findings read are those firing as this
cycle starts (rooms register by name, so storage runs before training: the data-stall findings are at
most one detector interval old, and a stall is sustained over minutes).

One file system, one finding: a network file system (NFS, Lustre, WEKA, ...: a device naming a
server, or a network fstype) mounted on many nodes is one file system per (site, fstype, device,
mount point); a local one (NVMe) is one per node and mount point. A local file system is judged
by its backing device, the diskstats device named by the mount's ``/dev/`` device
(``/dev/nvme0n1p1`` -> ``nvme0n1p1``); a network file system has none in diskstats and is judged
by its mounts' mountstats (NFS: node_exporter's mountstats collector, per export), summed over
the nodes that mount it: the bytes read from the server, and the READ operations' mean response
time. ``fs_window`` picks the one or the other, for this detector and for the correlation
(fleet.correlation.causes). A network file system without mountstats (Lustre, WEKA: their
clients print none) cannot be judged and raises none.

Every finding carries the labels a correlation needs: site, mountpoint, fstype, device, nodes
(comma-joined hostnames; ``hostname`` too for a local file system) and jobs (comma-joined job
ids), and in its impact the jobs with their GPUs and GPU-hours stalled. A starvation finding
carries ``gpu_hours_stalled`` but no ``gpu_hours``: the jobs' own data-stall findings carry those
hours, and the incident engine would count them twice.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from fleet.choices import MountPurpose
from fleet.inventory.models import NodeMount
from fleet.storage.models import MountRollup1m
from fleet.telemetry.placement import PlacedJob, jobs_on_hosts
from incidents.choices import FindingStatus, Severity
from incidents.detectors import FindingSpec, detector, source_of
from incidents.models import Finding

WINDOW = timedelta(minutes=5)  # the recent stretch judged (whole minutes before now's)
BASELINE = timedelta(hours=1)  # the read throughput before it, that a drop is measured against
MIN_RECENT_MINUTES = 3  # minutes of disk rollups the window needs to judge
IO_SATURATED = 0.9  # io_time seconds per second: the device busy nearly all the time
# NFS: a READ's mean response time (server round trip) over the window at or above this starves the
# readers, whatever it was before (as a saturated disk does); an NVMe-backed NFS or VAST/WEKA
# server answers a 1 MiB READ in a few ms, a disk-backed one in 10-20 ms. The hour before is
# reported with it.
SLOW_READ_SECONDS = 0.05
MIN_READS = 10  # READs in the window for their mean response time to count
READ_DROP = 0.5  # recent read throughput at or below (1 - this) x the baseline's is a drop
MIN_BASELINE_READ = 1e6  # bytes/s: a baseline below this is idle, not a throughput to fall from
DATA_STALL = "training-data-stall"
PROJECTION = timedelta(hours=3)  # the free-space trend is fitted over this
PROJECTION_MIN_SPAN = timedelta(minutes=30)
PROJECTION_MIN_POINTS = 10
FILL_WITHIN = timedelta(days=1)
FRESH = timedelta(minutes=15)  # a mount's free space older than this is not judged
NETWORK_FSTYPES = frozenset(
    {"nfs", "nfs4", "lustre", "wekafs", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.weka", "vastfs"}
)


@dataclass
class FileSystem:
    """One file system: its mounts (one per node for a network file system, one for a local)."""

    site: str
    mountpoint: str
    fstype: str
    device: str
    network: bool
    mounts: list[tuple[int, int, str]] = field(default_factory=list)  # (mount id, node id, hostname)

    @property
    def hosts(self) -> list[str]:
        return sorted({h for _, _, h in self.mounts})

    def fingerprint(self, detector: str) -> str:
        where = self.device if self.network else self.hosts[0]
        return f"{detector}:{self.site}:{where}:{self.mountpoint}"

    def backing(self) -> list[tuple[int, str]]:
        """(node id, diskstats device) of each mount on a block device."""
        if self.network or not self.device.startswith("/dev/"):
            return []
        return [(node_id, os.path.basename(self.device)) for _, node_id, _ in self.mounts]

    def labels(self, jobs: list[PlacedJob]) -> dict[str, str]:
        out = {
            "site": self.site,
            "mountpoint": self.mountpoint,
            "fstype": self.fstype,
            "device": self.device,
            "nodes": ",".join(self.hosts),
            "jobs": ",".join(str(j.pk) for j in jobs),
        }
        if not self.network:
            out["hostname"] = self.hosts[0]
        return out

    def name(self) -> str:
        return f"{self.mountpoint} ({self.device})" if self.network else f"{self.hosts[0]}:{self.mountpoint}"


def file_systems(purpose: str) -> list[FileSystem]:
    """The mounts of this purpose, grouped into file systems (one query)."""
    found: dict[tuple, FileSystem] = {}
    rows = NodeMount.objects.filter(purpose=purpose).values_list(
        "id", "node_id", "node__hostname", "node__site__name", "mountpoint", "fstype", "device"
    )
    for pk, node_id, hostname, site, mountpoint, fstype, device in rows.order_by("id"):
        network = fstype in NETWORK_FSTYPES or ":" in device or "@" in device
        key = (site, fstype, device, mountpoint) if network else (node_id, mountpoint)
        fs = found.setdefault(key, FileSystem(site, mountpoint, fstype, device, network))
        fs.mounts.append((pk, node_id, hostname))
    return list(found.values())


def _jobs(placed: dict[str, list[PlacedJob]], fs: FileSystem) -> list[PlacedJob]:
    jobs = {j.pk: j for h in fs.hosts for j in placed.get(h, [])}
    return [jobs[pk] for pk in sorted(jobs)]


def stalled_jobs() -> dict[int, dict[str, Any]]:
    """Job id -> its firing data-stall finding's impact (data_wait_fraction, gpu_hours_lost)."""
    rows = Finding.objects.filter(source=source_of(DATA_STALL), status=FindingStatus.FIRING).values_list(
        "labels", "impact"
    )
    out = {}
    for labels, impact in rows:
        job = str((labels or {}).get("job", ""))
        if job.isdigit():
            out[int(job)] = impact or {}
    return out


@dataclass(frozen=True)
class StorageWindow:
    """A file system's recent figures: over the last WINDOW whole minutes, and the BASELINE before."""

    io_util: float | None  # io_time seconds per second over the window (the busiest device)
    read_rate: float | None  # bytes/s over the window, summed over the devices (or the NFS mounts)
    baseline_read_rate: float | None  # bytes/s over the hour before
    read_latency: float | None = None  # NFS: seconds per READ over the window, all its mounts
    baseline_read_latency: float | None = None  # NFS: seconds per READ over the hour before


def fs_window(now: datetime, fs: FileSystem) -> StorageWindow:
    """The figures a file system is judged by: a network file system's mountstats over its mounts,
    a local one's backing disk."""
    if fs.network:
        return mount_window(now, [pk for pk, _, _ in fs.mounts])
    return disk_window(now, fs.backing())


def disk_window(now: datetime, devices: list[tuple[int, str]]) -> StorageWindow:
    """The backing devices' I/O time and read throughput over the last WINDOW whole minutes and
    the BASELINE before, from the 1-minute rollups' increases (resets counted as increase())."""
    if not devices:
        return StorageWindow(None, None, None)
    end = now.replace(second=0, microsecond=0)
    cut = end - WINDOW
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT node_id, device, quantity, bucket >= %(cut)s AS recent, count(*), sum(increase)
            FROM fleet_diskrollup_1m
            WHERE (node_id, device) IN (SELECT * FROM unnest(%(nodes)s::bigint[], %(devices)s::text[]))
              AND quantity IN ('io_time_seconds', 'read_bytes')
              AND bucket >= %(start)s AND bucket < %(end)s
            GROUP BY 1, 2, 3, 4
            """,
            {
                "cut": cut,
                "start": cut - BASELINE,
                "end": end,
                "nodes": [n for n, _ in devices],
                "devices": [d for _, d in devices],
            },
        )
        rows = cursor.fetchall()
    util: list[float] = []
    read: dict[bool, float] = defaultdict(float)
    seen: set[bool] = set()
    for _node, _device, quantity, recent, minutes, increase in rows:
        if recent and minutes < MIN_RECENT_MINUTES:
            continue
        rate = (increase or 0.0) / (minutes * 60)
        if quantity == "io_time_seconds":
            if recent:
                util.append(rate)
        else:
            read[recent] += rate
            seen.add(recent)
    return StorageWindow(
        max(util) if util else None,
        read[True] if True in seen else None,
        read[False] if False in seen else None,
    )


def mount_window(now: datetime, mount_ids: list[int]) -> StorageWindow:
    """NFS mounts' mountstats over the last WINDOW whole minutes and the BASELINE before, from the
    1-minute rollups' increases (resets counted as increase()): the bytes read from the server per
    second, summed over the mounts, and the mean response time of a READ (the READs' summed
    response time over their count, all mounts together). No I/O time: a network mount has none."""
    if not mount_ids:
        return StorageWindow(None, None, None)
    end = now.replace(second=0, microsecond=0)
    cut = end - WINDOW
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT mount_id, quantity, bucket >= %(cut)s AS recent, count(*), sum(increase)
            FROM fleet_mountrollup_1m
            WHERE mount_id = ANY(%(ids)s)
              AND quantity IN ('nfs_read_bytes', 'nfs_read_ops', 'nfs_read_response_seconds')
              AND bucket >= %(start)s AND bucket < %(end)s
            GROUP BY 1, 2, 3
            """,
            {"cut": cut, "start": cut - BASELINE, "end": end, "ids": mount_ids},
        )
        rows = cursor.fetchall()
    read: dict[bool, float] = defaultdict(float)
    seen: set[bool] = set()
    ops: dict[bool, float] = defaultdict(float)
    waited: dict[bool, float] = defaultdict(float)
    for _mount, quantity, recent, minutes, increase in rows:
        if recent and minutes < MIN_RECENT_MINUTES:
            continue
        if quantity == "nfs_read_bytes":
            read[recent] += (increase or 0.0) / (minutes * 60)
            seen.add(recent)
        elif quantity == "nfs_read_ops":
            ops[recent] += increase or 0.0
        else:
            waited[recent] += increase or 0.0

    def latency(recent: bool) -> float | None:
        return waited[recent] / ops[recent] if ops[recent] >= MIN_READS else None

    return StorageWindow(
        None,
        read[True] if True in seen else None,
        read[False] if False in seen else None,
        latency(True),
        latency(False),
    )


def starving(w: StorageWindow) -> str:
    """Why the file system starves its readers ('' when it does not)."""
    if w.io_util is not None and w.io_util >= IO_SATURATED:
        return f"its disk is busy {min(w.io_util, 1.0):.0%} of the time"
    if w.read_latency is not None and w.read_latency >= SLOW_READ_SECONDS:
        before = w.baseline_read_latency
        was = f", {before * 1000:.0f} ms the hour before" if before is not None else ""
        return f"its READs take {w.read_latency * 1000:.0f} ms each{was}"
    if (
        w.read_rate is not None
        and w.baseline_read_rate is not None
        and w.baseline_read_rate >= MIN_BASELINE_READ
        and w.read_rate <= (1 - READ_DROP) * w.baseline_read_rate
    ):
        return f"its reads fell to {w.read_rate / 1e6:.0f} MB/s from {w.baseline_read_rate / 1e6:.0f} MB/s"
    return ""


@detector("storage-starvation")
def storage_starvation(now: datetime) -> list[FindingSpec]:
    """A datasets file system whose readers stall on input data (each a firing data-stall finding)
    while, over the last 5 minutes, its backing disk's I/O time is >= 0.9 s per second (local), its
    NFS READs take >= 50 ms each on average over >= 10 of them (network, from mountstats), or its
    read throughput (the disk's, or the bytes its NFS mounts read from the server) fell to half or
    less of the hour before (from >= 1 MB/s): one SEV3 finding naming the stalled jobs, their
    data-wait fractions and GPU-hours stalled (their data-stall findings' GPU-hours lost). Queries:
    the mounts, the firing data-stall findings, the jobs on the mounts' nodes, and one series read
    per file system with a stalled job on it (fs_window)."""
    stalled = stalled_jobs()
    if not stalled:
        return []
    systems = file_systems(MountPurpose.DATASETS)
    placed = jobs_on_hosts(now, (h for fs in systems for h in fs.hosts))
    specs = []
    for fs in systems:
        jobs = [j for j in _jobs(placed, fs) if j.pk in stalled]
        if not jobs:
            continue
        window = fs_window(now, fs)
        why = starving(window)
        if not why:
            continue
        named = [
            {
                "job": j.pk,
                "job_name": j.name,
                "team": j.team,
                "gpus": j.gang,
                "data_wait_fraction": stalled[j.pk].get("data_wait_fraction"),
                "gpu_hours_stalled": round(float(stalled[j.pk].get("gpu_hours_lost") or 0.0), 3),
            }
            for j in jobs
        ]
        hours = round(sum(n["gpu_hours_stalled"] for n in named), 3)
        specs.append(
            FindingSpec(
                fingerprint=fs.fingerprint("storage-starvation"),
                labels=fs.labels(jobs),
                severity=Severity.SEV3,
                summary=(
                    f"Storage starvation on {fs.name()}: {len(jobs)} job(s) stall on input "
                    f"({', '.join(j.name for j in jobs)}) while {why}; {hours:.1f} GPU-hours stalled"
                ),
                description=(
                    "The jobs reading this file system wait for data while it saturates or slows: the "
                    "storage tier, not the jobs' data loaders, is the bottleneck."
                ),
                impact={
                    "gpus": sum(j.gang for j in jobs),
                    "jobs": named,
                    "gpu_hours_stalled": hours,
                    "io_utilisation": None if window.io_util is None else round(window.io_util, 3),
                    "read_bytes_per_s": window.read_rate,
                    "baseline_read_bytes_per_s": window.baseline_read_rate,
                    "read_seconds_per_op": window.read_latency,
                    "baseline_read_seconds_per_op": window.baseline_read_latency,
                },
                category="storage",
            )
        )
    return specs


def free_space(now: datetime, systems: list[FileSystem]) -> dict[int, tuple[float, float, float | None, int]]:
    """mount id -> (avail bytes, size bytes, avail's slope in bytes/s over PROJECTION or None,
    points), from the 1-minute rollups (one query)."""
    ids = [pk for fs in systems for pk, _, _ in fs.mounts]
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH a AS (
                SELECT mount_id, bucket, last FROM fleet_mountrollup_1m
                WHERE mount_id = ANY(%(ids)s) AND quantity = 'avail_bytes'
                  AND bucket >= %(since)s AND bucket <= %(now)s
            ), latest AS (
                SELECT DISTINCT ON (mount_id, quantity) mount_id, quantity, last, bucket
                FROM fleet_mountrollup_1m
                WHERE mount_id = ANY(%(ids)s) AND bucket >= %(fresh)s AND bucket <= %(now)s
                ORDER BY mount_id, quantity, bucket DESC
            ), trend AS (
                SELECT mount_id, regr_slope(last, extract(epoch FROM bucket)) AS slope, count(*) AS points,
                       max(bucket) - min(bucket) AS span
                FROM a GROUP BY mount_id
            )
            SELECT l.mount_id, l.last, s.last, t.slope, t.points, t.span
            FROM latest l JOIN latest s ON s.mount_id = l.mount_id AND s.quantity = 'size_bytes'
            LEFT JOIN trend t ON t.mount_id = l.mount_id
            WHERE l.quantity = 'avail_bytes'
            """,
            {"ids": ids, "since": now - PROJECTION, "fresh": now - FRESH, "now": now},
        )
        out = {}
        for pk, avail, size, slope, points, span in cursor.fetchall():
            fitted = slope if points and points >= PROJECTION_MIN_POINTS and span >= PROJECTION_MIN_SPAN else None
            out[pk] = (avail, size, fitted, points or 0)
    return out


def _reporting(now: datetime, labels: dict[str, Any]) -> bool:
    """Whether a checkpoint finding's mounts still report free space (else it cannot be judged)."""
    hosts = [h for h in str(labels.get("nodes", "")).split(",") if h]
    mounts = NodeMount.objects.filter(node__hostname__in=hosts, mountpoint=labels.get("mountpoint", ""))
    return MountRollup1m.objects.filter(
        mount__in=mounts, quantity="avail_bytes", bucket__gte=now - FRESH, bucket__lte=now
    ).exists()


@detector("storage-checkpoint-full", judged=_reporting)
def storage_checkpoint_full(now: datetime) -> list[FindingSpec]:
    """A checkpoints file system with less free space than STORAGE_CHECKPOINT_FREE_FRACTION of
        its size (SEV2 where a job holds GPUs on its nodes: its next save fails; else SEV3), or
        projected to fill within a day: free space falling at the least-squares rate of its
        per-minute values over the last 3 hours (>= 10 points over >= 30 minutes) (SEV3). A network
        file system's figures are those of its mount with the longest trend (every node sees the same
    file system). A firing finding whose mounts report no free space any more stays firing: missing
    data is not health."""
    limit = settings.STORAGE_CHECKPOINT_FREE_FRACTION
    systems = file_systems(MountPurpose.CHECKPOINTS)
    space = free_space(now, systems)
    placed: dict[str, list[PlacedJob]] | None = None
    specs = []
    for fs in systems:
        figures = [space[pk] for pk, _, _ in fs.mounts if pk in space]
        if not figures:
            continue
        avail, size, slope, _points = max(figures, key=lambda f: f[3])
        if size <= 0:
            continue
        free = avail / size
        to_full = avail / -slope if slope is not None and slope < 0 else None
        low = free < limit
        filling = to_full is not None and to_full <= FILL_WITHIN.total_seconds()
        if not (low or filling):
            continue
        if placed is None:
            placed = jobs_on_hosts(now, (h for f in systems for h in f.hosts))
        jobs = _jobs(placed, fs)
        hours_to_full = None if to_full is None else round(to_full / 3600, 1)
        if low:
            summary = f"Checkpoint storage {fs.name()} has {free:.1%} free (under {limit:.0%})"
        else:
            summary = f"Checkpoint storage {fs.name()} fills in {hours_to_full} h at its current rate ({free:.0%} free)"
        if jobs:
            summary += f"; jobs checkpointing there: {', '.join(j.name for j in jobs)}"
        specs.append(
            FindingSpec(
                fingerprint=fs.fingerprint("storage-checkpoint-full"),
                labels=fs.labels(jobs),
                severity=Severity.SEV2 if low and jobs else Severity.SEV3,
                summary=summary,
                description=(
                    "A checkpoint that cannot be written is lost work on the next failure. Free space on "
                    "the checkpoint file system, or move old checkpoints off it."
                ),
                impact={
                    "gpus": sum(j.gang for j in jobs),
                    "jobs": [{"job": j.pk, "job_name": j.name, "team": j.team, "gpus": j.gang} for j in jobs],
                    "free_fraction": round(free, 4),
                    "avail_bytes": avail,
                    "size_bytes": size,
                    "hours_to_full": hours_to_full,
                },
                category="storage",
            )
        )
    return specs
