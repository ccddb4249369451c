"""Scheduler detectors: functions from the queues' 1-minute rollups (fleet.scheduler.store:
counters as Prometheus increase(), a reset counted from zero; gauges by their last value) and the
capacity plan to the findings present now, registered with the incident engine like the fabric
and storage detectors.

* scheduler-admission-starvation: a Kueue ClusterQueue mapped to a pool whose p95 admission wait
  over the last 30 min (fleet.scheduler.read.admission_waits) is above the limit (setting
  SCHEDULER_ADMISSION_WAIT_SECONDS, per pool SCHEDULER_ADMISSION_WAIT_BY_POOL), while workloads
  still wait and the pool has idle GPUs: the nominal quota of the pool's ClusterQueues
  (``nvidia.com/gpu``, every flavor) above their usage. The finding names the cause: *quota*
  when the team's quota keeps it from part of the idle GPUs (what it may still take, its nominal
  quota plus what it may borrow within its borrowing limit and what the others lend, is less
  than the pool has idle) or *fragmentation* when its quota would let it take every idle GPU and
  its workloads are still not admitted (they do not fit the free GPUs' shape: gang size, flavor,
  topology). Kueue exports no workload's size, so a quota that leaves room for fewer GPUs than the
  team's workloads take counts as quota, as it should. A full pool raises nothing: waiting for
  GPUs that are all in use is capacity, not starvation;
* scheduler-eviction-storm: SCHEDULER_EVICTION_STORM_COUNT or more evictions (preemptions
  included: Kueue's reason ``Preempted``) of one ClusterQueue's workloads within
  SCHEDULER_EVICTION_STORM_WINDOW_SECONDS, with the reasons and the preempting queues: Kueue
  files ``kueue_preempted_workloads_total`` under the preempting ClusterQueue, never the
  victim's, so the preemptors named are the queues of the same cohort or pool (or the victim
  itself, ``InClusterQueue``) whose preemptions rose in the same window;
* scheduler-drained-capacity: more than SCHEDULER_DRAINED_SHARE of a cluster's nodes out of
  scheduling for SCHEDULER_DRAINED_SECONDS or longer, with the GPU-hours unavailable since it
  began (nodes out x GPUs per node). The pool is the cluster series' queue's. A Slurm cluster's
  nodes are drained or down (the exporter's ``slurm_nodes_drain`` + ``slurm_nodes_down`` over
  every node state; GPUs per node from ``slurm_gpus_total``); the exporter counts nodes without
  naming them, so no incident on them can be linked. A Kubernetes cluster's nodes are cordoned
  (kube-state-metrics' ``kube_node_spec_unschedulable``, per node; GPUs per node from
  ``kube_node_status_allocatable``): the finding names the cordoned nodes and links the open
  GPU-health and fabric incidents on those hostnames (GPU health labels a node ``hostname``,
  the fabric detectors ``node``);
* scheduler-reservation-unused: an approved or active reservation, current now, whose team's
  ClusterQueues on the pool admitted nothing (``kueue_admitted_active_workloads`` 0 every minute)
  for SCHEDULER_RESERVATION_IDLE_SECONDS or longer, with the GPU-hours held idle.

Each finding carries the labels site, scheduler, queue (or the reservation), pool and team where
mapped, and its figures in its text. A finding clears only while its queue reports (missing data
is not health); a starvation finding also holds while its queue admits nothing at all and still
has workloads waiting (no admissions, no wait to read: the worst starvation shows no p95).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import Coalesce

from fleet.capacity.models import Pool, Reservation
from fleet.capacity.read.supply import DEFAULT_GPUS_PER_NODE
from fleet.choices import QueueScheduler
from fleet.scheduler.models import SchedulerQueue, SchedulerRollup1m
from fleet.scheduler.read import admission_waits
from fleet.telemetry.histograms import parse_series
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector
from incidents.models import Incident

STARVATION_WINDOW = timedelta(minutes=30)  # the p95 admission wait is read over this
FRESH = timedelta(minutes=5)  # a gauge older than this is not a reading of now
DRAINED_LOOKBACK = timedelta(hours=24)  # how far back a drained stretch (and its GPU-hours) is followed
IDLE_LOOKBACK = timedelta(days=7)  # how far back a reservation's idle stretch is followed
GPU = "nvidia.com/gpu"  # Kueue's resource name (kube-state-metrics sanitises it; Kueue does not)
QUOTA_GAUGES = ("nominal_quota", "resource_usage", "borrowing_limit", "lending_limit")
OUT_OF_SERVICE = ('state="drain"', 'state="down"')  # Slurm exporter node states that hold no jobs
KUEUE, SLURM, KUBERNETES = QueueScheduler.KUEUE, QueueScheduler.SLURM, QueueScheduler.KUBERNETES
# The incidents on a node that a cordon is likely for: its GPUs' health and its fabric ports.
NODE_INCIDENT_CATEGORIES = ("gpu-health", "fabric")


# --- the rules, as plain functions of numbers --------------------------------------------------


@dataclass(frozen=True)
class QueueQuota:
    """One ClusterQueue's GPUs as Kueue enforces them (``kueue_cluster_queue_*``, summed over
    flavors): nominal quota, usage, and its borrowing and lending limits (+Inf: unset)."""

    nominal: float
    usage: float
    borrowing_limit: float = math.inf
    lending_limit: float = math.inf

    @property
    def lendable(self) -> float:
        """Its unused nominal quota that others may borrow, within its lending limit."""
        return max(0.0, min(self.lending_limit, self.nominal - self.usage))


def cohort_idle(quotas: Mapping[Any, QueueQuota]) -> float:
    """GPUs of the pool's nominal quotas that no ClusterQueue uses now."""
    return max(0.0, sum(q.nominal for q in quotas.values()) - sum(q.usage for q in quotas.values()))


def quota_room(queue: Any, quotas: Mapping[Any, QueueQuota]) -> float:
    """GPUs more that ``queue`` may be admitted now under Kueue's quota rules: up to its nominal
    quota plus what it may borrow (within its borrowing limit, out of what the other queues lend
    of their unused nominal quota), and never more than the pool has idle."""
    own = quotas[queue]
    borrowed = max(0.0, own.usage - own.nominal)
    lent = sum(q.lendable for key, q in quotas.items() if key != queue)
    room = own.nominal + min(own.borrowing_limit, borrowed + lent) - own.usage
    return max(0.0, min(room, cohort_idle(quotas)))


def starvation_cause(queue: Any, quotas: Mapping[Any, QueueQuota]) -> str | None:
    """Why a queue waits while its pool may have GPUs: None when the pool has none idle (genuinely
    full: capacity, not starvation), ``quota`` when its quota lets it take fewer GPUs than the
    pool has idle, ``fragmentation`` when its quota lets it take them all yet nothing is admitted."""
    idle = cohort_idle(quotas)
    if idle <= 0:
        return None
    return "quota" if quota_room(queue, quotas) < idle else "fragmentation"


def drained_share(out: float, total: float) -> float:
    return out / total if total > 0 else 0.0


# --- reads -------------------------------------------------------------------------------------


def latest_gauges(
    queue_ids: Iterable[int], quantities: Iterable[str], now: datetime
) -> dict[tuple[int, str, str], float]:
    """(queue, quantity, series) -> the last value of each series reported within FRESH of now."""
    rows = (
        SchedulerRollup1m.objects.filter(
            queue_id__in=list(queue_ids), quantity__in=list(quantities), bucket__gt=now - FRESH, bucket__lte=now
        )
        .order_by("queue_id", "quantity", "series", "-bucket")
        .distinct("queue_id", "quantity", "series")
        .values_list("queue_id", "quantity", "series", "last")
    )
    return {(queue_id, quantity, series): last for queue_id, quantity, series, last in rows}


def gpu_quotas(gauges: Mapping[tuple[int, str, str], float]) -> dict[int, QueueQuota]:
    """Each queue's GPU quota from its fresh Kueue resource gauges; a queue reporting no nominal
    GPU quota is left out (Kueue's resource metrics off, or a queue without GPUs)."""
    per: dict[int, dict[str, float]] = defaultdict(dict)
    for (queue_id, quantity, series), value in gauges.items():
        if quantity in QUOTA_GAUGES and parse_series(series).get("resource") == GPU:
            per[queue_id][quantity] = per[queue_id].get(quantity, 0.0) + value
    return {
        queue_id: QueueQuota(
            nominal=g["nominal_quota"],
            usage=g.get("resource_usage", 0.0),
            borrowing_limit=g.get("borrowing_limit", math.inf),
            lending_limit=g.get("lending_limit", math.inf),
        )
        for queue_id, g in per.items()
        if "nominal_quota" in g
    }


def _reporting(queue_ids: Iterable[int], now: datetime) -> set[int]:
    """The queues with any series within FRESH of now."""
    return set(
        SchedulerRollup1m.objects.filter(queue_id__in=list(queue_ids), bucket__gt=now - FRESH, bucket__lte=now)
        .values_list("queue_id", flat=True)
        .distinct()
    )


def _queue(labels: Mapping[str, Any]) -> SchedulerQueue | None:
    return SchedulerQueue.objects.filter(
        site__name=labels.get("site"), scheduler=labels.get("scheduler"), name=labels.get("queue", "")
    ).first()


def _queue_labels(queue: SchedulerQueue) -> dict[str, str]:
    labels = {"site": queue.site.name, "scheduler": queue.scheduler, "queue": queue.name}
    if queue.pool is not None:
        labels["pool"] = queue.pool.name
    if queue.team is not None:
        labels["team"] = queue.team.name
    return labels


def _fingerprint(detector: str, queue: SchedulerQueue) -> str:
    return f"{detector}:{queue.site.name}:{queue.scheduler}:{queue.name or '(cluster)'}"


def _named(queue: SchedulerQueue) -> str:
    name = queue.name or f"{queue.get_scheduler_display()} cluster"
    return f"{name} (team {queue.team.name})" if queue.team is not None else name


def _minutes(span: timedelta | float) -> str:
    seconds = span.total_seconds() if isinstance(span, timedelta) else span
    return f"{seconds / 60:,.0f} min"


def _n(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


# --- admission starvation ----------------------------------------------------------------------


def admission_wait_limit(pool: Pool) -> int:
    """The pool's admission wait limit in seconds: its own (SCHEDULER_ADMISSION_WAIT_BY_POOL,
    keyed site/pool), else SCHEDULER_ADMISSION_WAIT_SECONDS."""
    by_pool = settings.SCHEDULER_ADMISSION_WAIT_BY_POOL
    return by_pool.get(f"{pool.site.name}/{pool.name}", settings.SCHEDULER_ADMISSION_WAIT_SECONDS)


def _pool_queues() -> list[SchedulerQueue]:
    return list(
        SchedulerQueue.objects.filter(scheduler=KUEUE, pool__isnull=False)
        .exclude(name="")
        .select_related("site", "pool__site", "team")
    )


def _pending(gauges: Mapping[tuple[int, str, str], float], queue_id: int) -> float:
    return sum(v for (q, quantity, _), v in gauges.items() if q == queue_id and quantity == "pending_workloads")


def _starvation_judged(now: datetime, labels: dict[str, Any]) -> bool:
    """Judged while the queue reports, unless it admitted nothing in the window while workloads
    still wait: no admissions, no wait to read, and that is no sign of health."""
    queue = _queue(labels)
    if queue is None or queue.pk not in _reporting([queue.pk], now):
        return False
    if queue.pk in admission_waits([queue.pk], window=STARVATION_WINDOW, now=now):
        return True
    return _pending(latest_gauges([queue.pk], ["pending_workloads"], now), queue.pk) == 0


@detector("scheduler-admission-starvation", judged=_starvation_judged)
def scheduler_admission_starvation(now: datetime) -> list[FindingSpec]:
    """A ClusterQueue whose p95 admission wait over 30 min is above its pool's limit while
    workloads wait and the pool has idle GPUs: quota or fragmentation, not capacity."""
    queues = _pool_queues()
    if not queues:
        return []
    waits = admission_waits([q.pk for q in queues], window=STARVATION_WINDOW, now=now)
    slow = [
        q
        for q in queues
        if q.pk in waits and waits[q.pk].p95 is not None and waits[q.pk].p95 > admission_wait_limit(q.pool)
    ]
    if not slow:
        return []
    cohort = [q for q in queues if q.pool_id in {s.pool_id for s in slow}]
    gauges = latest_gauges([q.pk for q in cohort], (*QUOTA_GAUGES, "pending_workloads"), now)
    quotas = gpu_quotas(gauges)
    specs = []
    for queue in slow:
        pending = _pending(gauges, queue.pk)
        pool_quotas = {q.pk: quotas[q.pk] for q in cohort if q.pool_id == queue.pool_id and q.pk in quotas}
        if pending <= 0 or queue.pk not in pool_quotas:
            continue  # nothing waits now, or no quota to judge by
        cause = starvation_cause(queue.pk, pool_quotas)
        if cause is None:
            continue  # the pool is full: waiting for capacity
        own, idle, room = pool_quotas[queue.pk], cohort_idle(pool_quotas), quota_room(queue.pk, pool_quotas)
        wait, limit = waits[queue.pk], admission_wait_limit(queue.pool)
        assert wait.p95 is not None
        borrowing = "no limit" if math.isinf(own.borrowing_limit) else _n(own.borrowing_limit)
        quota = f"using {_n(own.usage)}, nominal {_n(own.nominal)}, borrowing limit {borrowing}"
        if cause == "quota":
            why = f"quota: it may take {_n(room)} of the {_n(idle)} idle GPUs ({quota}, and what the others lend)"
        else:
            why = f"fragmentation: its quota lets it take all {_n(idle)} idle GPUs ({quota}), yet nothing is admitted"
        specs.append(
            FindingSpec(
                fingerprint=_fingerprint("scheduler-admission-starvation", queue),
                labels=_queue_labels(queue) | {"cause": cause},
                severity=Severity.SEV3,
                summary=(
                    f"Admission starvation in {_named(queue)} on {queue.pool}: p95 admission wait "
                    f"{_minutes(wait.p95)} over 30 min (limit {_minutes(limit)}), {_n(pending)} workloads "
                    f"waiting while {_n(idle)} GPUs of the pool are idle; {why}"
                ),
                description=(
                    "Workloads wait for admission while the pool has idle GPUs, so the wait is not capacity. "
                    "Quota: raise the team's nominal quota or borrowing limit, or let others lend. "
                    "Fragmentation: the free GPUs do not fit the waiting workloads (gang size, flavor, topology)."
                ),
                impact={
                    "cause": cause,
                    "p50_seconds": wait.p50,
                    "p95_seconds": wait.p95,
                    "limit_seconds": limit,
                    "admissions": wait.admissions,
                    "pending_workloads": pending,
                    "idle_gpus": idle,
                    "quota_room_gpus": room,
                    "nominal_gpus": own.nominal,
                    "used_gpus": own.usage,
                    "borrowing_limit_gpus": None if math.isinf(own.borrowing_limit) else own.borrowing_limit,
                },
                category="scheduler",
            )
        )
    return specs


# --- eviction storm ----------------------------------------------------------------------------


def _queue_judged(now: datetime, labels: dict[str, Any]) -> bool:
    """A queue finding clears only while its queue reports."""
    queue = _queue(labels)
    return queue is not None and queue.pk in _reporting([queue.pk], now)


def _shares_cohort(a: SchedulerQueue, b: SchedulerQueue) -> bool:
    if a.site_id != b.site_id:
        return False
    return (
        a.pk == b.pk or (a.cohort != "" and a.cohort == b.cohort) or (a.pool_id is not None and a.pool_id == b.pool_id)
    )


def _by_reason(counts: Mapping[str, float]) -> str:
    return ", ".join(f"{_n(n)} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@detector("scheduler-eviction-storm", judged=_queue_judged)
def scheduler_eviction_storm(now: datetime) -> list[FindingSpec]:
    """A ClusterQueue whose workloads were evicted (or preempted) at least the storm count times
    in the window, with the reasons and the queues that preempted."""
    window = timedelta(seconds=settings.SCHEDULER_EVICTION_STORM_WINDOW_SECONDS)
    limit = settings.SCHEDULER_EVICTION_STORM_COUNT
    rows = list(
        SchedulerRollup1m.objects.filter(
            quantity__in=("evicted_workloads", "preempted_workloads"),
            bucket__gt=now - window,
            bucket__lte=now,
            increase__gt=0,
        )
        .values("queue_id", "quantity", "series")
        .annotate(total=Sum("increase"), first=Min("bucket"))
        .order_by()
    )
    evicted: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    preempted: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    first: dict[int, datetime] = {}
    for row in rows:
        labels = parse_series(row["series"])
        reason = labels.get("reason", "")
        if row["quantity"] == "evicted_workloads":
            if labels.get("underlying_cause"):
                reason = f"{reason}/{labels['underlying_cause']}"
            evicted[row["queue_id"]][reason] += row["total"]
            first[row["queue_id"]] = min(first.get(row["queue_id"], row["first"]), row["first"])
        else:
            preempted[row["queue_id"]][reason] += row["total"]
    storms = [queue_id for queue_id, reasons in evicted.items() if sum(reasons.values()) >= limit]
    if not storms:
        return []
    queues = SchedulerQueue.objects.select_related("site", "pool__site", "team").in_bulk([*storms, *preempted])
    specs = []
    for queue_id in storms:
        queue = queues[queue_id]
        reasons = evicted[queue_id]
        total = sum(reasons.values())
        preemptors = [
            (queues[p], counts)
            for p, counts in sorted(preempted.items(), key=lambda kv: -sum(kv[1].values()))
            if p in queues and _shares_cohort(queue, queues[p])
        ]
        summary = (
            f"Eviction storm in {_named(queue)}{f' on {queue.pool}' if queue.pool else ''}: "
            f"{_n(total)} workloads evicted in {_minutes(window)} (limit {limit}): {_by_reason(reasons)}"
        )
        if preemptors:
            summary += "; preempted by " + "; ".join(f"{_named(p)}: {_by_reason(c)}" for p, c in preemptors)
        specs.append(
            FindingSpec(
                fingerprint=_fingerprint("scheduler-eviction-storm", queue),
                labels=_queue_labels(queue)
                | ({"preempting_queues": ",".join(p.name for p, _ in preemptors)} if preemptors else {}),
                severity=Severity.SEV3,
                summary=summary,
                description=(
                    "The queue's workloads are being evicted over and over: each eviction restarts them from "
                    "their last checkpoint. Preempted: another workload of higher priority, or a team reclaiming "
                    "its nominal quota from a borrower; PodsReadyTimeout: pods not ready in time (image pulls, "
                    "unschedulable pods)."
                ),
                impact={
                    "evictions": total,
                    "by_reason": dict(reasons),
                    "window_seconds": window.total_seconds(),
                    "preempted_by": {
                        p.name: {"team": p.team.name if p.team else None, "by_reason": dict(c)} for p, c in preemptors
                    },
                },
                category="scheduler",
                started_at=first.get(queue_id),
            )
        )
    return specs


# --- drained capacity --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeMinute:
    bucket: datetime
    out: float  # nodes drained or down
    total: float  # nodes in every state
    gpus: float | None  # the cluster's GPUs (slurm_gpus_total), where reported


def _node_minutes(queue_ids: Iterable[int], now: datetime) -> dict[int, list[NodeMinute]]:
    """Per Slurm cluster series, its node counts per minute over DRAINED_LOOKBACK, oldest first."""
    rows = (
        SchedulerRollup1m.objects.filter(
            queue_id__in=list(queue_ids),
            quantity__in=("nodes", "gpus"),
            bucket__gt=now - DRAINED_LOOKBACK,
            bucket__lte=now,
        )
        .values("queue_id", "bucket")
        .annotate(
            out=Coalesce(Sum("last", filter=Q(quantity="nodes", series__in=OUT_OF_SERVICE)), 0.0),
            total=Coalesce(Sum("last", filter=Q(quantity="nodes")), 0.0),
            gpus=Max("last", filter=Q(quantity="gpus", series='state="total"')),
        )
        .order_by("queue_id", "bucket")
    )
    out: dict[int, list[NodeMinute]] = defaultdict(list)
    for row in rows:
        out[row["queue_id"]].append(NodeMinute(row["bucket"], row["out"], row["total"], row["gpus"]))
    return out


def _cordon_minutes(queue_ids: Iterable[int], now: datetime) -> dict[int, list[NodeMinute]]:
    """Per Kubernetes cluster series, its nodes per minute over DRAINED_LOOKBACK, oldest first:
    cordoned (``node_unschedulable`` is 1) of every node reporting, and the cluster's GPUs as
    allocatable GPUs per GPU node x nodes (so GPUs per node is the GPU nodes' average)."""
    rows = (
        SchedulerRollup1m.objects.filter(
            queue_id__in=list(queue_ids),
            quantity__in=("node_unschedulable", "gpus_allocatable"),
            bucket__gt=now - DRAINED_LOOKBACK,
            bucket__lte=now,
        )
        .values("queue_id", "bucket")
        .annotate(
            out=Coalesce(Sum("last", filter=Q(quantity="node_unschedulable")), 0.0),
            total=Count("series", filter=Q(quantity="node_unschedulable")),
            gpus=Sum("last", filter=Q(quantity="gpus_allocatable")),
            gpu_nodes=Count("series", filter=Q(quantity="gpus_allocatable")),
        )
        .order_by("queue_id", "bucket")
    )
    out: dict[int, list[NodeMinute]] = defaultdict(list)
    for row in rows:
        gpus = row["gpus"] / row["gpu_nodes"] * row["total"] if row["gpus"] and row["gpu_nodes"] else None
        out[row["queue_id"]].append(NodeMinute(row["bucket"], row["out"], float(row["total"]), gpus))
    return out


def cordoned_nodes(queue: SchedulerQueue, now: datetime) -> list[str]:
    """The Kubernetes cluster's nodes cordoned now (their last value within FRESH is 1), by name."""
    gauges = latest_gauges([queue.pk], ["node_unschedulable"], now)
    return sorted(parse_series(series).get("node", "") for (_, _, series), value in gauges.items() if value > 0)


def node_incidents(site: str, hostnames: Iterable[str]) -> list[Incident]:
    """The open GPU-health and fabric incidents on these hosts at the site, oldest first."""
    hosts = sorted(set(hostnames) - {""})
    if not hosts:
        return []
    return list(
        Incident.objects.open()
        .filter(category__in=NODE_INCIDENT_CATEGORIES)
        .filter(Q(labels__hostname__in=hosts) | Q(labels__node__in=hosts))
        .filter(Q(labels__site=site) | ~Q(labels__has_key="site"))
        .order_by("pk")
    )


@dataclass(frozen=True)
class DrainedStretch:
    since: datetime
    out: float  # nodes drained or down now
    total: float
    gpus_per_node: float
    gpu_hours: float


def drained_stretch(minutes: list[NodeMinute], now: datetime, share: float) -> DrainedStretch | None:
    """The stretch ending now (its last minute within FRESH) in which more than ``share`` of the
    nodes were drained or down every minute reported (a gap longer than FRESH ends it), with the
    GPU-hours it took out: each minute's drained nodes x GPUs per node until the next minute."""
    if not minutes or minutes[-1].bucket <= now - FRESH:
        return None
    run: list[NodeMinute] = []
    for minute in reversed(minutes):
        if drained_share(minute.out, minute.total) <= share:
            break
        if run and run[-1].bucket - minute.bucket > FRESH:
            break
        run.append(minute)
    if not run:
        return None
    run.reverse()
    last = run[-1]
    per_node = last.gpus / last.total if last.gpus and last.total else float(DEFAULT_GPUS_PER_NODE)
    ends = [m.bucket for m in run[1:]] + [now]
    hours = sum(m.out * per_node * (end - m.bucket).total_seconds() / 3600 for m, end in zip(run, ends, strict=True))
    return DrainedStretch(run[0].bucket, last.out, last.total, per_node, hours)


@detector("scheduler-drained-capacity", judged=_queue_judged)
def scheduler_drained_capacity(now: datetime) -> list[FindingSpec]:
    """A Slurm or Kubernetes cluster with more than the share of its nodes out of scheduling
    (drained or down; cordoned) for the threshold; a Kubernetes one names its cordoned nodes and
    the open incidents on them."""
    share = settings.SCHEDULER_DRAINED_SHARE
    threshold = timedelta(seconds=settings.SCHEDULER_DRAINED_SECONDS)
    clusters = {
        q.pk: q
        for q in SchedulerQueue.objects.filter(scheduler__in=(SLURM, KUBERNETES), name="").select_related(
            "site", "pool__site", "team"
        )
    }
    minutes = _node_minutes([pk for pk, q in clusters.items() if q.scheduler == SLURM], now)
    minutes |= _cordon_minutes([pk for pk, q in clusters.items() if q.scheduler == KUBERNETES], now)
    specs = []
    for queue_id, per_minute in minutes.items():
        stretch = drained_stretch(per_minute, now, share)
        if stretch is None or now - stretch.since < threshold:
            continue
        queue = clusters[queue_id]
        spec = _slurm_drained(queue, stretch, now) if queue.scheduler == SLURM else _cordoned(queue, stretch, now)
        specs.append(spec)
    return specs


def _drained_summary(queue: SchedulerQueue, stretch: DrainedStretch, now: datetime, state: str) -> str:
    where = f"{queue.pool}" if queue.pool else f"{queue.site.name} {queue.get_scheduler_display()} cluster"
    share = settings.SCHEDULER_DRAINED_SHARE
    return (
        f"Drained capacity on {where}: {_n(stretch.out)} of {_n(stretch.total)} nodes "
        f"({drained_share(stretch.out, stretch.total):.0%}, limit {share:.0%}) {state} for "
        f"{_minutes(now - stretch.since)}, {stretch.gpu_hours:,.1f} GPU-hours unavailable "
        f"({_n(stretch.out * stretch.gpus_per_node)} GPUs now)"
    )


def _drained_impact(stretch: DrainedStretch) -> dict[str, Any]:
    return {
        "nodes_out": stretch.out,
        "nodes_total": stretch.total,
        "gpus_out": stretch.out * stretch.gpus_per_node,
        "gpu_hours_unavailable": round(stretch.gpu_hours, 2),
    }


def _slurm_drained(queue: SchedulerQueue, stretch: DrainedStretch, now: datetime) -> FindingSpec:
    return FindingSpec(
        fingerprint=_fingerprint("scheduler-drained-capacity", queue),
        labels=_queue_labels(queue),
        severity=Severity.SEV3,
        summary=_drained_summary(queue, stretch, now, "drained or down"),
        description=(
            "Slurm holds no jobs on drained or down nodes: the GPUs are installed and counted as "
            "capacity, but the scheduler cannot use them. Resume the nodes once repaired "
            "(scontrol update nodename=... state=resume) or take them out of the plan."
        ),
        impact=_drained_impact(stretch),
        category="scheduler",
        started_at=stretch.since,
    )


def _cordoned(queue: SchedulerQueue, stretch: DrainedStretch, now: datetime) -> FindingSpec:
    """A Kubernetes cluster's cordoned capacity, naming the nodes and the open GPU-health and
    fabric incidents on them (most cordons are for one of those)."""
    nodes = cordoned_nodes(queue, now)
    incidents = node_incidents(queue.site.name, nodes)
    summary = _drained_summary(queue, stretch, now, "cordoned")
    if nodes:
        summary += f"; cordoned: {', '.join(nodes)}"
    if incidents:
        summary += "; open incidents on them: " + "; ".join(f"#{i.pk} {i.title}" for i in incidents)
    return FindingSpec(
        fingerprint=_fingerprint("scheduler-drained-capacity", queue),
        labels=_queue_labels(queue),
        severity=Severity.SEV3,
        summary=summary,
        description=(
            "Kubernetes schedules no new pod on a cordoned node: the GPUs are installed and counted as "
            "capacity, but the scheduler cannot use them. Uncordon the nodes once repaired "
            "(kubectl uncordon ...) or take them out of the plan; the linked incidents say why they were cordoned."
        ),
        impact=_drained_impact(stretch)
        | {
            "cordoned_nodes": nodes,
            "incidents": [{"id": i.pk, "title": i.title, "category": i.category} for i in incidents],
        },
        category="scheduler",
        started_at=stretch.since,
    )


# --- reservation unused ------------------------------------------------------------------------


def _current_reservations(now: datetime, idle: timedelta) -> list[Reservation]:
    return list(
        Reservation.objects.committed()
        .filter(start__lte=now - idle, end__gt=now)
        .select_related("pool__site")
        .order_by("pk")
    )


def _team_queues(reservations: Iterable[Reservation]) -> dict[tuple[int, str], list[int]]:
    """(pool, team name) -> the team's Kueue ClusterQueues mapped to that pool."""
    reservations = list(reservations)
    found: dict[tuple[int, str], list[int]] = defaultdict(list)
    for pk, pool_id, team in SchedulerQueue.objects.filter(
        scheduler=KUEUE,
        pool_id__in={r.pool_id for r in reservations},
        team__name__in={r.team_id for r in reservations},
    ).values_list("pk", "pool_id", "team__name"):
        found[(pool_id, team)].append(pk)
    return found


def _reservation_judged(now: datetime, labels: dict[str, Any]) -> bool:
    """A reservation finding clears once the reservation holds nothing now (ended, cancelled,
    preempted), else only while its team's queues report."""
    pk = str(labels.get("reservation", ""))
    reservation = (
        Reservation.objects.committed().filter(pk=int(pk), start__lte=now, end__gt=now).first()
        if pk.isdigit()
        else None
    )
    if reservation is None:
        return True
    queues = _team_queues([reservation]).get((reservation.pool_id, reservation.team_id), [])
    return bool(_reporting(queues, now))


@detector("scheduler-reservation-unused", judged=_reservation_judged)
def scheduler_reservation_unused(now: datetime) -> list[FindingSpec]:
    """An approved or active reservation whose team's queues on the pool admitted nothing for the
    threshold: GPUs held idle."""
    idle_limit = timedelta(seconds=settings.SCHEDULER_RESERVATION_IDLE_SECONDS)
    reservations = _current_reservations(now, idle_limit)
    if not reservations:
        return []
    team_queues = _team_queues(reservations)
    ids = [pk for pks in team_queues.values() for pk in pks]
    if not ids:
        return []
    since = max(min(r.start for r in reservations), now - IDLE_LOOKBACK)
    seen = {
        row["queue_id"]: row
        for row in SchedulerRollup1m.objects.filter(
            queue_id__in=ids, quantity="admitted_active_workloads", bucket__gte=since, bucket__lte=now
        )
        .values("queue_id")
        .annotate(first=Min("bucket"), latest=Max("bucket"), busy=Max("bucket", filter=Q(max__gt=0)))
        .order_by()
    }
    specs = []
    for reservation in reservations:
        rows = [seen[pk] for pk in team_queues.get((reservation.pool_id, reservation.team_id), []) if pk in seen]
        if not rows or max(r["latest"] for r in rows) <= now - FRESH:
            continue  # no queue of the team reports on the pool: nothing to judge by
        idle_since = max(reservation.start, min(r["first"] for r in rows))
        busy = [r["busy"] for r in rows if r["busy"] is not None]
        if busy:
            idle_since = max(idle_since, max(busy) + timedelta(minutes=1))
        if now - idle_since < idle_limit:
            continue
        hours = reservation.gpus * (now - idle_since).total_seconds() / 3600
        pool = reservation.pool
        specs.append(
            FindingSpec(
                fingerprint=f"scheduler-reservation-unused:{reservation.pk}",
                labels={
                    "site": pool.site.name,
                    "pool": pool.name,
                    "team": reservation.team_id,
                    "reservation": str(reservation.pk),
                },
                severity=Severity.SEV4,
                summary=(
                    f"Reservation unused: {reservation.team_id} holds {reservation.gpus} GPUs on {pool} "
                    f"(reservation {reservation.pk}, {reservation.get_state_display().lower()}) with no workload "
                    f"admitted for {(now - idle_since).total_seconds() / 3600:,.1f} h: {hours:,.1f} GPU-hours idle"
                ),
                description=(
                    "The reservation holds GPUs no one else may use, and the team's queues on the pool admitted "
                    "nothing. Release or shrink it, or let the team's ClusterQueue lend its unused quota."
                ),
                impact={
                    "gpus": reservation.gpus,
                    "idle_seconds": (now - idle_since).total_seconds(),
                    "idle_gpu_hours": round(hours, 2),
                },
                category="scheduler",
                started_at=idle_since,
            )
        )
    return specs
