"""An incident's GPU-hours lost is the sum of its findings' own figures, one definition per kind,
and the incident page, its list row, the API, /incidents/metrics/ and the job's own account all
say the same. One job's events go through the HTTP door with every training fault in turn."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.template.defaultfilters import floatformat
from django.test import Client
from django.utils import timezone

from fleet.models import Job, Site
from fleet.training import read as training_read
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from incidents.services.engine import clear_finding, raise_finding
from tests.fleet.training.test_detectors import TRAINING, Events, account_between, at, compute_between, new_job

pytestmark = pytest.mark.django_db

HOSTS = ["cost-001", "cost-002", "cost-003"]
GANG = 24


@pytest.fixture
def t0() -> datetime:
    return timezone.now().replace(microsecond=0) - timedelta(hours=3)


def own(detector: str, job_id: int) -> Finding:
    return Finding.objects.get(source=f"detector:{detector}", labels__job=str(job_id))


def test_one_jobs_faults_cost_the_same_on_the_incident_the_metrics_page_and_the_jobs_account(
    site_a: Site, token_a: str, t0: datetime, admin_client: Client
) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, HOSTS, t0, name="cost-probe", checkpoint_interval_s=300)
    ev = Events(client, token_a, job_id, t0)
    ev.start()  # allocated at 0 s, started at 10 s

    # 1. A straggler: cost-003 takes 4.2 s a step where its peers take 3.0 s (1.4 x).
    ev.steps(first_end=15, count=60, step_time=4.2, nodes={"cost-001": 3.0, "cost-002": 3.0, "cost-003": 4.2})
    ev.send((265, "checkpoint_saved", {"step": 60, "duration_s": 2}))
    run_detectors(now=at(t0, 300), only=TRAINING)
    straggler = own("training-straggler", job_id)
    # The slowdown's share of the gang's compute over the episode, as the job's account has it.
    share = (1 - 1 / 1.4) * compute_between(job_id, straggler.started_at, at(t0, 300))
    assert straggler.impact["gpu_hours"] == round(share / 3600, 3) > 0

    # 2. A data stall: half of every 4 s step waits for data (reported once a step: no straggler now).
    ev.steps(first_end=304, count=150, step_time=4.0, wait=2.0)  # to 900 s
    run_detectors(now=at(t0, 900), only=TRAINING)
    stall = own("training-data-stall", job_id)
    assert stall.status == "firing" and own("training-straggler", job_id).status == "cleared"
    stall_s = account_between(job_id, stall.started_at, at(t0, 900)).data_stall_s
    assert stall_s == GANG * 150 * 2  # the account's stall time x gang over the episode
    assert stall.impact["gpu_hours"] == round(stall_s / 3600, 3)
    # 3. No checkpoint for over 2 x 300 s since the save at 265 s: at risk, never lost.
    overdue = own("training-checkpoint-overdue", job_id)
    assert "gpu_hours" not in overdue.impact
    at_risk = account_between(job_id, at(t0, 0), at(t0, 900)).at_risk_s
    assert at_risk == GANG * 150 * 2  # the compute of the 150 steps since the save
    assert overdue.impact["gpu_hours_at_risk"] == round(at_risk / 3600, 3)

    # 4. A hang: no step after 900 s. It pages past 300 s and costs gang x the time without progress.
    run_detectors(now=at(t0, 1260), only=TRAINING)
    hang = own("training-hang", job_id)
    assert hang.status == "firing"
    assert hang.impact["gpu_hours"] == round(GANG * (1260 - 900) / 3600, 3)
    assert account_between(job_id, hang.started_at, at(t0, 1260)).hang_s == GANG * (1260 - 900)

    # 5. The job fails at 1300 s (the hang ends there: its final figure), waits, restarts at 1400 s,
    # re-initialises for 10 s, restores for 20 s and steps again.
    ev.send((1300, "failed", {"reason": "XID 79"}))
    run_detectors(now=at(t0, 1320), only=TRAINING)
    hang.refresh_from_db()
    assert hang.status == "cleared"
    assert hang.impact["gpu_hours"] == round(GANG * (1300 - 900) / 3600, 3)
    assert account_between(job_id, hang.started_at, at(t0, 1320)).hang_s == GANG * (1300 - 900)
    ev.send((1400, "started", {}), (1430, "restored", {"step": 60, "duration_s": 20}))
    ev.steps(first_end=1434, count=20, step_time=4.0)  # to 1510 s
    now = at(t0, 1520)
    run_detectors(now=now, only=TRAINING)
    failed = own("training-job-failed", job_id)
    assert failed.status == "cleared"  # the job made progress: the failure's cost is final
    job = Job.objects.get(pk=job_id)
    [row] = training_read.job_snapshot(job, now=now)["losses"]
    # Progress lost (the work at risk), 100 s waiting, 10 s re-initialising, 20 s restoring.
    assert row["cost_gpu_s"] == GANG * (300 + 100 + 10 + 20)
    assert failed.impact["gpu_hours"] == round(row["cost_gpu_s"] / 3600, 3)
    for part, key in [("lost", "progress_lost"), ("waiting", "waiting"), ("reinit", "reinit"), ("restore", "restore")]:
        assert failed.impact[f"{key}_gpu_h"] == pytest.approx(row[f"{part}_gpu_h"], abs=0.006)

    # The incident: one for the job, its GPU-hours lost the sum of its findings' own figures.
    incident = Incident.objects.get(group_key=f"job={job_id}")
    findings = list(incident.findings.all())
    assert {f.source.removeprefix("detector:") for f in findings} == set(TRAINING)
    reported = sum(f.impact.get("gpu_hours", 0) for f in findings)
    assert reported == pytest.approx(
        straggler.impact["gpu_hours"]
        + stall.impact["gpu_hours"]
        + hang.impact["gpu_hours"]
        + failed.impact["gpu_hours"]
    )
    incident.refresh_from_db()
    assert incident.gpus_out_of_service == 0  # the gang is the job's: no GPUs x time on top
    assert incident.current_gpu_hours() == pytest.approx(reported, abs=1e-6)

    # The API says the same, finding by finding.
    body = admin_client.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert body["gpu_hours"] == round(incident.current_gpu_hours(), 3)
    assert body["gpu_hours_reported"] == pytest.approx(reported) and body["gpu_hours_out_of_service"] == 0
    by_source = {f["source"]: f for f in body["findings"]}
    assert by_source["detector:training-job-failed"]["impact"]["gpu_hours"] == failed.impact["gpu_hours"]
    assert by_source["detector:training-job-failed"]["cost"]["gpu_hours_lost"] == failed.impact["gpu_hours"]
    assert by_source["detector:training-checkpoint-overdue"]["cost"] == {
        "gpu_hours_lost": None,
        "gpu_hours_at_risk": overdue.impact["gpu_hours_at_risk"],
        "gpus_out_of_service": 0,
    }
    assert sum(f["cost"]["gpu_hours_lost"] or 0 for f in body["findings"]) == pytest.approx(reported, abs=1e-6)

    # The incident page, its list row and the metrics page.
    figure = floatformat(incident.current_gpu_hours(), 2)
    page = admin_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert re.search(r'id="gpu-hours-lost">' + re.escape(figure), page)
    listing = admin_client.get("/incidents/?state=triggered&state=acknowledged&state=mitigated&state=resolved")
    row_html = re.search(rf'<tr data-id="{incident.pk}">(.*?)</tr>', listing.content.decode(), re.S)
    assert row_html is not None and f'<td class="num">{figure}</td>' in row_html.group(1)
    metrics = admin_client.get("/incidents/metrics/")
    data = json.loads(re.search(r'id="incident-metrics"[^>]*>(.*?)</script>', metrics.content.decode(), re.S).group(1))
    month = incident.detected_at.strftime("%Y-%m")
    assert {m["month"]: m["gpu_hours"] for m in data["gpu_hours"]}[month] == round(incident.current_gpu_hours(), 2)


# --- the engine's sum --------------------------------------------------------------------------


def _raise(fingerprint: str, impact: dict[str, Any], **labels: str) -> Finding:
    return raise_finding(fingerprint, {"job": "7", **labels}, "SEV3", fingerprint, impact=impact, source="test")


def test_findings_figures_add_up_and_a_repeat_adds_only_what_it_grew_by() -> None:
    _raise("hang", {"gpus": 16, "unit": "job:7", "gpu_hours": 2.0})
    _raise("stall", {"gpus": 16, "unit": "job:7", "gpu_hours": 0.5})
    incident = Incident.objects.get()
    # The sum, not the largest: a stall and a hang of one job both cost the job.
    assert incident.gpu_hours_lost == pytest.approx(2.5) and incident.current_gpu_hours() == pytest.approx(2.5)
    _raise("hang", {"gpus": 16, "unit": "job:7", "gpu_hours": 3.0})  # held an hour longer
    incident.refresh_from_db()
    assert incident.gpu_hours_lost == pytest.approx(3.5)
    # A finding that clears and fires again adds its new episode; the first stays counted.
    clear_finding("stall", source="test")
    _raise("stall", {"gpus": 16, "unit": "job:7", "gpu_hours": 0.25})
    incident.refresh_from_db()
    assert incident.gpu_hours_lost == pytest.approx(3.75)


def test_work_at_risk_and_a_gang_held_are_never_gpu_hours_lost() -> None:
    # A checkpoint overdue names the gang and its work at risk: neither is lost.
    _raise("overdue", {"gpus": 512, "unit": "job:7", "gpu_hours_at_risk": 40.0})
    incident = Incident.objects.get()
    Incident.objects.filter(pk=incident.pk).update(started_at=timezone.now() - timedelta(hours=3))
    incident.refresh_from_db()
    assert incident.affected_gpus == 512  # affected, yes
    assert incident.current_gpu_hours() == 0  # not 512 x 3 h
    assert incident.current_gpu_hours_at_risk() == pytest.approx(40.0)


def test_gpus_out_of_service_outside_a_job_count_for_the_incidents_length_each_once() -> None:
    node = [f"GPU-{i}" for i in range(8)]
    raise_finding(
        "xid",
        {"hostname": "n-1"},
        "SEV2",
        "XID 79",
        impact={"gpus": 8, "unit": "node:n-1", "gpu_uuids": node},
        source="t",
    )
    raise_finding(
        "dbe",
        {"hostname": "n-1"},
        "SEV2",
        "DBE",
        impact={"gpus": 1, "unit": "gpu:GPU-3", "gpu_uuids": ["GPU-3"]},
        source="t",
    )
    incident = Incident.objects.get()
    Incident.objects.filter(pk=incident.pk).update(started_at=timezone.now() - timedelta(hours=2))
    incident.refresh_from_db()
    assert incident.gpus_out_of_service == 8  # GPU 3 is one of the node's 8
    assert incident.current_gpu_hours() == pytest.approx(16, abs=0.01)  # 8 GPUs x 2 h


def test_a_gpu_fault_on_a_jobs_gpus_is_the_jobs_to_price() -> None:
    impact = {"gpus": 1, "unit": "gpu:GPU-3", "gpu_uuids": ["GPU-3"], "job_gpus": 8, "gpu_hours_at_risk": 1.5}
    raise_finding("xid", {"hostname": "n-1", "job": "7"}, "SEV2", "XID 48 (job j, 8 GPUs)", impact=impact, source="t")
    incident = Incident.objects.get()
    Incident.objects.filter(pk=incident.pk).update(started_at=timezone.now() - timedelta(hours=2))
    incident.refresh_from_db()
    assert incident.gpus_out_of_service == 0 and incident.current_gpu_hours() == 0
    assert incident.current_gpu_hours_at_risk() == pytest.approx(1.5)
