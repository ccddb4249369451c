"""One cause, one incident, every job it hit: a compute link flap and the training hangs or NCCL
failures on the nodes behind it join one incident, "Fabric fault → job hang", that counts the
jobs' GPU-hours lost; a hang elsewhere stays its own incident."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from fleet.fabric import detectors as fabric
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from tests.fleet.fabric.node_exporter import push
from tests.fleet.fabric.test_detectors import STEADY, node_text
from tests.fleet.training.conftest import register_job
from tests.fleet.training.test_detectors import TRAINING, Events, at, gpu_uuid, new_job, telemetry

pytestmark = pytest.mark.django_db

FABRIC = ["fabric-link-flap", "fabric-link-degrading", "fabric-rdma-congestion"]
HOSTS = ["h-001", "h-002"]


@pytest.fixture
def t0() -> datetime:
    """Two hours ago, to the second (as the training detectors' tests stamp their events)."""
    return timezone.now().replace(microsecond=0) - timedelta(hours=2)


def ports(
    client: Client, token: str, host: str, start: datetime, flap_at_minute: int | None, minutes: int = 12
) -> None:
    """One node_exporter push a minute from ``start`` for the host's mlx5_0/1; its link goes down
    once at ``flap_at_minute`` (None: steady)."""
    for k in range(minutes):
        downed = STEADY["link_downed"] + (1 if flap_at_minute is not None and k >= flap_at_minute else 0)
        body = node_text(start + timedelta(minutes=k), {"mlx5_0": {**STEADY, "link_downed": downed}})
        assert push(client, token, body, query=f"?hostname={host}").status_code == 202


def run(now: datetime, only: list[str]) -> None:
    fabric.port_window.cache_clear()
    run_detectors(now=now, only=only)


def hung_job(client: Client, token: str, site, hosts: list[str], t0: datetime, **fields) -> int:  # type: ignore[no-untyped-def]
    """A job on ``hosts`` whose last step ends at 210 s: hung from then on (threshold 300 s)."""
    job_id = new_job(client, token, site, hosts, t0, **fields)
    ev = Events(client, token, job_id, t0)
    ev.start()
    ev.steps(first_end=12, count=100, step_time=2.0)
    return job_id


def test_a_flap_and_a_hang_on_its_node_are_one_incident_with_the_jobs_gpu_hours(site_a, token_a, t0) -> None:
    client = Client()
    job_id = hung_job(client, token_a, site_a, HOSTS, t0, name="llama-70b")
    ports(client, token_a, "h-001", t0, flap_at_minute=3)  # the link goes down at 180 s
    now = at(t0, 510 + settings.DETECTOR_INTERVAL_SECONDS)
    run(now, FABRIC + TRAINING)
    flap = Finding.objects.get(source="detector:fabric-link-flap")
    hang = Finding.objects.get(source="detector:training-hang")
    incident = Incident.objects.get()
    assert flap.incident == hang.incident == incident
    assert flap.severity == "SEV2"  # compute fabric under a running two-node job
    assert hang.impact["caused_by"] == flap.fingerprint
    assert incident.title.startswith("Fabric fault → job hang: llama-70b (link flap on h-001 mlx5_0/1)")
    assert hang.labels["job"] == str(job_id)
    stalled = (now - at(t0, 210)).total_seconds()
    assert hang.impact["gpu_hours"] == round(16 * stalled / 3600, 3)
    assert incident.gpu_hours_lost == pytest.approx(hang.impact["gpu_hours"])
    assert incident.gpus_out_of_service == 0  # a flap takes no GPU out: the job prices its loss
    assert incident.current_gpu_hours() == pytest.approx(hang.impact["gpu_hours"], abs=1e-3)
    # The hang goes on: its growing cost goes on counting in the same incident.
    later = now + timedelta(seconds=60)
    run(later, FABRIC + TRAINING)
    hang.refresh_from_db()
    incident.refresh_from_db()
    assert incident.gpu_hours_lost == pytest.approx(round(16 * (stalled + 60) / 3600, 3))
    assert Incident.objects.count() == 1


def test_the_hang_first_then_the_flap_still_make_one_incident(site_a, token_a, t0) -> None:
    client = Client()
    hung_job(client, token_a, site_a, HOSTS, t0, name="llama-70b")
    ports(client, token_a, "h-002", t0, flap_at_minute=3)
    now = at(t0, 510 + settings.DETECTOR_INTERVAL_SECONDS)
    run(now, TRAINING)  # the training detectors report first: the hang waits for its cause
    hang = Finding.objects.get(source="detector:training-hang")
    assert hang.incident.group_key == f"cause={hang.impact['caused_by']}"
    run(now, FABRIC)
    flap = Finding.objects.get(source="detector:fabric-link-flap")
    assert flap.incident == hang.incident and Incident.objects.count() == 1
    assert Incident.objects.get().title.startswith("Fabric fault → job hang: llama-70b")


def test_a_hang_on_another_node_is_its_own_incident(site_a, token_a, t0) -> None:
    client = Client()
    job_id = hung_job(client, token_a, site_a, ["h-003", "h-004"], t0, name="other-job")
    telemetry(site_a, ["h-001"], at(t0, -3600), at(t0, -3600))  # the flapping node exists, runs nothing
    ports(client, token_a, "h-001", t0, flap_at_minute=3)
    run(at(t0, 510 + settings.DETECTOR_INTERVAL_SECONDS), FABRIC + TRAINING)
    flap = Finding.objects.get(source="detector:fabric-link-flap")
    hang = Finding.objects.get(source="detector:training-hang")
    assert flap.incident != hang.incident and Incident.objects.count() == 2
    assert "caused_by" not in hang.impact
    assert hang.incident.group_key == f"job={job_id}" and not hang.incident.title.startswith("Fabric fault")
    assert flap.severity == "SEV3" and flap.incident.gpu_hours_lost == 0


def test_a_flap_outside_the_hangs_window_is_not_its_cause(site_a, token_a, t0) -> None:
    client = Client()
    hung_job(client, token_a, site_a, HOSTS, t0)
    # The link went down an hour before the job stopped: long over.
    ports(client, token_a, "h-001", at(t0, -3600), flap_at_minute=1, minutes=3)
    run(at(t0, 510 + settings.DETECTOR_INTERVAL_SECONDS), FABRIC + TRAINING)
    hang = Finding.objects.get(source="detector:training-hang")
    assert "caused_by" not in hang.impact and not Finding.objects.filter(source="detector:fabric-link-flap").exists()


def test_an_nccl_timeout_failure_joins_the_flap(site_a, token_a, t0) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, HOSTS, t0, name="llama-70b")
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=12, count=100, step_time=2.0)
    reason = (
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE) "
        "ran for 600060 milliseconds before timing out."
    )
    ev.send((400, "failed", {"reason": reason}))
    ports(client, token_a, "h-001", t0, flap_at_minute=3)
    run(at(t0, 420), [*FABRIC, "training-job-failed"])
    flap = Finding.objects.get(source="detector:fabric-link-flap")
    failed = Finding.objects.get(source="detector:training-job-failed")
    assert failed.impact["failure_class"] == "nccl" and failed.impact["caused_by"] == flap.fingerprint
    incident = Incident.objects.get()
    assert failed.incident == flap.incident == incident
    assert incident.title.startswith("Fabric fault → job hang: llama-70b")
    assert failed.impact["gpu_hours"] > 0 and incident.gpu_hours_lost == pytest.approx(failed.impact["gpu_hours"])


def test_a_failure_of_another_class_does_not_join(site_a, token_a, t0) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, HOSTS, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=12, count=100, step_time=2.0)
    ev.send((400, "failed", {"reason": "torch.cuda.OutOfMemoryError: CUDA out of memory."}))
    ports(client, token_a, "h-001", t0, flap_at_minute=3)
    run(at(t0, 420), [*FABRIC, "training-job-failed"])
    failed = Finding.objects.get(source="detector:training-job-failed")
    assert "caused_by" not in failed.impact and Incident.objects.count() == 2


def test_two_jobs_hit_by_one_flap_are_one_incident_with_both_jobs_gpu_hours(site_a, token_a, t0) -> None:
    client = Client()
    telemetry(site_a, ["h-001", "h-002", "h-003"], at(t0, -3600), at(t0, -3600))
    ids = []
    for name, other, half in (("job-a", "h-002", range(4)), ("job-b", "h-003", range(4, 8))):
        response = register_job(
            client,
            token_a,
            name=name,
            gang_size=8,
            nodes=["h-001", other],
            gpus=[gpu_uuid(h, i) for h in ("h-001", other) for i in half],
            scheduler_id=f"default/{name}",
        )
        assert response.status_code == 201, response.content
        ids.append(int(response.json()["id"]))
        ev = Events(client, token_a, ids[-1], t0)
        ev.start()
        ev.steps(first_end=12, count=100, step_time=2.0)
    ports(client, token_a, "h-001", t0, flap_at_minute=3)
    run(at(t0, 510 + settings.DETECTOR_INTERVAL_SECONDS), FABRIC + TRAINING)
    hangs = list(Finding.objects.filter(source="detector:training-hang"))
    assert len(hangs) == 2
    incident = Incident.objects.get()
    assert {h.incident for h in hangs} == {incident}
    assert incident.title.startswith("Fabric fault → job hang: job-a, job-b (link flap on h-001 mlx5_0/1)")
    assert incident.gpu_hours_lost == pytest.approx(sum(h.impact["gpu_hours"] for h in hangs))
    assert incident.gpu_hours_lost == pytest.approx(2 * hangs[0].impact["gpu_hours"])
    assert {h.labels["job"] for h in hangs} == {str(i) for i in ids}
