"""The demo's first start writes the week before it (issue 21, item 15): every page opens on
history, and the history's figures agree with each other (the training jobs and the telemetry of
their GPUs, the job failures and their incidents, the serving traffic and its SLO windows).

One expensive set-up (the whole simulated fleet's week, as `make demo` writes it) shared by the
assertions of one test; the week's training events go through the events door's checks here.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleet.capacity.models import Reservation
from fleet.management import backfill
from fleet.management.commands.simulate import Command as SimulateCommand
from fleet.models import (
    Endpoint,
    EndpointChange,
    Gpu,
    GpuRollup1h,
    GpuRollup1m,
    Job,
    JobEvent,
    NodeInterface,
    NodeMount,
    SchedulerQueue,
    SchedulerRollup1m,
)
from fleet.scheduler.read import admission_waits
from fleet.scheduler.simulator import STARVING
from fleet.serving import slo as serving
from fleet.serving.simulator import SURGE_NOTE
from fleet.training.simulator import JOB_KINDS, NCCL_TIMEOUT
from incidents.choices import IncidentState
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from incidents.services.views_data import mttx_by_severity_and_month

# prepare() closes stale connections between its steps, as a long-running command does: no outer
# transaction around it.
pytestmark = pytest.mark.django_db(transaction=True)

PEAK_TFLOPS = {  # dense BF16, ../shared/REFERENCE.md
    "NVIDIA H100 80GB HBM3": 989,
    "NVIDIA H200": 989,
    "NVIDIA A100-SXM4-80GB": 312,
    "NVIDIA L40S": 362,
}
PAGES = [
    "/",
    "/fleet/",
    "/training/",
    "/serving/",
    "/incidents/",
    "/incidents/metrics/",
    "/capacity/",
    "/power/",
    "/fabric/",
    "/storage/",
    "/cost/",
]


def _prepare(data_dir: Path) -> Any:
    command = SimulateCommand(stdout=StringIO(), stderr=StringIO())
    options = {**vars(command.create_parser("manage.py", "simulate").parse_args([])), "history": True}
    return command.prepare(options, stop_event=threading.Event())


def test_a_first_start_writes_a_week_that_every_page_shows_and_that_agrees_with_itself(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, viewer_client: Client
) -> None:
    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(backfill, "CHECK_EVENTS", True)  # every event through the door's checks
    assert backfill.history_needed()
    started, began = time.monotonic(), timezone.now()
    session = _prepare(tmp_path)
    print(f"\nthe week written in {time.monotonic() - started:.1f} s: {session.history}")
    now = timezone.now()
    assert session.history["jobs"] == 8 and session.history["incidents"] >= 5

    # Every page opens, and the figures behind them span the week.
    for page in PAGES:
        assert viewer_client.get(page).status_code == 200, page
    training = viewer_client.get("/api/v1/training/overview", {"range": "7d"}).json()
    hours = training["series"]["gpu_h"]
    allocated = [sum(hours[c][i] or 0 for c in hours) for i in range(len(training["series"]["hours"]))]
    # The week ends at this hour: one begun since the backfill started has no account yet.
    moved_on = (timezone.now() - began).total_seconds() + began.minute * 60 + began.second >= 3600
    assert len(allocated) == backfill.WEEK_HOURS - moved_on and all(a > 0 for a in allocated[:-1])
    week = training["goodput"]["7d"]
    assert 0.8 < week["goodput"] < 0.99 and week["allocated_gpu_h"] > 1000
    lost = {c: sum(v or 0 for v in hours[c]) for c in hours}
    assert lost["checkpoint_save"] > 0 and lost["hang"] > 0 and lost["disruption"] > 0, lost
    fleet = viewer_client.get("/api/v1/fleet/overview/", {"range": "7d"}).json()
    assert fleet["series"]
    assert viewer_client.get("/api/v1/fleet/overview/", {"range": "15m"}).json()["series"]

    # Every running job at a possible model FLOPs utilisation, measured as the page measures it.
    kinds = {kind.name: kind.parameters for kind in JOB_KINDS}
    running = {row["id"]: row for row in training["running"]}
    assert len(running) == 8
    for job in Job.objects.all():
        row = running[job.pk]
        peak = sum(PEAK_TFLOPS[g.model] for g in job.gpus.all()) * 1e12
        mfu = 6 * kinds[job.name.rsplit("-", 1)[0]] * row["tokens_per_s"] / peak
        assert 0.25 <= mfu <= 0.55, (job.name, row["tokens_per_s"], mfu)

    # The jobs' story: checkpoints, failures and their restores, the scripted hang.
    kinds_seen = Counter(JobEvent.objects.exclude(kind="step").values_list("kind", flat=True))
    assert kinds_seen["checkpoint_saved"] > 100 and kinds_seen["failed"] >= 2
    assert kinds_seen["restored"] == kinds_seen["failed"]
    hang = JobEvent.objects.get(kind="failed", reason=NCCL_TIMEOUT)
    assert JobEvent.objects.filter(kind="failed", reason__contains="XID 79").count() == 1

    # The telemetry of the jobs' GPUs tells the same story.
    hung_job = hang.job
    before = hung_job.first_allocated_at.replace(minute=0, second=0, microsecond=0)
    gpu_ids = list(hung_job.gpus.values_list("pk", flat=True))
    idle = GpuRollup1h.objects.filter(gpu_id__in=gpu_ids, bucket__lt=before)
    busy = GpuRollup1h.objects.filter(gpu_id__in=gpu_ids, bucket__gt=before, bucket__lt=hang.ts.replace(minute=0))
    assert idle.exists() and max(r.util_mean for r in idle) < 5  # no job held them yet
    assert busy.exists() and min(r.util_mean for r in busy) > 80
    xid = JobEvent.objects.get(kind="failed", reason__contains="XID 79")
    faulty = Gpu.objects.get(node__hostname=xid.reason.split(" on ")[-1].split(" GPU ")[0], index=int(xid.reason[-1]))
    fault_hour = GpuRollup1h.objects.get(gpu_id=faulty.pk, bucket=xid.ts.replace(minute=0, second=0, microsecond=0))
    assert fault_hour.xid_max == 79 and fault_hour.error_samples > 0
    assert GpuRollup1m.objects.filter(bucket__gte=now - backfill.MINUTE_ROLLUPS + backfill.RAW).count() >= 384 * 300

    # Each job failure opened its incident, resolved, with detection and resolution times.
    failures = JobEvent.objects.filter(kind="failed").count()
    job_incidents = Incident.objects.filter(group_key__startswith="job=", state=IncidentState.RESOLVED)
    assert job_incidents.count() == failures
    # The hang, with the compute port that flapped under it: one incident, fabric fault -> job hang.
    hung = job_incidents.get(title__startswith="Fabric fault → job hang")
    assert hung.findings.filter(source="detector:fabric-link-flap").count() == 1
    assert hung.findings.filter(source="detector:training-hang").count() == 1
    assert all(i.started_at <= i.detected_at <= i.resolved_at <= now for i in Incident.objects.resolved())
    metrics = mttx_by_severity_and_month(now - timedelta(days=8))
    assert metrics and all(row["mttd"] is not None and row["mttr"] is not None for row in metrics)

    # Serving: SLO windows over the week, latency in the hundreds of milliseconds, and the one
    # scripted collapse labelled on its endpoint and in its resolved incident.
    for endpoint in Endpoint.objects.all():
        status = serving.slo_status(endpoint)
        assert status["coverage"]["seconds"] > 6.9 * 86400, endpoint.name
        for slo in ("ttft", "itl", "availability"):
            if status[slo]["budget_left"] is not None:
                assert 0 <= status[slo]["budget_left"] <= 1, (endpoint.name, slo)
        if endpoint.framework == "vllm":
            assert status["latency"]["1h"]["ttft"]["p99"] < 1000, endpoint.name
    surge = EndpointChange.objects.get(kind="config", note=SURGE_NOTE)
    assert now - surge.ts < backfill.MINUTE_ROLLUPS
    collapse = Incident.objects.get(category="serving")
    assert collapse.state == IncidentState.RESOLVED and "Queueing collapse" in collapse.title
    assert collapse.labels["endpoint"] == str(surge.endpoint_id)

    # Fabric and storage open on history: every port reported and up over the last hour, with
    # traffic on the compute fabric; the flap under the hang in the 6-hour timeline; the one
    # under-provisioned site's training servers below what a training server reads.
    fabric = viewer_client.get("/api/v1/fabric/", {"range": "1h"}).json()
    assert fabric["totals"]["ports"] == NodeInterface.objects.count() > 0
    assert fabric["totals"]["up"] == fabric["totals"]["ports"] and fabric["totals"]["flapping"] == 0
    compute = [v for v in fabric["throughput"]["bytes_per_second"]["compute"] if v]
    assert len(compute) >= 55 and min(compute) > 1e9
    flap = hung.findings.get(source="detector:fabric-link-flap")
    timeline = viewer_client.get("/api/v1/fabric/", {"range": "6h"}).json()["flaps"]
    assert [(f["hostname"], f["interface"]) for f in timeline] == [(flap.labels["node"], flap.labels["interface"])]
    storage = viewer_client.get("/api/v1/storage/", {"range": "1h"}).json()
    below = {s["hostname"] for s in storage["servers"] if s["below_need"]}
    training = set(NodeMount.objects.filter(purpose="datasets").values_list("node__hostname", flat=True))
    assert below == {h for h in training if h.startswith("iad2-")} and len(below) == 12, below
    assert all(m["free_pct"] is not None for m in storage["mounts"])

    # Kueue's queues open on history: every simulated ClusterQueue mapped to its pool and team, its
    # minutes over the last hours, and the team that waits while its pool has idle GPUs waiting
    # longer than the admission-starvation threshold (p95 over 30 min) in the last hour.
    queues = SchedulerQueue.objects.filter(scheduler="kueue")
    assert queues.count() == 10
    assert not queues.filter(pool__isnull=True).exists() and not queues.filter(team__isnull=True).exists()
    minutes = SchedulerRollup1m.objects.filter(bucket__gte=now - backfill.QUEUE_MINUTES + timedelta(minutes=5))
    assert minutes.values("bucket").distinct().count() >= 5 * 60 + 50
    assert set(minutes.values_list("queue_id", flat=True).distinct()) == set(queues.values_list("pk", flat=True))
    assert minutes.filter(quantity="admitted_workloads", increase__gt=0).exists()
    waits = admission_waits(queues.values_list("pk", flat=True), window=timedelta(hours=1), now=now)
    site, pool, team = STARVING
    starving = queues.get(site__name=site, name=f"{team}-{pool}")
    assert waits[starving.pk].p95 > 1800, waits[starving.pk]
    assert len(waits) >= 8 and all(w.p95 < waits[starving.pk].p95 for pk, w in waits.items() if pk != starving.pk)

    # The demo opens on a finding (issue 25): the admission-starvation detector, run once on the
    # backfill alone (no live scrape yet), names the starving team and says its quota is the cause.
    report = run_detectors(now=timezone.now(), only=["scheduler-admission-starvation"])
    firing = Finding.objects.filter(source="detector:scheduler-admission-starvation", status="firing")
    found = [(f.labels["site"], f.labels["team"], f.labels["cause"]) for f in firing]
    assert found == [(site, team, "quota")], (found, report)
    assert Incident.objects.open().filter(findings__in=firing).exists()

    # Cost opens on figures: the demo's pools are priced (owned H100/H200/A100 with power, rented
    # L40S), the week's badput and idle GPUs cost money, and each owned pool's price is plausible.
    cost = viewer_client.get("/api/v1/cost/", {"range": "7d"}).json()
    assert cost["has_prices"] and Decimal(cost["total"]) > 0, cost["by_kind"]
    kinds = {k["kind"]: Decimal(k["amount"]) for k in cost["by_kind"]}
    assert kinds["training"] > 0 and kinds.get("incident", 0) > 0, kinds
    owned = {r["pool"]: Decimal(r["hourly"]) for r in cost["own_or_rent"] if r["mode"] == "owned"}
    assert owned and all(Decimal("0.5") < v < Decimal("3") for v in owned.values()), owned
    assert all(r["periods"] for r in cost["own_or_rent"] if r["mode"] == "owned")

    # Reservations in every tier, from the capacity seed.
    assert set(Reservation.objects.values_list("tier", flat=True)) == {"reserved", "on-demand", "preemptible"}

    # The live run takes the same jobs on from the week's end; a restart writes no second week.
    assert all(
        job.job_id and job.cursor and abs((job.cursor - now).total_seconds()) < 600 for job in session.training.jobs
    )
    assert not backfill.history_needed()
    again = _prepare(tmp_path)
    assert again.history == {} and Job.objects.count() == 8
