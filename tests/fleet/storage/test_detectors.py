"""The storage detectors over real series (written by the storage writer, rolled up as increase())
and real jobs: starvation of a datasets file system under stalled jobs, and checkpoint storage
nearly full or filling within a day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.choices import JobState, MountPurpose
from fleet.inventory.models import Node, NodeMount, Site
from fleet.storage.detectors import storage_checkpoint_full, storage_starvation
from fleet.storage.store import store_storage_points
from fleet.telemetry.series import NodePoint
from fleet.training.models import Job
from incidents.choices import FindingStatus, Severity
from incidents.detectors import run_detectors, source_of
from incidents.models import Finding
from incidents.services.engine import raise_finding
from tests.fleet.fabric.node_exporter import roll

pytestmark = pytest.mark.django_db
NOW = datetime.now(UTC).replace(second=0, microsecond=0)
DISK = "nvme1n1"
TB = 1e12


def _node(site: Site, hostname: str = "gpu-a-001") -> Node:
    return Node.objects.create(site=site, hostname=hostname)


def _mount(node: Node, purpose: str, mountpoint: str, device: str = f"/dev/{DISK}", fstype: str = "xfs") -> NodeMount:
    return NodeMount.objects.create(node=node, mountpoint=mountpoint, fstype=fstype, device=device, purpose=purpose)


def _job(site: Site, name: str, nodes: list[Node], gang: int = 8) -> Job:
    job = Job.objects.create(
        site=site,
        name=name,
        team="foundation",
        gang_size=gang,
        scheduler="slurm",
        scheduler_id=name,
        state=JobState.RUNNING,
    )
    job.nodes.set(nodes)
    return job


def _stall(job: Job, fraction: float, hours: float) -> None:
    """The job's data-stall finding as the training detector raises it (its labels and impact)."""
    raise_finding(
        f"training-data-stall:{job.pk}",
        {"site": job.site.name, "job": str(job.pk), "job_name": job.name, "team": job.team},
        Severity.SEV3,
        f"Data-loader stall: {job.name}",
        impact={"gpus": job.gang_size, "gpu_hours_lost": hours, "gpu_hours": hours, "data_wait_fraction": fraction},
        source=source_of("training-data-stall"),
    )


def _disk(site: Site, hostname: str, quantity: str, rates: list[float], *, reset_at: int | None = None) -> None:
    """A disk counter sampled every 30 s over the last len(rates) minutes, rising at rates[i] per
    second in minute i; at minute ``reset_at`` the node rebooted (the counter starts from zero)."""
    points, value = [], 1_000_000.0
    start = NOW - timedelta(minutes=len(rates))
    for i, rate in enumerate(rates):
        for half in (0, 30):
            if i == reset_at and half == 0:
                value = 0.0 + rate * 30  # counted from zero: the increase since the last sample
            else:
                value += rate * 30
            ts = start + timedelta(minutes=i, seconds=half)
            points.append(NodePoint(hostname, "disk", quantity, ts, value, device=DISK))
    assert store_storage_points(site_id=site.pk, batch_key=f"{hostname}:{quantity}:{id(rates)}", points=points)
    roll()


def _space(site: Site, mount: NodeMount, avail: list[float], size: float) -> None:
    """Free space sampled once a minute over the last len(avail) minutes, and the size."""
    start = NOW - timedelta(minutes=len(avail))
    points = []
    for i, value in enumerate(avail):
        ts = start + timedelta(minutes=i, seconds=10)
        for quantity, v in (("avail_bytes", value), ("size_bytes", size)):
            points.append(
                NodePoint(
                    mount.node.hostname,
                    "filesystem",
                    quantity,
                    ts,
                    v,
                    device=mount.device,
                    mountpoint=mount.mountpoint,
                    fstype=mount.fstype,
                )
            )
    assert store_storage_points(site_id=site.pk, batch_key=f"space:{mount.pk}:{len(avail)}:{avail[-1]}", points=points)
    roll()


# --- storage starvation -----------------------------------------------------------------------


@pytest.fixture
def starving(site_a: Site) -> tuple[Node, Job]:
    node = _node(site_a)
    _mount(node, MountPurpose.DATASETS, "/mnt/datasets")
    job = _job(site_a, "llama-70b", [node])
    return node, job


def test_a_saturated_disk_under_a_stalled_job_is_one_finding_across_a_counter_reset(site_a, starving) -> None:
    node, job = starving
    _stall(job, 0.45, 2.5)
    # I/O time 0.95 s/s over the last 10 minutes; the node rebooted 3 minutes ago (counter to zero).
    _disk(site_a, node.hostname, "io_time_seconds", [0.2] * 60 + [0.95] * 10, reset_at=67)
    specs = storage_starvation(NOW)
    assert len(specs) == 1
    spec = specs[0]
    assert spec.labels == {
        "site": "ams-1",
        "mountpoint": "/mnt/datasets",
        "fstype": "xfs",
        "device": f"/dev/{DISK}",
        "nodes": node.hostname,
        "hostname": node.hostname,
        "jobs": str(job.pk),
    }
    assert spec.impact["io_utilisation"] == pytest.approx(0.95)
    assert spec.impact["jobs"] == [
        {
            "job": job.pk,
            "job_name": "llama-70b",
            "team": "foundation",
            "gpus": 8,
            "data_wait_fraction": 0.45,
            "gpu_hours_stalled": 2.5,
        }
    ]
    assert "gpu_hours" not in spec.impact  # the data-stall finding carries those hours


def test_io_time_at_the_saturation_line_fires_and_just_under_does_not(site_a, starving) -> None:
    node, job = starving
    _stall(job, 0.4, 1.0)
    _disk(site_a, node.hostname, "io_time_seconds", [0.89] * 70)
    assert storage_starvation(NOW) == []
    other = _node(site_a, "gpu-a-002")
    _mount(other, MountPurpose.DATASETS, "/mnt/datasets")
    job.nodes.add(other)
    _disk(site_a, other.hostname, "io_time_seconds", [0.9] * 70)
    [spec] = storage_starvation(NOW)
    assert spec.labels["hostname"] == "gpu-a-002" and spec.impact["io_utilisation"] == pytest.approx(0.9)


def test_reads_falling_to_half_fire_and_a_smaller_fall_does_not(site_a, starving) -> None:
    node, job = starving
    _stall(job, 0.5, 3.0)
    _disk(site_a, node.hostname, "read_bytes", [200e6] * 65 + [101e6] * 5)
    assert storage_starvation(NOW) == []  # down 49.5 %: not a drop yet
    other = _node(site_a, "gpu-a-002")
    _mount(other, MountPurpose.DATASETS, "/mnt/datasets")
    job.nodes.add(other)
    _disk(site_a, other.hostname, "read_bytes", [200e6] * 65 + [100e6] * 5)  # down to half: at the line
    [spec] = storage_starvation(NOW)
    assert spec.labels["hostname"] == "gpu-a-002"
    assert (spec.impact["read_bytes_per_s"], spec.impact["baseline_read_bytes_per_s"]) == (100e6, 200e6)


def test_a_healthy_mount_or_a_job_not_stalling_raises_nothing(site_a, starving) -> None:
    node, job = starving
    _disk(site_a, node.hostname, "io_time_seconds", [0.99] * 70)  # saturated, but the job does not stall
    assert storage_starvation(NOW) == []
    _stall(job, 0.6, 4.0)
    healthy = _node(site_a, "gpu-a-009")
    _mount(healthy, MountPurpose.DATASETS, "/mnt/datasets")
    other = _job(site_a, "mistral", [healthy])
    _stall(other, 0.6, 4.0)
    _disk(site_a, healthy.hostname, "io_time_seconds", [0.3] * 70)
    _disk(site_a, healthy.hostname, "read_bytes", [500e6] * 70)
    names = [s.labels["nodes"] for s in storage_starvation(NOW)]
    assert names == [node.hostname]  # the stalled job on the healthy mount is a data-loader problem


def test_one_finding_for_a_mount_two_jobs_read_names_both_with_their_gpu_hours(site_a) -> None:
    node = _node(site_a)
    _mount(node, MountPurpose.DATASETS, "/mnt/datasets")
    a, b = _job(site_a, "llama-70b", [node], gang=4), _job(site_a, "mistral-7b", [node], gang=4)
    _stall(a, 0.45, 2.0)
    _stall(b, 0.35, 1.25)
    _disk(site_a, node.hostname, "io_time_seconds", [0.5] * 60 + [1.0] * 10, reset_at=63)
    report = run_detectors(now=NOW, only=["storage-starvation"])
    assert report == {"storage-starvation": {"firing": 1}}
    finding = Finding.objects.get(source=source_of("storage-starvation"), status=FindingStatus.FIRING)
    assert finding.labels["jobs"] == f"{a.pk},{b.pk}" and finding.labels["mountpoint"] == "/mnt/datasets"
    assert [(j["job_name"], j["gpu_hours_stalled"]) for j in finding.impact["jobs"]] == [
        ("llama-70b", 2.0),
        ("mistral-7b", 1.25),
    ]
    assert finding.impact["gpu_hours_stalled"] == 3.25 and finding.impact["gpus"] == 8
    assert "llama-70b" in finding.summary and "mistral-7b" in finding.summary


# --- checkpoint storage nearly full ----------------------------------------------------------


def test_free_space_at_the_threshold_is_fine_and_under_it_fires_sev2_naming_the_job(site_a) -> None:
    at, under = _node(site_a, "gpu-a-001"), _node(site_a, "gpu-a-002")
    at_mount = _mount(at, MountPurpose.CHECKPOINTS, "/mnt/checkpoints")
    under_mount = _mount(under, MountPurpose.CHECKPOINTS, "/mnt/checkpoints")
    _job(site_a, "llama-70b", [at])
    job = _job(site_a, "mistral-7b", [under])
    _space(site_a, at_mount, [10 * TB] * 5, 100 * TB)  # 10 % free: at the line, not under it
    _space(site_a, under_mount, [9.9 * TB] * 5, 100 * TB)
    [spec] = storage_checkpoint_full(NOW)
    assert spec.labels["hostname"] == "gpu-a-002" and spec.labels["jobs"] == str(job.pk)
    assert spec.severity == Severity.SEV2 and spec.impact["free_fraction"] == 0.099
    assert spec.labels["mountpoint"] == "/mnt/checkpoints" and spec.impact["hours_to_full"] is None


def test_the_threshold_is_a_setting(site_a, settings) -> None:
    mount = _mount(_node(site_a), MountPurpose.CHECKPOINTS, "/mnt/checkpoints")
    _space(site_a, mount, [15 * TB] * 5, 100 * TB)
    assert storage_checkpoint_full(NOW) == []
    settings.STORAGE_CHECKPOINT_FREE_FRACTION = 0.2
    [spec] = storage_checkpoint_full(NOW)
    assert spec.severity == Severity.SEV3  # no job on it


def test_free_space_projected_to_fill_within_a_day_fires_and_slower_does_not(site_a) -> None:
    mount = _mount(_node(site_a), MountPurpose.CHECKPOINTS, "/mnt/checkpoints", "10.0.5.10@o2ib:/ckpt", "lustre")
    # 50 TB free, falling 2.5 TB an hour over the last hour: full in 20 h.
    per_minute = 2.5 * TB / 60
    _space(site_a, mount, [52.5 * TB - i * per_minute for i in range(61)], 100 * TB)
    [spec] = storage_checkpoint_full(NOW)
    assert spec.impact["hours_to_full"] == pytest.approx(20.0, abs=0.2)
    assert spec.labels["device"] == "10.0.5.10@o2ib:/ckpt" and "hostname" not in spec.labels
    slower = _mount(_node(site_a, "gpu-a-002"), MountPurpose.CHECKPOINTS, "/mnt/ckpt2")
    _space(site_a, slower, [52.5 * TB - i * per_minute / 2 for i in range(61)], 100 * TB)  # 40 h
    assert [s.labels["nodes"] for s in storage_checkpoint_full(NOW)] == ["gpu-a-001"]


def test_a_projection_needs_half_an_hour_of_points(site_a) -> None:
    mount = _mount(_node(site_a), MountPurpose.CHECKPOINTS, "/mnt/checkpoints")
    _space(site_a, mount, [50 * TB - i * TB for i in range(8)], 100 * TB)  # steep, but 8 minutes
    assert storage_checkpoint_full(NOW) == []


def test_a_network_checkpoint_file_system_is_one_finding_for_all_its_nodes(site_a) -> None:
    nodes = [_node(site_a, f"gpu-a-00{i}") for i in (1, 2)]
    mounts = [_mount(n, MountPurpose.CHECKPOINTS, "/mnt/ckpt", "10.0.5.10@o2ib:/ckpt", "lustre") for n in nodes]
    a, b = _job(site_a, "llama-70b", [nodes[0]]), _job(site_a, "mistral-7b", [nodes[1]])
    for m in mounts:
        _space(site_a, m, [5 * TB] * 5, 100 * TB)
    [spec] = storage_checkpoint_full(NOW)
    assert spec.labels["nodes"] == "gpu-a-001,gpu-a-002" and spec.labels["jobs"] == f"{a.pk},{b.pk}"
    assert spec.impact["gpus"] == 16


def test_a_firing_checkpoint_finding_clears_on_free_space_and_holds_when_the_mount_goes_silent(site_a) -> None:
    nodes = [_node(site_a, f"gpu-a-00{i}") for i in (1, 2)]
    full, silent = (_mount(n, MountPurpose.CHECKPOINTS, "/mnt/checkpoints") for n in nodes)
    for m in (full, silent):
        _space(site_a, m, [5 * TB] * 5, 100 * TB)
    assert run_detectors(now=NOW, only=["storage-checkpoint-full"]) == {"storage-checkpoint-full": {"firing": 2}}
    later = NOW + timedelta(minutes=20)
    start = later - timedelta(minutes=2)
    points = [
        NodePoint("gpu-a-001", "filesystem", q, start, v, device=full.device, mountpoint=full.mountpoint, fstype="xfs")
        for q, v in (("avail_bytes", 60 * TB), ("size_bytes", 100 * TB))
    ]
    assert store_storage_points(site_id=site_a.pk, batch_key="freed", points=points)
    roll()
    report = run_detectors(now=later, only=["storage-checkpoint-full"])
    assert report == {"storage-checkpoint-full": {"firing": 0, "held": 1}}
    firing = Finding.objects.filter(source=source_of("storage-checkpoint-full"), status=FindingStatus.FIRING)
    assert [f.labels["hostname"] for f in firing] == ["gpu-a-002"]  # silent: not judged healthy


def test_a_released_job_is_not_named_on_its_old_nodes_mounts(site_a) -> None:
    node = _node(site_a)
    mount = _mount(node, MountPurpose.CHECKPOINTS, "/mnt/checkpoints")
    gone = _job(site_a, "finished", [node])
    Job.objects.filter(pk=gone.pk).update(state=JobState.RELEASED, ended_at=NOW - timedelta(minutes=5))
    running = _job(site_a, "llama-70b", [node])
    _space(site_a, mount, [1 * TB] * 5, 100 * TB)
    [spec] = storage_checkpoint_full(NOW)
    assert spec.labels["jobs"] == str(running.pk) and [j["job_name"] for j in spec.impact["jobs"]] == ["llama-70b"]
