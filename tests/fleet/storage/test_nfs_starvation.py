"""Starvation of a network (NFS) datasets file system, judged by its mounts' mountstats over real
series (written by the storage writer, rolled up as increase()): READs slowing to the threshold,
reads halving against the hour before, one finding per file system across its nodes naming every
stalled job with its GPU-hours, counter resets in the middle; and fs_window, the one judgement the
detector and the correlation share."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.choices import MountPurpose
from fleet.inventory.models import Node, NodeMount, Site
from fleet.storage.detectors import (
    MIN_READS,
    SLOW_READ_SECONDS,
    file_systems,
    fs_window,
    starving,
    storage_starvation,
)
from fleet.storage.store import store_storage_points
from fleet.telemetry.series import NodePoint
from incidents.choices import FindingStatus
from incidents.detectors import run_detectors, source_of
from incidents.models import Finding
from tests.fleet.fabric.node_exporter import roll
from tests.fleet.storage.test_detectors import NOW, _job, _node, _stall

pytestmark = pytest.mark.django_db
EXPORT = "vast01:/datasets"


def _nfs_mount(node: Node, device: str = EXPORT, fstype: str = "nfs4") -> NodeMount:
    return NodeMount.objects.create(
        node=node, mountpoint="/mnt/datasets", fstype=fstype, device=device, purpose=MountPurpose.DATASETS
    )


def _counter(site: Site, mount: NodeMount, quantity: str, rates: list[float], *, reset_at: int | None = None) -> None:
    """A mountstats counter of ``mount``'s export sampled every 30 s over the last len(rates)
    minutes, rising rates[i] per second in minute i; at minute ``reset_at`` the client remounted
    (the counter from zero)."""
    points, value = [], 1_000_000.0
    start = NOW - timedelta(minutes=len(rates))
    for i, rate in enumerate(rates):
        for half in (0, 30):
            value = rate * 30 if (i == reset_at and half == 0) else value + rate * 30
            ts = start + timedelta(minutes=i, seconds=half)
            points.append(NodePoint(mount.node.hostname, "mountstats", quantity, ts, value, device=mount.device))
    key = f"{mount.pk}:{quantity}:{len(rates)}:{rates[-1]}:{reset_at}"
    assert store_storage_points(site_id=site.pk, batch_key=key, points=points)
    roll()


def _reads(site: Site, mount: NodeMount, ops: float, latency: list[float], *, reset_at: int | None = None) -> None:
    """READs at ``ops`` a second, each answered in latency[i] seconds in minute i."""
    _counter(site, mount, "nfs_read_ops", [ops] * len(latency), reset_at=reset_at)
    _counter(site, mount, "nfs_read_response_seconds", [ops * s for s in latency], reset_at=reset_at)


@pytest.fixture
def shared(site_a: Site) -> tuple[list[NodeMount], list]:  # type: ignore[type-arg]
    """vast01:/datasets mounted on two nodes, a job on each, both stalling on input."""
    nodes = [_node(site_a, f"gpu-a-00{i}") for i in (1, 2)]
    mounts = [_nfs_mount(n) for n in nodes]
    jobs = [_job(site_a, "llama-70b", [nodes[0]], gang=8), _job(site_a, "mistral-7b", [nodes[1]], gang=4)]
    _stall(jobs[0], 0.5, 2.5)
    _stall(jobs[1], 0.4, 0.75)
    return mounts, jobs


def test_slow_reads_on_an_nfs_mount_two_jobs_read_are_one_finding_naming_both(site_a, shared) -> None:
    mounts, (a, b) = shared
    # 4 ms a READ for the hour before, 120 ms over the 5 minutes judged; one client remounted 3
    # minutes ago (its counters from zero).
    _reads(site_a, mounts[0], 200, [0.004] * 65 + [0.12] * 5, reset_at=67)
    _reads(site_a, mounts[1], 100, [0.004] * 65 + [0.12] * 5)
    report = run_detectors(now=NOW, only=["storage-starvation"])
    assert report == {"storage-starvation": {"firing": 1}}
    finding = Finding.objects.get(source=source_of("storage-starvation"), status=FindingStatus.FIRING)
    assert {k: v for k, v in finding.labels.items() if k != "detector"} == {
        "site": "ams-1",
        "mountpoint": "/mnt/datasets",
        "fstype": "nfs4",
        "device": EXPORT,
        "nodes": "gpu-a-001,gpu-a-002",
        "jobs": f"{a.pk},{b.pk}",
    }  # no hostname: one file system across its nodes
    assert [(j["job_name"], j["gpus"], j["gpu_hours_stalled"]) for j in finding.impact["jobs"]] == [
        ("llama-70b", 8, 2.5),
        ("mistral-7b", 4, 0.75),
    ]
    assert finding.impact["gpu_hours_stalled"] == 3.25 and finding.impact["gpus"] == 12
    assert finding.impact["read_seconds_per_op"] == pytest.approx(0.12)
    assert finding.impact["baseline_read_seconds_per_op"] == pytest.approx(0.004)
    assert finding.impact["io_utilisation"] is None
    assert "READs take 120 ms each, 4 ms the hour before" in finding.summary
    assert finding.summary.startswith(f"Storage starvation on /mnt/datasets ({EXPORT})")


def test_reads_at_the_threshold_fire_and_just_under_do_not(site_a, shared) -> None:
    mounts, _ = shared
    under = SLOW_READ_SECONDS * 0.98
    for m in mounts:
        _reads(site_a, m, 100, [0.004] * 60 + [under] * 10)
    assert storage_starvation(NOW) == []
    other = _nfs_mount(_node(site_a, "gpu-a-003"), device="vast02:/datasets")
    job = _job(site_a, "gemma", [other.node])
    _stall(job, 0.5, 1.0)
    _reads(site_a, other, 100, [0.004] * 60 + [SLOW_READ_SECONDS] * 10)
    [spec] = storage_starvation(NOW)
    assert spec.labels["device"] == "vast02:/datasets" and spec.labels["jobs"] == str(job.pk)


def test_too_few_reads_are_not_judged_by_their_response_time(site_a, shared) -> None:
    mounts, _ = shared
    # Over the 5 minutes judged: fewer READs than MIN_READS, each slow.
    few = (MIN_READS - 1) / (5 * 60) / len(mounts)
    for m in mounts:
        _reads(site_a, m, few, [0.5] * 70)
    assert storage_starvation(NOW) == []


def test_nfs_reads_halving_against_the_hour_before_fire_across_a_counter_reset(site_a, shared) -> None:
    mounts, (a, b) = shared
    # Bytes read from the server: 400 + 200 MB/s for the hour, then 150 + 150 MB/s (300: at half).
    _counter(site_a, mounts[0], "nfs_read_bytes", [400e6] * 65 + [150e6] * 5, reset_at=66)
    _counter(site_a, mounts[1], "nfs_read_bytes", [200e6] * 65 + [150e6] * 5)
    [spec] = storage_starvation(NOW)
    assert spec.labels["jobs"] == f"{a.pk},{b.pk}"
    assert spec.impact["read_bytes_per_s"] == pytest.approx(300e6)
    assert spec.impact["baseline_read_bytes_per_s"] == pytest.approx(600e6)
    assert "its reads fell to 300 MB/s from 600 MB/s" in spec.summary


def test_a_healthy_nfs_mount_and_a_network_mount_without_mountstats_raise_nothing(site_a, shared) -> None:
    mounts, _ = shared
    for m in mounts:
        _reads(site_a, m, 100, [0.004] * 70)
        _counter(site_a, m, "nfs_read_bytes", [300e6] * 70)
    lustre = _nfs_mount(_node(site_a, "gpu-a-003"), device="10.0.5.10@o2ib:/data", fstype="lustre")
    _stall(_job(site_a, "gemma", [lustre.node]), 0.5, 1.0)
    assert storage_starvation(NOW) == []  # the stalls are the data loaders' own
    [window] = [fs_window(NOW, fs) for fs in file_systems(MountPurpose.DATASETS) if fs.fstype == "lustre"]
    figures = (window.io_util, window.read_rate, window.baseline_read_rate, window.read_latency)
    assert figures == (None, None, None, None)  # Lustre's client prints no mountstats: not judged


def test_fs_window_judges_a_network_file_system_by_mountstats_and_a_local_one_by_its_disk(site_a, shared) -> None:
    mounts, _ = shared
    for m in mounts:
        _reads(site_a, m, 100, [0.004] * 60 + [0.2] * 10)
    local = _node(site_a, "gpu-a-009")
    NodeMount.objects.create(
        node=local, mountpoint="/mnt/datasets", fstype="xfs", device="/dev/nvme1n1", purpose=MountPurpose.DATASETS
    )
    judged = {fs.fstype: fs_window(NOW, fs) for fs in file_systems(MountPurpose.DATASETS)}
    assert judged["nfs4"].read_latency == pytest.approx(0.2) and judged["nfs4"].io_util is None
    assert starving(judged["nfs4"]).startswith("its READs take 200 ms")
    assert judged["xfs"].read_latency is None and starving(judged["xfs"]) == ""  # its disk reported nothing
