"""The demo's first start: a week of history, written in-process before the console serves a page.

On an empty database the demo used to open on 0.0 % goodput, empty hourly charts and SLO windows a
few minutes long. ``backfill`` writes the week before ``now`` as the console would have recorded
it, each part through the writer its door uses and rolled up by the code that rolls up live data:

* training: the simulated jobs (fleet.training.simulator) from staggered starts, with their steps,
  checkpoints, random failures and restores, one scripted hang and a GPU fault that kills a job,
  stored by the events writer; their goodput accounts by the accounts refresh;
* GPU telemetry: the last 15 minutes as raw samples through the telemetry writer; each GPU's
  minute rollups for the last 6 hours and hour rollups before, by COPY, from what drove the GPU
  (its job's phase, its faults: fleet.telemetry.simulator.FleetSimulator.history_row); the node,
  rack, site and fleet rollups and the last 6 hours' GPU hours by the rollup code itself;
* serving: every endpoint's scrapes of the last hour through the serving writer, rolled up by
  the serving rollups; the minute rollups of the 5 hours before and the hour rollups of the
  rest of the week by COPY, mirroring what the rollups make of such scrapes
  (fleet.serving.simulator.RollupMirror); a queueing collapse 4 hours ago (the week's one scripted
  serving incident), evals and change events;
* node_exporter's series (fleet.telemetry.node_simulator): every node's ports, disks and file
  systems as 1-minute rollups for the last 2 hours, by COPY, following what the GPUs did (a hung
  or idle node carries no collective traffic and reads no data), with the compute port that
  flapped just before the scripted hang; the fabric page's read model is read from those rollups;
* Kueue's series (fleet.scheduler.simulator): every simulated ClusterQueue's pending and admitted
  workloads, evictions, preemptions, admission wait histogram and GPU quota and usage as 1-minute
  rollups for the last 6 hours, by COPY, rolled up as the series writer (fleet.telemetry.series)
  rolls up Kueue's scrapes every 15 s, so the queue figures and their waits show on first open;
  the live run's Kueue goes on from those counters;
* incidents: each GPU fault, job failure and hang, and the collapse, as the detectors would have
  opened them, resolved, with their detection, acknowledgement and resolution times (MTTx); the
  scripted hang's as fleet.correlation joins it to the flap under it ("Fabric fault → job hang");
* reservations are the capacity seed's (fleet.capacity.simulator), which runs before.

One transaction: a start interrupted half-way leaves nothing, and the next start writes the week.
The simulators go on from where the history ends: the live run continues the same jobs and
servers.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.db import connection, transaction
from django.utils import timezone

from fleet.choices import Fabric, InterfaceKind, QueueScheduler
from fleet.correlation.causes import FABRIC_EFFECT
from fleet.fabric import detectors as fabric_detectors
from fleet.fabric.read import summaries as fabric_summaries
from fleet.ingest.batches import parse_gpu_batch
from fleet.inventory.models import DEFAULT_FABRIC, Gpu, Node, NodeInterface, NodeMount, purpose_of_mountpoint
from fleet.scheduler.mappings import SCHEDULER_SERIES
from fleet.scheduler.models import SchedulerQueue
from fleet.scheduler.simulator import KueueSimulator, Sample
from fleet.scheduler.store import QUEUE_COUNTERS
from fleet.serving import rollups as serving_rollups
from fleet.serving.simulator import ServingSimulator
from fleet.telemetry import partitions, rollups
from fleet.telemetry.models import GpuRollup1h
from fleet.telemetry.node_simulator import FLAP_LEAD, SCRIPTED_FLAP_PORT, NodeExporterSimulator
from fleet.telemetry.simulator import FleetSimulator, SimGpu
from fleet.telemetry.store import PendingBatch, store_gpu_batches
from fleet.training.models import Job
from fleet.training.simulator import NCCL_TIMEOUT, HistoryFault, SimJob, TrainingSimulator
from incidents.choices import FindingStatus, IncidentState, Severity, TimelineKind
from incidents.models import Finding, Incident, TimelineEntry
from incidents.services.engine import title_of_effects

WEEK_HOURS = 168  # the 7-day window: this hour and the 167 before it
# Minute rollups (GPUs and endpoints) for the last 6 hours: the 6-hour views, and the detectors'
# windows, read them; the hours before are hour rollups (the 7-day views). A day of minutes would
# be about four times the rows: longer than a first start should take.
MINUTE_ROLLUPS = timedelta(hours=6)
RAW = timedelta(minutes=15)  # raw samples for the last 15 minutes (the live fleet view reads them)
RAW_INTERVAL = 30.0  # seconds between them (the live simulator samples every 5 s)
# Each job's allocation, in hours after the week's start (by job index): one small job ran all
# week and the rest joined it, the big gangs in the last two days (a week of every job's steps
# would be about half a million events, more than a first start can write in seconds).
JOB_START_HOURS = (137, 127, 0, 147, 155, 107, 159, 127)
FAILURE_RATE_PER_GPU_HOUR = 0.0015  # random job failures over the week: a few per big job
SERVING_COLLAPSE_BEFORE = timedelta(hours=4)  # the scripted queueing collapse, in the minute rollups


@dataclass(frozen=True)
class ScriptedFault:
    """A GPU fault of the week: the ``index``-th GPU of ``hostname`` (when the fleet has it)."""

    hostname: str
    index: int
    kind: str  # xid79, dbe, thermal
    before_end: timedelta
    duration: timedelta


# A job's GPU falls off the bus (its job fails and restarts), and three faults elsewhere.
JOB_FAULT = (1, 5, timedelta(hours=30), timedelta(minutes=4))  # job index, GPU index, before the end, duration
# Job index, before the end: a compute port of its first node flaps, NCCL hangs, the watchdog
# kills it 12 min later (within the node series' minutes, so the fabric page shows the flap).
HANG = (0, timedelta(minutes=100))
# node_exporter's series: minute rollups for the last 2 hours (the fabric and storage pages open
# on the last hour; the storage detector's baseline is the hour before its window). Six hours
# would be three quarters of a million rows: longer than a first start should take.
NODE_MINUTES = timedelta(hours=2)
# Kueue's series: minute rollups for the last 6 hours (the capacity page's 1-hour waits, and a
# quarter of its 24-hour ones); about 120,000 rows.
QUEUE_MINUTES = timedelta(hours=6)
GPU_FAULTS = (
    ScriptedFault("ams1-l40s-002", 6, "xid79", timedelta(hours=130), timedelta(minutes=5)),
    ScriptedFault("iad2-a100-003", 1, "dbe", timedelta(hours=100), timedelta(minutes=3)),
    ScriptedFault("sin1-l40s-006", 2, "thermal", timedelta(hours=31), timedelta(minutes=4)),
)
XID_MEANING = {79: "GPU has fallen off the bus"}
# Send the week's training events through the events door's parser and checks (the tests do; a
# first start trusts its own simulator and saves the time).
CHECK_EVENTS = False
DETECTION_S = 45  # detectors run every 30 s: a fault is seen 30-60 s after it starts


def history_needed() -> bool:
    """True on a first start: no job and no GPU hour rollup yet (a database that has run before
    has its own history, which a backfill would only write over)."""
    return not Job.objects.exists() and not GpuRollup1h.objects.exists()


def _floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def backfill(
    fleet_sim: FleetSimulator,
    training: TrainingSimulator | None,
    serving: ServingSimulator | None,
    *,
    site_ids: dict[str, int],
    now: datetime,
    nodes: NodeExporterSimulator | None = None,
    queues: KueueSimulator | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, int]:
    """Write the week before ``now`` (see the module's docstring); return what was written."""
    started = time.monotonic()
    start = _floor_hour(now) - timedelta(hours=WEEK_HOURS - 1)
    done: dict[str, int] = {}

    def say(message: str) -> None:
        log(f"history: {message} ({time.monotonic() - started:.1f} s)")

    with transaction.atomic():
        faults = _gpu_faults(fleet_sim, training, now)
        if training is not None:
            starts = {
                job.index: start + timedelta(hours=JOB_START_HOURS[job.index % len(JOB_START_HOURS)])
                for job in training.jobs
            }
            hang = (HANG[0], now - HANG[1]) if len(training.jobs) > HANG[0] else None
            job_faults = [f for items in faults.values() for f in items if isinstance(f, HistoryFault)]
            training.history(
                starts, now, failure_rate_per_gpu_hour=FAILURE_RATE_PER_GPU_HOUR, hang=hang, faults=job_faults
            )
        drivers = _Drivers(fleet_sim, training, faults)
        _register_gpus(fleet_sim)
        if training is not None:
            done["jobs"] = len(training.store_history(now=now, site_ids=site_ids, checked=CHECK_EVENTS))
            done["job_events"] = training.accepted
            say(f"{done['jobs']} training jobs, {done['job_events']} events")
        done["gpu_rollups"] = _rollups(fleet_sim, drivers, start, now)
        say(f"{done['gpu_rollups']} GPU rollup rows")
        if serving is not None:
            written = serving.history(
                start, now, site_ids=site_ids, collapse_at=now - SERVING_COLLAPSE_BEFORE, minutes=MINUTE_ROLLUPS
            )
            serving_rollups.roll_everything(now=now)
            done.update({f"serving_{kind}": n for kind, n in written.items()})
            say(
                f"serving: {written['hour_rollups']} hour and {written['minute_rollups']} minute rollup rows, "
                f"{written['points']} series values"
            )
        flap = None
        if nodes is not None:
            flap = _hang_flap(nodes, training, now)
            done["node_rollups"] = _node_history(fleet_sim, nodes, drivers, start=now - NODE_MINUTES, now=now)
            say(f"{done['node_rollups']} port, disk and file system rollup rows")
        if queues is not None:
            done["scheduler_rollups"] = _queue_history(queues, site_ids, start=now - QUEUE_MINUTES, now=now)
            say(f"{done['scheduler_rollups']} Kueue rollup rows")
        done["incidents"] = _incidents(training, serving, faults, now, flap=flap)
        say(f"{done['incidents']} resolved incidents")
        # Last, up to the moment the live run takes over: the raw samples of the last minutes.
        done["samples"] = _raw_samples(fleet_sim, drivers, site_ids, now, until=timezone.now())
        say(f"{done['samples']} samples of the last {RAW.seconds // 60} minutes")
    say("a week written")
    return done


# --- what drove each GPU ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fault:
    """A fault on one GPU: the training simulator's HistoryFault when it kills a job."""

    gpu: SimGpu
    site: str
    kind: str
    at: datetime
    duration: timedelta

    @property
    def end(self) -> datetime:
        return self.at + self.duration


def _gpu_faults(fleet_sim: FleetSimulator, training: TrainingSimulator | None, now: datetime) -> dict[str, list[Any]]:
    """The week's GPU faults by GPU UUID: HistoryFault for the one under a job, _Fault for the rest."""
    out: dict[str, list[Any]] = {}
    if training is not None and len(training.jobs) > JOB_FAULT[0]:
        job = training.jobs[JOB_FAULT[0]]
        position = min(JOB_FAULT[1], len(job.gpus) - 1)
        fault = HistoryFault(JOB_FAULT[0], position, now - JOB_FAULT[2], JOB_FAULT[3], "xid79")
        out.setdefault(job.gpus[position].uuid, []).append(fault)
    by_slot = {(g.hostname, g.index): (site, g) for site, gpus in fleet_sim.fleet.items() for g in gpus}
    for spec in GPU_FAULTS:
        site, gpu = by_slot.get((spec.hostname, spec.index), ("", None))
        if gpu is not None:
            out.setdefault(gpu.uuid, []).append(_Fault(gpu, site, spec.kind, now - spec.before_end, spec.duration))
    return out


class _Drivers:
    """What drove each GPU over any stretch of the week (fleet.telemetry.simulator.HISTORY_PARTS):
    its job's phases (none before the job's allocation: the GPU idles), its faults, else its own
    workload."""

    PHASE_PART = {"running": "work", "hung": "hung"}  # every other phase of a job: idle

    def __init__(self, fleet_sim: FleetSimulator, training: TrainingSimulator | None, faults: dict[str, list[Any]]):
        self.job_of: dict[str, SimJob] = {}
        self.segments: dict[int, tuple[list[datetime], list[str]]] = {}
        for job in training.jobs if training is not None else ():
            if not job.timeline:
                continue
            for gpu in job.gpus:
                self.job_of[gpu.uuid] = job
            times = [t for t, _ in job.timeline]
            parts = [self.PHASE_PART.get(phase, "idle") for _, phase in job.timeline]
            self.segments[job.index] = (times, parts)
        self.faults = {uuid: [(f.at, f.at + f.duration, f.kind) for f in items] for uuid, items in faults.items()}
        self._cache: dict[tuple[int, datetime, float], list[tuple[str, float]]] = {}
        self._work: dict[float, list[tuple[str, float]]] = {}

    def parts(self, gpu: SimGpu, start: datetime, seconds: float) -> list[tuple[str, float]]:
        """(part, seconds) over [start, start + seconds)."""
        job = self.job_of.get(gpu.uuid)
        if job is None:
            parts = self._work.get(seconds) or self._work.setdefault(seconds, [("work", seconds)])
        else:
            key = (job.index, start, seconds)
            parts = self._cache.get(key)
            if parts is None:
                parts = self._cache[key] = self._job_parts(job.index, start, seconds)
        faults = self.faults.get(gpu.uuid)
        if faults:
            parts = self._with_faults(parts, faults, start, seconds)
        return parts

    def _job_parts(self, index: int, start: datetime, seconds: float) -> list[tuple[str, float]]:
        times, kinds = self.segments[index]
        end = start + timedelta(seconds=seconds)
        out: dict[str, float] = {}
        i = bisect.bisect_right(times, start) - 1
        t = start
        while t < end:
            kind = kinds[i] if i >= 0 else "idle"
            until = times[i + 1] if i + 1 < len(times) else end
            until = min(until, end)
            out[kind] = out.get(kind, 0.0) + (until - t).total_seconds()
            t, i = until, i + 1
        return list(out.items())

    @staticmethod
    def _with_faults(
        parts: list[tuple[str, float]], faults: list[tuple[datetime, datetime, str]], start: datetime, seconds: float
    ) -> list[tuple[str, float]]:
        end = start + timedelta(seconds=seconds)
        out = dict(parts)
        for at, until, kind in faults:
            overlap = (min(end, until) - max(start, at)).total_seconds()
            if overlap <= 0:
                continue
            # The fault takes its seconds from what the GPU was doing (work first, then idle).
            left = overlap
            for taken in ("work", "hung", "idle"):
                cut = min(left, out.get(taken, 0.0))
                if cut:
                    out[taken] -= cut
                    left -= cut
            out[kind] = out.get(kind, 0.0) + overlap
        return [(k, v) for k, v in out.items() if v > 0]

    def overrides(self, gpu: SimGpu, at: datetime) -> dict[str, float] | None:
        """What the training simulator's telemetry coupling would set for ``gpu`` at ``at``."""
        job = self.job_of.get(gpu.uuid)
        if job is None:
            return None
        times, kinds = self.segments[job.index]
        i = bisect.bisect_right(times, at) - 1
        kind = kinds[i] if i >= 0 else "idle"
        if kind == "hung":
            return {"gpu_util": 100.0, "sm_active": 0.97}
        if kind == "idle":
            return {"gpu_util": 0.0, "sm_active": 0.0}
        return None


# --- GPU telemetry ---------------------------------------------------------------------------------


def _register_gpus(fleet_sim: FleetSimulator) -> None:
    """The fleet's GPUs, as their first samples would register them (fleet.telemetry.store): the
    week's jobs name them before the raw samples, which come last, arrive."""
    nodes = dict(Node.objects.values_list("hostname", "pk"))
    gpus = [g for site_gpus in fleet_sim.fleet.values() for g in site_gpus if g.hostname in nodes]
    Gpu.objects.bulk_create(
        [
            # Framebuffer used + free, as the writer sizes a GPU from its first sample.
            Gpu(
                node_id=nodes[g.hostname],
                uuid=g.uuid,
                index=g.index,
                model=g.model.name,
                hbm_gib=round(g.model.hbm_mib / 1024),
            )
            for g in sorted(gpus, key=lambda g: g.uuid)
        ],
        ignore_conflicts=True,
    )


def _raw_samples(
    fleet_sim: FleetSimulator, drivers: _Drivers, site_ids: dict[str, int], now: datetime, *, until: datetime
) -> int:
    """The samples of the RAW before ``until``, every RAW_INTERVAL, through the ingest schema and
    the telemetry writer (which marks their minutes for the rollups)."""
    step = timedelta(seconds=RAW_INTERVAL)
    t = until - RAW
    batches: list[PendingBatch] = []
    # The sampler's own figures, every RAW_INTERVAL (its energy counters counting that long), with
    # no random faults: the week's are scripted.
    saved = fleet_sim.fault_p, fleet_sim.interval
    fleet_sim.fault_p, fleet_sim.interval = 0.0, RAW_INTERVAL
    for _ in range(8):  # temperatures settle where the load holds them
        fleet_sim.batches(t)
    try:
        while t < until:
            for gpus in fleet_sim.fleet.values():
                for gpu in gpus:
                    override = drivers.overrides(gpu, t)
                    if override is None:
                        fleet_sim.overrides.pop(gpu.uuid, None)
                    else:
                        fleet_sim.overrides[gpu.uuid] = override
            for site, samples in fleet_sim.batches(t).items():
                if samples:
                    parsed = parse_gpu_batch(msgspec.json.encode({"samples": samples}), now=until)
                    batches.append(PendingBatch(site_ids[site], f"history:{site}:{t.isoformat()}", parsed.samples))
            t += step
    finally:
        fleet_sim.fault_p, fleet_sim.interval = saved
        fleet_sim.overrides.clear()
    return store_gpu_batches(batches)


_ROLLUP_COLUMNS = f"gpu_id, bucket, {rollups.GPU_COLUMNS}"
# The rollup tables' own column types (fleet/migrations/0002): reals, and a double for energy.
_ROLLUP_TYPES = ["int8", "timestamptz", "int4", *["float4"] * 6, "float8", "int4", "int4", "int4"]


def _copy_rows(
    table: partitions.PartitionedTable,
    columns: str,
    types: list[str],
    rows: Iterable[tuple[Any, ...]],
    buckets: list[datetime],
) -> int:
    """COPY ``rows`` into ``table``'s ``columns`` (binary, with these types), making the buckets'
    partitions first; return the rows written."""
    partitions.ensure_partitions_for(table, buckets)
    n = 0
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table.name} ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)
            n += 1
    return n


def _rollups(fleet_sim: FleetSimulator, drivers: _Drivers, start: datetime, now: datetime) -> int:
    """Each GPU's minutes over the last day (up to the raw samples) and hours before it, by COPY;
    then the rollup code rolls the groups, and the last day's hours from their minutes."""
    ids = dict(Gpu.objects.filter(parent__isnull=True).values_list("uuid", "pk"))
    gpus = [(ids[g.uuid], g) for site_gpus in fleet_sim.fleet.values() for g in site_gpus if g.uuid in ids]
    minute_from = _floor_hour(now - MINUTE_ROLLUPS)
    raw_from = (now - RAW).replace(second=0, microsecond=0) + timedelta(minutes=1)  # the raw minutes' own
    minutes = [minute_from + timedelta(minutes=k) for k in range(int((raw_from - minute_from).total_seconds() // 60))]
    hours = [start + timedelta(hours=k) for k in range(int((minute_from - start).total_seconds() // 3600))]
    row = fleet_sim.history_row
    offsets = {g.utc_offset_h for _, g in gpus}

    def rows(buckets: list[datetime], seconds: float) -> Iterable[tuple[Any, ...]]:
        for bucket in buckets:
            middle = bucket + timedelta(seconds=seconds / 2)
            loads = {offset: fleet_sim.daily_load(offset, middle) for offset in offsets}
            hot = fleet_sim.hot_share(bucket, seconds)
            for gpu_id, gpu in gpus:
                parts = drivers.parts(gpu, bucket, seconds)
                yield (gpu_id, bucket, *row(gpu, seconds, parts, load=loads[gpu.utc_offset_h], hot_share=hot))

    written = _copy_rows(partitions.GPU_ROLLUP_1M, _ROLLUP_COLUMNS, _ROLLUP_TYPES, rows(minutes, 60.0), minutes)
    written += _copy_rows(partitions.GPU_ROLLUP_1H, _ROLLUP_COLUMNS, _ROLLUP_TYPES, rows(hours, 3600.0), hours)
    rollups._mark("1m", minutes)
    rollups._mark("1h", hours)
    # Minutes (the copied ones and the raw ones) into groups, then every hour: from its minutes
    # where it has them, its copied GPU rows where not. Marked hours settle after a minute; these
    # are final now.
    rollups.update_rollups(now=now + rollups.HOUR_SETTLE * 5)
    return written


# --- incidents -------------------------------------------------------------------------------------


def _incidents(
    training: TrainingSimulator | None,
    serving: ServingSimulator | None,
    faults: dict[str, list[Any]],
    now: datetime,
    *,
    flap: _Flap | None = None,
) -> int:
    """The week's incidents, resolved, as the detectors and the engine would have left them."""
    made = _Incidents(now)
    job_rows = {} if training is None else {j.job_id: j for j in training.jobs if j.job_id is not None}
    for job in job_rows.values():
        _job_incidents(made, job, faults, flap if flap is not None and flap.job == job.index else None)
    for items in faults.values():
        for fault in items:
            if isinstance(fault, _Fault):
                _gpu_incident(made, fault)
    if serving is not None:
        _serving_incident(made, serving, now - SERVING_COLLAPSE_BEFORE)
    made.findings()
    return made.count


class _Incidents:
    """Writes resolved incidents with their findings and timelines. A detector's fingerprint is one
    finding row, which each new firing moves to its new incident: only the latest incident of a
    fingerprint keeps it, as the engine leaves them."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.count = 0
        self.latest: dict[str, tuple[datetime, Incident, dict[str, Any]]] = {}

    def add(
        self,
        *,
        title: str,
        severity: str,
        category: str,
        group_key: str,
        labels: dict[str, Any],
        started_at: datetime,
        cleared_at: datetime,
        findings: list[dict[str, Any]],
        gpus: int = 0,
        gpu_hours_lost: float = 0.0,
        error_budget: float = 0.0,
        acknowledged_after: timedelta | None = None,
        detected_at: datetime | None = None,
    ) -> Incident | None:
        detected = detected_at or started_at + timedelta(seconds=DETECTION_S)
        resolved = max(cleared_at, detected + timedelta(seconds=30))
        if resolved >= self.now:
            return None  # still going at the start: the live detectors open it
        acknowledged = detected + acknowledged_after if acknowledged_after is not None else None
        if acknowledged is not None and acknowledged >= resolved:
            acknowledged = None
        incident = Incident.objects.create(
            title=title[:300],
            severity=severity,
            state=IncidentState.RESOLVED,
            category=category,
            group_key=group_key,
            labels=labels,
            started_at=started_at,
            detected_at=detected,
            acknowledged_at=acknowledged,
            resolved_at=resolved,
            affected_gpus=gpus,
            gpu_hours_lost=round(gpu_hours_lost, 3),
            error_budget_burned=round(error_budget, 4),
        )
        entries = [(detected, TimelineKind.STATE, f"Triggered ({severity}) by {findings[0]['source']}: {title}")]
        for finding in findings[1:]:
            entries.append((detected, TimelineKind.FINDING, f"Finding joined: {finding['summary']}"))
        if acknowledged is not None:
            entries.append((acknowledged, TimelineKind.STATE, "Acknowledged by the on-call engineer"))
        for finding in findings:
            entries.append((cleared_at, TimelineKind.FINDING, f"Finding cleared: {finding['summary']}"))
        if acknowledged is None:
            entries.append((resolved, TimelineKind.STATE, "Auto-resolved: healthy for the hold-down"))
        else:
            entries.append((resolved, TimelineKind.STATE, "Resolved: the job runs again from its checkpoint"))
        TimelineEntry.objects.bulk_create(
            [
                TimelineEntry(incident=incident, at=at, kind=kind, actor_label="history", text=text)
                for at, kind, text in entries
            ]
        )
        for finding in findings:
            previous = self.latest.get(finding["fingerprint"])
            if previous is None or previous[0] < started_at:
                self.latest[finding["fingerprint"]] = (started_at, incident, {**finding, "cleared_at": cleared_at})
        self.count += 1
        return incident

    def findings(self) -> None:
        Finding.objects.bulk_create(
            [
                Finding(
                    fingerprint=fingerprint,
                    source=f["source"],
                    labels={**f["labels"], "detector": f["source"].removeprefix("detector:")},
                    severity=f["severity"],
                    summary=f["summary"][:500],
                    impact=f.get("impact", {}),
                    status=FindingStatus.CLEARED,
                    incident=incident,
                    started_at=started,
                    first_seen=incident.detected_at,
                    last_seen=f["cleared_at"],
                    cleared_at=f["cleared_at"],
                )
                for fingerprint, (started, incident, f) in self.latest.items()
            ]
        )


def _job_incidents(made: _Incidents, job: SimJob, faults: dict[str, list[Any]], flap: _Flap | None) -> None:
    """An incident per failure of the job, as training-job-failed opens it (the work since the
    attempt's last checkpoint lost), with the hang before it or the GPU fault that caused it
    joined; its findings clear when the job starts again."""
    from fleet.training.models import JobEvent

    events = list(
        JobEvent.objects.filter(job_id=job.job_id)
        .exclude(kind="step")
        .order_by("ts", "seq")
        .values_list("kind", "ts", "reason")
    )
    labels = {"site": job.site, "job": str(job.job_id), "job_name": job.name, "team": job.team}
    labels["cluster"] = f"{job.site}-train"
    attempt_start = checkpoint_at = None
    failed: tuple[datetime, str, float] | None = None
    for kind, ts, reason in events:
        if kind == "started":
            if failed is not None:
                _job_failure(made, job, labels, failed, ts, faults, flap)
                failed = None
            attempt_start, checkpoint_at = ts, None
        elif kind == "checkpoint_saved":
            checkpoint_at = ts
        elif kind == "failed":
            since = checkpoint_at or attempt_start or ts
            failed = (ts, reason, job.gang * (ts - since).total_seconds() / 3600)


def _job_failure(
    made: _Incidents,
    job: SimJob,
    labels: dict[str, Any],
    failed: tuple[datetime, str, float],
    restarted: datetime,
    faults: dict[str, list[Any]],
    flap: _Flap | None,
) -> None:
    from fleet.training.models import JobEvent

    at, reason, lost = failed
    impact = {"gpus": job.gang, "unit": f"job:{job.job_id}", "gpu_uuids": sorted(g.uuid for g in job.gpus)}
    summary = f"{job.name} failed ({reason}): {lost:.1f} GPU-hours of work since its last checkpoint lost"
    findings = [
        {
            "fingerprint": f"training-job-failed:{job.job_id}",
            "source": "detector:training-job-failed",
            "severity": Severity.SEV3,
            "summary": summary,
            "labels": labels,
            "impact": {**impact, "gpu_hours_lost": round(lost, 3), "gpu_hours": round(lost, 3), "reason": reason},
        }
    ]
    started, title, severity, hours = at, summary, Severity.SEV3, lost
    if reason == NCCL_TIMEOUT:
        last_step = JobEvent.objects.filter(job_id=job.job_id, kind="step", ts__lt=at).order_by("-ts").first()
        if last_step is not None:
            stalled = (at - last_step.ts).total_seconds()
            held = job.gang * stalled / 3600
            title = (
                f"Suspected hang: {job.name} ({job.gang} GPUs) has made no step for {stalled / 60:.0f} min "
                "(threshold 5 min) while its GPUs report 100 % utilisation"
            )
            findings.insert(
                0,
                {
                    "fingerprint": f"training-hang:{job.job_id}",
                    "source": "detector:training-hang",
                    "severity": Severity.SEV2,
                    "summary": title,
                    "labels": labels,
                    "impact": {**impact, "gpu_hours_held": round(held, 3), "gpu_hours": round(held, 3)},
                },
            )
            started, severity, hours = last_step.ts + timedelta(minutes=5), Severity.SEV2, max(lost, held)
            # The correlation's rule (fleet.correlation.causes): a flap from the fabric window
            # before the hang's start on.
            if flap is not None and started - fabric_detectors.WINDOW <= flap.at <= at:
                title = _caused_by_flap(findings, flap, job)
                started = flap.at
    for fault in (f for items in faults.values() for f in items if isinstance(f, HistoryFault)):
        gpu = job.gpus[fault.gpu]
        if fault.job != job.index or not fault.at <= at <= fault.at + fault.duration:
            continue
        title = f"XID 79 ({XID_MEANING[79]}) on {gpu.hostname} GPU {gpu.index}"
        gpu_labels = {"site": job.site, "hostname": gpu.hostname, "gpu": gpu.uuid, "gpu_index": str(gpu.index)}
        findings.insert(
            0,
            {
                "fingerprint": f"xid:{gpu.uuid}:79",
                "source": "detector:critical-xid",
                "severity": Severity.SEV2,
                "summary": title,
                "labels": {**gpu_labels, "model": gpu.model.name, "xid": "79", **labels},
                "impact": {"gpus": 8, "job_gpus": job.gang, "gpu_hours_at_risk": round(lost, 3)},
            },
        )
        started, severity = fault.at, Severity.SEV2
    made.add(
        title=title,
        severity=severity,
        category={"critical-xid": "gpu-health", "fabric-link-flap": "fabric"}.get(
            findings[0]["source"].removeprefix("detector:"), "training"
        ),
        group_key=f"job={job.job_id}",
        labels=labels,
        started_at=started,
        cleared_at=restarted,
        findings=findings,
        gpus=job.gang,
        gpu_hours_lost=hours,
        acknowledged_after=timedelta(minutes=4) if severity == Severity.SEV2 else None,
    )


GPU_FAULT_TITLES = {
    "xid79": ("critical-xid", "xid:{uuid}:79", Severity.SEV2, "XID 79 (GPU has fallen off the bus) on {host} GPU {i}"),
    "dbe": (
        "ecc-double-bit",
        "ecc-dbe:{uuid}",
        Severity.SEV2,
        "Double-bit ECC errors on {host} GPU {i}: 1 since the driver loaded (+1 in 10 min)",
    ),
    "thermal": ("thermal-throttling", "thermal:{uuid}", Severity.SEV3, "Thermal throttling on {host} GPU {i}"),
}


def _gpu_incident(made: _Incidents, fault: _Fault) -> None:
    """A fault on a GPU no job holds: the GPU-health detector's incident on its node, cleared once
    the GPU reports healthy again (its next samples)."""
    detector, fingerprint, severity, summary = GPU_FAULT_TITLES[fault.kind]
    gpu = fault.gpu
    summary = summary.format(host=gpu.hostname, i=gpu.index)
    if fault.kind == "thermal":
        summary += f": {gpu.model.slowdown_temp + 2:.0f} °C, SM clock {gpu.model.sm_clock_max * 0.52:.0f} MHz"
    drained = fault.kind == "xid79"
    labels = {"site": fault.site, "hostname": gpu.hostname, "gpu": gpu.uuid, "gpu_index": str(gpu.index)}
    labels["model"] = gpu.model.name
    if drained:
        labels["xid"] = "79"
    made.add(
        title=summary,
        severity=severity,
        category="gpu-health",
        group_key=f"node={gpu.hostname}",
        labels=labels,
        started_at=fault.at,
        cleared_at=fault.end + timedelta(seconds=30),
        findings=[
            {
                "fingerprint": fingerprint.format(uuid=gpu.uuid),
                "source": f"detector:{detector}",
                "severity": severity,
                "summary": summary,
                "labels": labels,
                "impact": {"gpus": 8 if drained else 1},
            }
        ],
        gpus=8 if drained else 1,
        acknowledged_after=timedelta(minutes=6) if severity == Severity.SEV2 else None,
    )


SERVING_DETECTORS = ("serving-queueing-collapse", "serving-cold-start", "serving-burn-rate")


def _serving_incident(made: _Incidents, serving: ServingSimulator, collapse_at: datetime) -> None:
    """The collapse's incident as the serving detectors saw it: each run every four minutes over
    the stored minutes of it (they read rollups by time), the first cause's words as its title."""
    from incidents.detectors import registered

    ids = {str(ep.endpoint_id) for ep in serving.endpoints if ep.spec.scenario == "collapse" and ep.endpoint_id}
    if not ids:
        return
    detectors = registered()
    seen: dict[str, list[Any]] = {}  # fingerprint -> [first seen, last seen, spec]
    t = collapse_at
    while t <= collapse_at + timedelta(minutes=40):
        for name in SERVING_DETECTORS:
            for spec in detectors[name](t):
                if spec.labels.get("endpoint") in ids:
                    entry = seen.setdefault(spec.fingerprint, [t, t, spec, name])
                    entry[1], entry[2] = t, spec if name != "serving-burn-rate" else entry[2]
        t += timedelta(minutes=4)
    if not seen:
        return
    entries = sorted(seen.values(), key=lambda e: e[0])
    causes = [e for e in entries if not (e[2].impact or {}).get("symptom")]
    first = (causes or entries)[0][2]
    endpoint = next(iter(ids))
    labels = {k: v for k, v in first.labels.items() if k != "slo"}
    started = min(e[2].started_at or e[0] for e in entries)
    made.add(
        title=first.summary,
        severity=min(e[2].severity for e in entries),
        category="serving",
        group_key=f"endpoint={endpoint}",
        labels=labels,
        started_at=started,
        detected_at=entries[0][0],
        cleared_at=max(e[1] for e in entries) + timedelta(minutes=2),
        findings=[
            {
                "fingerprint": spec.fingerprint,
                "source": f"detector:{name}",
                "severity": spec.severity,
                "summary": spec.summary,
                "labels": spec.labels,
                "impact": spec.impact,
            }
            for _, _, spec, name in entries
        ],
        error_budget=max(float((e[2].impact or {}).get("error_budget") or 0) for e in entries),
        acknowledged_after=timedelta(minutes=3),
    )


# --- node_exporter's series ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Flap:
    """The compute port that flapped under the history's scripted hang."""

    job: int
    site: str
    hostname: str
    port: str
    at: datetime


def _hang_flap(nodes: NodeExporterSimulator, training: TrainingSimulator | None, now: datetime) -> _Flap | None:
    """Script the flap under the history's hang (HANG) into the node simulator."""
    if training is None or len(training.jobs) <= HANG[0]:
        return None
    job = training.jobs[HANG[0]]
    flap = _Flap(job.index, job.site, job.nodes[0], SCRIPTED_FLAP_PORT, now - HANG[1] - FLAP_LEAD)
    nodes.flap(flap.hostname, flap.port, flap.at)
    return flap


def _caused_by_flap(findings: list[dict[str, Any]], flap: _Flap, job: SimJob) -> str:
    """The hang's finding (findings[0]) named as the flap's effect, as fleet.correlation names it,
    and the flap's finding first; returns the incident's title, as the engine titles it."""
    detail = f"link flap on {flap.hostname} {flap.port}"
    hang = findings[0]
    effect = {"headline": FABRIC_EFFECT, "name": job.name, "detail": detail}
    cause = fabric_detectors.fingerprint("link-flap", flap.site, flap.hostname, flap.port)
    hang["summary"] = f"{FABRIC_EFFECT}: {job.name} ({detail}); {hang['summary']}"
    flapped = [f"{flap.hostname} {flap.port}"]
    hang["impact"] = {**hang["impact"], "caused_by": cause, "effect": effect, "flapped": flapped}
    findings.insert(
        0,
        {
            "fingerprint": cause,
            "source": "detector:fabric-link-flap",
            "severity": Severity.SEV2,
            "summary": (
                f"Link flap on {flap.hostname} {flap.port} ({Fabric.COMPUTE} fabric): link downed +1 in 10 min; "
                "the node runs a multi-node training job"
            ),
            "labels": {"site": flap.site, "node": flap.hostname, "interface": flap.port, "fabric": Fabric.COMPUTE},
            "impact": {"link_downed": 1.0, "state": 4.0, "gang_node": True},
        },
    )
    return title_of_effects([effect])


_SERIES_TYPES = ["text", "timestamptz", "int4", "float8", "float8", "float8", "float8"]
_SERIES_COLUMNS = "quantity, bucket, samples, increase, min, max, last"


def _node_history(
    fleet_sim: FleetSimulator, nodes: NodeExporterSimulator, drivers: _Drivers, *, start: datetime, now: datetime
) -> int:
    """Every node's ports, disks and file systems, registered as node_exporter's first scrape
    registers them, and their minutes from ``start`` (a whole hour) to this minute by COPY, as the
    series writer (fleet.telemetry.series) would have rolled up the scrapes. Each node's traffic
    follows what its first GPU did (_Drivers); the live run then goes on from these counters."""
    start = _floor_hour(start)
    end = now.replace(second=0, microsecond=0)
    node_ids = dict(Node.objects.filter(hostname__in=list(nodes.nodes)).values_list("hostname", "pk"))
    first_gpu: dict[str, SimGpu] = {}
    for gpus in fleet_sim.fleet.values():
        for gpu in gpus:
            first_gpu.setdefault(gpu.hostname, gpu)
    sims = [n for n in nodes.nodes.values() if n.hostname in node_ids]
    NodeInterface.objects.bulk_create(
        [
            NodeInterface(
                node_id=node_ids[n.hostname],
                name=p.name,
                kind=(kind := InterfaceKind.IB if p.port else InterfaceKind.ETHERNET),
                rate_bytes_per_second=p.rate,
                fabric=DEFAULT_FABRIC[kind],
            )
            for n in sims
            for p in n.ports
        ],
        ignore_conflicts=True,
    )
    NodeMount.objects.bulk_create(
        [
            NodeMount(
                node_id=node_ids[n.hostname],
                mountpoint=m.mountpoint,
                fstype=m.fstype,
                device=m.device,
                purpose=purpose_of_mountpoint(m.mountpoint),
            )
            for n in sims
            for m in n.mounts
        ],
        ignore_conflicts=True,
    )
    ids = {v: k for k, v in node_ids.items()}
    interfaces = {(ids[n], name): pk for pk, n, name in NodeInterface.objects.values_list("pk", "node_id", "name")}
    mounts = {(ids[n], mp): pk for pk, n, mp in NodeMount.objects.values_list("pk", "node_id", "mountpoint")}

    def activity(hostname: str, at: datetime) -> dict[str, float]:
        return {part: seconds / 60 for part, seconds in drivers.parts(first_gpu[hostname], at, 60.0)}

    live, nodes.activity = nodes.activity, activity
    written = 0
    try:
        minute = start
        while minute < end:  # an hour of minutes at a time: three COPYs, bounded memory
            count = min(60, int((end - minute).total_seconds() // 60))
            rows: dict[str, list[tuple[Any, ...]]] = {"port": [], "disk": [], "mount": []}
            for hostname, kind, name, bucket, figures in nodes.minute_rows(minute, count):
                if hostname not in node_ids:
                    continue
                key: tuple[Any, ...] = (
                    (interfaces[(hostname, name)],)
                    if kind == "port"
                    else (node_ids[hostname], name)
                    if kind == "disk"
                    else (mounts[(hostname, name)],)
                )
                rows[kind] += [(*key, quantity, bucket, *values) for quantity, values in figures.items()]
            buckets = [minute + timedelta(minutes=k) for k in range(count)]
            for table, keys, types, kind in (
                (partitions.PORT_ROLLUP_1M, "interface_id", ["int8"], "port"),
                (partitions.DISK_ROLLUP_1M, "node_id, device", ["int8", "text"], "disk"),
                (partitions.MOUNT_ROLLUP_1M, "mount_id", ["int8"], "mount"),
            ):
                columns = f"{keys}, {_SERIES_COLUMNS}"
                written += _copy_rows(table, columns, [*types, *_SERIES_TYPES], rows[kind], buckets)
            minute += timedelta(minutes=count)
    finally:
        nodes.activity = live
    # The port rollups went in by COPY, past the port writer: the fabric page's read model (its
    # throughput per fabric, the ports' latest state and rate) is read from them here.
    fabric_summaries.rebuild(start, end)
    return written


# --- Kueue's series --------------------------------------------------------------------------------


def queue_values(site: str, samples: list[Sample]) -> list[tuple[str, str, str, float]]:
    """(ClusterQueue, quantity, series, value) of each of a Kueue scrape's samples, as the
    Prometheus door maps them (fleet.scheduler.mappings: the label naming the queue, the
    labels kept, in canonical Prometheus label text); a name the door does not map is left out."""
    out = []
    for name, labels, value in samples:
        spec = SCHEDULER_SERIES.get(name)
        if spec is None or spec.queue_label is None:
            continue
        kept = {k: labels[k] for k in spec.keep if k in labels}
        kept.update(spec.fixed)
        series = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(kept.items()))
        out.append((labels[spec.queue_label], spec.quantity, series, value))
    return out


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _queue_history(queues: KueueSimulator, site_ids: dict[str, int], *, start: datetime, now: datetime) -> int:
    """Every simulated ClusterQueue's minutes from ``start`` (a whole hour) to this minute by COPY:
    the queues run scrape by scrape (every ``interval``) and each series' scrapes of a minute
    rolled up as the series writer rolls them up (fleet.telemetry.series.SeriesTable.rollup_sql):
    the samples, min, max and last, and for a counter its increase from the scrape before (none
    before the first: 0; a fall: a reset, counted from zero). The queues must be registered
    (fleet.scheduler.simulator.seed_queues); the live run goes on from ``now``."""
    start = _floor_hour(start)
    end = now.replace(second=0, microsecond=0)
    names = {pk: name for name, pk in site_ids.items()}
    ids = {
        (names[site_id], name): pk
        for site_id, name, pk in SchedulerQueue.objects.filter(
            site_id__in=list(names), scheduler=QueueScheduler.KUEUE
        ).values_list("site_id", "name", "pk")
    }
    step = queues.interval.total_seconds()
    per_minute = max(1, round(60 / step))
    previous: dict[tuple[int, str, str], float] = {}
    queues.advance(start)
    written = 0
    minute = start
    while minute < end:  # an hour of minutes at a time: one COPY, bounded memory
        count = min(60, int((end - minute).total_seconds() // 60))
        buckets = [minute + timedelta(minutes=k) for k in range(count)]
        rows: list[tuple[Any, ...]] = []
        for bucket in buckets:
            seen: dict[tuple[int, str, str], list[float]] = {}
            for i in range(per_minute):
                queues.advance(bucket + timedelta(seconds=i * step))
                for site in queues.sites:
                    for queue, quantity, series, value in queue_values(site, queues.samples(site)):
                        key = ids.get((site, queue))
                        if key is not None:
                            seen.setdefault((key, series, quantity), []).append(value)
            for key, values in seen.items():
                increase = None
                if key[2] in QUEUE_COUNTERS:
                    increase, prev = 0.0, previous.get(key)
                    for value in values:
                        if prev is not None:
                            increase += value - prev if value >= prev else value
                        prev = value
                previous[key] = values[-1]
                rows.append((*key, bucket, len(values), increase, min(values), max(values), values[-1]))
        columns = f"queue_id, series, {_SERIES_COLUMNS}"
        written += _copy_rows(partitions.SCHEDULER_ROLLUP_1M, columns, ["int8", "text", *_SERIES_TYPES], rows, buckets)
        minute += timedelta(minutes=count)
    queues.advance(now)
    return written
