"""The training simulator: jobs register and report through the HTTP doors like a real client, the
scripted hang, data-loader stall and straggler each trigger their detector, and failures restore
from the last checkpoint. A simulated hour runs in seconds on an explicit clock."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from django.utils import timezone

from console.models import AgentToken
from fleet.ingest.batches import parse_gpu_batch
from fleet.models import Job, JobEvent, Site
from fleet.telemetry.simulator import DEFAULT_SITES, FleetSimulator, build_fleet
from fleet.telemetry.store import store_gpu_samples
from fleet.training.simulator import (
    HANG_FAILS_AFTER,
    NCCL_TIMEOUT,
    TrainingSimulator,
    release_simulated_jobs,
    simulated_scheduler_id,
)
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
    """Posts as fleet.telemetry.simulator.Poster does (JSON, the site's agent token), through Django's test
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
    assert max(starved) < 50  # under the data-stall detector's line
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
    # The fault's cost to the job is its failure finding's (fleet.training.detectors.link_to_jobs).
    failure = incident.findings.get(source="detector:training-job-failed")
    assert xid.impact["job_gpus"] == job.gang and "job_failed_at" in xid.impact and "gpu_hours" not in xid.impact
    assert failure.impact["gpu_hours"] > 0
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
    # A 3-node job's steps of 15-30 s: ~8 step events a minute once started.
    assert stored.filter(kind="allocated").count() == 1 and stored.filter(kind="step").count() > 20


# --- a restarted session, a full buffer, a refused chunk, a save that ends after the tick -------------

PAGING = ["training-hang", "training-checkpoint-overdue"]


class Rollback(Exception):
    """Undoes what a block wrote (a savepoint): a look at what would happen, kept out of the test's data."""


def firing(sources: list[str]) -> list[tuple[str, str]]:
    return sorted(
        (source.removeprefix("detector:"), labels.get("job", ""))
        for source, labels in Finding.objects.filter(
            status="firing", source__in=[f"detector:{s}" for s in sources]
        ).values_list("source", "labels")
    )


def new_session(world: World, *, jobs: int, run: str, seed: int = 6) -> None:
    world.training = TrainingSimulator(
        world.fleet_sim, world.sender, jobs=jobs, seed=seed, failure_rate_per_gpu_hour=0.0, scenarios=False, run=run
    )


@pytest.mark.django_db
def test_a_second_session_releases_the_first_sessions_jobs_before_the_detectors_run() -> None:
    world = make_world(jobs=3, seed=6, scenarios=False, failure_rate=0.0)
    start = start_time()
    world.run(start, 10, detectors=False)
    assert set(Job.objects.values_list("state", flat=True)) == {"running"}
    # The process dies; the next session starts 30 minutes later. Its beat runs the detectors at
    # once: without a release, every old job (no step for 30 min > 5 min; no checkpoint for 30
    # min > 2 x a 3-5 min interval) pages.
    restart = start + timedelta(minutes=40)
    with pytest.raises(Rollback), transaction.atomic():
        run_detectors(now=restart, only=PAGING)
        assert {source for source, _ in firing(PAGING)} == set(PAGING)
        raise Rollback
    released = release_simulated_jobs(run="r1", now=restart)
    assert released == 3
    run_detectors(now=restart, only=PAGING)
    assert firing(PAGING) == []
    # Released at the restart, through the writer: state released, the event at `restart`.
    for job in Job.objects.all():
        assert job.state == "released"
        assert JobEvent.objects.get(job=job, event_id="r1-release").ts == restart
    # A session with fewer jobs (2 of 3): its jobs run again, the third stays released, and
    # 15 minutes of detectors raise no hang and no overdue checkpoint.
    new_session(world, jobs=2, run="r1")
    world.run(restart, 15, only=PAGING)
    assert world.training.rejected == [] and firing(PAGING) == [] and not world.fired
    states = dict(Job.objects.values_list("scheduler_id", "state"))
    assert states == {
        simulated_scheduler_id(6, 0): "running",
        simulated_scheduler_id(6, 1): "running",
        simulated_scheduler_id(6, 2): "released",
    }
    # Nothing holds GPUs any more in the released job: a second release finds nothing to do.
    new_session(world, jobs=0, run="r2")
    assert release_simulated_jobs(run="r2", now=restart + timedelta(minutes=15)) == 2


@pytest.mark.django_db
def test_release_leaves_jobs_that_are_not_the_simulators() -> None:
    world = make_world(jobs=1, seed=6, scenarios=False, failure_rate=0.0)
    start = start_time()
    world.run(start, 3, detectors=False)
    # The same job, registered by a real trainer under its own scheduler id.
    job = Job.objects.get()
    Job.objects.filter(pk=job.pk).update(scheduler_id="team-a/llama-70b")
    assert release_simulated_jobs(run="r1", now=start + timedelta(minutes=5)) == 0
    assert Job.objects.get().state == "running"


@pytest.mark.django_db
def test_a_registration_refused_for_good_registers_the_run_under_a_new_scheduler_id() -> None:
    world = make_world(jobs=2, seed=6, scenarios=False, failure_rate=0.0)
    start = start_time()
    world.run(start, 5, detectors=False)
    # Job 1 ran with another gang size (another --gpus): re-registering it is a 400 for good.
    first = Job.objects.get(scheduler_id=simulated_scheduler_id(6, 0))
    Job.objects.filter(pk=first.pk).update(gang_size=first.gang_size + 8)
    release_simulated_jobs(run="r1", now=start + timedelta(minutes=6))
    new_session(world, jobs=2, run="r1")
    world.run(start + timedelta(minutes=6), 5, detectors=False)
    assert world.training.rejected == []
    renamed = world.training.jobs[0]
    assert renamed.scheduler_id == f"{simulated_scheduler_id(6, 0)}.r1" and renamed.job_id != first.pk
    job = Job.objects.get(pk=renamed.job_id)
    assert job.state == "running" and job.gang_size == renamed.gang and job.last_step > 0
    # The old row stays released; the other job continued under its own id.
    assert Job.objects.get(pk=first.pk).state == "released"
    assert world.training.jobs[1].scheduler_id == simulated_scheduler_id(6, 1)
    # The renamed job is the simulator's too: the next session's release finds it.
    assert release_simulated_jobs(run="r2", now=start + timedelta(minutes=12)) == 2


@pytest.mark.django_db
def test_a_registration_refused_twice_abandons_the_job_instead_of_retrying_forever() -> None:
    world = make_world(jobs=1, seed=6, scenarios=False, failure_rate=0.0)

    class Refusing(ClientSender):
        def send(self, site: str, url: str, body: dict[str, Any]) -> Any:
            self.statuses[0] += 1
            return type("R", (), {"status_code": 400, "text": '{"name": ["bad"]}'})()

    refusing = Refusing(world.sender.tokens)
    world.training.sender = refusing
    world.run(start_time(), 5, detectors=False)
    # Two tries (the scheduler id, then the id with the run's suffix), then nothing more.
    assert refusing.statuses[0] == 2
    assert world.training.jobs[0].phase == "abandoned" and len(world.training.rejected) == 1


@pytest.mark.django_db
def test_the_buffer_while_the_console_is_away_drops_the_oldest_steps_and_keeps_lifecycle_events() -> None:
    world = make_world(jobs=1, seed=8, scenarios=False, failure_rate=0.0)
    cap = 20
    world.training = TrainingSimulator(
        world.fleet_sim, world.sender, jobs=1, seed=8, failure_rate_per_gpu_hour=0.0, scenarios=False,
        max_buffered_events=cap,
    )  # fmt: skip
    training = world.training
    emitted: list[str] = []
    emit = training._emit

    def spy(job: Any, ts: datetime, kind: str, **fields: Any) -> None:
        emitted.append(kind)
        emit(job, ts, kind, **fields)

    training._emit = spy  # type: ignore[method-assign]
    flaky = FlakySender(world.sender.tokens, outages=12)  # one events POST a minute: 12 minutes away
    training.sender = flaky
    start = start_time()
    job = training.jobs[0]
    for m in range(12):
        world.run(start + timedelta(minutes=m), 1, detectors=False)
        # A 3-node job makes ~3 x 60 / 22.5 s = ~8 step events a minute: the cap is reached
        # within three minutes, and the buffer never grows past it.
        assert len(job.events) <= cap
    world.run(start + timedelta(minutes=12), 3, detectors=False)
    assert flaky.outages == 0 and training.rejected == []
    # ~11 minutes of steps (the first minute or so is start-up) x ~8, less the 20 kept: ~65;
    # a wide margin for the steps' random lengths (15-30 s).
    assert job.dropped > 30
    stored = Counter(JobEvent.objects.filter(job_id=job.job_id).values_list("kind", flat=True))
    lifecycle = Counter(k for k in emitted if k != "step")
    # Every lifecycle event (allocated, started, checkpoints) arrived; only steps were dropped.
    assert lifecycle["checkpoint_saved"] >= 2
    assert {k: stored[k] for k in lifecycle} == dict(lifecycle)
    assert stored["step"] == emitted.count("step") - job.dropped


class Recorder:
    """Answers the first events POST with a 400, the rest with a 202; records what was sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any:
        self.sent.append(len(body["events"]))
        status = 400 if len(self.sent) == 1 else 202
        return type("R", (), {"status_code": status, "text": '{"error": "events[3] (id \'x\'): step"}'})()


@pytest.mark.django_db
def test_a_flush_stops_at_its_first_refused_chunk() -> None:
    world = make_world(jobs=1, seed=8, scenarios=False, failure_rate=0.0)
    logged: list[str] = []
    training = world.training
    training.log = logged.append
    world.run(start_time(), 1, detectors=False)  # registered
    job = training.jobs[0]
    job.events = [{"id": f"r0-x{i}", "ts": "", "kind": "step"} for i in range(1200)]  # 3 chunks of <= 500
    accepted = training.accepted
    recorder = Recorder()
    training.sender = recorder
    training.flush(timezone.now())
    # One chunk sent and refused; the two after it (built on it) not sent, and not kept either.
    assert recorder.sent == [500]
    assert job.events == [] and training.accepted == accepted
    assert len(training.rejected) == 1 and "HTTP 400" in training.rejected[0]
    assert any("1200 events dropped" in line for line in logged)


@pytest.mark.django_db
def test_a_checkpoint_is_never_stamped_after_the_ticks_now() -> None:
    world = make_world(jobs=6, seed=9, scenarios=False, failure_rate=0.0)
    start = start_time()
    deferred = 0
    for m in range(40):
        now = start + timedelta(minutes=m)
        world.run(now, 1, detectors=False)
        deferred += sum(1 for j in world.training.jobs if j.pending_checkpoint is not None)
        # Every event the simulator generated so far was sent this tick (60 s > the 15 s flush).
        assert not JobEvent.objects.filter(ts__gt=now).exists()
    # Saves (4-18 s) that ended after a tick's now did happen, and waited for the next tick.
    assert deferred > 0
    assert world.training.rejected == []
    for checkpoint in JobEvent.objects.filter(kind="checkpoint_saved"):
        # The save keeps its whole duration: it starts after the step it saved.
        step = JobEvent.objects.filter(job=checkpoint.job, kind="step", ts__lte=checkpoint.ts).order_by("ts").last()
        assert step is not None and step.step == checkpoint.step
        assert checkpoint.ts - timedelta(seconds=checkpoint.duration_s) >= step.ts


@pytest.mark.django_db(transaction=True)
def test_simulate_releases_the_jobs_a_session_with_fewer_jobs_does_not_place(live_server) -> None:  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("simulate", url=live_server.url, gpus=24, ticks=2, interval=0.2, jobs=2, stdout=out, stderr=out)
    first, second = Job.objects.order_by("scheduler_id")
    assert first.state == second.state == "allocated"  # starting up (20-45 s) when the session ended
    call_command("simulate", url=live_server.url, gpus=24, ticks=1, interval=0.2, jobs=1, stdout=out, stderr=out)
    assert "rejected" not in out.getvalue() and "released 2 simulated jobs" in out.getvalue()
    # Both released before the loop. The one job of this session takes all 3 training nodes (24
    # GPUs, not 16): its old row refuses the new gang size (400), so it runs as a new job.
    assert set(Job.objects.filter(pk__in=[first.pk, second.pk]).values_list("state", flat=True)) == {"released"}
    for old in (first, second):
        kinds = list(JobEvent.objects.filter(job=old).order_by("ts", "seq").values_list("kind", flat=True))
        assert kinds == ["allocated", "released"]
    new = Job.objects.exclude(pk__in=[first.pk, second.pk]).get()
    assert new.scheduler_id.startswith(f"{first.scheduler_id}.r") and new.gang_size == 24
    assert new.state == "allocated"


@pytest.mark.django_db(transaction=True)
def test_demo_releases_the_simulated_jobs_before_its_beat_runs_the_detectors(
    settings: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    import console.scheduler
    from goodput.management.commands.demo import Command as DemoCommand

    world = make_world(jobs=2, seed=6, scenarios=False, failure_rate=0.0)
    world.run(start_time(), 5, detectors=False)
    settings.DATA_DIR, settings.EAGER_TASKS = tmp_path, True
    seen: list[set[str]] = []

    class Beat:
        """Where the beat would start (and run the detectors at once): what the jobs' states are."""

        def __init__(self, stop: Any) -> None:
            pass

        def start(self) -> None:
            seen.append(set(Job.objects.values_list("state", flat=True)))

    monkeypatch.setattr(console.scheduler, "EmbeddedBeat", Beat)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    monkeypatch.setattr(DemoCommand, "_prepare_simulator", lambda self, *args: None)
    monkeypatch.setattr(DemoCommand, "_run_simulator", lambda self, *args: None)
    call_command("demo", stdout=StringIO())
    assert seen == [{"released"}]


# --- physically possible figures (issue 21, item 16) ------------------------------------------------

PEAK_TFLOPS = {  # dense BF16 (../shared/REFERENCE.md): the H200 has the H100's compute
    "NVIDIA H100 80GB HBM3": 989,
    "NVIDIA H200": 989,
    "NVIDIA A100-SXM4-80GB": 312,
    "NVIDIA L40S": 362,
}
# Parameters each token passes through (a mixture of experts: the active ones), by model family.
PARAMETERS = {
    "llama-70b": 70e9,
    "mixtral-8x22b": 39e9,
    "vit-g": 1.8e9,
    "codegen-34b": 34e9,
    "llama-8b": 8e9,
    "whisper-large": 1.55e9,
    "rm-13b": 13e9,
    "llava-13b": 13e9,
}
# Who trains what: a team's own kind of model.
TEAMS = {
    "llama-70b": "foundation",
    "llama-8b": "foundation",
    "mixtral-8x22b": "post-training",
    "rm-13b": "post-training",
    "vit-g": "multimodal",
    "llava-13b": "multimodal",
    "codegen-34b": "code",
    "whisper-large": "speech",
}


def _family(name: str) -> str:
    return next(family for family in PARAMETERS if name.startswith(family))


def test_the_gpu_models_carry_their_dense_bf16_peaks() -> None:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=None, seed=7)
    models = {g.model.name: g.model.bf16_tflops for gpus in fleet.values() for g in gpus}
    assert models == PEAK_TFLOPS


def test_job_names_and_teams_belong_together() -> None:
    fleet_sim = FleetSimulator(
        build_fleet(DEFAULT_SITES, gpu_limit=None, seed=7), fault_rate_per_gpu_hour=0, interval=5, seed=7
    )
    jobs = TrainingSimulator(fleet_sim, None, jobs=8, seed=7).jobs  # type: ignore[arg-type]
    assert {job.team for job in jobs} <= set(TEAMS.values())
    for job in jobs:
        assert job.team == TEAMS[_family(job.name)], job.name


@pytest.mark.django_db
def test_every_job_runs_at_a_physically_possible_model_flops_utilisation() -> None:
    """6 x parameters x tokens/s / GPUs / peak between 25 % and 55 % for every job, every minute of a
    scripted half hour (a straggler, a data stall, a preemption, a hang) that it ran through (no
    start, restore, preemption or failure in the rate's window: those are time without steps, not
    slow steps), read from the tokens/s the training page shows for it."""
    from fleet.training.read import RATE_WINDOW_S, running_jobs

    world = make_world(jobs=8, seed=7, scenarios=True, failure_rate=0.0)
    start = start_time()
    measured: dict[str, list[float]] = defaultdict(list)
    for minute in range(30):
        now = start + timedelta(minutes=minute)
        world.run(now, 1, detectors=False)
        for row in running_jobs(now=now):
            if row["tokens_per_s"] is None:
                continue
            job = Job.objects.get(pk=row["id"])
            window = JobEvent.objects.filter(job=job, ts__gt=now - timedelta(seconds=RATE_WINDOW_S), ts__lte=now)
            if window.filter(kind__in=["allocated", "started", "restored", "preempted", "resumed", "failed"]).exists():
                continue
            peak = sum(PEAK_TFLOPS[g.model] for g in job.gpus.all()) * 1e12
            measured[job.name].append(6 * PARAMETERS[_family(job.name)] * row["tokens_per_s"] / peak)
    assert world.training.rejected == []
    assert len(measured) == 8
    for name, mfus in measured.items():
        assert len(mfus) >= 10, name
        assert min(mfus) >= 0.25 and max(mfus) <= 0.55, (name, min(mfus), max(mfus))


@pytest.mark.django_db
def test_a_steps_reports_from_every_node_of_the_gang_count_as_one_step_in_the_rate() -> None:
    """Every node of a gang reports each step, a millisecond apart: with one step in the window the
    rate is unknown (not its tokens over a millisecond: 131,072,000 tokens/s); with more, the tokens
    of the steps after the first over the time from the first step's last report."""
    from fleet.training.events import JobEventIn, record_job_events
    from fleet.training.read import running_jobs

    site = Site.objects.create(name="ams-1", region="eu-west")
    job = Job.objects.create(site=site, name="llama-70b-pretrain-01", team="foundation", gang_size=24, scheduler_id="x")
    base = timezone.now() - timedelta(minutes=3)

    def step(n: int, at: datetime) -> list[JobEventIn]:
        return [
            JobEventIn(id=f"s{n}-{k}", ts=at + timedelta(milliseconds=k), kind="step", step=n, tokens=131_072,
                       step_time_s=20.0, node=node)
            for k, node in enumerate(("n1", "n2", "n3"))
        ]  # fmt: skip

    opening = [JobEventIn(id="a", ts=base, kind="allocated"), JobEventIn(id="b", ts=base, kind="started")]
    record_job_events(job.pk, [*opening, *step(1, base + timedelta(seconds=30))])
    [row] = running_jobs(now=base + timedelta(seconds=40))
    assert row["tokens_per_s"] is None and row["step_rate"] is None
    record_job_events(job.pk, step(2, base + timedelta(seconds=50)))
    [row] = running_jobs(now=base + timedelta(seconds=60))
    # Step 2's three reports (3 x 131,072 tokens) over the 20 s from step 1's last report to step 2's.
    assert row["tokens_per_s"] == round(3 * 131_072 / 20.0, 1)
    assert row["step_rate"] == round(1 / 20.0, 3)
