"""The checkpoint advisor: how often a job should checkpoint, given what checkpoints cost it and
how often jobs of its size fail on its cluster (REFERENCE.md, "Training goodput").

Young: tau = sqrt(2 delta M). Daly: tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta
for delta < 2M, else tau = M. Expected waste fraction at interval tau: delta / tau + tau / 2M (the
blocking save time, plus half an interval of work lost per failure). delta is the blocking time of
one save, M the job's mean time between failures: the per-GPU MTBF over the gang size (a job of N
GPUs fails N times as often as one GPU).

Every input and every assumption travels in the Advice, in words, for the job page.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet.choices import JobEventKind
from fleet.training.models import Job

WINDOW_DAYS = 30
HOURS_PER_WEEK = 168
GANG_CLASSES: tuple[tuple[str, int, int | None], ...] = (
    ("1-8 GPUs", 1, 8),
    ("9-64 GPUs", 9, 64),
    ("65-512 GPUs", 65, 512),
    ("513-4096 GPUs", 513, 4096),
    (">4096 GPUs", 4097, None),
)


def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: sqrt(2 delta M)."""
    return math.sqrt(2 * delta_s * mtbf_s)


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum; M itself when the checkpoint costs at least 2M."""
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = delta_s / (2 * mtbf_s)
    return math.sqrt(2 * delta_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + delta_s / (18 * mtbf_s)) - delta_s


def expected_waste_fraction(interval_s: float, delta_s: float, mtbf_s: float) -> float:
    """The fraction of time lost at a checkpoint interval: delta / tau + tau / 2M."""
    return delta_s / interval_s + interval_s / (2 * mtbf_s)


@dataclass
class Advice:
    """A checkpoint interval recommendation with every input it used.

    Intervals and costs in seconds; waste as fractions of allocated time; the saving in GPU-hours
    a week. For a gang-size class of a cluster (advise_cluster), job_id is None and gang_class,
    jobs say which jobs it stands for.
    """

    gang_size: int
    checkpoint_cost_s: float
    checkpoint_cost_source: str  # "job" or "cluster"
    saves_observed: int
    failures_observed: int
    cluster_gpu_hours: float
    gpu_mtbf_h: float
    mtbf_assumed: bool
    job_mtbf_s: float
    current_interval_s: float | None
    current_interval_source: str | None  # "planned", "observed" or None
    young_interval_s: float
    daly_interval_s: float
    recommended_interval_s: float
    waste_current: float | None
    waste_recommended: float
    gpu_hours_saved_per_week: float | None
    assumptions: list[str] = field(default_factory=list)
    # Where the per-GPU MTBF comes from, each figure labelled: "observed", "assumed" or "blended"
    # (gpu_mtbf_h is then neither the observed nor the assumed one, but their blend).
    gpu_mtbf_source: str = "assumed"
    observed_gpu_mtbf_h: float | None = None  # cluster GPU-hours / failures, where both are > 0
    assumed_gpu_mtbf_h: float = 0.0
    observed_weight: float = 0.0
    mtbf_explained: str = ""
    # The waste model (cost / interval + interval / 2 MTBF) is least at Young's interval; the saving
    # is computed from the current interval to the recommended (Daly's) one, as saving_explained says.
    waste_young: float = 0.0
    saving_interval_s: float = 0.0
    saving_explained: str = ""
    job_id: int | None = None
    gang_class: str | None = None
    jobs: int = 1
    window_days: int = WINDOW_DAYS


@dataclass
class FailureRate:
    """Failures and allocated GPU-hours of one cluster over the window, and the per-GPU MTBF.

    observed_weight is how much of the MTBF comes from what was observed (0 to 1, see
    cluster_failure_rate); assumed is True when any of it is the assumed per-GPU MTBF.
    """

    failures: int
    gpu_hours: float
    gpu_mtbf_h: float
    assumed: bool
    observed_weight: float = 1.0


# Below these the observed rate is too noisy to stand alone (one bad day of a small cluster).
MIN_FAILURES = 3
MIN_GPU_HOURS = 1000.0

# Failures that count: the first failed event of each attempt (an attempt starts at allocated,
# resumed or started), and only if the attempt made a step before it: one crash reported by many
# nodes, or a job that cannot start and fails again and again, is not the hardware failing often.
_FAILURES_SQL = """
    SELECT count(DISTINCT (f.job_id, f.attempt)) FROM (
        SELECT e.job_id, e.ts, COALESCE(
            (SELECT max(b.ts) FROM fleet_jobevent b
              WHERE b.job_id = e.job_id AND b.kind IN (%s, %s, %s) AND b.ts <= e.ts),
            '-infinity'::timestamptz) AS attempt
          FROM fleet_jobevent e JOIN fleet_job j ON j.id = e.job_id
         WHERE j.site_id = %s AND j.cluster = %s AND e.kind = %s AND e.ts >= %s AND e.ts < %s
    ) f
    WHERE EXISTS (
        SELECT 1 FROM fleet_jobevent s
         WHERE s.job_id = f.job_id AND s.kind = %s AND s.ts >= f.attempt AND s.ts <= f.ts
    )
"""


def assumed_gpu_mtbf_hours() -> float:
    return float(settings.ASSUMED_GPU_MTBF_HOURS)


def blended_gpu_mtbf_h(failures: int, gpu_hours: float, assumed_h: float) -> tuple[float, float]:
    """(per-GPU MTBF in hours, weight of the observed rate).

    The weight is min(failures / 3, GPU-hours / 1,000, 1); the failure rates (1 / MTBF) are
    blended: weight x failures / GPU-hours + (1 - weight) / assumed. Continuous: no failures or no
    hours give the assumed MTBF exactly, 3 failures over 1,000 GPU-hours or more the observed one.
    """
    if failures <= 0 or gpu_hours <= 0:
        return assumed_h, 0.0
    weight = min(failures / MIN_FAILURES, gpu_hours / MIN_GPU_HOURS, 1.0)
    if weight >= 1.0:
        return gpu_hours / failures, 1.0
    rate = weight * failures / gpu_hours + (1 - weight) / assumed_h
    return 1 / rate, weight


def cluster_failure_rate(site_id: int, cluster: str, *, now: datetime) -> FailureRate:
    """Failures over allocated GPU-hours of the cluster's jobs in the last 30 days (two queries).

    A failure counts once per attempt, and only after the attempt's first step (_FAILURES_SQL).
    With fewer than 3 such failures or 1,000 GPU-hours the observed rate is blended with the
    assumed per-GPU MTBF (blended_gpu_mtbf_h); with none, the MTBF is the assumed one.
    """
    since = now - timedelta(days=WINDOW_DAYS)
    with connection.cursor() as cursor:
        cursor.execute(
            _FAILURES_SQL,
            [
                JobEventKind.ALLOCATED,
                JobEventKind.RESUMED,
                JobEventKind.STARTED,
                site_id,
                cluster,
                JobEventKind.FAILED,
                since,
                now,
                JobEventKind.STEP,
            ],
        )
        failures = cursor.fetchone()[0]
        cursor.execute(
            "SELECT COALESCE(SUM(a.allocated_s), 0) FROM fleet_jobaccount a JOIN fleet_job j ON j.id = a.job_id "
            "WHERE j.site_id = %s AND j.cluster = %s AND a.hour >= %s AND a.hour < %s",
            [site_id, cluster, since, now],
        )
        gpu_hours = float(cursor.fetchone()[0]) / 3600
    mtbf_h, weight = blended_gpu_mtbf_h(failures, gpu_hours, assumed_gpu_mtbf_hours())
    return FailureRate(failures, gpu_hours, mtbf_h, assumed=weight < 1.0, observed_weight=weight)


def _save_events(job_ids: list[int], *, since: datetime | None = None) -> dict[int, list[tuple[datetime, float]]]:
    """(ts, duration_s) of each job's checkpoint saves, in time order."""
    sql = (
        "SELECT job_id, ts, duration_s FROM fleet_jobevent WHERE job_id = ANY(%s) AND kind = %s "
        "AND duration_s IS NOT NULL"
    )
    params: list[object] = [job_ids, JobEventKind.CHECKPOINT_SAVED]
    if since is not None:
        sql += " AND ts >= %s"
        params.append(since)
    out: dict[int, list[tuple[datetime, float]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql + " ORDER BY job_id, ts, seq", params)
        for job_id, ts, duration in cursor.fetchall():
            out.setdefault(job_id, []).append((ts, duration))
    return out


def _cluster_median_save_s(site_id: int, cluster: str, *, now: datetime) -> tuple[float | None, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY e.duration_s), count(*) "
            "FROM fleet_jobevent e JOIN fleet_job j ON j.id = e.job_id "
            "WHERE j.site_id = %s AND j.cluster = %s AND e.kind = %s AND e.duration_s IS NOT NULL AND e.ts >= %s",
            [site_id, cluster, JobEventKind.CHECKPOINT_SAVED, now - timedelta(days=WINDOW_DAYS)],
        )
        median, count = cursor.fetchone()
    return median, count


def _observed_interval_s(saves: list[tuple[datetime, float]]) -> float | None:
    """The median time between consecutive saves (robust to the odd gap across a restart)."""
    gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(saves)]
    gaps = [g for g in gaps if g > 0]
    return statistics.median(gaps) if gaps else None


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def _build(
    *,
    gang_size: int,
    delta_s: float,
    cost_source: str,
    saves: int,
    rate: FailureRate,
    where: str,
    current_s: float | None,
    current_source: str | None,
    weekly_gpu_hours: float,
    weekly_basis: str,
) -> Advice:
    """The advice from its inputs, with the assumptions written out (_assumptions) and the MTBF
    and saving each explained in a sentence (_mtbf_explained, _saving_explained)."""
    job_mtbf_s = rate.gpu_mtbf_h * 3600 / gang_size
    young = young_interval_s(delta_s, job_mtbf_s)
    daly = daly_interval_s(delta_s, job_mtbf_s)
    waste_recommended = expected_waste_fraction(daly, delta_s, job_mtbf_s)
    waste_current = expected_waste_fraction(current_s, delta_s, job_mtbf_s) if current_s else None
    saved = (waste_current - waste_recommended) * weekly_gpu_hours if waste_current is not None else None
    near_optimum = waste_current is not None and waste_current <= waste_recommended
    if near_optimum:
        # Daly's interval is not the exact minimum of the displayed model (Young's is): a current
        # interval between them wastes no more than Daly's, and a saving is never negative.
        saved = 0.0
    waste_young = expected_waste_fraction(young, delta_s, job_mtbf_s)
    saving_explained = _saving_explained(current_s=current_s, daly=daly, young=young, waste_young=waste_young)
    source, observed_h, assumed_h, mtbf_explained = _mtbf_explained(rate, where)
    notes = _assumptions(
        gang_size=gang_size,
        delta_s=delta_s,
        cost_source=cost_source,
        saves=saves,
        rate=rate,
        where=where,
        current_s=current_s,
        current_source=current_source,
        job_mtbf_s=job_mtbf_s,
        young=young,
        daly=daly,
        near_optimum=near_optimum,
        saved=saved,
        weekly_basis=weekly_basis,
    )
    return Advice(
        gang_size=gang_size,
        checkpoint_cost_s=delta_s,
        checkpoint_cost_source=cost_source,
        saves_observed=saves,
        failures_observed=rate.failures,
        cluster_gpu_hours=rate.gpu_hours,
        gpu_mtbf_h=rate.gpu_mtbf_h,
        mtbf_assumed=rate.assumed,
        job_mtbf_s=job_mtbf_s,
        current_interval_s=current_s,
        current_interval_source=current_source,
        young_interval_s=young,
        daly_interval_s=daly,
        recommended_interval_s=daly,
        waste_current=waste_current,
        waste_recommended=waste_recommended,
        gpu_hours_saved_per_week=saved,
        assumptions=notes,
        gpu_mtbf_source=source,
        observed_gpu_mtbf_h=observed_h,
        assumed_gpu_mtbf_h=assumed_h,
        observed_weight=rate.observed_weight,
        mtbf_explained=mtbf_explained,
        waste_young=waste_young,
        saving_interval_s=daly,
        saving_explained=saving_explained,
    )


def _saving_explained(*, current_s: float | None, daly: float, young: float, waste_young: float) -> str:
    """Which interval the saving is computed for, and against what."""
    if not current_s:
        return (
            f"No current interval to compare: the figures are for Daly's interval {_hours(daly)} (recommended). "
            f"The waste model's minimum is at Young's interval {_hours(young)} ({waste_young:.2%})."
        )
    return (
        f"Saving computed for Daly's interval {_hours(daly)} (recommended), against the current "
        f"{_hours(current_s)}. The waste model's minimum is at Young's interval {_hours(young)} "
        f"({waste_young:.2%}), which Daly's refines for the restart it does not model."
    )


def _mtbf_explained(rate: FailureRate, where: str) -> tuple[str, float | None, float, str]:
    """Where the per-GPU MTBF comes from (observed, assumed or blended), the observed and assumed
    figures, and the sentence that says so."""
    assumed_h = assumed_gpu_mtbf_hours()
    observed_h = rate.gpu_hours / rate.failures if rate.failures > 0 and rate.gpu_hours > 0 else None
    if rate.observed_weight >= 1.0:
        source = "observed"
        mtbf_explained = (
            f"observed per-GPU MTBF {rate.gpu_mtbf_h:,.0f} GPU-hours = {rate.gpu_hours:,.0f} GPU-hours / "
            f"{_count(rate.failures, 'failure')} on {where} in {WINDOW_DAYS} days"
        )
    elif rate.observed_weight <= 0:
        source = "assumed"
        mtbf_explained = (
            f"assumed per-GPU MTBF {assumed_h:,.0f} GPU-hours ({_count(rate.failures, 'failure')} and "
            f"{rate.gpu_hours:,.0f} GPU-hours observed on {where} in {WINDOW_DAYS} days)"
        )
    else:
        source = "blended"
        observed_text = f"{observed_h:,.0f} GPU-hours" if observed_h is not None else "none"
        mtbf_explained = (
            f"blended per-GPU MTBF {rate.gpu_mtbf_h:,.0f} GPU-hours: observed {observed_text} "
            f"({_count(rate.failures, 'failure')} over {rate.gpu_hours:,.0f} GPU-hours on {where} "
            f"in {WINDOW_DAYS} days) "
            f"weighted {rate.observed_weight:.0%}, assumed {assumed_h:,.0f} GPU-hours weighted "
            f"{1 - rate.observed_weight:.0%} (failure rates blended)"
        )
    return source, observed_h, assumed_h, mtbf_explained


def _assumptions(
    *,
    gang_size: int,
    delta_s: float,
    cost_source: str,
    saves: int,
    rate: FailureRate,
    where: str,
    current_s: float | None,
    current_source: str | None,
    job_mtbf_s: float,
    young: float,
    daly: float,
    near_optimum: bool,
    saved: float | None,
    weekly_basis: str,
) -> list[str]:
    """The advice's assumptions, one sentence each, in the order a reader checks them: the checkpoint
    cost, the failure rate, the job's MTBF, the current and recommended intervals, the waste model."""
    notes = []
    if cost_source == "job":
        notes.append(f"Checkpoint cost {_hours(delta_s)}: the median blocking time of this job's {saves} saves.")
    else:
        notes.append(
            f"Checkpoint cost {_hours(delta_s)}: the median blocking time of {saves} saves on {where} in the last "
            f"{WINDOW_DAYS} days (no saves of its own to measure)."
        )
    counted = "failures (the first of each attempt, after its first step)"
    if rate.observed_weight <= 0:
        why = f"{rate.failures} {counted} but no accounted GPU-hours yet" if rate.failures else "no failures observed"
        notes.append(
            f"{why[0].upper()}{why[1:]} on {where} in the last {WINDOW_DAYS} days: assuming a per-GPU MTBF of "
            f"{rate.gpu_mtbf_h:,.0f} GPU-hours (Meta's 7.9 h at 1,024 GPUs by default; "
            "set GOODPUT_ASSUMED_GPU_MTBF_HOURS). A failure counts once per attempt, after its first step."
        )
    elif rate.assumed:
        notes.append(
            f"Per-GPU MTBF {rate.gpu_mtbf_h:,.0f} GPU-hours: only {rate.failures} {counted} over "
            f"{rate.gpu_hours:,.0f} allocated GPU-hours on {where} in the last {WINDOW_DAYS} days, too few to "
            f"trust alone (under {MIN_FAILURES} failures or {MIN_GPU_HOURS:,.0f} GPU-hours), so the observed "
            f"failure rate is blended ({rate.observed_weight:.0%}) with the assumed per-GPU MTBF of "
            f"{assumed_gpu_mtbf_hours():,.0f} GPU-hours (set GOODPUT_ASSUMED_GPU_MTBF_HOURS)."
        )
    else:
        notes.append(
            f"Per-GPU MTBF {rate.gpu_mtbf_h:,.0f} GPU-hours: {rate.failures} {counted} over {rate.gpu_hours:,.0f} "
            f"allocated GPU-hours on {where} in the last {WINDOW_DAYS} days."
        )
    notes.append(
        f"Failures are independent and a {gang_size}-GPU job fails {gang_size} times as often as one GPU: "
        f"job MTBF {_hours(job_mtbf_s)}."
    )
    if current_source == "planned":
        notes.append(f"Current interval {_hours(current_s or 0)}: the planned checkpoint interval.")
    elif current_source == "observed":
        notes.append(f"Current interval {_hours(current_s or 0)}: the median time between saves (none planned).")
    else:
        notes.append("Current interval unknown: no planned interval and fewer than two saves.")
    notes.append(
        f"Recommended: Daly's interval {_hours(daly)} (Young's first-order sqrt(2 x cost x MTBF) is {_hours(young)})."
    )
    notes.append(
        "Expected waste = cost / interval + interval / (2 x MTBF): the blocking saves plus half an interval "
        "of work lost per failure; restart and restore time are not included."
    )
    if near_optimum:
        notes.append(
            "The current interval is already near the optimum: it wastes no more than the recommended one "
            "in this model, so there is nothing to save."
        )
    elif saved is not None:
        notes.append(f"Weekly saving: the difference in waste over {weekly_basis}.")
    return notes


def _where(site_name: str, cluster: str) -> str:
    return f"cluster {cluster} of {site_name}" if cluster else f"{site_name} (no cluster name)"


def advise_job(job: Job, *, now: datetime | None = None) -> Advice | None:
    """The checkpoint advice for one job; None when no checkpoint cost can be measured (neither the
    job nor its cluster has saved a checkpoint that blocked training)."""
    now = now or timezone.now()
    saves = _save_events([job.pk]).get(job.pk, [])
    durations = [d for _, d in saves]
    if durations and statistics.median(durations) > 0:
        delta_s, cost_source, save_count = statistics.median(durations), "job", len(durations)
    else:
        median, count = _cluster_median_save_s(job.site_id, job.cluster, now=now)
        if not median or median <= 0:
            return None
        delta_s, cost_source, save_count = float(median), "cluster", count
    if job.checkpoint_interval_s:
        current_s, current_source = float(job.checkpoint_interval_s), "planned"
    else:
        observed = _observed_interval_s(saves)
        current_s, current_source = observed, "observed" if observed else None
    advice = _build(
        gang_size=job.gang_size,
        delta_s=delta_s,
        cost_source=cost_source,
        saves=save_count,
        rate=cluster_failure_rate(job.site_id, job.cluster, now=now),
        where=_where(job.site.name, job.cluster),
        current_s=current_s,
        current_source=current_source,
        weekly_gpu_hours=job.gang_size * HOURS_PER_WEEK,
        weekly_basis=f"{job.gang_size} GPUs held for the {HOURS_PER_WEEK} hours of a week",
    )
    advice.job_id = job.pk
    return advice


def gang_class(gang_size: int) -> str:
    """The label of the gang-size class a gang falls in."""
    for label, low, high in GANG_CLASSES:
        if gang_size >= low and (high is None or gang_size <= high):
            return label
    return GANG_CLASSES[0][0]


def advise_cluster(site_id: int, cluster: str, *, now: datetime | None = None) -> list[Advice]:
    """One Advice per gang-size class of the cluster's jobs active in the last 30 days.

    A class stands for its jobs: its median gang size and median checkpoint cost, the median of
    their current intervals, and a weekly saving over the GPU-hours the class actually held (its
    last 30 days' allocated GPU-hours, per week). Classes with no measurable checkpoint cost are left out.
    """
    now = now or timezone.now()
    since = now - timedelta(days=WINDOW_DAYS)
    jobs = list(
        Job.objects.filter(site_id=site_id, cluster=cluster, first_allocated_at__isnull=False)
        .exclude(ended_at__lt=since)
        .select_related("site")
    )
    if not jobs:
        return []
    rate = cluster_failure_rate(site_id, cluster, now=now)
    saves = _save_events([j.pk for j in jobs], since=since)
    held = _allocated_gpu_hours([j.pk for j in jobs], since=since, now=now)
    where = _where(jobs[0].site.name, cluster)
    cluster_median, cluster_count = _cluster_median_save_s(site_id, cluster, now=now)
    rows = []
    for label, _, _ in GANG_CLASSES:
        members = [j for j in jobs if gang_class(j.gang_size) == label]
        if not members:
            continue
        durations = [d for j in members for _, d in saves.get(j.pk, [])]
        if durations and statistics.median(durations) > 0:
            delta_s, source, count = statistics.median(durations), "job", len(durations)
        elif cluster_median and cluster_median > 0:
            delta_s, source, count = float(cluster_median), "cluster", cluster_count
        else:
            continue
        planned = [float(j.checkpoint_interval_s) for j in members if j.checkpoint_interval_s]
        observed = [o for j in members if (o := _observed_interval_s(saves.get(j.pk, [])))]
        if planned:
            current_s, current_source = statistics.median(planned), "planned"
        elif observed:
            current_s, current_source = statistics.median(observed), "observed"
        else:
            current_s, current_source = None, None
        weekly = sum(held.get(j.pk, 0.0) for j in members) * 7 / WINDOW_DAYS
        advice = _build(
            gang_size=round(statistics.median(j.gang_size for j in members)),
            delta_s=delta_s,
            cost_source=source,
            saves=count,
            rate=rate,
            where=where,
            current_s=current_s,
            current_source=current_source,
            weekly_gpu_hours=weekly,
            weekly_basis=(
                f"the {weekly:,.0f} GPU-hours a week these {len(members)} jobs held on average over the last "
                f"{WINDOW_DAYS} days"
            ),
        )
        if source == "job":
            advice.assumptions[0] = (
                f"Checkpoint cost {_hours(delta_s)}: the median blocking time of {count} saves by these jobs."
            )
        advice.gang_class = label
        advice.jobs = len(members)
        rows.append(advice)
    return rows


def _allocated_gpu_hours(job_ids: list[int], *, since: datetime, now: datetime) -> dict[int, float]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT job_id, SUM(allocated_s) FROM fleet_jobaccount WHERE job_id = ANY(%s) AND hour >= %s "
            "AND hour < %s GROUP BY job_id",
            [job_ids, since, now],
        )
        return {job_id: float(total) / 3600 for job_id, total in cursor.fetchall()}
