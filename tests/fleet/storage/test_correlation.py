"""One cause, one incident: a datasets file system that starves and the data stalls of the jobs
reading it join one incident, "Storage stall → data stall", whose GPU-hours are the stalled jobs'
own; a stall over a healthy mount stays its own incident (a data-loader problem). Both a local
disk (diskstats) and an NFS mount on two nodes (mountstats) are judged."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from fleet.choices import MountPurpose
from fleet.inventory.models import Node, NodeMount
from fleet.storage.store import store_storage_points
from fleet.telemetry.series import NodePoint
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from tests.fleet.fabric.node_exporter import roll
from tests.fleet.training.test_detectors import Events, at, new_job, telemetry

pytestmark = pytest.mark.django_db

DISK = "nvme1n1"
DETECTORS = ["training-data-stall", "storage-starvation"]


@pytest.fixture
def t0() -> datetime:
    """Two hours ago, on the minute: the detectors' runs at 610 s and 625 s then judge the same
    whole minutes of disk data (the last of which ends at 600 s)."""
    return timezone.now().replace(second=0, microsecond=0) - timedelta(hours=2)


def stalled_job(client: Client, token: str, site, host: str, t0: datetime, name: str) -> int:  # type: ignore[no-untyped-def]
    """A job on ``host`` waiting for data half of each 4 s step, from 14 s to 610 s."""
    job_id = new_job(client, token, site, [host], t0, name=name)
    ev = Events(client, token, job_id, t0)
    ev.start()
    ev.steps(first_end=14, count=150, step_time=4.0, wait=2.0)
    telemetry(site, [host], at(t0, 10), at(t0, 610), all={"gpu_util": 35.0})
    return job_id


def datasets_disk(site, host: str, end: datetime, busy: float) -> None:  # type: ignore[no-untyped-def]
    """The host's /mnt/datasets on /dev/nvme1n1, its I/O time rising ``busy`` s a second over the
    hour before ``end`` (sampled every 30 s on the minute), with a reboot (the counter from zero)
    half an hour before it."""
    NodeMount.objects.create(
        node=Node.objects.get(hostname=host),
        mountpoint="/mnt/datasets",
        fstype="xfs",
        device=f"/dev/{DISK}",
        purpose=MountPurpose.DATASETS,
    )
    points, value = [], 5_000.0
    last = end.replace(second=0)
    for k in range(120):
        ts = last - timedelta(seconds=30 * (119 - k))
        value = busy * 30 if k == 60 else value + busy * 30
        points.append(NodePoint(host, "disk", "io_time_seconds", ts, value, device=DISK))
    assert store_storage_points(site_id=site.pk, batch_key=f"{host}:io", points=points)
    roll()


def test_a_starving_mount_and_the_stall_of_the_job_reading_it_are_one_incident(site_a, token_a, t0) -> None:
    client = Client()
    starved = stalled_job(client, token_a, site_a, "s-001", t0, name="llama-70b")
    other = stalled_job(client, token_a, site_a, "s-002", t0, name="loader-bound")
    now = at(t0, 610)
    datasets_disk(site_a, "s-001", now, busy=0.97)  # saturated
    datasets_disk(site_a, "s-002", now, busy=0.10)  # healthy: its job's stall is its own
    run_detectors(now=now, only=DETECTORS)
    # The stalls fire first; the starvation finding follows on the next cycle, once it sees them.
    run_detectors(now=now + timedelta(seconds=settings.DETECTOR_INTERVAL_SECONDS), only=DETECTORS)
    starvation = Finding.objects.get(source="detector:storage-starvation")
    stalls = {f.labels["job"]: f for f in Finding.objects.filter(source="detector:training-data-stall")}
    assert starvation.labels["jobs"] == str(starved)  # only the job over the starving mount
    caused = stalls[str(starved)]
    assert caused.impact["caused_by"] == starvation.fingerprint
    assert caused.incident == starvation.incident
    incident = caused.incident
    assert incident.title.startswith("Storage stall → data stall: llama-70b (s-001:/mnt/datasets:")
    # The incident's cost is the stalled job's own, counted once (the starvation finding adds none).
    assert incident.gpu_hours_lost == pytest.approx(caused.impact["gpu_hours"])
    assert starvation.impact["gpu_hours_stalled"] == pytest.approx(caused.impact["gpu_hours"])
    loner = stalls[str(other)]
    assert "caused_by" not in loner.impact and loner.incident != incident
    assert Incident.objects.count() == 2


EXPORT = "vast01:/datasets"


def datasets_nfs(site, host: str, end: datetime, slow_from: int) -> NodeMount:  # type: ignore[no-untyped-def]
    """The host's /mnt/datasets on NFS (vast01:/datasets), its mountstats over the hour before
    ``end`` (sampled every 30 s on the minute): 100 READs a second, each answered in 4 ms until
    sample ``slow_from``, then in 150 ms; the client remounted (counters from zero) at sample 110."""
    mount = NodeMount.objects.create(
        node=Node.objects.get(hostname=host),
        mountpoint="/mnt/datasets",
        fstype="nfs4",
        device=EXPORT,
        purpose=MountPurpose.DATASETS,
    )
    points, ops, waited = [], 1_000.0, 10.0
    last = end.replace(second=0)
    for k in range(120):
        ts = last - timedelta(seconds=30 * (119 - k))
        latency = 0.15 if k >= slow_from else 0.004
        ops, waited = (3_000.0, 3_000 * latency) if k == 110 else (ops + 3_000, waited + 3_000 * latency)
        points.append(NodePoint(host, "mountstats", "nfs_read_ops", ts, ops, device=EXPORT))
        points.append(NodePoint(host, "mountstats", "nfs_read_response_seconds", ts, waited, device=EXPORT))
    assert store_storage_points(site_id=site.pk, batch_key=f"{host}:nfs", points=points)
    roll()
    return mount


def test_a_slow_nfs_mount_and_the_stalls_of_the_jobs_reading_it_on_two_nodes_are_one_incident(
    site_a, token_a, t0
) -> None:
    client = Client()
    first = stalled_job(client, token_a, site_a, "s-001", t0, name="llama-70b")
    second = stalled_job(client, token_a, site_a, "s-002", t0, name="mistral-7b")
    now = at(t0, 610)
    for host in ("s-001", "s-002"):
        datasets_nfs(site_a, host, now, slow_from=100)  # slow over the last 10 minutes
    run_detectors(now=now, only=DETECTORS)
    run_detectors(now=now + timedelta(seconds=settings.DETECTOR_INTERVAL_SECONDS), only=DETECTORS)
    starvation = Finding.objects.get(source="detector:storage-starvation")
    assert starvation.labels["nodes"] == "s-001,s-002" and starvation.labels["jobs"] == f"{first},{second}"
    assert starvation.labels["device"] == EXPORT and "hostname" not in starvation.labels
    stalls = {f.labels["job"]: f for f in Finding.objects.filter(source="detector:training-data-stall")}
    assert set(stalls) == {str(first), str(second)}
    for stall in stalls.values():
        assert stall.impact["caused_by"] == starvation.fingerprint
        assert stall.incident == starvation.incident
    incident = starvation.incident
    assert Incident.objects.count() == 1
    assert incident.title.startswith(
        f"Storage stall → data stall: llama-70b, mistral-7b (/mnt/datasets ({EXPORT}): its READs take 150 ms each"
    )
    # The incident's cost: both stalled jobs' own GPU-hours, each counted once.
    hours = sum(s.impact["gpu_hours"] for s in stalls.values())
    assert hours > 0
    assert incident.gpu_hours_lost == pytest.approx(hours)
    assert starvation.impact["gpu_hours_stalled"] == pytest.approx(hours)
