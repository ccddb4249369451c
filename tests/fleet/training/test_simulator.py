"""The training simulator: jobs register and report through the HTTP doors like a real client, the
scripted hang, data-loader stall and straggler each trigger their detector, and failures restore
from the last checkpoint. A simulated hour runs in seconds on an explicit clock."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from console.models import AgentToken
from fleet.models import Job, JobEvent, Site
from fleet.services.ingest import parse_gpu_batch
from fleet.services.telemetry import store_gpu_samples
from fleet.simulator import DEFAULT_SITES, FleetSimulator, build_fleet
from fleet.simulator_training import HANG_FAILS_AFTER, NCCL_TIMEOUT, TrainingSimulator
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident

TRAINING = [
    "training-hang",
    "training-data-stall",
    "training-straggler",
    "training-checkpoint-overdue",
    "training-job-failed",
]


class ClientSender:
    """Posts as fleet.simulator.Poster does (JSON, the site's agent token), through Django's test
    client instead of a socket."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.client, self.tokens = Client(), tokens
        self.statuses: dict[int, int] = defaultdict(int)

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any:
        response = self.client.post(
            url, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {self.tokens[site]}"
        )
        self.statuses[response.status_code] += 1
        return response


@dataclass
class World:
    fleet_sim: FleetSimulator
    training: TrainingSimulator
    sender: ClientSender
    sites: dict[str, int]
    fired: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # detector -> job ids
    first: dict[str, int] = field(default_factory=dict)  # detector -> the simulated minute it first fired

    def run(self, start: datetime, minutes: int, *, detectors: bool = True, only: list[str] = TRAINING) -> None:
        """Every simulated minute: the fleet's telemetry (through the door's schema and writer), the
        training simulator's tick, and the detectors."""
        for m in range(minutes):
            now = start + timedelta(minutes=m)
            for site, samples in self.fleet_sim.batches(now).items():
                if samples:
                    batch = parse_gpu_batch(json.dumps({"samples": samples}).encode(), now=now)
                    store_gpu_samples(site_id=self.sites[site], batch_key=f"{site}:{now}", samples=batch.samples)
            self.training.tick(now)
            if detectors:
                run_detectors(now=now, only=only)
                for source, labels in Finding.objects.filter(status="firing").values_list("source", "labels"):
                    self.fired[source.removeprefix("detector:")].add(labels.get("job", ""))
                    self.first.setdefault(source.removeprefix("detector:"), m)


def make_world(*, jobs: int, seed: int, scenarios: bool, failure_rate: float) -> World:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=None, seed=seed)
    sites, tokens = {}, {}
    for spec in DEFAULT_SITES:
        site = Site.objects.create(name=spec.name, region=spec.region, contracted_power_kw=spec.contracted_power_kw)
        sites[spec.name] = site.pk
        tokens[spec.name] = AgentToken.issue(site=site, name="simulator")[1]
    fleet_sim = FleetSimulator(fleet, fault_rate_per_gpu_hour=0, interval=60, seed=seed)
    sender = ClientSender(tokens)
    training = TrainingSimulator(
        fleet_sim, sender, jobs=jobs, seed=seed, failure_rate_per_gpu_hour=failure_rate, scenarios=scenarios
    )
    return World(fleet_sim, training, sender, sites)


def start_time() -> datetime:
    # Far enough back that a simulated hour ends before now (the door refuses events from the future).
    return timezone.now().replace(microsecond=0) - timedelta(minutes=90)


@pytest.mark.django_db
def test_an_hour_of_jobs_with_the_scripted_faults_triggers_each_detector() -> None:
    world = make_world(jobs=8, seed=5, scenarios=True, failure_rate=0.0)
    world.run(start_time(), 60)
    training = world.training
    # Every job registered through the API and every batch was accepted.
    assert training.rejected == []
    assert all(status < 400 for status in world.sender.statuses), world.sender.statuses
    assert Job.objects.count() == 8 and all(j.job_id for j in training.jobs)
    assert {s.scheduler_id for s in Job.objects.all()} == {j.scheduler_id for j in training.jobs}
    by_scenario = {j.scenario: str(j.job_id) for j in training.jobs}
    hang_job = str(next(j.job_id for j in training.jobs if j.scenario in ("hang", "hang-done")))
    # The scripted faults trigger their detectors, on their jobs and no other.
    assert world.fired["training-hang"] == {hang_job}
    assert world.fired["training-data-stall"] == {by_scenario["stall"]}
    assert world.fired["training-straggler"] == {by_scenario["straggler"]}
    straggler = next(j for j in training.jobs if j.scenario == "straggler")
    straggler_findings = Finding.objects.filter(source="detector:training-straggler")
    assert {f.labels["hostname"] for f in straggler_findings} == {straggler.nodes[-1]}
    # Soon enough for a demo: the hang 1.5 min in + its 5-minute threshold; the stall once 5
    # minutes of starved steps are in; the straggler as soon as both signals have data.
    assert world.first["training-hang"] <= 8
    assert world.first["training-data-stall"] <= 8
    assert world.first["training-straggler"] <= 4
    # The hang ends in an NCCL timeout 12 minutes in, and the job restarts from its checkpoint.
    hang_events = JobEvent.objects.filter(job_id=int(hang_job)).order_by("ts", "seq")
    failed = hang_events.get(kind="failed")
    assert failed.reason == NCCL_TIMEOUT
    last_step = hang_events.filter(kind="step", ts__lt=failed.ts).last()
    assert last_step is not None
    assert failed.ts - last_step.ts >= HANG_FAILS_AFTER - timedelta(seconds=10)
    assert hang_events.filter(kind="restored", ts__gt=failed.ts).exists()
    assert world.fired["training-job-failed"] == {hang_job}
    # The preempted job resumed and restored.
    preempted = JobEvent.objects.filter(job_id=int(by_scenario["preempt"]))
    assert preempted.filter(kind="preempted").count() == 1 and preempted.filter(kind="resumed").count() == 1
    # Healthy jobs raised nothing.
    healthy = {str(j.job_id) for j in training.jobs if j.scenario == "healthy"}
    assert not any(jobs & healthy for jobs in world.fired.values())


@pytest.mark.django_db
def test_failures_restart_and_restore_from_the_last_checkpoint() -> None:
    world = make_world(jobs=6, seed=9, scenarios=False, failure_rate=0.3)  # several failures an hour
    world.run(start_time(), 60, detectors=False)
    assert world.training.rejected == []
    failures = 0
    for job in Job.objects.all():
        checkpoint = 0
        events = list(JobEvent.objects.filter(job=job).order_by("ts", "seq"))
        for previous, event in itertools.pairwise(events):
            if event.kind == "checkpoint_saved":
                checkpoint = event.step
            if event.kind == "failed":
                failures += 1
            if event.kind == "restored":
                # A restore follows a restart, and loads the last checkpoint saved before it.
                assert previous.kind == "started" and event.step == checkpoint
        stored = Job.objects.get(pk=job.pk)
        assert stored.failures == sum(1 for e in events if e.kind == "failed")
    assert failures >= 3
    assert sum(len(j.restores) for j in world.training.jobs) == failures
    # Steps carry on after each restore from the step restored (the door checks they never go back).
    assert all(j.step >= j.last_checkpoint_step for j in world.training.jobs)


@pytest.mark.django_db
def test_telemetry_follows_the_jobs_hung_gpus_spin_and_starved_ones_idle() -> None:
    world = make_world(jobs=4, seed=3, scenarios=True, failure_rate=0.0)
    start = start_time()
    world.run(start, 8, detectors=False)
    jobs = {j.scenario: j for j in world.training.jobs}
    samples = {s["gpu_uuid"]: s for b in world.fleet_sim.batches(start + timedelta(minutes=9)).values() for s in b}
    hung = [samples[g.uuid]["gpu_util"] for g in jobs["hang"].gpus]
    starved = [samples[g.uuid]["gpu_util"] for g in jobs["stall"].gpus]
    straggler = jobs["straggler"]
    slow = [samples[g.uuid]["sm_active"] for g in straggler.gpus if g.hostname == straggler.nodes[-1]]
    peers = [samples[g.uuid]["sm_active"] for g in straggler.gpus if g.hostname != straggler.nodes[-1]]
    assert jobs["hang"].phase == "hung" and min(hung) > 95
    assert max(starved) < 40
    assert sum(slow) / len(slow) < 0.7 * sum(peers) / len(peers)


@pytest.mark.django_db(transaction=True)
def test_simulate_runs_training_jobs_through_the_http_api(live_server) -> None:  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("simulate", url=live_server.url, gpus=24, ticks=3, interval=0.2, jobs=2, stdout=out, stderr=out)
    assert "rejected" not in out.getvalue()
    jobs = list(Job.objects.order_by("scheduler_id"))
    assert [j.gang_size for j in jobs] == [16, 8]  # 3 training nodes: 2 + 1, a node left for each job
    for job in jobs:
        assert job.gpus.count() == job.gang_size
        assert JobEvent.objects.filter(job=job, kind="allocated").exists()


@pytest.mark.django_db(transaction=True)
def test_simulate_with_no_jobs_runs_no_training(live_server) -> None:  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("simulate", url=live_server.url, gpus=8, ticks=1, interval=0.2, jobs=0, stdout=out, stderr=out)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_gpu_fault_kills_the_job_on_it_and_lands_in_the_jobs_incident() -> None:
    world = make_world(jobs=2, seed=4, scenarios=False, failure_rate=0.0)
    start = start_time()
    world.run(start, 5)
    job = world.training.jobs[0]
    gpu = job.gpus[3]
    gpu.fault, gpu.fault_ticks_left = "xid79", 4  # the fleet simulator's XID 79, for four samples
    world.run(start + timedelta(minutes=5), 3, only=[*TRAINING, "critical-xid"])
    failed = JobEvent.objects.get(job_id=job.job_id, kind="failed")
    assert "XID 79" in failed.reason and gpu.hostname in failed.reason
    incident = Incident.objects.get(group_key=f"job={job.job_id}")
    assert set(incident.findings.values_list("source", flat=True)) == {
        "detector:critical-xid",
        "detector:training-job-failed",
    }
    xid = incident.findings.get(source="detector:critical-xid")
    assert xid.impact["job_gpus"] == job.gang and xid.impact["gpu_hours_at_risk"] > 0
    # The GPU recovers (4 samples later); the job restarts and restores its checkpoint.
    world.run(start + timedelta(minutes=8), 5)
    assert JobEvent.objects.filter(job_id=job.job_id, kind="restored", ts__gt=failed.ts).exists()
    assert world.training.rejected == []


@pytest.mark.django_db
def test_a_restarted_simulator_continues_its_jobs() -> None:
    world = make_world(jobs=3, seed=6, scenarios=False, failure_rate=0.0)
    start = start_time()
    world.run(start, 10, detectors=False)
    first_ids = sorted(j.job_id for j in world.training.jobs)
    # A new process: the same seed (the same jobs), another run (other event ids).
    world.training = TrainingSimulator(
        world.fleet_sim, world.sender, jobs=3, seed=6, failure_rate_per_gpu_hour=0.0, scenarios=False, run="r1"
    )
    world.run(start + timedelta(minutes=10), 10, detectors=False)
    assert world.training.rejected == []
    assert sorted(j.job_id for j in world.training.jobs) == first_ids and Job.objects.count() == 3
    for job in Job.objects.all():
        kinds = list(
            JobEvent.objects.filter(job=job, event_id__startswith="r1-")
            .order_by("ts", "seq")
            .values_list("kind", flat=True)
        )
        # Released by the old run's scheduler, allocated again, restored from the last checkpoint.
        assert kinds[:4] == ["released", "allocated", "started", "restored"]
        assert job.state == "running" and job.last_step > 0


class FlakySender(ClientSender):
    """The console away for the first event batches: the poster gave up (None)."""

    def __init__(self, tokens: dict[str, str], outages: int) -> None:
        super().__init__(tokens)
        self.outages = outages

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any:
        if url.endswith("/events") and self.outages > 0:
            self.outages -= 1
            return None
        return super().send(site, url, body)


@pytest.mark.django_db
def test_events_undelivered_during_an_outage_are_sent_later_in_order() -> None:
    world = make_world(jobs=1, seed=8, scenarios=False, failure_rate=0.0)
    flaky = FlakySender(world.sender.tokens, outages=3)
    world.training.sender = flaky
    world.run(start_time(), 6, detectors=False)
    job = world.training.jobs[0]
    assert flaky.outages == 0 and world.training.rejected == []
    stored = JobEvent.objects.filter(job_id=job.job_id)
    assert stored.count() == job.counter  # every event generated, none lost, none refused
    assert stored.filter(kind="allocated").count() == 1 and stored.filter(kind="step").count() > 50
