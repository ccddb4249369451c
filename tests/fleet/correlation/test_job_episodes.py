"""The job page's hangs and stalls (fleet.correlation.episodes): each episode's window (its start
minus 10 minutes to its clear, or now) with its nodes' compute ports that flapped in it and not
outside it, its datasets mount's saturation, the cause's incident; the empty state of a healthy
job; the section and the snapshot's ``episodes`` for any role, neither for anonymous."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet.choices import JobState, MountPurpose
from fleet.correlation.episodes import job_episodes
from fleet.fabric import detectors as fabric
from fleet.fabric.store import store_port_points
from fleet.inventory.models import Node, NodeMount, Site
from fleet.storage.store import store_storage_points
from fleet.telemetry.series import NodePoint
from fleet.training.models import Job
from incidents.choices import Severity
from incidents.detectors import source_of
from incidents.models import Finding
from incidents.services.engine import clear_finding, raise_finding
from tests.fleet.fabric.node_exporter import roll

pytestmark = pytest.mark.django_db
SPAN = 90  # minutes of port series, ending a minute before NOW
DISK = "nvme1n1"
NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def set_now() -> None:
    """NOW is this test's start, to the whole minute (the rollups' buckets): the pages read the
    real clock, so the series end just before it."""
    global NOW
    NOW = datetime.now(UTC).replace(second=0, microsecond=0)


@pytest.fixture(autouse=True)
def _now() -> None:
    set_now()


def _node(site: Site, hostname: str) -> Node:
    return Node.objects.create(site=site, hostname=hostname)


def _job(site: Site, name: str, nodes: list[Node]) -> Job:
    job = Job.objects.create(
        site=site,
        name=name,
        team="foundation",
        gang_size=16,
        scheduler="slurm",
        scheduler_id=name,
        state=JobState.RUNNING,
    )
    job.nodes.set(nodes)
    return job


def _port(site: Site, hostname: str, device: str, *, flap_minutes_ago: int | None) -> None:
    """An InfiniBand port sampled every 30 s over SPAN minutes, Active throughout; its link goes
    down once in the minute ``flap_minutes_ago`` (None: steady)."""
    points, downed = [], 3.0
    for minute in range(SPAN, 0, -1):
        for half in (0, 30):
            if minute == flap_minutes_ago and half == 30:
                downed += 1
            ts = NOW - timedelta(minutes=minute, seconds=-half)
            points.append(NodePoint(hostname, "infiniband", "link_downed", ts, downed, device=device, port="1"))
            points.append(NodePoint(hostname, "infiniband", "state", ts, 4.0, device=device, port="1"))
    assert store_port_points(site_id=site.pk, batch_key=f"{hostname}:{device}", points=points)
    roll()


def _hang(job: Job, *, started_minutes_ago: int, cleared_minutes_ago: int | None = None, **impact) -> Finding:  # type: ignore[no-untyped-def]
    return _finding("training-hang", job, started_minutes_ago, cleared_minutes_ago, **impact)


def _finding(detector: str, job: Job, started: int, cleared: int | None, **impact) -> Finding:  # type: ignore[no-untyped-def]
    fingerprint = f"{detector}:{job.pk}"
    raise_finding(
        fingerprint,
        {"site": job.site.name, "job": str(job.pk), "job_name": job.name, "team": job.team},
        Severity.SEV2,
        f"{detector} on {job.name}",
        impact={"gpus": job.gang_size, "gpu_hours": 4.0, **impact},
        source=source_of(detector),
        started_at=NOW - timedelta(minutes=started),
    )
    if cleared is not None:
        clear_finding(fingerprint, source=source_of(detector), at=NOW - timedelta(minutes=cleared))
    return Finding.objects.get(fingerprint=fingerprint)


@pytest.fixture
def flapped(site_a: Site) -> Job:
    return seed_flapped(site_a)


def seed_flapped(site_a: Site) -> Job:
    """A two-node job hung from 60 to 40 minutes ago, and data-stalled from 15 minutes ago; h-001's
    mlx5_0 went down 65 minutes ago (inside the hang's window), h-002's mlx5_1 20 minutes ago
    (outside it, inside the stall's)."""
    job = _job(site_a, "llama-70b", [_node(site_a, "h-001"), _node(site_a, "h-002")])
    _port(site_a, "h-001", "mlx5_0", flap_minutes_ago=65)
    _port(site_a, "h-002", "mlx5_1", flap_minutes_ago=20)
    _port(site_a, "h-002", "mlx5_2", flap_minutes_ago=None)
    _hang(job, started_minutes_ago=60, cleared_minutes_ago=40)
    _finding("training-data-stall", job, 15, None)
    return job


def _ports(episode: dict) -> set[str]:  # type: ignore[type-arg]
    return {f"{n['hostname']} {p['name']}" for n in episode["nodes"] for p in n["ports"] if p["flapped"]}


def test_a_hangs_window_shows_the_port_that_flapped_in_it_and_not_one_outside_it(flapped: Job) -> None:
    stall, hang = job_episodes(flapped, now=NOW)  # newest first
    assert (hang["kind"], stall["kind"]) == ("Hang", "Data stall")
    assert hang["window"]["from"] == NOW - timedelta(minutes=70)  # 10 minutes before the hang
    assert hang["window"]["to"] == NOW - timedelta(minutes=40) and not hang["ongoing"]
    assert _ports(hang) == {"h-001 mlx5_0/1"}
    [port] = next(n for n in hang["nodes"] if n["hostname"] == "h-001")["ports"]
    assert port["flapped_at"] == NOW - timedelta(minutes=65) and port["flaps"] == 1
    # The stall's window (from 25 minutes ago to now) holds h-002's flap, not h-001's.
    assert stall["ongoing"] and _ports(stall) == {"h-002 mlx5_1/1"}
    # The steady port is in neither.
    assert all(p["name"] != "mlx5_2/1" for e in (hang, stall) for n in e["nodes"] for p in n["ports"])


def test_the_flaps_are_the_link_flap_detectors_own(flapped: Job) -> None:
    """One definition: a port the page shows as flapped in a window is one the detector's
    flapped_ports names over it."""
    _, hang = job_episodes(flapped, now=NOW)
    found = fabric.flapped_ports(hang["window"]["to"], {"h-001", "h-002"}, hang["window"]["from"])
    assert {f"{h} {i}" for h, i, _, _ in found} == _ports(hang)


def test_the_job_page_shows_the_flapped_port_in_the_hang_only(viewer_client: Client, flapped: Job) -> None:
    page = viewer_client.get(f"/training/jobs/{flapped.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="job-episodes"' in html and "Hangs and stalls" in html
    hang = Finding.objects.get(fingerprint=f"training-hang:{flapped.pk}")
    section = html.split(f'data-episode="{hang.pk}"')[1].split("</section>")[0]
    assert 'data-port="h-001 mlx5_0/1"' in section and "flapped" in section
    assert 'data-port="h-002 mlx5_1/1"' not in section


def _disk(site: Site, hostname: str, quantity: str, rate: float, minutes: int) -> None:
    points, value = [], 1e6
    for minute in range(minutes, 0, -1):
        for half in (0, 30):
            value += rate * 30
            ts = NOW - timedelta(minutes=minute, seconds=-half)
            points.append(NodePoint(hostname, "disk", quantity, ts, value, device=DISK))
    assert store_storage_points(site_id=site.pk, batch_key=f"{hostname}:{quantity}", points=points)
    roll()


def _space(site: Site, mount: NodeMount, free: float, size: float, minutes: int) -> None:
    points = []
    for minute in range(minutes, 0, -1):
        ts = NOW - timedelta(minutes=minute, seconds=-10)
        for quantity, v in (("avail_bytes", free), ("size_bytes", size)):
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
    assert store_storage_points(site_id=site.pk, batch_key=f"space:{mount.pk}", points=points)
    roll()


@pytest.fixture
def stalled(site_a: Site) -> Job:
    """A job data-stalled for the last 8 minutes on a node whose datasets disk is busy 97 % of the
    time; its checkpoints mount is a fifth free."""
    node = _node(site_a, "gpu-a-001")
    datasets = NodeMount.objects.create(
        node=node, mountpoint="/mnt/datasets", fstype="xfs", device=f"/dev/{DISK}", purpose=MountPurpose.DATASETS
    )
    checkpoints = NodeMount.objects.create(
        node=node, mountpoint="/mnt/ckpt", fstype="nfs4", device="10.0.4.20:/ckpt", purpose=MountPurpose.CHECKPOINTS
    )
    NodeMount.objects.create(node=node, mountpoint="/", fstype="ext4", device="/dev/sda1")
    job = _job(site_a, "mixtral", [node])
    _disk(site_a, "gpu-a-001", "io_time_seconds", 0.97, 30)
    _disk(site_a, "gpu-a-001", "read_bytes", 50e6, 30)
    _space(site_a, datasets, 6e11, 1e12, 30)
    _space(site_a, checkpoints, 2e11, 1e12, 30)
    _finding("training-data-stall", job, 8, None, data_wait_fraction=0.45)
    return job


def test_a_data_stall_shows_its_datasets_mounts_saturation(stalled: Job) -> None:
    [stall] = job_episodes(stalled, now=NOW)
    assert stall["kind"] == "Data stall" and stall["ongoing"]
    [node] = stall["nodes"]
    mounts = {m["mountpoint"]: m for m in node["mounts"]}
    assert set(mounts) == {"/mnt/datasets", "/mnt/ckpt"}  # the root mount is neither
    datasets = mounts["/mnt/datasets"]
    assert datasets["saturated"] and datasets["io_busy_pct"] == pytest.approx(97.0, abs=0.1)
    assert datasets["starving"] == "its disk is busy 97% of the time"  # storage.detectors.starving's words
    assert datasets["read_bytes_per_second"] == pytest.approx(50e6, rel=0.01)
    assert datasets["free_pct"] == 60.0
    assert mounts["/mnt/ckpt"]["free_pct"] == 20.0 and not mounts["/mnt/ckpt"]["starving"]
    assert node["ports"] == [] and stall["cause"] is None


def test_the_job_page_shows_the_saturated_datasets_mount(viewer_client: Client, stalled: Job) -> None:
    html = viewer_client.get(f"/training/jobs/{stalled.pk}/").content.decode()
    row = html.split('data-mount="gpu-a-001:/mnt/datasets"')[1].split("</tr>")[0]
    assert "starving:" in row and "its disk is busy 97% of the time" in row
    assert 'class="num bad-text"' in row  # its I/O busy share, at or over the detector's line
    assert "data-ports-healthy" in html  # no compute port troubled on its node


def test_a_caused_hang_links_to_its_causes_incident(viewer_client: Client, site_a: Site) -> None:
    job = _job(site_a, "llama-8b", [_node(site_a, "h-010")])
    flap_fingerprint = fabric.fingerprint("link-flap", site_a.name, "h-010", "mlx5_0/1")
    raise_finding(
        flap_fingerprint,
        {"site": site_a.name, "node": "h-010", "interface": "mlx5_0/1", "fabric": "compute"},
        Severity.SEV2,
        "Link flap on h-010 mlx5_0/1",
        source=source_of("fabric-link-flap"),
        started_at=NOW - timedelta(minutes=12),
    )
    effect = {"headline": "Fabric fault → job hang", "name": job.name, "detail": "link flap on h-010 mlx5_0/1"}
    _hang(job, started_minutes_ago=10, caused_by=flap_fingerprint, effect=effect)
    flap = Finding.objects.get(fingerprint=flap_fingerprint)
    [hang] = job_episodes(job, now=NOW)
    assert hang["cause"]["fingerprint"] == flap_fingerprint
    assert hang["cause"]["incident"]["id"] == flap.incident_id
    html = viewer_client.get(f"/training/jobs/{job.pk}/").content.decode()
    assert "Fabric fault → job hang" in html and f'href="/incidents/{flap.incident_id}/"' in html


def test_a_failure_that_is_not_a_fabric_class_is_no_episode(site_a: Site) -> None:
    job = _job(site_a, "oom-job", [_node(site_a, "h-020")])
    _finding("training-job-failed", job, 5, None, failure_class="oom")
    assert job_episodes(job, now=NOW) == []
    other = _job(site_a, "nccl-job", [_node(site_a, "h-021")])
    _finding("training-job-failed", other, 5, None, failure_class="nccl")
    assert [e["kind"] for e in job_episodes(other, now=NOW)] == ["Failure"]


def test_a_healthy_job_says_it_had_no_hangs_or_stalls(viewer_client: Client, site_a: Site) -> None:
    job = _job(site_a, "healthy", [_node(site_a, "h-030")])
    html = viewer_client.get(f"/training/jobs/{job.pk}/").content.decode()
    assert "data-no-episodes" in html and "No hangs or stalls" in html
    assert viewer_client.get(f"/api/v1/training/jobs/{job.pk}/snapshot").json()["episodes"] == []


def test_the_snapshot_carries_the_episodes_for_a_viewer(viewer_client: Client, flapped: Job) -> None:
    body = viewer_client.get(f"/api/v1/training/jobs/{flapped.pk}/snapshot").json()
    assert [e["kind"] for e in body["episodes"]] == ["Data stall", "Hang"]
    hang = body["episodes"][1]
    assert {f"{n['hostname']} {p['name']}" for n in hang["nodes"] for p in n["ports"]} == {"h-001 mlx5_0/1"}


def test_anonymous_sees_neither_the_page_nor_the_snapshot(client: Client, norole_client: Client, flapped: Job) -> None:
    page = client.get(f"/training/jobs/{flapped.pk}/")
    assert page.status_code == 302 and "/login/" in page["Location"]
    assert client.get(f"/api/v1/training/jobs/{flapped.pk}/snapshot").status_code == 401
    assert norole_client.get(f"/training/jobs/{flapped.pk}/").status_code == 403


def test_an_episode_costs_the_same_queries_for_one_node_and_for_eight(
    site_a: Site, django_assert_max_num_queries: Any
) -> None:
    few = _job(site_a, "one-node", [_node(site_a, "h-100")])
    many = _job(site_a, "eight-nodes", [_node(site_a, f"h-2{n:02d}") for n in range(8)])
    for job in (few, many):
        _hang(job, started_minutes_ago=30)
        for n, node in enumerate(job.nodes.all()):
            NodeMount.objects.create(
                node=node, mountpoint="/mnt/datasets", fstype="xfs", device=f"/dev/nvme{n}n1", purpose="datasets"
            )
    with CaptureQueriesContext(connection) as one:
        job_episodes(few, now=NOW)
    with django_assert_max_num_queries(len(one.captured_queries)):
        job_episodes(many, now=NOW)
