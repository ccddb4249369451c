"""Training detectors: functions from jobs' recent events (and their GPUs' telemetry) to the
findings present now, registered with the incident engine like the GPU-health detectors.

* training-hang: a running job with no step for longer than max(10 x its median step time, 300 s),
  whatever its GPUs' utilisation says (NCCL spins at 100 % while a collective hangs);
* training-data-stall: a sustained data-wait fraction >= 0.3 of the step time the job reports,
  whatever its GPUs' utilisation (a 40 % wait leaves them some 60 % busy); the utilisation only
  sets the severity;
* training-straggler: one node of a multi-node job far slower (step time) or far less busy (SM
  activity) than its peers;
* training-checkpoint-overdue: no checkpoint for 2 x the job's planned interval;
* training-job-failed: the job's latest attempt failed and it has not made progress since.

Every finding carries the labels site, job (its id: the engine groups a job's findings into one
incident by it), job_name, team and cluster, and its own impact in GPU-hours, one definition per
kind (``gpu_hours_lost``, repeated as ``gpu_hours``, which the incident engine adds up into the
incident's GPU-hours lost):
  * hang: gang x the time without progress;
  * straggler: the slowdown's share, (1 - 1 / slowdown) x the gang's compute over the episode;
  * data stall: the stall time x gang over the episode (the account's data-loading stall);
  * failure: what it cost (goodput.FailureLoss: progress lost since the retained checkpoint +
    waiting to restart + re-initialisation + restore), fixed once the job has made progress
    again or been released;
  * checkpoint overdue: ``gpu_hours_at_risk`` only (the work not yet checkpointed), never lost.
The episode figures come from the goodput accounting of the episode's own events
(goodput.stretch_of), so the finding agrees with the job's account over the same stretch. ``gpus``
is the gang (the incident's GPUs affected); a training finding never charges GPUs x time.

Queries are bounded per detector run: one for the candidate jobs (with their latest events, to
tell a failed attempt), one for their GPUs, one over their recent steps (index range scans of
(job, ts, seq) per job) and, where needed, one over their GPUs' samples in the last ten minutes.
The window's step statistics are computed once per ``now`` and shared by the data-stall and
straggler detectors; the hang detector reads only each job's latest 50 step times.

Hysteresis: a straggler or data stall already firing clears only at looser thresholds (1.2 x step
time, 0.8 x SM activity; a data-wait fraction under 0.2), so a value hovering at the line does
not flap. Their GPU-hours lost cover the whole episode, from the firing finding's start.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from fleet.choices import JobEventKind, JobState
from fleet.telemetry import placement
from fleet.training import goodput
from fleet.training.accounts import job_rows
from fleet.training.failures import classify
from fleet.training.goodput import hang_threshold_s
from fleet.training.models import HOLDING_STATES, Job
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector, firing_since

WINDOW = timedelta(minutes=10)
RECENT_STEPS = 50  # the hang threshold's median is over this many of the job's latest steps
STALL_FRACTION = 0.3
STALL_MIN_STEPS = 5
STALL_MIN_SPAN = timedelta(minutes=5)
STALL_UTIL_BELOW = 50.0  # %: a stalled job's GPUs busier than this make it SEV4, not SEV3
STALL_CLEAR_FRACTION = 0.2  # a firing stall clears only under this fraction
STRAGGLER_STEP_RATIO = 1.3
STRAGGLER_ACTIVITY_RATIO = 0.7
STRAGGLER_CLEAR_STEP_RATIO = 1.2  # a firing straggler clears only under these
STRAGGLER_CLEAR_ACTIVITY_RATIO = 0.8
STRAGGLER_MIN_STEPS = 3  # per node, in the window
STRAGGLER_MIN_PEER_ACTIVITY = 10.0  # %: below it the whole job is idle, not one node slow
CHECKPOINT_OVERDUE_MULTIPLE = 2
FAILED_WITHIN = timedelta(minutes=30)
BLOCKING_MARGIN = 1.5  # a save or restore in progress may take this x the job's longest observed one
# A job's first save (or restore) has no history: allow it 10 minutes, more than the worked
# example (a 6-minute save of a 1,024-GPU gang), so a hang then pages after 300 + 1.5 x 600 s.
BLOCKING_DEFAULT_S = 600.0
FAULT_GRACE = timedelta(minutes=2)  # a fault this soon after a failed job's release still killed it
LATEST_EVENTS = 6  # a job's latest events read with it: enough to tell a failure not yet recovered from
# Events that are not progress: between a failure and any of these the job is still recovering.
_NOT_PROGRESS = frozenset(
    {
        JobEventKind.RELEASED,
        JobEventKind.STARTED,
        JobEventKind.ALLOCATED,
        JobEventKind.RESUMED,
        JobEventKind.CHECKPOINT_STARTED,
    }
)


# What rooms above this one add to a job's hang or failure findings (fleet.correlation: the fabric
# fault under them, so they join its incident). Each hook takes (now, findings) and returns them.
JobFindingHook = Callable[[datetime, list[FindingSpec]], list[FindingSpec]]
_job_finding_hooks: list[JobFindingHook] = []


def register_job_finding_hook(hook: JobFindingHook) -> None:
    """Add to the hang, data-stall and failure findings (called once, at import, by a room above
    this one)."""
    if hook not in _job_finding_hooks:
        _job_finding_hooks.append(hook)


def _with_hooks(now: datetime, specs: list[FindingSpec]) -> list[FindingSpec]:
    for hook in _job_finding_hooks:
        specs = hook(now, specs)
    return specs


@dataclass
class JobRow:
    """What the detectors read of a job: its facts, its GPUs and its latest attempt's failure."""

    pk: int
    name: str
    team: str
    cluster: str
    site: str
    gang: int
    state: str
    checkpoint_interval_s: int | None
    allocated_since: datetime | None
    progress_since: datetime | None
    last_step_at: datetime | None
    last_checkpoint_at: datetime | None
    ended_at: datetime | None
    events_seen: int = 0
    last_event_at: datetime | None = None
    failed_at: datetime | None = None  # the latest attempt failed at
    failed_reason: str = ""
    # The latest failure the job has made no progress since (its restart may be under way).
    recovering_from: datetime | None = None
    recovering_reason: str = ""
    latest_kind: str = ""  # the job's latest event (ts <= now)
    latest_ts: datetime | None = None
    hostnames: list[str] = field(default_factory=list)
    gpus: list[tuple[int, str, str]] = field(default_factory=list)  # (id, uuid, hostname)
    names_gpus: bool = False  # the job names its GPUs (else ``gpus`` are its nodes' physical GPUs)

    @property
    def holding(self) -> bool:
        return self.state in HOLDING_STATES

    @property
    def labels(self) -> dict[str, str]:
        return {
            "site": self.site,
            "job": str(self.pk),
            "job_name": self.name,
            "team": self.team,
            "cluster": self.cluster,
        }

    def impact(self, key: str, gpu_hours: float, *, headline: bool = True, **extra: Any) -> dict[str, Any]:
        """The job's whole gang (the GPUs the incident says are affected), and the finding's own
        GPU-hours under ``key`` (and, with ``headline``, under ``gpu_hours``, which the engine adds
        up into the incident's GPU-hours lost: only hours lost, never hours merely at risk).

        Where the job names as many GPUs as its gang, they are named (``gpu_uuids``), so a GPU
        fault on one of them in the same incident does not count its GPUs twice."""
        uuids = sorted({uuid for _, uuid, _ in self.gpus})
        named: dict[str, Any] = {"gpu_uuids": uuids} if len(uuids) == self.gang else {}
        hours = round(gpu_hours, 3)
        engine = {"gpu_hours": hours} if headline else {}
        return {"gpus": self.gang, "unit": f"job:{self.pk}", **named, key: hours, **engine, **extra}

    @property
    def retained_since(self) -> datetime | None:
        """Since when the job's work is not checkpointed: its last checkpoint, or the attempt's
        start or restore when later (what came before them was lost or restored over)."""
        return _latest(self.last_checkpoint_at, self.progress_since, self.allocated_since)

    def at_risk_hours(self, until: datetime) -> float:
        """GPU-hours of work not yet checkpointed at ``until``: the account's at risk, from the
        events since the last checkpoint (goodput.stretch_of)."""
        since = self.retained_since
        if since is None or until <= since:
            return 0.0
        return stretch(self, since, until).account.at_risk_s / 3600


def stretch(job: JobRow, start: datetime, end: datetime) -> goodput.Stretch:
    """The job's account of [start, end] from that stretch's events (one indexed range read)."""
    rows = job_rows(job.pk, after=start, until=end)
    return goodput.stretch_of(rows, gang_size=job.gang, start_us=goodput.to_us(start), end_us=goodput.to_us(end))


def _latest(*stamps: datetime | None) -> datetime | None:
    present = [s for s in stamps if s is not None]
    return max(present) if present else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def candidate_jobs(
    now: datetime, *, ended_within: timedelta | None = None, hostnames: Iterable[str] | None = None
) -> list[JobRow]:
    """Jobs holding GPUs now (and, with ``ended_within``, jobs released that recently), with
    their GPUs; with ``hostnames``, only jobs on those hosts. Two queries: the jobs with their
    latest events (a backward scan of the (job, ts, seq) index that stops after a few rows), then
    their GPUs: those the job names, else its nodes' physical GPUs."""
    ended_after = now - ended_within if ended_within is not None else now
    gpus_through = Job.gpus.through._meta.db_table
    nodes_through = Job.nodes.through._meta.db_table
    on_hosts = ""
    params: list[Any] = [now, LATEST_EVENTS, list(HOLDING_STATES), JobState.RELEASED, ended_after]
    if hostnames is not None:
        hosts = sorted(set(hostnames))
        if not hosts:
            return []
        on_hosts = f"""AND (EXISTS (SELECT 1 FROM {nodes_through} jn JOIN fleet_node n ON n.id = jn.node_id
                                WHERE jn.job_id = j.id AND n.hostname = ANY(%s))
                      OR EXISTS (SELECT 1 FROM {gpus_through} jg JOIN fleet_gpu g ON g.id = jg.gpu_id
                                 JOIN fleet_node n ON n.id = g.node_id
                                 WHERE jg.job_id = j.id AND n.hostname = ANY(%s)))"""
        params += [hosts, hosts]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT j.id, j.name, j.team, j.cluster, s.name, j.gang_size, j.state, j.checkpoint_interval_s,
                   j.allocated_since, j.progress_since, j.last_step_at, j.last_checkpoint_at, j.ended_at,
                   j.events_seen, j.last_event_at, latest.kinds, latest.stamps, latest.reasons
            FROM fleet_job j
            JOIN fleet_site s ON s.id = j.site_id
            CROSS JOIN LATERAL (
                SELECT array_agg(e.kind ORDER BY e.ts DESC, e.seq DESC) AS kinds,
                       array_agg(e.ts ORDER BY e.ts DESC, e.seq DESC) AS stamps,
                       array_agg(e.reason ORDER BY e.ts DESC, e.seq DESC) AS reasons
                FROM (SELECT kind, ts, seq, reason FROM fleet_jobevent
                      WHERE job_id = j.id AND ts <= %s ORDER BY ts DESC, seq DESC LIMIT %s) e
            ) latest
            WHERE (j.state = ANY(%s) OR (j.state = %s AND j.ended_at > %s)) {on_hosts}
            ORDER BY j.id
            """,
            params,
        )
        rows: dict[int, JobRow] = {}
        for r in cursor.fetchall():
            job = JobRow(*r[:15])
            kinds, stamps, reasons = r[15] or [], r[16] or [], r[17] or []
            job.failed_at, job.failed_reason = _latest_failure(kinds, stamps, reasons)
            job.recovering_from, job.recovering_reason = _unrecovered_failure(kinds, stamps, reasons)
            if kinds:
                job.latest_kind, job.latest_ts = kinds[0], stamps[0]
            rows[job.pk] = job
    if not rows:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT jn.job_id, n.hostname, NULL, NULL, false FROM {nodes_through} jn
            JOIN fleet_node n ON n.id = jn.node_id WHERE jn.job_id = ANY(%s)
            UNION ALL
            SELECT jg.job_id, n.hostname, g.id, g.uuid, true FROM {gpus_through} jg
            JOIN fleet_gpu g ON g.id = jg.gpu_id JOIN fleet_node n ON n.id = g.node_id WHERE jg.job_id = ANY(%s)
            UNION ALL
            SELECT jn.job_id, n.hostname, g.id, g.uuid, false FROM {nodes_through} jn
            JOIN fleet_node n ON n.id = jn.node_id
            JOIN fleet_gpu g ON g.node_id = jn.node_id AND g.parent_id IS NULL
            WHERE jn.job_id = ANY(%s) AND NOT EXISTS (SELECT 1 FROM {gpus_through} x WHERE x.job_id = jn.job_id)
            """,
            [list(rows)] * 3,
        )
        for job_id, hostname, gpu_id, uuid, named in cursor.fetchall():
            job = rows[job_id]
            job.names_gpus = job.names_gpus or named
            if hostname not in job.hostnames:
                job.hostnames.append(hostname)
            if gpu_id is not None:
                job.gpus.append((gpu_id, uuid, hostname))
    for job in rows.values():
        job.hostnames.sort()
    return list(rows.values())


def _latest_failure(kinds: list[str], stamps: list[datetime], reasons: list[str]) -> tuple[datetime | None, str]:
    """Whether the latest attempt failed: the latest event other than a release is a failure."""
    for kind, ts, reason in zip(kinds, stamps, reasons, strict=False):
        if kind == JobEventKind.RELEASED:
            continue
        return (ts, reason) if kind == JobEventKind.FAILED else (None, "")
    return None, ""


def _unrecovered_failure(kinds: list[str], stamps: list[datetime], reasons: list[str]) -> tuple[datetime | None, str]:
    """The latest failure with no progress after it (no step, save, restore or completion): the
    job still holds its GPUs failed, or was released, or is restarting. None when progress came
    after it, or when it lies beyond the latest events read (LATEST_EVENTS)."""
    for kind, ts, reason in zip(kinds, stamps, reasons, strict=False):
        if kind == JobEventKind.FAILED:
            return ts, reason
        if kind not in _NOT_PROGRESS:
            return None, ""
    return None, ""


@dataclass
class StepStats:
    steps: int = 0  # in the window
    wait_s: float = 0.0
    step_s: float = 0.0
    first_start: datetime | None = None  # the window's first step began (ts - step_time)
    last_ts: datetime | None = None
    nodes: dict[str, tuple[int, float]] = field(default_factory=dict)  # hostname -> (steps, median step time)


def recent_step_times(now: datetime, job_ids: Iterable[int]) -> dict[int, list[float]]:
    """Per job: the step times of its latest RECENT_STEPS steps (one backward range scan of the
    (job, ts, seq) index per job that stops after RECENT_STEPS rows)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT j.id, recent.times
            FROM unnest(%(ids)s::bigint[]) AS j(id)
            CROSS JOIN LATERAL (
                SELECT array_agg(step_time_s) AS times FROM (
                    SELECT step_time_s FROM fleet_jobevent
                    WHERE job_id = j.id AND kind = 'step' AND ts <= %(now)s
                    ORDER BY ts DESC, seq DESC LIMIT %(recent)s) r
            ) recent
            """,
            {"ids": ids, "now": now, "recent": RECENT_STEPS},
        )
        return {job_id: list(times or []) for job_id, times in cursor.fetchall()}


def step_stats(
    now: datetime, job_ids: Iterable[int], *, per_node: bool | Iterable[int] = False
) -> dict[int, StepStats]:
    """Per job: the window's step count, data wait and span (and, for the jobs in ``per_node``,
    or all with ``per_node=True``, each reporting node's step count and median step time). One
    query: LATERAL range scans of the (job, ts, seq) index per job."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    node_ids = ids if per_node is True else sorted(set(per_node or []))
    with connection.cursor() as cursor:
        # CASE evaluates the per-node subquery only for the jobs that need it.
        cursor.execute(
            """
            SELECT j.id, win.n, win.wait, win.total, win.first_start, win.last_ts,
                   CASE WHEN j.id = ANY(%(node_ids)s) THEN (
                       SELECT coalesce(json_agg(json_build_array(node, n, median)), '[]'::json) FROM (
                           SELECT node, count(*) AS n,
                                  percentile_cont(0.5) WITHIN GROUP (ORDER BY step_time_s) AS median
                           FROM fleet_jobevent
                           WHERE job_id = j.id AND kind = 'step' AND node <> ''
                             AND ts > %(since)s AND ts <= %(now)s
                           GROUP BY node) per_node)
                   ELSE '[]'::json END
            FROM unnest(%(ids)s::bigint[]) AS j(id)
            CROSS JOIN LATERAL (
                SELECT count(*) AS n, sum(coalesce(data_wait_s, 0)) AS wait, sum(step_time_s) AS total,
                       min(ts - make_interval(secs => step_time_s)) AS first_start, max(ts) AS last_ts
                FROM fleet_jobevent
                WHERE job_id = j.id AND kind = 'step' AND ts > %(since)s AND ts <= %(now)s
            ) win
            """,
            {"ids": ids, "node_ids": node_ids, "now": now, "since": now - WINDOW},
        )
        out = {}
        for job_id, n, wait, total, first_start, last_ts, nodes in cursor.fetchall():
            out[job_id] = StepStats(
                steps=n,
                wait_s=wait or 0.0,
                step_s=total or 0.0,
                first_start=first_start,
                last_ts=last_ts,
                nodes={node: (count, median) for node, count, median in (nodes or [])},
            )
        return out


# The window's statistics of the running jobs, computed once per ``now`` for the data-stall and
# straggler detectors. Keyed by now and every job's events_seen too: a new event (or another
# test's jobs at the same ``now``) is a miss, never a stale answer.
_window_cache: dict[str, Any] = {}  # "entry": (key, stats), replaced whole


def _multi_node(job: JobRow) -> bool:
    return len({h for _, _, h in job.gpus} | set(job.hostnames)) >= 2


def window_stats(now: datetime, jobs: Iterable[JobRow]) -> dict[int, StepStats]:
    """step_stats for these running jobs (per node for those on >= 2 nodes), computed once per
    ``now`` and set of jobs' event counts and shared by the detectors that read it."""
    jobs = list(jobs)
    key = (now, tuple(sorted((j.pk, j.events_seen) for j in jobs)))
    cached_key, cached = _window_cache.get("entry", (None, None))
    if cached_key == key:
        return cached
    stats = step_stats(now, (j.pk for j in jobs), per_node=[j.pk for j in jobs if _multi_node(j)])
    _window_cache["entry"] = (key, stats)  # one entry, the current cycle's, swapped in one step
    return stats


def gpu_activity(now: datetime, gpu_ids: Iterable[int]) -> dict[int, tuple[float | None, float | None]]:
    """Per GPU over the last ten minutes of samples: (mean utilisation %, mean SM activity %, its
    sm_active where reported, else its utilisation). One scan of the window's samples of these
    GPUs, as the GPU-health detectors scan theirs (the minute rollups carry no SM activity)."""
    ids = sorted(set(gpu_ids))
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT gpu_id, avg(gpu_util), coalesce(avg(sm_active) * 100, avg(gpu_util))
            FROM fleet_gpusample
            WHERE gpu_id = ANY(%s) AND ts > %s AND ts <= %s
            GROUP BY gpu_id
            """,
            [ids, now - WINDOW, now],
        )
        return {gpu_id: (util, active) for gpu_id, util, active in cursor.fetchall()}


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _running(now: datetime) -> list[JobRow]:
    return [j for j in candidate_jobs(now) if j.state == JobState.RUNNING]


def longest_blocking_s(now: datetime, job_ids: Iterable[int]) -> dict[int, float]:
    """Per job: its longest observed checkpoint save or restore (duration_s), up to ``now``."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT job_id, max(duration_s) FROM fleet_jobevent
            WHERE job_id = ANY(%s) AND kind = ANY(%s) AND ts <= %s AND duration_s IS NOT NULL
            GROUP BY job_id
            """,
            [ids, [JobEventKind.CHECKPOINT_SAVED, JobEventKind.RESTORED], now],
        )
        return {job_id: float(longest) for job_id, longest in cursor.fetchall()}


# The latest event opens a stretch that blocks steps: a synchronous save, or a (re)start that a
# restore will follow.
BLOCKING_KINDS = (JobEventKind.CHECKPOINT_STARTED, JobEventKind.STARTED)


def _blocking_allowance_s(job: JobRow, longest: float | None) -> float:
    """Extra seconds for the save or (re)start in progress: 1.5 x the job's longest observed save
    or restore, else 1.5 x BLOCKING_DEFAULT_S; none for a start with no checkpoint to restore
    (a hang in start-up, in NCCL's initialisation say, pages at the base threshold)."""
    if longest is None and job.latest_kind == JobEventKind.STARTED and job.last_checkpoint_at is None:
        return 0.0
    return BLOCKING_MARGIN * (longest if longest is not None else BLOCKING_DEFAULT_S)


def _hangs_ended(now: datetime, hung: set[int]) -> list[FindingSpec]:
    """Final figures for the hangs that ended since the last run (the job progressed, failed or
    was released): gang x the time from the hang's start to that moment, as the account has it,
    not as of the run before it ended."""
    ended = {
        int(fingerprint.rsplit(":", 1)[1]): started
        for fingerprint, started in firing_since("training-hang").items()
        if int(fingerprint.rsplit(":", 1)[1]) not in hung
    }
    if not ended:
        return []
    specs = []
    for job in candidate_jobs(now, ended_within=FAILED_WITHIN):
        started = ended.get(job.pk)
        if started is None or now <= started:
            continue
        quiet_s = stretch(job, started, now).quiet_s
        # A restart stalled before its first progress is its failure's re-initialisation.
        held = 0.0 if job.recovering_from is not None and job.recovering_from <= started else job.gang * quiet_s / 3600
        specs.append(
            FindingSpec(
                fingerprint=f"training-hang:{job.pk}",
                labels=job.labels,
                severity=Severity.SEV2,
                summary=f"Suspected hang: {job.name} ({job.gang} GPUs) made no step for {_minutes(quiet_s)}",
                impact=job.impact("gpu_hours_lost", held, gpu_hours_held=round(job.gang * quiet_s / 3600, 3)),
                category="training",
                started_at=started,
                final=True,
            )
        )
    return specs


@detector("training-hang")
def training_hang(now: datetime) -> list[FindingSpec]:
    """A running job without a step for longer than max(10 x median step time, 300 s), measured
    from its last progress (its last step, the attempt's start or restore, or a checkpoint save
    it started, whichever is latest). While a save or a (re)start is in progress, the threshold
    grows by 1.5 x the job's longest observed save or restore (10 minutes where it has none, see
    _blocking_allowance_s). GPU utilisation does not clear it:
    a hung collective keeps the GPUs spinning at 100 %."""
    jobs = [j for j in _running(now) if _latest(j.last_step_at, j.progress_since) is not None]
    recent = recent_step_times(now, (j.pk for j in jobs))
    over: list[tuple[JobRow, datetime, float, float, bool]] = []
    for job in jobs:
        blocking = job.latest_kind in BLOCKING_KINDS and job.latest_ts is not None
        since = _latest(job.last_step_at, job.progress_since, job.latest_ts if blocking else None)
        assert since is not None
        threshold = hang_threshold_s(recent.get(job.pk, []))
        stalled = (now - since).total_seconds()
        if stalled > threshold:
            over.append((job, since, stalled, threshold, blocking))
    # Only the few jobs past the base threshold mid-save or mid-start need their history.
    longest = longest_blocking_s(now, (job.pk for job, *_, blocking in over if blocking))
    hung: list[tuple[JobRow, datetime, float, float]] = []
    for job, since, stalled, threshold, blocking in over:
        if blocking:
            threshold += _blocking_allowance_s(job, longest.get(job.pk))
        if stalled > threshold:
            hung.append((job, since, stalled, threshold))
    activity = gpu_activity(now, (g for job, *_ in hung for g, _, _ in job.gpus)) if hung else {}
    specs = _hangs_ended(now, {job.pk for job, *_ in hung})
    for job, since, stalled, threshold in hung:
        # Gang x the time without progress. A restart after a failure that stalls before its first
        # progress is that failure's re-initialisation, counted in its cost: not counted twice.
        held = job.gang * stalled / 3600
        counted_in_failure = job.recovering_from is not None
        summary = (
            f"Suspected hang: {job.name} ({job.gang} GPUs) has made no step for {_minutes(stalled)} "
            f"(threshold {_minutes(threshold)})"
        )
        util = _mean(activity.get(g, (None, None))[0] for g, _, _ in job.gpus)
        if util is not None:
            summary += f" while its GPUs report {util:.0f} % utilisation"
        specs.append(
            FindingSpec(
                fingerprint=f"training-hang:{job.pk}",
                labels=job.labels,
                severity=Severity.SEV2,
                summary=summary,
                description=(
                    "No training step for longer than max(10 x the job's median step time, 5 minutes). "
                    "A collective (NCCL) waiting on a lost peer or link keeps GPUs busy, so utilisation "
                    "does not prove progress. Check the job's logs for NCCL timeouts and its nodes' links."
                ),
                # Held GPU-hours are lost, not at risk: the engine's headline figure.
                impact=job.impact(
                    "gpu_hours_lost",
                    0.0 if counted_in_failure else held,
                    gpu_hours_held=round(held, 3),
                    stalled_s=round(stalled),
                    threshold_s=round(threshold),
                    gpu_util=util,
                    **({"counted_in": "training-job-failed"} if counted_in_failure else {}),
                ),
                category="training",
                started_at=since,
            )
        )
    return _with_hooks(now, specs)


@detector("training-data-stall")
def training_data_stall(now: datetime) -> list[FindingSpec]:
    """Over the last ten minutes (at least 5 steps spanning 5 minutes) the job waited for input
    data for >= 30 % of its step time (a stall already firing: >= 20 %), as the job reports it
    (data_wait_s over step_time_s), whatever its GPUs' utilisation: a 40 % wait leaves them about
    60 % busy. Utilisation only sets the severity: SEV3 where the job's GPUs average under 50 %
    (or report no telemetry), SEV4 where they stay busier. GPU-hours lost: the account's
    data-loading stall x gang over the episode (since the firing finding started, else since the
    window's first step began)."""
    jobs = {j.pk: j for j in _running(now)}
    stats = window_stats(now, jobs.values())
    firing = firing_since("training-data-stall")
    stalled = {
        pk: s
        for pk, s in stats.items()
        if s.steps >= STALL_MIN_STEPS
        and s.step_s > 0
        and s.wait_s / s.step_s >= (STALL_CLEAR_FRACTION if f"training-data-stall:{pk}" in firing else STALL_FRACTION)
        and s.first_start is not None
        and s.last_ts is not None
        and s.last_ts - s.first_start >= STALL_MIN_SPAN
    }
    activity = gpu_activity(now, (g for pk in stalled for g, _, _ in jobs[pk].gpus))
    specs = []
    for pk, s in stalled.items():
        job = jobs[pk]
        fraction = s.wait_s / s.step_s
        util = _mean(activity.get(g, (None, None))[0] for g, _, _ in job.gpus)
        fingerprint = f"training-data-stall:{pk}"
        started = firing.get(fingerprint) or s.first_start
        assert started is not None
        summary = f"Data-loader stall: {job.name} waited for input {fraction:.0%} of its step time over 10 min"
        if util is not None:
            summary += f"; its GPUs average {util:.0f} % utilisation"
        stall_s = stretch(job, started, now).account.data_stall_s if now > started else 0.0
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels=job.labels,
                severity=Severity.SEV3 if util is None or util < STALL_UTIL_BELOW else Severity.SEV4,
                summary=summary,
                description=(
                    "The input pipeline does not keep up: steps wait for data. Check the data loader's "
                    "workers, the storage it reads from and pre-processing on the CPUs."
                ),
                # GPU-time spent waiting for data over the whole episode, as the job's account has it.
                impact=job.impact(
                    "gpu_hours_lost", stall_s / 3600, data_wait_fraction=round(fraction, 3), gpu_util=util
                ),
                category="training",
                started_at=started,
            )
        )
    return _with_hooks(now, specs)


@detector("training-straggler")
def training_straggler(now: datetime) -> list[FindingSpec]:
    """In a job on >= 2 nodes, a node whose median step time over ten minutes is >= 1.3 x the
    median of its peers' medians, or whose GPUs' mean SM activity is <= 0.7 x its peers' median
    (one already firing: >= 1.2 x, <= 0.8 x): in synchronous training the whole gang waits for
    it. One finding per job and node; GPU-hours lost: (1 - 1 / slowdown) x the gang's compute
    over the whole episode (the account's compute, whatever became of it)."""
    running = _running(now)
    jobs = {j.pk: j for j in running if _multi_node(j)}
    # All running jobs, as the data-stall detector asks: the same cycle's statistics, computed once.
    stats = window_stats(now, running) if jobs else {}
    firing = firing_since("training-straggler") if jobs else {}
    activity = gpu_activity(now, (g for j in jobs.values() for g, _, _ in j.gpus))
    specs = []
    for pk, job in jobs.items():
        slow: dict[str, list[str]] = {}
        slowdown: dict[str, float] = {}

        def was_firing(host: str, pk: int = pk) -> bool:
            return f"training-straggler:{pk}:{host}" in firing

        job_stats = stats.get(pk, StepStats())
        nodes = {h: m for h, (n, m) in job_stats.nodes.items() if n >= STRAGGLER_MIN_STEPS}
        if len(nodes) >= 2:
            for host, median in nodes.items():
                peers = statistics.median(m for h, m in nodes.items() if h != host)
                ratio = STRAGGLER_CLEAR_STEP_RATIO if was_firing(host) else STRAGGLER_STEP_RATIO
                if peers > 0 and median >= ratio * peers:
                    slow.setdefault(host, []).append(f"median step {median:.2f} s vs {peers:.2f} s on its peers")
                    slowdown[host] = median / peers
        per_node: dict[str, list[float]] = {}
        for gpu_id, _, host in job.gpus:
            active = activity.get(gpu_id, (None, None))[1]
            if active is not None:
                per_node.setdefault(host, []).append(active)
        node_activity = {h: sum(v) / len(v) for h, v in per_node.items()}
        if len(node_activity) >= 2:
            for host, active in node_activity.items():
                peers = statistics.median(a for h, a in node_activity.items() if h != host)
                ratio = STRAGGLER_CLEAR_ACTIVITY_RATIO if was_firing(host) else STRAGGLER_ACTIVITY_RATIO
                if peers >= STRAGGLER_MIN_PEER_ACTIVITY and active <= ratio * peers:
                    slow.setdefault(host, []).append(f"SM activity {active:.0f} % vs {peers:.0f} % on its peers")
                    slowdown.setdefault(host, peers / max(active, 1.0))
        window_start = _latest(job_stats.first_start, now - WINDOW)
        for host, reasons in sorted(slow.items()):
            fingerprint = f"training-straggler:{pk}:{host}"
            started = firing.get(fingerprint) or window_start
            # The gang computes at the straggler's pace: 1 - 1/slowdown of its compute is lost, over
            # the whole episode (since the firing finding started, else the window's first step).
            compute_s = stretch(job, started, now).compute_s if now > started else 0.0
            lost = (1 - 1 / slowdown[host]) * compute_s / 3600
            specs.append(
                FindingSpec(
                    fingerprint=fingerprint,
                    labels={**job.labels, "hostname": host},
                    severity=Severity.SEV3,
                    summary=f"Straggler: {host} slows {job.name} ({'; '.join(reasons)})",
                    description=(
                        "Synchronous training runs at its slowest node's pace. Check the node's GPUs "
                        "(clocks, thermals, power), its network links and its CPU and memory pressure."
                    ),
                    impact=job.impact("gpu_hours_lost", lost, slowdown=round(slowdown[host], 2)),
                    category="training",
                    started_at=started,
                )
            )
    return specs


@detector("training-checkpoint-overdue")
def training_checkpoint_overdue(now: datetime) -> list[FindingSpec]:
    """A running job with a planned interval and no checkpoint for 2 x that interval, counted from
    its last checkpoint, or from the attempt's start when it has saved none since."""
    specs = []
    for job in _running(now):
        if not job.checkpoint_interval_s:
            continue
        since = job.last_checkpoint_at
        if since is None or (job.progress_since is not None and since < job.progress_since):
            since = job.progress_since
        if since is None:
            continue
        overdue_after = CHECKPOINT_OVERDUE_MULTIPLE * job.checkpoint_interval_s
        age = (now - since).total_seconds()
        if age <= overdue_after:
            continue
        specs.append(
            FindingSpec(
                fingerprint=f"training-checkpoint-overdue:{job.pk}",
                labels=job.labels,
                severity=Severity.SEV3,
                summary=(
                    f"Checkpoint overdue: {job.name} has not checkpointed for {_minutes(age)} "
                    f"(planned every {_minutes(job.checkpoint_interval_s)})"
                ),
                description="A failure now loses all the work since the last checkpoint, on every GPU of the gang.",
                # At risk, not lost: no headline ``gpu_hours`` for the incident's GPU-hours lost. The
                # account's work not yet checkpointed.
                impact=job.impact("gpu_hours_at_risk", job.at_risk_hours(now), headline=False),
                category="training",
                started_at=since + timedelta(seconds=overdue_after),
            )
        )
    return specs


# A failed job's disruptions, kept per job between detector runs while no event arrives: a job of
# 300,000 events takes a second to sweep, and meanwhile its cost only grows with the clock.
_losses_cache: dict[int, tuple[int, datetime, list[goodput.FailureLoss]]] = {}


def failure_cost(job: JobRow, now: datetime, *, since: datetime | None = None) -> list[goodput.FailureLoss]:
    """The disruptions the job has not recovered from (goodput.unrecovered: the failure, and any
    failure of its restart), as its whole account has them at ``now``: one definition with the
    job page's failure rows. With ``since``, the disruptions from then on, recovered or not (a
    finding's whole episode, once it is over). A part still growing (waiting, or
    re-initialisation) grows with the clock until the next event, so the sweep is reused until
    then."""
    cached = _losses_cache.get(job.pk)
    if (
        cached is not None
        and cached[0] == job.events_seen
        and now >= cached[1]
        and (job.last_event_at is None or cached[1] >= job.last_event_at)
    ):
        _, then, found = cached
        extra = job.gang * (now - then).total_seconds()
        found = [
            dataclasses.replace(x, **{f"{x.growing}_gpu_s": getattr(x, f"{x.growing}_gpu_s") + extra})
            if x.growing
            else x
            for x in found
        ]
    else:
        rows = job_rows(job.pk, until=now)
        found = goodput.failure_losses_of_rows(rows, gang_size=job.gang, now_us=goodput.to_us(now))
        _losses_cache[job.pk] = (job.events_seen, now, found)
    if since is not None:
        return [x for x in found if x.ts >= since]
    return goodput.unrecovered(found)


@detector("training-job-failed")
def training_job_failed(now: datetime) -> list[FindingSpec]:
    """A job whose latest failure it has made no progress since: still holding its GPUs, restarting
    (re-initialising, restoring), or released within the last 30 minutes. GPU-hours lost: what the
    failure cost (goodput.FailureLoss: progress lost since the retained checkpoint + waiting to
    restart + re-initialisation + restore; a failure of the restart adds its own), the parts beside
    it. It grows while the job waits or restarts and is fixed once the job is released or makes
    progress (and the finding clears)."""
    specs = []
    jobs = candidate_jobs(now, ended_within=FAILED_WITHIN)
    firing = firing_since("training-job-failed")
    for job in jobs:
        fingerprint = f"training-job-failed:{job.pk}"
        final = job.recovering_from is None or (not job.holding and now - job.recovering_from > FAILED_WITHIN)
        if final and fingerprint not in firing:
            continue
        # Once the job made progress again (or its 30 minutes after the release are over), the
        # failure's cost is final: its finding takes the whole of it as it clears.
        chain = failure_cost(job, now, since=firing[fingerprint] if final else None)
        if not chain:
            continue
        parts = {
            "progress_lost_gpu_h": sum(x.lost_gpu_s for x in chain) / 3600,
            "waiting_gpu_h": sum(x.waiting_gpu_s for x in chain) / 3600,
            "reinit_gpu_h": sum(x.reinit_gpu_s for x in chain) / 3600,
            "restore_gpu_h": sum(x.restore_gpu_s for x in chain) / 3600,
        }
        reason = f" ({job.recovering_reason})" if job.recovering_reason else ""
        checkpoint = chain[0].checkpoint_step
        fell_back = f"step {checkpoint}" if checkpoint is not None else "its start: no checkpoint"
        specs.append(
            FindingSpec(
                fingerprint=f"training-job-failed:{job.pk}",
                labels=job.labels,
                severity=Severity.SEV3,
                # No figure in the summary: it becomes the incident's title and would go stale
                # beside the incident's GPU-hours, which keep counting while the job waits.
                summary=f"{job.name} failed{reason}: it falls back to {fell_back}",
                description=(
                    "What the failure cost = progress lost since the retained checkpoint + waiting to restart "
                    "+ re-initialisation + restore, each gang size x time."
                ),
                impact=job.impact(
                    "gpu_hours_lost",
                    sum(parts.values()),
                    **{k: round(v, 3) for k, v in parts.items()},
                    failures=len(chain),
                    checkpoint_step=checkpoint,
                    growing=chain[-1].growing,
                    reason=job.recovering_reason[:200],
                    # What the reason says caused it (failures.classify): the fabric correlation
                    # reads it (an NCCL timeout on nodes whose links flapped).
                    failure_class=classify(job.recovering_reason).value,
                ),
                category="training",
                started_at=chain[0].ts,
                final=final,
            )
        )
    seen = {job.pk for job in jobs}
    for pk in [pk for pk in _losses_cache if pk not in seen]:
        del _losses_cache[pk]
    return _with_hooks(now, specs)


def jobs_on(now: datetime, hostnames: Iterable[str], gpu_uuids: Iterable[str] = ()) -> dict[str, list[JobRow]]:
    """The jobs each of these hosts and GPUs (keys: ``host:<hostname>``, ``gpu:<uuid>``) runs, best
    first: jobs still holding GPUs ahead of released ones (released within FAILED_WITHIN: a fault
    that killed a job still belongs to it), then the largest gang, then the latest job. Reads only
    the jobs on these hosts."""
    hosts, uuids = set(hostnames) - {""}, set(gpu_uuids) - {""}
    if not hosts and not uuids:
        return {}
    out: dict[str, list[JobRow]] = {}
    jobs = candidate_jobs(now, ended_within=FAILED_WITHIN, hostnames=hosts)
    for job in sorted(jobs, key=lambda j: (not j.holding, -j.gang, -j.pk)):
        for host in sorted(set(job.hostnames) & hosts):
            out.setdefault(f"host:{host}", []).append(job)
        for uuid in sorted({uuid for _, uuid, _ in job.gpus} & uuids):
            out.setdefault(f"gpu:{uuid}", []).append(job)
    return out


def _may_own(job: JobRow, fault_at: datetime) -> bool:
    """A job holding GPUs owns a fault on them; a released one only if it failed and the fault
    began by its release (plus a grace: the fault is often seen just after the job died)."""
    if job.holding:
        return True
    return job.failed_at is not None and job.ended_at is not None and fault_at <= job.ended_at + FAULT_GRACE


def _owner(spec: FindingSpec, found: dict[str, list[JobRow]], now: datetime) -> JobRow | None:
    """The job a GPU finding belongs to: one using its GPU; else, for a node-scoped finding (a
    drain) or a job that names no GPUs (it may use any of the node's), one on its host."""
    fault_at = spec.started_at or now
    node_scoped = str(spec.impact.get("unit", "")).startswith("node:")
    for job in found.get(f"gpu:{spec.labels.get('gpu')}", []):
        if _may_own(job, fault_at):
            return job
    for job in found.get(f"host:{spec.labels.get('hostname')}", []):
        if (node_scoped or not job.names_gpus) and _may_own(job, fault_at):
            return job
    return None


def link_to_jobs(now: datetime, specs: list[FindingSpec]) -> list[FindingSpec]:
    """GPU-fault findings on a GPU or node that a job runs on, with the job's labels (so they join
    the job's incident) and ``job_gpus`` (its gang). What the fault costs the job is the job's own
    findings' to count: while it runs, its work not yet checkpointed is at risk
    (``gpu_hours_at_risk``, the account's, to now or its release); once it failed, its
    training-job-failed finding prices the failure (``job_failed_at`` says when). A linked fault
    carries no GPU-hours lost of its own (``gpu_hours``), nor GPUs out of service: the job holds
    them, and the incident would count them twice."""
    if not specs:
        return specs
    found = jobs_on(
        now,
        (s.labels.get("hostname", "") for s in specs),
        (s.labels.get("gpu", "") for s in specs),
    )
    if not found:
        return specs
    linked = []
    at_risk: dict[int, float] = {}
    for spec in specs:
        job = _owner(spec, found, now)
        if job is None:
            linked.append(spec)
            continue
        cost: dict[str, Any] = {"job_gpus": job.gang}
        if job.failed_at is not None:
            cost["job_failed_at"] = job.failed_at.isoformat()
        else:
            if job.pk not in at_risk:
                until = min(now, job.ended_at) if job.ended_at is not None else now
                at_risk[job.pk] = round(job.at_risk_hours(until), 3)
            cost["gpu_hours_at_risk"] = at_risk[job.pk]
        linked.append(
            FindingSpec(
                fingerprint=spec.fingerprint,
                labels={**spec.labels, "job": str(job.pk), "job_name": job.name, "team": job.team},
                severity=spec.severity,
                summary=f"{spec.summary} (job {job.name}, {job.gang} GPUs)",
                description=spec.description,
                impact={**{k: v for k, v in spec.impact.items() if k != "gpu_hours"}, **cost},
                category=spec.category,
                started_at=spec.started_at,
            )
        )
    return linked


def placed_jobs(now: datetime, hostnames: Iterable[str]) -> dict[str, list[placement.PlacedJob]]:
    """The jobs holding GPUs on each host now, for the rooms that may not import training."""
    found = jobs_on(now, hostnames)
    return {
        key.removeprefix("host:"): [placement.PlacedJob(j.pk, j.name, j.team, j.gang) for j in jobs if j.holding]
        for key, jobs in found.items()
        if key.startswith("host:")
    }
