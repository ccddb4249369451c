"""A simulated Kueue for the demo's capacity pools: one ClusterQueue per team and pool (the
capacity seed's TeamQuotas, fleet.capacity.simulator.QUOTAS), the pool's teams in one cohort,
exposed as Kueue's controller exposes its metrics (names, labels, types and the admission wait
histogram's bounds as in tests/fixtures/kueue.prom) and pushed to the console's Prometheus door
(``POST /api/v1/ingest/prometheus``, one body per site: one Kueue per site's cluster) every
``interval``.

What happens in each cohort, step by step (every ``interval``, 15 s):

1. admitted workloads that have run their time finish; one admitted with pods that never became
   ready is evicted after waitForPodsReady's timeout (reason ``PodsReadyTimeout``) and requeued;
2. workloads arrive: Poisson arrivals sized and timed per team (``Profile``); a team's sweep
   controller (``keep_pending``) instead keeps that many of its workloads queued;
3. one admission pass over the cohort's pending workloads, oldest first: a workload is admitted
   when it fits the team's available quota as Kueue computes it (nominal quota plus what it may
   borrow of the cohort's unused quota: fleet.capacity.quotas.available) and the pool's GPUs;
   else, if the team stays within its nominal quota, by preempting other teams' borrowing
   workloads, newest first (reclaimWithinCohort: Any; the victims are evicted ``Preempted`` and
   requeued, the preemptor counts ``InCohortReclamation``); else it stays pending, inadmissible
   (BestEffortFIFO) or, behind a blocked head, active (StrictFIFO).

The admission wait is the time from a workload's creation or requeue to its admission. One team
waits while GPUs sit idle behind its quota (``STARVING``: batch-eval on iad-2's H200 pool, whose
two-node evaluations of 16 GPUs each fit its 8 + 16 GPUs one at a time), so its waits run to
tens of minutes while the others' run from seconds to minutes.

The clock is always an argument and every draw comes from one seeded generator: the same seed
and the same times give the same figures. ``samples`` gives a site's metric values at the
simulator's clock (fleet.management.backfill rolls them up into the history), ``exposition``
prints them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from fleet.capacity.models import Pool, Team
from fleet.capacity.quotas import Quota, available
from fleet.capacity.simulator import QUOTAS, pool_name
from fleet.choices import QueueScheduler
from fleet.inventory.models import Site
from fleet.scheduler.models import SchedulerQueue
from fleet.telemetry.simulator import SimGpu

SCRAPE_S = 15.0
RESOURCE = "nvidia.com/gpu"
REPLICA_ROLE = "leader"  # one Kueue replica, the leader (a follower's copies are ignored by the door)
# Kueue's admission wait bounds (pkg/metrics/metrics.go, generateExponentialBuckets): 1 s, then
# 2.5 s doubling, 16 bounds to 40960 s.
WAIT_BOUNDS: tuple[float, ...] = (1.0, *(2.5 * 2**k for k in range(15)))
PODS_READY_TIMEOUT = timedelta(minutes=5)  # waitForPodsReady's default timeout
PODS_NEVER_READY = 0.01  # of admissions: pods that never become ready (an image pull, a bad node)
MAX_PENDING = 12  # a team's submitters hold back while this many of its workloads wait
WARM_UP = timedelta(hours=2)  # run before the first scrape, so the queues start busy
STARVING = ("iad-2", "h200", "batch-eval")
# Kueue's eviction reasons and causes as its metrics label them (tests/fixtures/kueue.prom).
PREEMPTED = ("Preempted", "")
PODS_READY = ("PodsReadyTimeout", "WaitForStart")
EVICTIONS = (PREEMPTED, PODS_READY)
RECLAMATION = "InCohortReclamation"
PRIORITY_CLASS = {
    "research": "training-high",
    "llm-pretrain": "training-high",
    "inference": "serving",
    "batch-eval": "batch-low",
}
_LOGNORMAL_SIGMA = 0.5


@dataclass(frozen=True)
class Profile:
    """How one team's workloads arrive on one pool: ``per_hour`` Poisson arrivals (or, with
    ``keep_pending``, a controller that keeps that many queued), each of one of ``sizes`` GPUs,
    running ``minutes`` on average (log-normal)."""

    per_hour: float
    sizes: tuple[int, ...]
    minutes: float
    keep_pending: int = 0
    strict_fifo: bool = False


def _profile(site: str, pool: str, team: str, nominal: int) -> Profile:
    """The team's workloads on the pool: gangs of nodes on the training pools, a few GPUs on the
    inference pools, offered at a share of the team's nominal quota (above it for batch-eval,
    which borrows and is reclaimed from)."""
    if (site, pool, team) == STARVING:
        return Profile(0.0, (16,), 12.0, keep_pending=4, strict_fifo=True)
    training = pool in ("h100", "h200")
    if team == "batch-eval":
        sizes, minutes = ((8, 8, 16), 20.0) if training else ((1, 2, 4), 15.0)
        load = 1.2 if training else 0.6
    elif training:
        sizes, minutes = (8, 8, 16, 16, 24), 45.0
        load = 0.5 if site == "ams-1" else 0.35
    else:
        sizes, minutes = (1, 2, 2, 4, 8), 15.0
        load = 0.45
    return Profile(load * nominal / (sum(sizes) / len(sizes) * minutes / 60), sizes, minutes)


@dataclass
class Workload:
    id: int
    gpus: int
    runtime: timedelta
    created: datetime  # or requeued: where its admission wait starts
    admitted: datetime | None = None
    tried: bool = False  # an admission attempt failed (Kueue's inadmissible)
    never_ready: bool = False


@dataclass
class ClusterQueue:
    """One team's ClusterQueue on one pool, and its counters since Kueue started."""

    site: str
    pool: str
    team: str
    quota: Quota
    profile: Profile
    pending: list[Workload] = field(default_factory=list)
    running: list[Workload] = field(default_factory=list)
    admitted_total: int = 0
    evicted: dict[tuple[str, str], int] = field(default_factory=lambda: dict.fromkeys(EVICTIONS, 0))
    preempted: dict[str, int] = field(default_factory=lambda: {RECLAMATION: 0})
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BOUNDS) + 1))  # per bound, +Inf last
    wait_sum: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.team}-{self.pool}"

    @property
    def cohort(self) -> str:
        return f"{self.pool}-pool"

    @property
    def flavor(self) -> str:
        return self.pool

    @property
    def priority_class(self) -> str:
        return PRIORITY_CLASS.get(self.team, "standard")

    @property
    def usage(self) -> int:
        return sum(w.gpus for w in self.running)

    def observe_wait(self, seconds: float) -> None:
        for i, bound in enumerate(WAIT_BOUNDS):
            if seconds <= bound:
                self.wait_counts[i] += 1
                break
        else:
            self.wait_counts[-1] += 1
        self.wait_sum += seconds


@dataclass
class Cohort:
    """A pool's ClusterQueues, sharing its GPUs."""

    site: str
    pool: str
    gpus: int
    queues: list[ClusterQueue]

    @property
    def quotas(self) -> dict[str, Quota]:
        return {q.team: q.quota for q in self.queues}

    def used(self) -> dict[str, int]:
        return {q.team: q.usage for q in self.queues}

    def fits(self, queue: ClusterQueue, gpus: int) -> bool:
        """Within the team's available quota (Kueue's) and the GPUs the pool has."""
        used = self.used()
        return gpus <= available(queue.team, self.quotas, used) and sum(used.values()) + gpus <= self.gpus


def cohorts(fleet: dict[str, list[SimGpu]]) -> list[Cohort]:
    """A cohort per pool of the simulated fleet with quotas in the capacity seed, its GPUs counted
    from the fleet (fewer with ``--gpus``: the nominal quotas then add up to more than it has)."""
    gpus: dict[tuple[str, str], int] = {}
    for site, site_gpus in fleet.items():
        for gpu in site_gpus:
            key = (site, pool_name(gpu.model.name))
            gpus[key] = gpus.get(key, 0) + 1
    out = []
    for (site, pool), quotas in QUOTAS.items():
        if not gpus.get((site, pool)):
            continue
        queues = [
            ClusterQueue(site, pool, team, Quota(nominal, limit), _profile(site, pool, team, nominal))
            for team, nominal, limit in quotas
        ]
        out.append(Cohort(site, pool, gpus[(site, pool)], queues))
    return out


Sample = tuple[str, dict[str, str], float]  # (metric name, labels, value)

FAMILIES = (  # (name, type, help) in the order Kueue prints them (alphabetical)
    (
        "kueue_admission_wait_time_seconds",
        "histogram",
        "The time between a workload was created or requeued until admission, per 'cluster_queue'",
    ),
    (
        "kueue_admitted_active_workloads",
        "gauge",
        "The number of admitted Workloads that are active, per 'cluster_queue'",
    ),
    ("kueue_admitted_workloads_total", "counter", "The total number of admitted workloads per 'cluster_queue'"),
    (
        "kueue_cluster_queue_borrowing_limit",
        "gauge",
        "Reports the cluster_queue's resource borrowing limit within all the flavors. If borrowingLimit is unset, "
        "this metric reports +Inf.",
    ),
    (
        "kueue_cluster_queue_lending_limit",
        "gauge",
        "Reports the cluster_queue's resource lending limit within all the flavors. If lendingLimit is unset, this "
        "metric reports +Inf.",
    ),
    (
        "kueue_cluster_queue_nominal_quota",
        "gauge",
        "Reports the cluster_queue's resource nominal quota within all the flavors",
    ),
    (
        "kueue_cluster_queue_resource_usage",
        "gauge",
        "Reports the cluster_queue's total resource usage within all the flavors",
    ),
    ("kueue_evicted_workloads_total", "counter", "The number of evicted workloads per 'cluster_queue'"),
    ("kueue_pending_workloads", "gauge", "The number of pending workloads, per 'cluster_queue' and 'status'."),
    ("kueue_preempted_workloads_total", "counter", "The number of preempted workloads per 'preempting_cluster_queue'"),
    (
        "kueue_reserving_active_workloads",
        "gauge",
        "The number of Workloads that are reserving quota, per 'cluster_queue'",
    ),
)


def _value(value: float) -> str:
    return "+Inf" if value == math.inf else f"{value:.17g}"


class KueueSimulator:
    """Kueue on each site's cluster of the simulated fleet (see the module's docstring)."""

    def __init__(
        self,
        fleet: dict[str, list[SimGpu]],
        *,
        seed: int,
        interval: float = SCRAPE_S,
        stamped: bool = False,
    ) -> None:
        self.stamped = stamped  # print each scrape's time (a simulated clock); else the door stamps it
        self.rng = random.Random(seed + 41)
        self.interval = timedelta(seconds=interval)
        self.cohorts = cohorts(fleet)
        self.clock: datetime | None = None
        self.posted_at: datetime | None = None
        self.rejected: list[str] = []
        self._next_id = 0

    @property
    def queues(self) -> list[ClusterQueue]:
        return [q for c in self.cohorts for q in c.queues]

    @property
    def sites(self) -> list[str]:
        return sorted({c.site for c in self.cohorts})

    # --- the queues ----------------------------------------------------------------------------------

    def advance(self, until: datetime) -> None:
        """Run every cohort to ``until`` in steps of at most ``interval``; the first call starts
        ``WARM_UP`` before it, so the first scrape finds work running and waiting."""
        if self.clock is None:
            self.clock = until - WARM_UP
        while self.clock < until:
            at = min(self.clock + self.interval, until)
            self._step(self.clock, at)
            self.clock = at

    def _step(self, start: datetime, end: datetime) -> None:
        seconds = (end - start).total_seconds()
        for cohort in self.cohorts:
            for queue in cohort.queues:
                self._finish(queue, end)
                self._arrive(queue, start, seconds)
            self._admit(cohort, end)

    def _finish(self, queue: ClusterQueue, at: datetime) -> None:
        for w in list(queue.running):
            assert w.admitted is not None
            if w.never_ready:  # its pods never start: it holds its quota until the timeout
                if at >= w.admitted + PODS_READY_TIMEOUT:
                    queue.running.remove(w)
                    queue.evicted[PODS_READY] += 1
                    self._requeue(queue, w, at)
            elif at >= w.admitted + w.runtime:
                queue.running.remove(w)

    def _requeue(self, queue: ClusterQueue, w: Workload, at: datetime) -> None:
        w.admitted, w.created, w.tried, w.never_ready = None, at, False, False
        queue.pending.append(w)

    def _arrive(self, queue: ClusterQueue, start: datetime, seconds: float) -> None:
        p, rng = queue.profile, self.rng
        if p.keep_pending:
            count = max(0, p.keep_pending - len(queue.pending))
        else:
            count = _poisson(rng, p.per_hour * seconds / 3600)
            count = min(count, max(0, MAX_PENDING - len(queue.pending)))
        mu = math.log(p.minutes * 60) - _LOGNORMAL_SIGMA**2 / 2
        for _ in range(count):
            self._next_id += 1
            runtime = timedelta(seconds=max(120.0, rng.lognormvariate(mu, _LOGNORMAL_SIGMA)))
            created = start + timedelta(seconds=rng.uniform(0, seconds))
            queue.pending.append(Workload(self._next_id, rng.choice(p.sizes), runtime, created))

    def _admit(self, cohort: Cohort, at: datetime) -> None:
        """One admission pass (module docstring, step 3)."""
        blocked: set[str] = set()
        waiting = sorted(((w.created, w.id, q, w) for q in cohort.queues for w in q.pending), key=lambda e: e[:2])
        for _, _, queue, w in waiting:
            if queue.team in blocked:
                continue  # StrictFIFO: behind a head that does not fit
            if not cohort.fits(queue, w.gpus) and not self._reclaim(cohort, queue, w, at):
                w.tried = True
                if queue.profile.strict_fifo:
                    blocked.add(queue.team)
                continue
            queue.pending.remove(w)
            w.admitted, w.tried = at, False
            w.never_ready = self.rng.random() < PODS_NEVER_READY
            queue.running.append(w)
            queue.admitted_total += 1
            queue.observe_wait(max(0.0, (at - w.created).total_seconds()))

    def _reclaim(self, cohort: Cohort, queue: ClusterQueue, w: Workload, at: datetime) -> bool:
        """Preempt other teams' borrowing workloads, newest first, so that ``w`` fits within its
        team's nominal quota; False (nobody preempted) when that cannot make it fit."""
        if queue.usage + w.gpus > queue.quota.nominal:
            return False
        candidates = sorted(
            ((v.admitted, v.id, other, v) for other in cohort.queues if other is not queue for v in other.running),
            key=lambda e: (e[0], e[1]),
            reverse=True,
        )
        taken: list[tuple[ClusterQueue, Workload]] = []
        for _, _, other, victim in candidates:
            if other.usage <= other.quota.nominal:
                continue  # no longer borrowing: Kueue leaves it alone
            other.running.remove(victim)
            taken.append((other, victim))
            if cohort.fits(queue, w.gpus):
                break
        else:
            for other, victim in taken:  # it would not fit: put them back untouched
                other.running.append(victim)
            return False
        for other, victim in taken:
            other.evicted[PREEMPTED] += 1
            queue.preempted[RECLAMATION] += 1
            self._requeue(other, victim, at)
        return True

    # --- Kueue's metrics ----------------------------------------------------------------------------

    def samples(self, site: str) -> list[Sample]:
        """Every value the site's Kueue exports now, as (name, labels, value)."""
        out: list[Sample] = []
        role = {"replica_role": REPLICA_ROLE}
        for cohort in (c for c in self.cohorts if c.site == site):
            for q in cohort.queues:
                cq = {"cluster_queue": q.name, **role}
                pc = {**cq, "priority_class": q.priority_class}
                cumulative = 0
                for bound, count in zip((*WAIT_BOUNDS, math.inf), q.wait_counts, strict=True):
                    cumulative += count
                    le = "+Inf" if bound == math.inf else f"{bound:g}"
                    out.append(("kueue_admission_wait_time_seconds_bucket", {**pc, "le": le}, cumulative))
                out.append(("kueue_admission_wait_time_seconds_sum", pc, q.wait_sum))
                out.append(("kueue_admission_wait_time_seconds_count", pc, cumulative))
                out.append(("kueue_admitted_active_workloads", cq, len(q.running)))
                out.append(("kueue_admitted_workloads_total", pc, q.admitted_total))
                resource = {"cohort": q.cohort, **cq, "flavor": q.flavor, "resource": RESOURCE}
                limits = {
                    "kueue_cluster_queue_borrowing_limit": q.quota.borrowing_limit,
                    "kueue_cluster_queue_lending_limit": q.quota.lending_limit,
                    "kueue_cluster_queue_nominal_quota": q.quota.nominal,
                }
                for name, limit in limits.items():
                    out.append((name, resource, math.inf if limit is None else limit))
                out.append(("kueue_cluster_queue_resource_usage", resource, q.usage))
                for (reason, cause), count in q.evicted.items():
                    out.append(
                        ("kueue_evicted_workloads_total", {**pc, "reason": reason, "underlying_cause": cause}, count)
                    )
                inadmissible = sum(1 for w in q.pending if w.tried)
                out.append(("kueue_pending_workloads", {**cq, "status": "active"}, len(q.pending) - inadmissible))
                out.append(("kueue_pending_workloads", {**cq, "status": "inadmissible"}, inadmissible))
                for reason, count in q.preempted.items():
                    labels = {"preempting_cluster_queue": q.name, "reason": reason, **role}
                    out.append(("kueue_preempted_workloads_total", labels, count))
                out.append(("kueue_reserving_active_workloads", cq, len(q.running)))
        return out

    def exposition(self, site: str, at: datetime | None = None) -> str:
        """The site's Kueue metrics as its /metrics prints them; with ``at``, each line stamped
        with it (Kueue prints none: the console stamps a scrape when it arrives)."""
        by_family: dict[str, list[str]] = {name: [] for name, _, _ in FAMILIES}
        stamp = f" {round(at.timestamp() * 1000)}" if at is not None else ""
        for name, labels, value in self.samples(site):
            family = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            by_family[family if family in by_family else name].append(f"{name}{{{text}}} {_value(value)}{stamp}")
        out = []
        for name, kind, help_text in FAMILIES:
            if by_family[name]:
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *by_family[name]]
        return "\n".join(out) + "\n"

    # --- the live run --------------------------------------------------------------------------------

    def tick(self, now: datetime, sender: Any) -> int:
        """Every ``interval``: run the queues to ``now`` and push each site's scrape; returns the
        sites pushed. ``sender`` is fleet.telemetry.simulator.Poster (``send_text``). The first
        tick also pushes the scrape one interval before, stamped: a counter's increase needs two
        samples, and without it the run's first minute would show no admissions."""
        if self.posted_at is not None and now - self.posted_at < self.interval:
            return 0
        if self.posted_at is None:
            before = now - self.interval
            self._scrape(max(before, self.clock or before), sender, stamped=True)
        return self._scrape(now, sender, stamped=self.stamped)

    def _scrape(self, now: datetime, sender: Any, *, stamped: bool) -> int:
        self.posted_at = now
        self.advance(now)
        pushed = 0
        for site in self.sites:
            response = sender.send_text(
                site, "/api/v1/ingest/prometheus", self.exposition(site, now if stamped else None)
            )
            if response is not None and response.status_code < 300:
                pushed += 1
            else:
                status = response.status_code if response is not None else "no answer"
                self.rejected.append(f"{site}: Kueue scrape {status}: {getattr(response, 'text', '')[:200]}")
        return pushed


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method: the means here are well below one)."""
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def seed_queues(sim: KueueSimulator) -> int:
    """The simulated ClusterQueues registered under their sites, each mapped to its pool and team
    as an operator would have mapped them (the door registers a queue on first sighting, unmapped;
    a mapping an operator changed is left alone). Returns how many this call created."""
    created = 0
    with transaction.atomic():
        sites = dict(Site.objects.filter(name__in=sim.sites).values_list("name", "pk"))
        pools = {(p.site.name, p.name): p for p in Pool.objects.filter(site__name__in=sim.sites).select_related("site")}
        teams = dict(Team.objects.filter(name__in={q.team for q in sim.queues}).values_list("name", "pk"))
        for q in sim.queues:
            if q.site not in sites:
                continue
            queue, new = SchedulerQueue.objects.get_or_create(
                site_id=sites[q.site],
                scheduler=QueueScheduler.KUEUE,
                name=q.name,
                defaults={
                    "cohort": q.cohort,
                    "pool": pools.get((q.site, q.pool)),
                    "team_id": teams.get(q.team),
                },
            )
            created += new
            if not new and queue.pool_id is None and queue.team_id is None:
                # Registered by the door before this seed ran: map it once.
                queue.pool, queue.team_id = pools.get((q.site, q.pool)), teams.get(q.team)
                queue.save(update_fields=["pool", "team"])
    return created
