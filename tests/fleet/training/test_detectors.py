"""Training detectors: hang, data-loader stall, straggler, checkpoint overdue, failed job, and a
GPU fault on a job's node joining the job's incident. Events go through the HTTP door as a
training client sends them; GPU samples through the telemetry writer."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import Job, Site
from fleet.telemetry.store import store_gpu_samples
from fleet.training import read as training_read
from fleet.training.detectors import candidate_jobs, jobs_on
from fleet.training.goodput import Account, account, job_spans
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from tests.fleet.telemetry.test_rollups_and_retention import sample
from tests.fleet.training.conftest import post_events, register_job
from tests.fleet.training.test_simulator import make_world, start_time

pytestmark = pytest.mark.django_db

TRAINING = [
    "training-hang",
    "training-data-stall",
    "training-straggler",
    "training-checkpoint-overdue",
    "training-job-failed",
]
_keys = itertools.count()


@pytest.fixture
def t0() -> datetime:
    """Two hours ago, to the second: events and samples are stamped from here, detectors run at
    explicit times after it (the door takes events up to a week old)."""
    return timezone.now().replace(microsecond=0) - timedelta(hours=2)


def gpu_uuid(host: str, index: int) -> str:
    return f"GPU-{abs(hash(host)) % 10**8:08d}-{index:04d}"


def telemetry(site: Site, hosts: list[str], start: datetime, end: datetime, every: float = 30, **values: Any) -> None:
    """Samples for every GPU (8 per host) from start to end, with ``values`` (under "all")."""
    rows = []
    t = start
    while t <= end:
        for host in hosts:
            per_host = values.get("all", {})
            for i in range(8):
                rows.append(sample(gpu_uuid=gpu_uuid(host, i), hostname=host, gpu_index=i, ts=t, **per_host))
        t += timedelta(seconds=every)
    store_gpu_samples(site_id=site.id, batch_key=f"t{next(_keys)}", samples=rows)


def new_job(client: Client, token: str, site: Site, hosts: list[str], t: datetime, **fields: Any) -> int:
    """A job on whole hosts (their GPUs registered by one telemetry sample first)."""
    telemetry(site, hosts, t - timedelta(hours=1), t - timedelta(hours=1))
    response = register_job(
        client,
        token,
        gang_size=8 * len(hosts),
        nodes=hosts,
        gpus=[gpu_uuid(h, i) for h in hosts for i in range(8)],
        scheduler_id=f"default/{next(_keys)}",
        **fields,
    )
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


class Events:
    """A job's events as a client builds them, posted through the door."""

    def __init__(self, client: Client, token: str, job_id: int, t0: datetime) -> None:
        self.client, self.token, self.job_id, self.t0 = client, token, job_id, t0
        self.n = 0
        self.step = 0

    def send(self, *events: tuple[float, str, dict[str, Any]]) -> None:
        body = []
        for seconds, kind, fields in events:
            self.n += 1
            body.append({"id": f"e{self.n}", "ts": (self.t0 + timedelta(seconds=seconds)).isoformat(), "kind": kind})
            body[-1].update(fields)
        response = post_events(self.client, self.job_id, body, self.token)
        assert response.status_code == 200, response.content

    def start(self, at: float = 0) -> None:
        self.send((at, "allocated", {}), (at + 10, "started", {}))

    def steps(
        self, first_end: float, count: int, step_time: float, wait: float = 0.0, nodes: dict[str, float] | None = None
    ) -> float:
        """``count`` steps, one every step_time seconds, the first ending at first_end; with
        ``nodes`` each node reports every step with its own step time. Returns the last step's end."""
        events = []
        end = first_end
        for k in range(count):
            self.step += 1
            end = first_end + k * step_time
            for j, (node, own) in enumerate((nodes or {"": step_time}).items()):
                fields: dict[str, Any] = {"step": self.step, "step_time_s": own, "data_wait_s": wait}
                if node:
                    fields["node"] = node
                events.append((end + j / 1000, "step", fields))
        for chunk in range(0, len(events), 400):
            self.send(*events[chunk : chunk + 400])
        return end


def at(t0: datetime, seconds: float) -> datetime:
    return t0 + timedelta(seconds=seconds)


def firing(detector: str) -> list[Finding]:
    return list(Finding.objects.filter(source=f"detector:{detector}", status="firing"))


def account_between(job_id: int, start: datetime, end: datetime) -> Account:
    """The job's account over [start, end), from its whole history as its page computes it."""
    events = training_read.job_events(job_id)
    gang = Job.objects.get(pk=job_id).gang_size
    return account(job_spans(events, now=end), gang_size=gang, start=start, end=end)


def compute_between(job_id: int, start: datetime, end: datetime) -> float:
    """GPU-seconds of step compute over [start, end) (no failure in it: nothing is waiting)."""
    acc = account_between(job_id, start, end)
    return acc.productive_s + acc.at_risk_s + acc.disruption_s


# --- hang ----------------------------------------------------------------------------------------


def test_a_hang_opens_an_incident_within_two_cycles_while_its_gpus_show_100_percent_and_resolves(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    hosts = ["h-001", "h-002"]
    job_id = new_job(client, token_a, site_a, hosts, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    last = ev.steps(first_end=12, count=100, step_time=2.0)  # steps every 2 s; the last ends at 210 s
    assert last == 210
    # NCCL spins: the job's 16 GPUs report 100 % through the hang.
    telemetry(site_a, hosts, at(t0, 200), at(t0, 600), every=15, all={"gpu_util": 100.0, "sm_active": 0.98})
    # Threshold: max(10 x median step time 2 s, 300 s) = 300 s after the last step: at 510 s.
    cycle = settings.DETECTOR_INTERVAL_SECONDS
    run_detectors(now=at(t0, 505), only=TRAINING)
    assert not Finding.objects.exists()  # 295 s without a step: below the threshold
    run_detectors(now=at(t0, 510 + cycle), only=TRAINING)
    run_detectors(now=at(t0, 510 + 2 * cycle), only=TRAINING)
    (finding,) = firing("training-hang")
    incident = Incident.objects.get()
    assert finding.incident == incident and incident.severity == "SEV2"
    assert incident.group_key == f"job={job_id}"
    assert incident.labels["job"] == str(job_id) and incident.labels["team"] == "foundation"
    assert finding.started_at == at(t0, 210)  # the last progress
    stalled = 510 + 2 * cycle - 210
    assert finding.impact["gpus"] == 16
    assert finding.impact["gpu_hours_held"] == round(16 * stalled / 3600, 3)  # 16 GPUs x the stalled time
    assert "100 % utilisation" in finding.summary
    assert incident.gpu_hours_lost == pytest.approx(16 * stalled / 3600, abs=1e-3)
    # Steps resume: the finding clears.
    ev.steps(first_end=560, count=5, step_time=2.0)
    run_detectors(now=at(t0, 575), only=TRAINING)
    finding.refresh_from_db()
    assert finding.status == "cleared"
    assert Incident.objects.get().auto_resolve_at is not None


def test_a_slow_job_between_steps_is_not_a_hang(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["s-001"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    last = ev.steps(first_end=70, count=10, step_time=60.0)  # 60 s steps: threshold 10 x 60 = 600 s
    run_detectors(now=at(t0, last + 550), only=TRAINING)
    assert not firing("training-hang")
    run_detectors(now=at(t0, last + 601), only=TRAINING)
    assert len(firing("training-hang")) == 1


def test_a_job_that_ended_is_not_hung(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["e-001"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    last = ev.steps(first_end=12, count=10, step_time=2.0)
    ev.send((last + 1, "completed", {}), (last + 2, "released", {}))
    run_detectors(now=at(t0, last + 3600), only=TRAINING)
    assert not Finding.objects.exists()


# --- data stall ----------------------------------------------------------------------------------


def test_a_data_stall_is_judged_by_the_wait_the_job_reports_and_utilisation_only_sets_severity(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    starved = new_job(client, token_a, site_a, ["d-001"], t0, name="starved")
    busy = new_job(client, token_a, site_a, ["d-002"], t0, name="busy")
    for job_id in (starved, busy):
        ev = Events(client, token_a, job_id, t0)
        ev.start()
        # 150 steps of 4 s, 2 s of each waiting for data, ending at 14 + 149 x 4 = 610 s.
        ev.steps(first_end=14, count=150, step_time=4.0, wait=2.0)
    telemetry(site_a, ["d-001"], at(t0, 10), at(t0, 610), all={"gpu_util": 35.0})
    telemetry(site_a, ["d-002"], at(t0, 10), at(t0, 610), all={"gpu_util": 96.0})
    run_detectors(now=at(t0, 610), only=TRAINING)
    found = {f.labels["job"]: f for f in firing("training-data-stall")}
    # Both waited half of each step: both stall. Busy GPUs lower the severity, they do not hide it.
    assert set(found) == {str(starved), str(busy)}
    finding = found[str(starved)]
    assert finding.severity == "SEV3" and "50%" in finding.summary and "35 % utilisation" in finding.summary
    assert found[str(busy)].severity == "SEV4"
    # Window (0 s, 610 s]: steps ending 14..610 s, the first began at 10 s. The account's stall over
    # it: 150 steps x 2 s = 300 s; 8 GPUs x 300 s = 2400 GPU-s = 0.667 GPU-hours.
    assert finding.impact["gpu_hours_lost"] == finding.impact["gpu_hours"] == round(8 * 150 * 2 / 3600, 3)
    assert finding.impact["data_wait_fraction"] == 0.5


def test_a_forty_percent_data_wait_at_sixty_percent_utilisation_opens_a_finding(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    """The account records the stall; a finding must open too, whatever the GPUs' utilisation."""
    client = Client()
    job_id = new_job(client, token_a, site_a, ["d-003"], t0, name="ordinary")
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=15, count=120, step_time=5.0, wait=2.0)  # 40 % of each 5 s step waits: to 610 s
    telemetry(site_a, ["d-003"], at(t0, 10), at(t0, 610), all={"gpu_util": 60.0})
    run_detectors(now=at(t0, 610), only=["training-data-stall"])
    (finding,) = firing("training-data-stall")
    assert finding.labels["job"] == str(job_id) and finding.severity == "SEV4"
    assert finding.impact["data_wait_fraction"] == 0.4 and "60 % utilisation" in finding.summary
    # The stall time x gang over the episode, as the job's account has it.
    stall = account_between(job_id, finding.started_at, at(t0, 610)).data_stall_s
    assert stall == 120 * 2.0 * 8
    assert finding.impact["gpu_hours_lost"] == round(stall / 3600, 3)


def test_a_stall_needs_five_minutes_of_steps_and_a_high_fraction(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    short = Events(client, token_a, new_job(client, token_a, site_a, ["q-001"], t0), t0)
    short.start()
    short.steps(first_end=14, count=50, step_time=4.0, wait=2.0)  # 200 s of steps: not yet sustained
    light = Events(client, token_a, new_job(client, token_a, site_a, ["q-002"], t0), t0)
    light.start()
    light.steps(first_end=14, count=50, step_time=4.0, wait=0.4)  # 10 % waiting
    run_detectors(now=at(t0, 214), only=TRAINING)
    assert not firing("training-data-stall")
    # Without telemetry the fraction alone decides, once sustained.
    short.steps(first_end=218, count=30, step_time=4.0, wait=2.0)  # to 334 s: steps span 10..334 s
    run_detectors(now=at(t0, 334), only=TRAINING)
    assert [f.labels["job"] for f in firing("training-data-stall")] == [str(short.job_id)]


# --- straggler -----------------------------------------------------------------------------------


def test_a_node_with_longer_steps_is_a_straggler(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    hosts = ["g-001", "g-002", "g-003"]
    job_id = new_job(client, token_a, site_a, hosts, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    # The gang runs at the pace of g-003, whose steps take 4.2 s: 1.4 x its peers' median (3.0 s).
    ev.steps(first_end=15, count=60, step_time=4.2, nodes={"g-001": 3.0, "g-002": 3.0, "g-003": 4.2})
    run_detectors(now=at(t0, 300), only=TRAINING)
    (finding,) = firing("training-straggler")
    assert finding.labels["hostname"] == "g-003" and finding.labels["job"] == str(job_id)
    assert "median step 4.20 s vs 3.00 s" in finding.summary
    assert finding.impact["slowdown"] == 1.4
    # (1 - 1/1.4) of the gang's compute over the episode so far: from the window's first step,
    # which began at 15.002 - 4.2 = 10.802 s (g-003's report of the first step), to its last report
    # at 262.802 s (then no step until now, 300 s): 252 s x 24 GPUs, as the account has it.
    compute = compute_between(job_id, finding.started_at, at(t0, 300))
    assert compute == pytest.approx(252 * 24)
    assert finding.impact["gpu_hours_lost"] == round((1 - 1 / 1.4) * compute / 3600, 3)


def test_a_node_whose_gpus_are_far_less_active_is_a_straggler(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    hosts = ["m-001", "m-002", "m-003"]
    job_id = new_job(client, token_a, site_a, hosts, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=13, count=100, step_time=3.0)  # steps without a node: only telemetry can tell
    busy = {"gpu_util": 97.0, "sm_active": 0.9}
    telemetry(site_a, ["m-001", "m-002"], at(t0, 0), at(t0, 300), all=busy)
    # m-003's GPUs: 60 % SM activity vs 90 % on its peers: 0.67 x, under the 0.7 x line.
    telemetry(site_a, ["m-003"], at(t0, 1), at(t0, 301), all={"gpu_util": 95.0, "sm_active": 0.6})
    run_detectors(now=at(t0, 310), only=TRAINING)
    (finding,) = firing("training-straggler")
    assert finding.labels["hostname"] == "m-003"
    assert "SM activity 60 % vs 90 %" in finding.summary


def test_nodes_within_the_ratios_are_not_stragglers(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    hosts = ["n-001", "n-002"]
    job_id = new_job(client, token_a, site_a, hosts, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=14, count=60, step_time=3.8, nodes={"n-001": 3.0, "n-002": 3.8})  # 1.27 x: under 1.3
    telemetry(site_a, ["n-001"], at(t0, 0), at(t0, 200), all={"sm_active": 0.9})
    telemetry(site_a, ["n-002"], at(t0, 1), at(t0, 201), all={"sm_active": 0.72})  # 0.8 x: above 0.7
    run_detectors(now=at(t0, 210), only=TRAINING)
    assert not firing("training-straggler")


# --- checkpoint overdue --------------------------------------------------------------------------


def test_a_checkpoint_overdue_for_twice_its_interval(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["c-001"], t0, checkpoint_interval_s=600)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=15, count=50, step_time=5.0)  # to 260 s
    ev.send((300, "checkpoint_saved", {"step": 50, "duration_s": 20}))
    ev.steps(first_end=305, count=250, step_time=5.0)  # to 1550 s: steps keep coming
    run_detectors(now=at(t0, 1500), only=["training-checkpoint-overdue"])
    assert not Finding.objects.exists()  # 1200 s since the checkpoint: not over 2 x 600 s yet
    run_detectors(now=at(t0, 1510), only=["training-checkpoint-overdue"])
    (finding,) = firing("training-checkpoint-overdue")
    assert finding.started_at == at(t0, 1500)
    # 8 GPUs x 1210 s since the checkpoint at 300 s.
    assert finding.impact["gpu_hours_at_risk"] == round(8 * 1210 / 3600, 3)
    # At risk is not lost: no headline figure, so the incident counts no GPU-hours lost.
    assert "gpu_hours" not in finding.impact
    assert finding.incident.gpu_hours_lost == 0


# --- a failed job and the GPU fault that killed it -----------------------------------------------


def test_a_failed_job_and_the_xid_79_on_its_node_are_one_incident_with_the_jobs_gpu_hours(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["x-001"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=14, count=146, step_time=4.0)  # to 594 s
    ev.send((600, "checkpoint_saved", {"step": 146, "duration_s": 10}))
    ev.steps(first_end=604, count=150, step_time=4.0)  # to 1200 s
    ev.send((1210, "failed", {"reason": "CUDA error: GPU has fallen off the bus"}))
    # GPU 3 of the job's node reports XID 79 from 1205 s; the detectors run at 1230 s.
    telemetry(site_a, ["x-001"], at(t0, 1100), at(t0, 1190))
    xid = [
        sample(gpu_uuid=gpu_uuid("x-001", 3), hostname="x-001", gpu_index=3, ts=at(t0, s), xid=79) for s in (1205, 1220)
    ]
    store_gpu_samples(site_id=site_a.id, batch_key="xid", samples=xid)
    run_detectors(now=at(t0, 1230), only=["critical-xid", "training-job-failed"])

    incident = Incident.objects.get()
    failed, gpu_fault = (
        Finding.objects.get(source="detector:training-job-failed"),
        Finding.objects.get(source="detector:critical-xid"),
    )
    assert failed.incident == gpu_fault.incident == incident
    assert incident.group_key == f"job={job_id}"
    # What the failure cost so far: the 600 s of compute since the checkpoint at 600 s, and 20 s
    # of the gang held waiting to restart: 8 GPUs x 620 s = 1.378 GPU-hours.
    lost = round(8 * (600 + 20) / 3600, 3)
    assert failed.impact["gpu_hours_lost"] == failed.impact["gpu_hours"] == lost and failed.impact["gpus"] == 8
    assert failed.impact["progress_lost_gpu_h"] == round(8 * 600 / 3600, 3)
    assert failed.impact["waiting_gpu_h"] == round(8 * 20 / 3600, 3) and failed.impact["growing"] == "waiting"
    assert failed.started_at == at(t0, 1210)
    # "CUDA error: GPU has fallen off the bus" names XID 79's text: the cause, not the CUDA error.
    assert failed.impact["failure_class"] == "xid"
    assert "GPU-hours" not in failed.summary  # the incident's title names no figure to go stale
    assert gpu_fault.labels["job"] == str(job_id) and gpu_fault.labels["job_name"] == "llama-70b-pretrain"
    # The fault's cost to the job is the failure finding's: none of its own, nothing at risk.
    assert gpu_fault.impact["job_gpus"] == 8 and "gpu_hours" not in gpu_fault.impact
    assert gpu_fault.impact["job_failed_at"] == at(t0, 1210).isoformat()
    assert gpu_fault.impact["gpu_uuids"] and len(gpu_fault.impact["gpu_uuids"]) == 8  # the node drains
    assert incident.gpu_hours_lost == pytest.approx(lost) and incident.gpus_out_of_service == 0
    assert incident.current_gpu_hours() == pytest.approx(lost)
    assert incident.affected_gpus == 8  # the job's GPUs are the node's: counted once
    # The job restarts: the failure finding takes its final cost and clears. 90 s waiting (1210 s
    # to the restart at 1300 s), no re-initialisation (the restore began at the restart), the 30 s
    # restore: 8 GPUs x (600 + 90 + 30) s.
    ev.send((1300, "started", {}), (1330, "restored", {"step": 146, "duration_s": 30}))
    run_detectors(now=at(t0, 1340), only=["training-job-failed"])
    failed.refresh_from_db()
    incident.refresh_from_db()
    assert failed.status == "cleared"
    final = round(8 * (600 + 90 + 30) / 3600, 3)
    assert failed.impact["gpu_hours_lost"] == final and failed.impact["restore_gpu_h"] == round(8 * 30 / 3600, 3)
    assert incident.gpu_hours_lost == pytest.approx(final)
    # The job page's failure row says the same.
    [row] = training_read.job_snapshot(Job.objects.get(pk=job_id), now=at(t0, 1340))["losses"]
    assert row["cost_gpu_s"] == 8 * (600 + 90 + 30) and row["cost_gpu_h"] == round(final, 2)
    assert (row["failure_class"], row["failure_class_label"]) == ("xid", "GPU XID error")


def test_a_job_released_after_failing_stays_failed_for_30_minutes(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["f-001"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=20, count=10, step_time=1.0)
    ev.send((100, "failed", {"reason": "OOM"}), (160, "released", {}))
    run_detectors(now=at(t0, 1000), only=TRAINING)
    (finding,) = firing("training-job-failed")
    # Never checkpointed: all its compute lost (10 steps of 1 s), and the gang held from the failure
    # at 100 s to the release at 160 s: (10 + 60) s x 8 GPUs, fixed at the release.
    cost = round(8 * (10 + 60) / 3600, 3)
    assert finding.impact["gpu_hours_lost"] == cost and finding.impact["growing"] is None
    assert finding.impact["failure_class"] == "oom"
    run_detectors(now=at(t0, 1500), only=TRAINING)
    finding.refresh_from_db()
    assert finding.impact["gpu_hours_lost"] == cost and finding.incident.gpu_hours_lost == pytest.approx(cost)
    run_detectors(now=at(t0, 100 + 1801), only=TRAINING)
    assert not firing("training-job-failed")
    finding.refresh_from_db()
    assert finding.incident.current_gpu_hours() == pytest.approx(cost)  # nothing accrues after the release


def test_a_gpu_fault_on_a_node_without_a_job_keeps_its_node_grouping(site_a: Site, t0: datetime) -> None:
    now = timezone.now()
    xid = [sample(gpu_uuid=gpu_uuid("z-001", 1), hostname="z-001", gpu_index=1, ts=now, xid=79)]
    store_gpu_samples(site_id=site_a.id, batch_key="xid-z", samples=xid)
    run_detectors(now=now, only=["critical-xid"])
    incident = Incident.objects.get()
    assert incident.group_key == "node=z-001" and "job" not in incident.labels


# --- the simulator's healthy jobs ----------------------------------------------------------------


def test_twenty_healthy_simulated_jobs_over_an_hour_raise_nothing() -> None:
    world = make_world(jobs=20, seed=21, scenarios=False, failure_rate=0.0)
    assert len(world.training.jobs) == 20 and len({n for j in world.training.jobs for n in j.nodes}) >= 20
    world.run(start_time(), 60)  # the detectors run every simulated minute
    # Steady traffic for the detectors to judge: at least three events a job a minute (steps at
    # the simulator's physically possible rates, 25-55 % MFU, are seconds long; a gang reports each once).
    assert world.training.rejected == [] and world.training.accepted > 20 * 60 * 3
    assert dict(world.fired) == {}
    assert not Finding.objects.exists()


# --- hang: long blocking stretches are not hangs -------------------------------------------------


def test_a_checkpoint_save_as_long_as_one_seen_before_is_not_a_hang(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["k-001"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=12, count=100, step_time=2.0)  # to 210 s
    # A 6-minute synchronous save: started at 212 s, saved at 572 s.
    ev.send((212, "checkpoint_started", {"step": 100}), (572, "checkpoint_saved", {"step": 100, "duration_s": 360}))
    ev.steps(first_end=574, count=50, step_time=2.0)  # to 672 s
    ev.send((674, "checkpoint_started", {"step": 150}))
    # 6 minutes into the second save (1034 s): 360 s since it began, over the 300 s base threshold,
    # but the threshold grows by 1.5 x the longest save seen (360 s): 300 + 540 = 840 s.
    run_detectors(now=at(t0, 674 + 360), only=TRAINING)
    assert not firing("training-hang")
    # A save that never ends is a hang all the same: 841 s after it began.
    run_detectors(now=at(t0, 674 + 841), only=TRAINING)
    (finding,) = firing("training-hang")
    assert finding.started_at == at(t0, 674)  # the progress stopped when the save began
    assert finding.impact["threshold_s"] == 840


def test_a_restart_whose_restore_is_in_progress_is_not_a_hang(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["k-002"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=12, count=100, step_time=2.0)  # to 210 s
    ev.send((220, "checkpoint_saved", {"step": 100, "duration_s": 5}))
    ev.steps(first_end=224, count=50, step_time=2.0)  # to 322 s
    ev.send((330, "failed", {"reason": "NCCL timeout"}), (400, "started", {}))
    # The first restart's restore took 240 s.
    ev.send((640, "restored", {"step": 100, "duration_s": 240}))
    ev.steps(first_end=642, count=50, step_time=2.0)  # to 740 s
    ev.send((750, "failed", {"reason": "NCCL timeout"}), (800, "started", {}))
    # 400 s after the second start, still restoring: threshold 300 + 1.5 x 240 = 660 s.
    run_detectors(now=at(t0, 1200), only=TRAINING)
    assert not firing("training-hang")
    run_detectors(now=at(t0, 800 + 661), only=TRAINING)
    assert len(firing("training-hang")) == 1


def test_jobs_allocated_but_not_started_or_failed_and_waiting_are_not_hung(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    waiting = Events(client, token_a, new_job(client, token_a, site_a, ["k-003"], t0), t0)
    waiting.send((0, "allocated", {}))  # the program has not started: nothing to hang
    failed = Events(client, token_a, new_job(client, token_a, site_a, ["k-004"], t0), t0)
    failed.start()
    failed.steps(first_end=12, count=10, step_time=2.0)
    failed.send((40, "failed", {"reason": "OOM"}))  # holds its GPUs until it restarts
    run_detectors(now=at(t0, 3600), only=TRAINING)
    assert not firing("training-hang")


# --- a GPU fault joins the right job -------------------------------------------------------------


def _xid(site: Site, host: str, index: int, seconds: list[float], t0: datetime, xid: int = 79) -> None:
    rows = [
        sample(gpu_uuid=gpu_uuid(host, index), hostname=host, gpu_index=index, ts=at(t0, s), xid=xid) for s in seconds
    ]
    store_gpu_samples(site_id=site.id, batch_key=f"x{next(_keys)}", samples=rows)


def test_a_gpu_fault_joins_the_running_job_not_a_larger_released_one(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    big = new_job(client, token_a, site_a, ["q-101", "q-102"], t0, name="big-a")
    ea = Events(client, token_a, big, t0)
    ea.start()
    ea.steps(first_end=12, count=10, step_time=2.0)
    ea.send((100, "failed", {"reason": "OOM"}), (110, "released", {}))
    small = new_job(client, token_a, site_a, ["q-101"], t0, name="small-b")
    eb = Events(client, token_a, small, t0)
    eb.start(at=200)
    eb.steps(first_end=220, count=200, step_time=2.0)  # to 618 s
    _xid(site_a, "q-101", 3, [600, 610], t0)
    run_detectors(now=at(t0, 620), only=["critical-xid"])
    finding = Finding.objects.get(source="detector:critical-xid")
    # The released job failed at 100 s, long before the fault (600 s > 110 s + 2 min grace).
    assert finding.labels["job"] == str(small) and finding.labels["job_name"] == "small-b"


def test_a_released_job_owns_a_fault_only_if_it_failed_and_the_fault_began_by_its_release(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    jobs = {}
    for host, (failed, fault_at) in {"u-001": (True, 250), "u-002": (True, 400), "u-003": (False, 150)}.items():
        job_id = new_job(client, token_a, site_a, [host], t0)
        ev = Events(client, token_a, job_id, t0)
        ev.start()
        ev.steps(first_end=12, count=10, step_time=2.0)  # to 30 s
        ev.send((100, "failed" if failed else "completed", {"reason": "XID"} if failed else {}), (160, "released", {}))
        _xid(site_a, host, 2, list(range(fault_at, 420, 10)), t0)  # from fault_at, until now
        jobs[host] = job_id
    run_detectors(now=at(t0, 420), only=["critical-xid"])
    linked = {f.labels["hostname"]: f.labels.get("job") for f in Finding.objects.filter(source="detector:critical-xid")}
    # u-001: failed, released at 160 s, fault from 250 s <= 160 + 120 s: its fault.
    # u-002: fault from 400 s > 280 s: a later fault on a free node. u-003: completed, not killed.
    assert linked == {"u-001": str(jobs["u-001"]), "u-002": None, "u-003": None}


def test_a_fault_on_a_gpu_the_job_does_not_use_is_not_linked_unless_it_drains_the_node(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    telemetry(site_a, ["r-001"], t0 - timedelta(hours=1), t0 - timedelta(hours=1))
    response = register_job(
        client,
        token_a,
        gang_size=4,
        nodes=["r-001"],
        gpus=[gpu_uuid("r-001", i) for i in range(4)],
        scheduler_id="default/r-001",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=12, count=100, step_time=2.0)  # to 210 s
    six = gpu_uuid("r-001", 6)
    store_gpu_samples(
        site_id=site_a.id,
        batch_key="dbe-r",
        samples=[
            sample(gpu_uuid=six, hostname="r-001", gpu_index=6, ts=at(t0, s), ecc_dbe_total=2) for s in (190, 205)
        ],
    )
    _xid(site_a, "r-001", 7, [195, 205], t0)  # XID 79 drains the node: the job's GPUs too
    run_detectors(now=at(t0, 210), only=["ecc-double-bit", "critical-xid"])
    ecc = Finding.objects.get(source="detector:ecc-double-bit")
    assert "job" not in ecc.labels  # GPU 6 is not one of the job's GPUs 0-3
    xid = Finding.objects.get(source="detector:critical-xid")
    assert xid.labels["job"] == str(job_id)


def test_a_linked_fault_never_counts_the_jobs_hours_itself_the_failure_finding_does(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    running = new_job(client, token_a, site_a, ["s-102"], t0)
    job_id = new_job(client, token_a, site_a, ["s-101"], t0)
    for pk in (running, job_id):
        ev = Events(client, token_a, pk, t0)
        ev.start()
        ev.steps(first_end=14, count=146, step_time=4.0)  # to 594 s
        ev.send((600, "checkpoint_saved", {"step": 146, "duration_s": 10}))
        ev.steps(first_end=604, count=100, step_time=4.0)  # to 1000 s
    # A fault on a GPU of a running job: at risk only, nothing lost yet.
    _xid(site_a, "s-102", 3, [995], t0, xid=48)
    run_detectors(now=at(t0, 1000), only=["critical-xid", "training-job-failed"])
    fault = Finding.objects.get(source="detector:critical-xid")
    assert fault.labels["job"] == str(running)
    # The account's work not yet checkpointed: the 400 s of compute since the save at 600 s.
    assert fault.impact["gpu_hours_at_risk"] == round(8 * 400 / 3600, 3)
    assert account_between(running, at(t0, 0), at(t0, 1000)).at_risk_s == 8 * 400
    assert "gpu_hours" not in fault.impact and fault.incident.current_gpu_hours() == 0
    assert fault.incident.current_gpu_hours_at_risk() == pytest.approx(8 * 400 / 3600, abs=1e-3)
    # The other job fails with an XID 79 on its node: its failure finding prices the failure, the
    # fault adds nothing of its own (not even its GPUs out of service: the job holds them).
    ev.steps(first_end=1004, count=50, step_time=4.0)  # to 1200 s
    ev.send((1210, "failed", {"reason": "XID 79"}))
    _xid(site_a, "s-101", 3, [1205, 1220], t0)
    run_detectors(now=at(t0, 1230), only=["critical-xid", "training-job-failed"])
    xid = Finding.objects.get(source="detector:critical-xid", labels__job=str(job_id))
    failed = Finding.objects.get(source="detector:training-job-failed", labels__job=str(job_id))
    assert "gpu_hours" not in xid.impact and "gpu_hours_at_risk" not in xid.impact
    assert xid.incident == failed.incident
    incident = xid.incident
    cost = round(8 * (600 + 20) / 3600, 3)  # 600 s of progress since the save, 20 s waiting so far
    assert failed.impact["gpu_hours"] == cost and incident.current_gpu_hours() == pytest.approx(cost)
    # The job restarts and trains for over an hour while the XID sticks: the fault adds nothing,
    # and the incident keeps the failure's final cost (90 s waiting and a 30 s restore).
    ev.send((1300, "started", {}), (1330, "restored", {"step": 146, "duration_s": 30}))
    ev.steps(first_end=1334, count=1000, step_time=4.0)  # to 5330 s
    _xid(site_a, "s-101", 3, [5300, 5320], t0)
    run_detectors(now=at(t0, 5330), only=["critical-xid", "training-job-failed"])
    xid.refresh_from_db()
    incident.refresh_from_db()
    assert xid.status == "firing" and "gpu_hours" not in xid.impact
    assert incident.current_gpu_hours() == pytest.approx(8 * (600 + 90 + 30) / 3600, abs=1e-3)


# --- cost per cycle ------------------------------------------------------------------------------


def test_window_statistics_are_computed_once_per_cycle_and_the_hang_reads_only_recent_steps(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    for host in ("w-001", "w-002"):
        ev = Events(client, token_a, new_job(client, token_a, site_a, [host, f"{host}b"], t0), t0)
        ev.start()
        ev.steps(first_end=12, count=20, step_time=2.0, nodes={host: 2.0, f"{host}b": 2.0})
    with CaptureQueriesContext(connection) as queries:
        run_detectors(now=at(t0, 60), only=TRAINING)
    window_scans = [q for q in queries.captured_queries if "AS first_start" in q["sql"]]
    recent_scans = [q for q in queries.captured_queries if "LIMIT %(recent)s" in q["sql"] or "AS times" in q["sql"]]
    assert len(window_scans) == 1  # shared by the data-stall and straggler detectors
    assert len(recent_scans) == 1 and "first_start" not in recent_scans[0]["sql"]  # the hang's


def test_linking_reads_only_the_jobs_on_the_faulty_hosts(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    near = new_job(client, token_a, site_a, ["v-001"], t0)
    far = new_job(client, token_a, site_a, ["v-002"], t0)
    for job_id in (near, far):
        Events(client, token_a, job_id, t0).start()
    assert {j.pk for j in candidate_jobs(at(t0, 60))} == {near, far}
    assert [j.pk for j in candidate_jobs(at(t0, 60), hostnames=["v-001"])] == [near]
    assert set(jobs_on(at(t0, 60), ["v-001"], [])) == {"host:v-001"}


# --- hysteresis and whole-episode cost -----------------------------------------------------------


def test_a_firing_straggler_clears_only_under_1_2_x_and_counts_the_whole_episode(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    hosts = ["y-001", "y-002", "y-003"]
    job_id = new_job(client, token_a, site_a, hosts, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=15, count=60, step_time=4.2, nodes={"y-001": 3.0, "y-002": 3.0, "y-003": 4.2})  # to 251 s
    run_detectors(now=at(t0, 300), only=TRAINING)
    (finding,) = firing("training-straggler")
    assert finding.started_at == at(t0, 10.802)  # the window's first step began (15.002 - 4.2 s)
    # y-003 improves to 3.75 s: 1.25 x its peers, under the 1.3 x that raises but not under 1.2 x.
    ev.steps(first_end=305, count=200, step_time=3.75, nodes={"y-001": 3.0, "y-002": 3.0, "y-003": 3.75})
    run_detectors(now=at(t0, 1051), only=TRAINING)  # window (451, 1051]: only the 3.75 s steps
    (finding,) = firing("training-straggler")
    # The whole episode, not a 10-minute slice: (1 - 1/1.25) x the gang's compute since 10.802 s.
    compute = compute_between(job_id, at(t0, 10.802), at(t0, 1051))
    assert compute > 24 * 900  # the compute of some 950 s of steps, not 600 s
    assert finding.impact["gpu_hours_lost"] == round((1 - 1 / 1.25) * compute / 3600, 3)
    assert finding.incident.gpu_hours_lost == pytest.approx(finding.impact["gpu_hours_lost"])
    ev.steps(first_end=1055, count=200, step_time=3.45, nodes={"y-001": 3.0, "y-002": 3.0, "y-003": 3.45})
    run_detectors(now=at(t0, 1742), only=TRAINING)  # 1.15 x: under 1.2 x, it clears
    assert not firing("training-straggler")
    # A straggler that is not firing needs 1.3 x again: 1.25 x does not raise it.
    ev.steps(first_end=1746, count=200, step_time=3.75, nodes={"y-001": 3.0, "y-002": 3.0, "y-003": 3.75})
    run_detectors(now=at(t0, 2493), only=TRAINING)
    assert not firing("training-straggler")


def test_a_firing_data_stall_clears_only_under_a_fifth_and_counts_the_whole_episode(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    job_id = new_job(client, token_a, site_a, ["d-101"], t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=14, count=150, step_time=4.0, wait=2.0)  # to 610 s, half of each step waiting
    run_detectors(now=at(t0, 610), only=TRAINING)
    (finding,) = firing("training-data-stall")
    assert finding.started_at == at(t0, 10)
    ev.steps(first_end=614, count=150, step_time=4.0, wait=1.0)  # to 1210 s: 25 % waiting
    run_detectors(now=at(t0, 1210), only=TRAINING)  # window (610, 1210]: only the 25 % steps
    (finding,) = firing("training-data-stall")
    # The stall time of the whole episode since 10 s, not of a 10-minute slice: 150 steps waiting
    # 2 s, then 150 waiting 1 s: 8 GPUs x 450 s = 1.0 GPU-hours.
    assert finding.impact["gpu_hours_lost"] == round(8 * (150 * 2 + 150 * 1) / 3600, 3)
    assert account_between(job_id, at(t0, 10), at(t0, 1210)).data_stall_s == 8 * 450
    ev.steps(first_end=1214, count=150, step_time=4.0, wait=0.6)  # to 1810 s: 15 % waiting
    run_detectors(now=at(t0, 1810), only=TRAINING)
    assert not firing("training-data-stall")


def test_a_firing_sm_activity_straggler_clears_only_above_0_8_x(site_a: Site, token_a: str, t0: datetime) -> None:
    client = Client()
    hosts = ["o-001", "o-002", "o-003"]
    job_id = new_job(client, token_a, site_a, hosts, t0)
    ev = Events(client, token_a, job_id, t0)
    ev.start()
    ev.steps(first_end=13, count=100, step_time=3.0)
    peers = {"gpu_util": 97.0, "sm_active": 0.9}
    telemetry(site_a, ["o-001", "o-002"], at(t0, 0), at(t0, 1540), all=peers)
    telemetry(site_a, ["o-003"], at(t0, 1), at(t0, 301), all={"sm_active": 0.6})  # 0.67 x its peers: raised
    run_detectors(now=at(t0, 310), only=["training-straggler"])
    assert len(firing("training-straggler")) == 1
    telemetry(site_a, ["o-003"], at(t0, 331), at(t0, 921), all={"sm_active": 0.7})  # 70 / 90 = 0.78 x
    run_detectors(now=at(t0, 921), only=["training-straggler"])  # window (321, 921]: only the 70 %
    assert len(firing("training-straggler")) == 1  # above 0.7 x, but not above 0.8 x: still firing
    telemetry(site_a, ["o-003"], at(t0, 931), at(t0, 1531), all={"sm_active": 0.75})  # 75 / 90 = 0.83 x
    run_detectors(now=at(t0, 1531), only=["training-straggler"])
    assert not firing("training-straggler")


def test_a_first_six_minute_save_is_not_a_hang_but_a_start_up_hang_still_pages_at_five_minutes(
    site_a: Site, token_a: str, t0: datetime
) -> None:
    client = Client()
    saving = Events(client, token_a, new_job(client, token_a, site_a, ["k-005"], t0), t0)
    saving.start()
    saving.steps(first_end=12, count=100, step_time=2.0)  # to 210 s
    saving.send((212, "checkpoint_started", {"step": 100}))  # its first save: no history
    starting = Events(client, token_a, new_job(client, token_a, site_a, ["k-006"], t0), t0)
    starting.start()  # started at 10 s, never checkpointed: no restore will follow
    # 6 minutes into the save (572 s): within 300 + 1.5 x 600 (the default save) = 1200 s.
    run_detectors(now=at(t0, 212 + 360), only=TRAINING)
    assert [f.labels["job"] for f in firing("training-hang")] == [str(starting.job_id)]  # 562 s > 300 s
    run_detectors(now=at(t0, 212 + 1201), only=TRAINING)
    assert {f.labels["job"] for f in firing("training-hang")} == {str(saving.job_id), str(starting.job_id)}
