"""Simulated training jobs on the simulated fleet's training nodes, talking to the console exactly
as a real training client does: register through POST /api/v1/training/jobs/ with the site's agent
token, then send the job's events in batches to its events door.

Each job trains a model of its team (JOB_KINDS) on the GPUs of its nodes. Its numbers are
physically possible: each step (15-30 s, a small part waiting for data) processes the tokens that
the gang's dense BF16 peak delivers at a model FLOPs utilisation of 49-53 % (6 x parameters x
tokens/s / peak); every node reports its share of each step. Checkpoints are saved every few
minutes (the save blocks training for a few seconds), random failures (a per-GPU-hour rate, so
big gangs fail more often) are followed by a restart that restores the last checkpoint and
continues from it. A GPU fault of the fleet simulator that kills a job (XID 79, double-bit ECC)
on one of a job's GPUs fails the job, which restarts once the GPU is back.

``history`` generates a past for the jobs (the demo's first start, fleet.management.backfill) and
``store_history`` writes it in-process; the live run then goes on with the same jobs.

Scripted scenarios (``scenarios=True``) make a demo show every detector within ~15 minutes:
  * hang: from minute 1.5 the job makes no step while its GPUs spin at ~100 % (NCCL waiting on a
    lost peer); after 12 minutes it fails with an NCCL timeout and restarts from its checkpoint;
  * stall: from minute 1 to 21 the job's data loader starves it (about 40 % of each step waits
    for data) and its GPUs idle at ~46 %;
  * straggler: from minute 1 to 21 one node of a multi-node job is slow: its GPUs' SM activity
    is low, its step times 1.5 x its peers', and the gang runs at its pace;
  * preemption: at minute 4 one job is preempted, and resumes 2 minutes later.

The GPU telemetry is coupled through FleetSimulator.overrides (per GPU UUID). The clock is always
an argument (``tick(now)``), so tests can run a simulated hour in seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import transaction

from fleet.telemetry.simulator import FleetSimulator, SimGpu

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class JobKind:
    """What a simulated job trains: its name, the team that runs it and the parameters each token
    passes through (for a mixture of experts, the active ones), which fix its tokens per second."""

    name: str
    team: str
    parameters: float


# In placement order (SIZES gives each its nodes): the big models on the big gangs.
JOB_KINDS = (
    JobKind("llama-70b-pretrain", "foundation", 70e9),
    JobKind("mixtral-8x22b-sft", "post-training", 39e9),  # 141B in all, 39B active per token
    JobKind("vit-g-clip", "multimodal", 1.8e9),
    JobKind("codegen-34b", "code", 34e9),
    JobKind("llama-8b-pretrain", "foundation", 8e9),
    JobKind("whisper-large-v3", "speech", 1.55e9),
    JobKind("rm-13b-rlhf", "post-training", 13e9),
    JobKind("llava-13b", "multimodal", 13e9),
)
SIZES = (3, 2, 1, 2, 3, 1, 2, 1, 4, 1)  # nodes per job, in order
# Model FLOPs utilisation of a healthy job: 6 x parameters x tokens/s / GPUs / dense BF16 peak.
# Well-run training reaches 35-55 %; above 60 % is suspect. The band is narrow and high so that a
# straggler (1.5 x the step) or the scripted data stall (about 1.75 x) still leaves every job above
# 25 %, and the step-to-step noise never takes one past 55 %.
MFU_RANGE = (0.49, 0.53)
HANG_AT = timedelta(minutes=1.5)
HANG_FAILS_AFTER = timedelta(minutes=12)
STALL_FROM, STALL_UNTIL = timedelta(minutes=1), timedelta(minutes=21)
PREEMPT_AT, PREEMPTED_FOR = timedelta(minutes=4), timedelta(minutes=2)
RESTART_AFTER_S = (30.0, 90.0)
FAILURE_REASONS = (
    "NCCL error: unhandled system error (ncclSystemError), remote process exited",
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: uncorrectable ECC error encountered",
    "RuntimeError: NCCL communicator was aborted on rank 17",
)
JOB_KILLING_FAULTS = {
    "xid79": "CUDA error: GPU has fallen off the bus (XID 79)",
    "dbe": "CUDA error: uncorrectable ECC error encountered",
}
NCCL_TIMEOUT = "NCCL watchdog: collective operation (ALLREDUCE) timed out after 600000 ms"
SCHEDULER = "kueue"
# The simulator's scheduler ids: sim-<seed>/job-<n>, and .<run> after one its registration refused.
SIMULATED_ID = r"^sim-[0-9]+/job-[0-9]+(\.[A-Za-z0-9]+)?$"
MAX_BUFFERED_EVENTS = 5000  # about 50 minutes of a 4-node job's steps while the console is away
CHUNK = 500


@dataclass(frozen=True)
class HistoryFault:
    """A GPU fault in a history: the fleet simulator's kind ("xid79", "dbe") on the ``gpu``-th GPU
    of job ``job`` (indices), from ``at`` for ``duration``."""

    job: int
    gpu: int
    at: datetime
    duration: timedelta
    kind: str = "xid79"


class Sender(Protocol):
    """What posts for the simulator: fleet.telemetry.simulator.Poster, or a test's in-process client."""

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any: ...


@dataclass
class SimJob:
    """One simulated job: its shape, where it is in its life, and its events not yet sent."""

    index: int
    site: str
    name: str
    team: str
    scheduler_id: str
    nodes: list[str]
    gpus: list[SimGpu]
    step_time_s: float
    data_wait_share: float
    tokens_per_step: int
    checkpoint_interval_s: int
    save_s: float
    parameters: float = 0.0
    peak_flops: float = 0.0  # the gang's dense BF16 peak, FLOP/s
    scenario: str = "healthy"  # healthy, hang, stall, straggler, preempt
    job_id: int | None = None
    phase: str = "new"  # new, starting, running, hung, failed, preempted
    cursor: datetime | None = None  # simulated time the job has been advanced to
    phase_until: datetime | None = None  # when a start-up, restart or preemption ends
    step: int = 0
    last_checkpoint_at: datetime | None = None
    last_checkpoint_step: int = 0
    hung_since: datetime | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    sent_at: datetime | None = None
    counter: int = 0
    failures: int = 0
    restores: list[int] = field(default_factory=list)  # the steps restored from
    needs_restore: bool = False  # the next attempt restores the last checkpoint
    preempted_once: bool = False
    # A checkpoint whose save ends after the tick's now: sent once the clock reaches its end.
    pending_checkpoint: dict[str, Any] | None = None
    renamed: bool = False  # registered under scheduler_id + "." + run after a refusal
    dropped: int = 0  # step events dropped while the console was away (the buffer was full)
    hang_at: datetime | None = None  # a history's scripted hang (``history``)
    # (time, phase) from the job's allocation on: what its GPUs did, for the history's telemetry.
    timeline: list[tuple[datetime, str]] = field(default_factory=list)

    @property
    def gang(self) -> int:
        return len(self.gpus)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation of a healthy step: 6 x parameters x tokens/s / the gang's peak."""
        return 6 * self.parameters * self.tokens_per_step / self.step_time_s / self.peak_flops


class TrainingSimulator:
    """Realistic training jobs on a FleetSimulator's training nodes. Call ``tick(now)`` on every
    round: it advances each job to ``now``, sets its GPUs' telemetry overrides and sends what is
    due (registrations, then event batches)."""

    def __init__(
        self,
        fleet_sim: FleetSimulator,
        sender: Sender,
        *,
        jobs: int = 8,
        seed: int = 7,
        failure_rate_per_gpu_hour: float = 0.002,
        scenarios: bool = True,
        flush_interval_s: float = 15.0,
        run: str = "",
        log: Callable[[str], None] | None = None,
        max_buffered_events: int = MAX_BUFFERED_EVENTS,
    ) -> None:
        self.fleet_sim = fleet_sim
        self.sender = sender
        self.rng = random.Random(seed + 11)
        self.failure_rate = failure_rate_per_gpu_hour
        self.flush_interval = timedelta(seconds=flush_interval_s)
        self.run = run or "r0"
        self.log = log or (lambda message: None)
        self.max_buffered = max_buffered_events
        self.started_at: datetime | None = None
        self.rejected: list[str] = []  # 4xx answers: a bug in the simulator or the door
        self.accepted = 0
        self.in_history = False  # generating a history (``history``): the live scenarios wait
        self.jobs = self._place(jobs, seed)
        if scenarios:
            # The straggler first: it needs a job of two nodes or more (peers to be slower than).
            free = list(self.jobs)
            for scenario in ("straggler", "hang", "stall", "preempt"):
                fits = [j for j in free if scenario != "straggler" or len(j.nodes) >= 2]
                if fits:
                    fits[0].scenario = scenario
                    free.remove(fits[0])

    # --- set-up ---------------------------------------------------------------------------------

    def _place(self, count: int, seed: int) -> list[SimJob]:
        """Jobs on whole training nodes, round-robin over the sites, each node in one job."""
        free: dict[str, dict[str, list[SimGpu]]] = {}
        for site, gpus in self.fleet_sim.fleet.items():
            for gpu in gpus:
                if gpu.workload == "training":
                    free.setdefault(site, {}).setdefault(gpu.hostname, []).append(gpu)
        sites = sorted(free)
        jobs: list[SimJob] = []
        i = 0
        while len(jobs) < count and any(free.values()):
            site = sites[i % len(sites)]
            i += 1
            hosts = sorted(free[site])
            if not hosts:
                continue
            # Leave a node for each job still to place, where the fleet has enough.
            spare = sum(len(h) for h in free.values()) - (count - len(jobs) - 1)
            size = max(1, min(SIZES[len(jobs) % len(SIZES)], len(hosts), spare))
            taken = hosts[:size]
            gpus = [g for h in taken for g in sorted(free[site].pop(h), key=lambda g: g.index)]
            n = len(jobs)
            kind = JOB_KINDS[n % len(JOB_KINDS)]
            jobs.append(
                self.sized_job(
                    index=n,
                    site=site,
                    name=f"{kind.name}-{n + 1:02d}",
                    kind=kind,
                    scheduler_id=simulated_scheduler_id(seed, n),
                    nodes=taken,
                    gpus=gpus,
                )
            )
        return jobs

    def sized_job(
        self,
        *,
        index: int,
        site: str,
        name: str,
        kind: JobKind,
        scheduler_id: str,
        nodes: list[str],
        gpus: list[SimGpu],
    ) -> SimJob:
        """A job of ``kind`` on these nodes and GPUs, sized as large-model training runs: steps of
        15-30 s, each the tokens its gang's BF16 peak processes at an MFU in MFU_RANGE (a global
        batch of a few hundred thousand to a few million tokens, and a week of history a few
        hundred thousand events; the hang detector's line stays its floor, 300 s), split evenly
        over its nodes (each node reports its share of every step)."""
        step = round(self.rng.uniform(15.0, 30.0), 2)
        peak = sum(g.model.bf16_tflops for g in gpus) * 1e12
        per_node = self.rng.uniform(*MFU_RANGE) * peak * step / (6 * kind.parameters) / len(nodes)
        return SimJob(
            index=index,
            site=site,
            name=name,
            team=kind.team,
            scheduler_id=scheduler_id,
            nodes=nodes,
            gpus=gpus,
            step_time_s=step,
            data_wait_share=self.rng.uniform(0.01, 0.05),
            tokens_per_step=max(1, round(per_node)) * len(nodes),
            checkpoint_interval_s=self.rng.choice((180, 240, 300)),
            save_s=round(self.rng.uniform(4, 15), 1),
            parameters=kind.parameters,
            peak_flops=peak,
        )

    # --- the clock ------------------------------------------------------------------------------

    def tick(self, now: datetime) -> None:
        """Advance every job to ``now``, set its GPUs' telemetry, and send what is due."""
        if self.started_at is None:
            self.started_at = now
        for job in self.jobs:
            if job.phase == "abandoned" or (job.job_id is None and not self._register(job, now)):
                continue
            self._advance(job, now)
            self._set_telemetry(job, now)
            if job.events and (job.sent_at is None or now - job.sent_at >= self.flush_interval):
                self._flush(job, now)

    def flush(self, now: datetime) -> None:
        """Send every job's buffered events now."""
        for job in self.jobs:
            if job.job_id is not None and job.events:
                self._flush(job, now)

    def elapsed(self, now: datetime) -> timedelta:
        return now - (self.started_at or now)

    def node_activity(self, hostname: str, at: datetime) -> dict[str, float]:
        """What a node's GPUs do now, as the node simulator (fleet.telemetry.node_simulator) reads
        it: its job computing ("work"), hung, or waiting ("idle"). A node no simulated job holds
        works as its GPUs' telemetry shows (fleet.telemetry.simulator: busy training GPUs)."""
        job = next((j for j in self.jobs if hostname in j.nodes), None)
        if job is None:
            return {"work": 1.0}
        if job.phase not in ("running", "hung"):
            return {"idle": 1.0}
        return {"hung": 1.0} if job.phase == "hung" else {"work": 1.0}

    # --- a history (the demo's first start) -----------------------------------------------------

    def history(
        self,
        starts: dict[int, datetime],
        end: datetime,
        *,
        failure_rate_per_gpu_hour: float,
        hang: tuple[int, datetime] | None = None,
        faults: list[HistoryFault] = (),  # type: ignore[assignment]
    ) -> None:
        """Generate the jobs' events from each one's allocation (``starts``, by job index) to ``end``,
        in memory (``store_history`` writes them): steps, checkpoints, random failures at
        ``failure_rate_per_gpu_hour`` and their restores, a scripted hang (job index, when) that
        ends in the NCCL watchdog's timeout, and GPU faults (``faults``) that kill the job on
        the GPU. The live scenarios wait for the live run: ``tick`` continues from ``end``."""
        saved_rate, saved_run, saved_log = self.failure_rate, self.run, self.log
        self.failure_rate, self.run, self.in_history = failure_rate_per_gpu_hour, f"{saved_run}h", True
        self.log = lambda message: None  # a week of failures and restores is not news
        if hang is not None:
            self.jobs[hang[0]].hang_at = hang[1]
        moments: list[tuple[datetime, int, Any]] = [(at, 0, job) for job in self.jobs if (at := starts.get(job.index))]
        for fault in faults:
            moments += [(fault.at, 1, fault), (fault.at + fault.duration, 2, fault)]
        try:
            for at, what, item in sorted(moments, key=lambda m: (m[0], m[1])):
                for job in self.jobs:
                    if job.cursor is not None:
                        self._advance(job, at)
                if what == 0:
                    self._begin(item, at)
                    continue
                job = self.jobs[item.job]
                gpu = job.gpus[item.gpu]
                gpu.fault = item.kind if what == 1 else None
                if what == 1 and job.phase == "running":
                    # The job dies with its GPU (a save in progress completes first).
                    failed_at = max(at, job.cursor or at)
                    self._send_due_checkpoint(job, failed_at)
                    self._fail(job, failed_at, self._gpu_fault(job) or "GPU fault")
            for job in self.jobs:
                if job.cursor is not None:
                    self._advance(job, end)
        finally:
            self.failure_rate, self.run, self.in_history, self.log = saved_rate, saved_run, False, saved_log
            for job in self.jobs:
                for gpu in job.gpus:
                    gpu.fault = None

    def store_history(self, *, now: datetime, site_ids: dict[str, int], checked: bool = False) -> list[int]:
        """Register the jobs that ran in the history and store their events in-process through the
        events writer (the console's server may not be up yet), then bring their goodput accounts
        up to date; return the job ids. Nothing is sent later: the live run goes on from each
        job's cursor. ``checked`` sends every batch through the door's parser and checks first
        (the tests do; a demo's first start trusts its own simulator and saves the time)."""
        import msgspec

        from fleet.inventory.models import Gpu, Node
        from fleet.training.accounts import refresh_job_accounts
        from fleet.training.events import JobEventIn, parse_job_events, record_job_events, store_job_events
        from fleet.training.models import Job

        ids = []
        for job in self.jobs:
            if job.cursor is None:
                continue
            row = Job.objects.create(
                site_id=site_ids[job.site],
                **{k: v for k, v in self._registration(job).items() if k not in ("nodes", "gpus")},
            )
            row.nodes.set(Node.objects.filter(hostname__in=job.nodes))
            row.gpus.set(Gpu.objects.filter(uuid__in=[g.uuid for g in job.gpus]))
            job.job_id = row.pk
            for start in range(0, len(job.events), CHUNK * 10):
                chunk = job.events[start : start + CHUNK * 10]
                if checked:
                    record_job_events(row.pk, parse_job_events(msgspec.json.encode({"events": chunk})), now=now)
                    continue
                events = [JobEventIn(**{**e, "ts": datetime.fromisoformat(e["ts"])}) for e in chunk]
                with transaction.atomic():
                    store_job_events(Job.objects.select_for_update().get(pk=row.pk), events)
            self.accepted += len(job.events)
            job.events, job.sent_at = [], now
            ids.append(row.pk)
        refresh_job_accounts(ids, now=now)
        return ids

    @staticmethod
    def _registration(job: SimJob) -> dict[str, Any]:
        return {
            "name": job.name,
            "team": job.team,
            "cluster": f"{job.site}-train",
            "framework": "pytorch",
            "gang_size": job.gang,
            "nodes": job.nodes,
            "gpus": [g.uuid for g in job.gpus],
            "priority_tier": "preemptible" if job.scenario == "preempt" else "reserved",
            "checkpoint_interval_s": job.checkpoint_interval_s,
            "scheduler": SCHEDULER,
            "scheduler_id": job.scheduler_id,
        }

    def _register(self, job: SimJob, now: datetime) -> bool:
        response = self.sender.send(job.site, "/api/v1/training/jobs/", self._registration(job))
        if response is not None and 400 <= response.status_code < 500 and "Unknown GPUs" not in _text(response):
            # Refused for good (the job ran with another gang size, say): retrying the same request
            # would be refused forever. Register the run as a new job, under a new scheduler id.
            detail = f"HTTP {response.status_code} {_text(response)[:300]}"
            if job.renamed:
                self.rejected.append(f"{job.name}: registration {detail}")
                self.log(f"job {job.name}: registration refused again ({detail}); job abandoned")
                job.phase = "abandoned"
                return False
            job.scheduler_id, job.renamed = f"{job.scheduler_id}.{self.run}", True
            self.log(f"job {job.name}: registration refused ({detail}); registering as {job.scheduler_id}")
            return self._register(job, now)
        if response is None or response.status_code not in (200, 201):
            # The GPUs' first telemetry may still be on its way (unknown GPUs): try next round.
            status = "no answer" if response is None else f"HTTP {response.status_code}"
            self.log(f"job {job.name}: registration not accepted ({status}); retrying")
            return False
        data = response.json()
        job.job_id = data["id"]
        job.cursor = now
        if data.get("last_event_at"):
            # A job this simulator ran before (a restarted demo): its events continue after its last.
            last = datetime.fromisoformat(data["last_event_at"])
            job.cursor = max(now, last + timedelta(seconds=1))
            job.step = data.get("last_checkpoint_step") or 0
            job.last_checkpoint_step = job.step
            job.needs_restore = True
            if data["state"] in ("allocated", "running", "failed"):
                # The simulated cluster went away with the old process: the scheduler released it.
                self._emit(job, job.cursor, "released")
        self._begin(job, job.cursor)
        return True

    def _begin(self, job: SimJob, at: datetime) -> None:
        """The scheduler allocates the job's nodes at ``at``; it starts up for 20-45 s."""
        job.cursor = at
        self._emit(job, at, "allocated", node=job.nodes[0])
        self._mark(job, at, "starting")
        job.phase = "starting"
        job.phase_until = at + timedelta(seconds=self.rng.uniform(20, 45))

    def _flush(self, job: SimJob, now: datetime) -> None:
        events, job.events = job.events, []
        job.sent_at = now
        for start in range(0, len(events), CHUNK):
            chunk = events[start : start + CHUNK]
            response = self.sender.send(job.site, f"/api/v1/training/jobs/{job.job_id}/events", {"events": chunk})
            if response is None:
                # The console is away (the poster gave up after its retries): keep the events, in
                # order, for the next round, as a buffered client does.
                job.events = events[start:] + job.events
                self._cap_buffer(job)
                self.log(f"job {job.name}: events undelivered; {len(job.events)} kept for the next round")
                return
            if response.status_code >= 400:
                # The door refused the chunk whole. The chunks after it build on it (steps after its
                # allocated, a restore of its checkpoint): sending them would only be refused in turn.
                left = len(events) - start
                detail = f"HTTP {response.status_code} {_text(response)[:300]}"
                self.rejected.append(f"{job.name}: {detail}")
                self.log(f"job {job.name}: events refused ({detail}); {left} events dropped")
                return
            self.accepted += len(chunk)

    def _cap_buffer(self, job: SimJob) -> None:
        """Keep at most max_buffered events: drop the oldest steps, never a lifecycle event (nor a
        step a buffered checkpoint names: the door refuses a checkpoint of a step not reached)."""
        excess = len(job.events) - self.max_buffered
        if excess <= 0:
            return
        named = {e["step"] for e in job.events if e["kind"] == "checkpoint_saved"}
        kept: list[dict[str, Any]] = []
        for event in job.events:
            if excess > 0 and event["kind"] == "step" and event["step"] not in named:
                excess -= 1
                job.dropped += 1
                continue
            kept.append(event)
        job.events = kept
        self.log(f"job {job.name}: event buffer full; {job.dropped} oldest steps dropped so far")

    def _emit(self, job: SimJob, ts: datetime, kind: str, **fields: Any) -> None:
        job.counter += 1
        job.events.append({"id": f"{self.run}-{job.counter}", "ts": ts.isoformat(), "kind": kind, **fields})

    # --- a job's life ---------------------------------------------------------------------------

    def _advance(self, job: SimJob, now: datetime) -> None:
        """Generate the job's events from its cursor up to ``now``."""
        assert job.cursor is not None
        self._send_due_checkpoint(job, now)
        while job.cursor < now:
            fault = self._gpu_fault(job)
            if job.phase in ("starting", "failed", "preempted"):
                assert job.phase_until is not None
                if job.phase_until > now:
                    return
                if fault is not None:  # the scheduler waits for the GPU to be reset or replaced
                    job.phase_until = now + timedelta(seconds=30)
                    return
                self._start_attempt(job)
                continue
            if job.phase == "running" and fault is not None:
                self._fail(job, job.cursor, fault)
                continue
            if job.phase == "hung":
                assert job.hung_since is not None
                fails_at = job.hung_since + HANG_FAILS_AFTER
                if fails_at > now:
                    return
                self._fail(job, fails_at, NCCL_TIMEOUT)
                continue
            if not self._step_or_event(job, now):
                return

    @staticmethod
    def _gpu_fault(job: SimJob) -> str | None:
        """Why the job dies if one of its GPUs has a fault that kills a job (the fleet simulator's
        XID 79 or double-bit ECC): the failure the GPU-fault incident links to."""
        for gpu in job.gpus:
            if gpu.fault in JOB_KILLING_FAULTS:
                return f"{JOB_KILLING_FAULTS[gpu.fault]} on {gpu.hostname} GPU {gpu.index}"
        return None

    def _start_attempt(self, job: SimJob) -> None:
        assert job.phase_until is not None
        t = job.phase_until
        if job.phase == "preempted":
            self._emit(job, t, "resumed")
            t += timedelta(seconds=self.rng.uniform(15, 30))
        self._emit(job, t, "started", node=job.nodes[0])
        if job.needs_restore:
            load = round(self.rng.uniform(0.6, 1.2) * job.save_s * 2, 1)
            t += timedelta(seconds=load)
            self._emit(job, t, "restored", step=job.last_checkpoint_step, duration_s=load)
            job.restores.append(job.last_checkpoint_step)
            job.step = job.last_checkpoint_step
            job.needs_restore = False
        else:
            t += timedelta(seconds=self.rng.uniform(20, 40))  # loading the model, warming up
        job.cursor = t
        job.phase, job.phase_until = "running", None
        self._mark(job, t, "running")
        job.last_checkpoint_at = t  # the interval counts from the attempt's start

    def _step_or_event(self, job: SimJob, now: datetime) -> bool:
        """One step (or a scripted or random event) if it ends by ``now``; False when not."""
        assert job.cursor is not None
        # The live run's scenarios count from its start; a history has only its own script.
        scenario = "healthy" if self.in_history else job.scenario
        elapsed = self.elapsed(job.cursor)
        hang = job.hang_at is not None and job.cursor >= job.hang_at
        if hang or (scenario == "hang" and job.hung_since is None and elapsed >= HANG_AT):
            job.phase, job.hung_since, job.hang_at = "hung", job.cursor, None
            self._mark(job, job.cursor, "hung")
            self.log(f"job {job.name}: hangs (scripted)")
            return True
        if scenario == "preempt" and not job.preempted_once and elapsed >= PREEMPT_AT:
            job.preempted_once = job.needs_restore = True
            self._emit(job, job.cursor, "preempted", reason="Preempted by a higher-priority workload")
            self._mark(job, job.cursor, "preempted")
            job.phase, job.phase_until = "preempted", job.cursor + PREEMPTED_FOR
            self.log(f"job {job.name}: preempted (scripted)")
            return True
        stalled = scenario == "stall" and STALL_FROM <= elapsed < STALL_UNTIL
        straggling = scenario == "straggler" and STALL_FROM <= elapsed < STALL_UNTIL
        compute = job.step_time_s * (1 - job.data_wait_share) * self.rng.uniform(0.97, 1.03)
        wait = job.step_time_s * job.data_wait_share * self.rng.uniform(0.8, 1.2)
        if stalled:
            # About 40 % of each step waits for data (the detector's line is 30 %): the step takes
            # about 1.75 x as long, and the job's utilisation falls to just above a quarter.
            wait = compute * self.rng.uniform(0.7, 0.8)
        slow = compute * 1.5 if straggling else compute
        duration = max(compute, slow) + wait
        end = job.cursor + timedelta(seconds=duration)
        if end > now:
            return False
        # A failure somewhere in this step (any GPU of the gang: the whole job dies).
        if self.failure_rate > 0:
            p = 1 - math.exp(-self.failure_rate * job.gang * duration / 3600)
            if self.rng.random() < p:
                self._fail(job, end, self.rng.choice(FAILURE_REASONS))
                return True
        job.step += 1
        for k, node in enumerate(job.nodes):
            own = slow if straggling and node == job.nodes[-1] else compute
            self._emit(
                job,
                end + timedelta(milliseconds=k),
                "step",
                step=job.step,
                tokens=job.tokens_per_step // len(job.nodes),
                step_time_s=round(own + wait, 3),
                data_wait_s=round(wait, 3),
                node=node,
            )
        job.cursor = end + timedelta(milliseconds=len(job.nodes))
        assert job.last_checkpoint_at is not None
        if (job.cursor - job.last_checkpoint_at).total_seconds() >= job.checkpoint_interval_s:
            save = round(job.save_s * self.rng.uniform(0.9, 1.2), 1)
            job.cursor += timedelta(seconds=save)
            job.pending_checkpoint = {"step": job.step, "duration_s": save, "bytes": job.gang * 2_000_000_000}
            job.last_checkpoint_at, job.last_checkpoint_step = job.cursor, job.step
            # A save that ends after now is not done yet: its event waits for the tick that reaches
            # its end (an event is never stamped after the tick's now).
            self._send_due_checkpoint(job, now)
        return True

    def _send_due_checkpoint(self, job: SimJob, now: datetime) -> None:
        """Emit the job's pending checkpoint_saved once its save has ended by ``now``."""
        if job.pending_checkpoint is not None and job.cursor is not None and job.cursor <= now:
            self._emit(job, job.cursor, "checkpoint_saved", **job.pending_checkpoint)
            job.pending_checkpoint = None

    def _fail(self, job: SimJob, at: datetime, reason: str) -> None:
        self._emit(job, at, "failed", reason=reason, node=job.nodes[0])
        self._mark(job, at, "failed")
        self.log(f"job {job.name}: failed ({reason[:60]})")
        job.failures += 1
        job.needs_restore = True
        job.cursor = at
        job.phase, job.phase_until = "failed", at + timedelta(seconds=self.rng.uniform(*RESTART_AFTER_S))
        job.hung_since = None
        if job.scenario == "hang" and not self.in_history:
            job.scenario = "hang-done"  # it hung once; it runs healthy after its restart

    def _mark(self, job: SimJob, at: datetime, phase: str) -> None:
        """Note what the job's GPUs do from ``at`` (the history's telemetry reads job.timeline)."""
        if not job.timeline or job.timeline[-1][1] != phase:
            job.timeline.append((at, phase))

    # --- telemetry ------------------------------------------------------------------------------

    def _set_telemetry(self, job: SimJob, now: datetime) -> None:
        """What the job's GPUs report now: busy while it computes, spinning at ~100 % while hung,
        idle while it waits (start-up, failed, preempted), low while starved, and the straggler
        node's SM activity low."""
        elapsed = self.elapsed(now)
        overrides = self.fleet_sim.overrides
        for gpu in job.gpus:
            if job.phase == "hung":
                value = {"gpu_util": 100.0, "sm_active": 0.97}  # NCCL spin-waits on the GPU
            elif job.phase in ("starting", "failed", "preempted"):
                value = {"gpu_util": 0.0, "sm_active": 0.0}
            elif job.scenario == "stall" and STALL_FROM <= elapsed < STALL_UNTIL:
                value = {"gpu_util": 46.0, "sm_active": 0.4}  # idle while the loader catches up
            elif job.scenario == "straggler" and STALL_FROM <= elapsed < STALL_UNTIL and gpu.hostname == job.nodes[-1]:
                value = {"gpu_util": 90.0, "sm_active": 0.4}
            else:
                overrides.pop(gpu.uuid, None)
                continue
            overrides[gpu.uuid] = value


def simulated_scheduler_id(seed: int, index: int) -> str:
    """The scheduler id of the simulator's job ``index`` (from 0) for ``seed``."""
    return f"sim-{seed}/job-{index + 1:02d}"


def release_simulated_jobs(*, run: str, now: datetime | None = None, log: Callable[[str], None] | None = None) -> int:
    """Release every simulated job that still holds GPUs; return how many were released.

    A simulated job dies with the simulator's process, but its row stays running with an old last
    step: the detectors would page for a hang and an overdue checkpoint (and price the downtime in
    GPU-hours), forever for a job the next session does not place. Call this before a session (and
    a demo's detectors) starts; the session allocates the jobs it places again. In-process, through
    the events writer: the console's server may not be up yet.
    """
    from django.utils import timezone

    from fleet.training.events import JobEventIn, record_job_events
    from fleet.training.models import HOLDING_STATES, Job
    from fleet.validation import IngestError

    now = now or timezone.now()
    released = 0
    jobs = Job.objects.filter(scheduler=SCHEDULER, scheduler_id__regex=SIMULATED_ID, state__in=HOLDING_STATES)
    for job_id, last_event_at, name in jobs.values_list("pk", "last_event_at", "name"):
        # Never before the job's last event (a clock that went back): the door keeps a job's order.
        ts = max(now, last_event_at) if last_event_at else now
        try:
            record_job_events(job_id, [JobEventIn(id=f"{run}-release", ts=ts, kind="released")], now=now)
        except IngestError as exc:
            if log:
                log(f"job {name}: not released ({exc})")
            continue
        released += 1
    if log and released:
        log(f"released {released} simulated jobs of a previous session")
    return released


def _text(response: Any) -> str:
    text = getattr(response, "text", None)
    if text is None:
        text = response.content.decode(errors="replace")
    return str(text)
