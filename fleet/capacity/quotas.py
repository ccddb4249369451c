"""Admission by quota, as Kueue decides it for ClusterQueues in one cohort: pure arithmetic, no ORM.

A pool is a cohort; each team's TeamQuota on it is a ClusterQueue with one resource (GPUs):

- **nominalQuota** (``nominal``): GPUs the team is entitled to.
- **lendingLimit** (``lending_limit``; None: all of it): how much of its nominal quota the cohort
  may lend to others. The rest, nominal - lendingLimit, is *guaranteed*: only the team uses it.
- **borrowingLimit** (``borrowing_limit``; None: no limit within the cohort): how much beyond its
  nominal quota the team may hold, out of what the others lend and leave unused.

Kueue's available quota for team t (its ``available()`` for a ClusterQueue under a root cohort):

    guaranteed_t = max(0, nominal_t - lending_limit_t)      (0 without a lending limit)
    lendable_t   = nominal_t - guaranteed_t
    cohort_free  = sum(lendable_i) - sum(max(0, used_i - guaranteed_i))    over every team i
    from_cohort  = cohort_free, capped by lendable_t - max(0, used_t - guaranteed_t) + borrowing_limit_t
    available_t  = max(0, guaranteed_t - used_t) + from_cohort

A request of g GPUs fits when g <= available_t. One that does not fit but stays within the team's
nominal quota (used_t + g <= nominal_t) may reclaim it (``reclaimWithinCohort``): Never, no;
LowerPriority, by preempting other teams' borrowing reservations of lower priority; Any, whatever
their priority. Candidates are taken as Kueue orders them (lower priority first, then the most
recently admitted), skipping a team that no longer borrows, until the request fits; then those not
needed after all are given back (Kueue's fill-back), newest choice first.

Where the console differs from Kueue (docs/capacity.md):

- Time: a reservation has a window, a Kueue workload runs from now. The decision holds at every
  moment of the window: the team's use at each moment is the sum of its committed reservations
  then (``moments``: one usage per stretch between reservation boundaries), a request fits when
  it fits at the tightest moment, and a reclaim must make it fit at every moment.
- Priority is the tier first (preemptible < on-demand < reserved), then the reservation's priority.
- Reserved-tier reservations are never preempted, whatever the policy: the tier is a promise. Kueue's
  Any would take a high-priority workload too; a lender whose quota is held by reserved-tier
  borrowing waits for those reservations to end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from fleet.capacity.models import ReclaimPolicy
from fleet.choices import PriorityTier

# A reservation's rank for LowerPriority and for the order of preemption: the tier, then priority.
TIER_RANK = {PriorityTier.PREEMPTIBLE: 0, PriorityTier.ON_DEMAND: 1, PriorityTier.RESERVED: 2}
NEVER_PREEMPTED = frozenset({PriorityTier.RESERVED})


_NOT_PREEMPTED = {
    ReclaimPolicy.ANY: " (reserved-tier reservations are never preempted).",
    ReclaimPolicy.LOWER_PRIORITY: " (only their lower-priority, non-reserved reservations are preempted).",
}


@dataclass(frozen=True)
class Quota:
    """A team's ClusterQueue quota on the pool (GPUs)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def guaranteed(self) -> int:
        """Nominal quota that is never lent (nominal - lendingLimit)."""
        return 0 if self.lending_limit is None else max(0, self.nominal - self.lending_limit)

    @property
    def lendable(self) -> int:
        return self.nominal - self.guaranteed


@dataclass(frozen=True)
class Held:
    """A committed reservation (approved or active) on the pool."""

    id: int
    team: str
    gpus: int
    start: datetime
    end: datetime
    tier: str = PriorityTier.RESERVED
    priority: int = 0
    admitted_at: datetime | None = None  # when approved: the newest is preempted first


@dataclass(frozen=True)
class Request:
    team: str
    gpus: int
    start: datetime
    end: datetime
    tier: str = PriorityTier.RESERVED
    priority: int = 0
    pool: str = "the pool"  # named in the refusal


class Admission(StrEnum):
    NOMINAL = "nominal"  # within the team's nominal quota
    BORROWING = "borrowing"  # beyond it, borrowing from the cohort
    RECLAIM = "reclaim"  # within nominal, after preempting borrowers
    REFUSED = "refused"


@dataclass(frozen=True)
class Decision:
    admission: Admission
    borrowed: int = 0  # GPUs beyond nominal the team holds at its peak once admitted
    preempt: tuple[Held, ...] = ()
    reason: str = ""  # a refusal's message: what would fit and why
    fits: int = 0  # the most GPUs the team could add over the window without preempting anyone
    figures: dict[str, int | None] = field(default_factory=dict)

    @property
    def admitted(self) -> bool:
        return self.admission != Admission.REFUSED


def peak(reservations: Iterable[Held], start: datetime, end: datetime) -> int:
    """The most GPUs the reservations hold together at some moment of [start, end)."""
    events = []
    for r in reservations:
        if r.start < end and r.end > start:
            events.append((max(r.start, start), r.gpus))
            events.append((min(r.end, end), -r.gpus))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at one instant: [start, end) windows
    level = best = 0
    for _, delta in events:
        level += delta
        best = max(best, level)
    return best


def usage(held: Iterable[Held], start: datetime, end: datetime) -> dict[str, int]:
    """Each team's peak over the window (what the team holds at most, for display)."""
    by_team: dict[str, list[Held]] = defaultdict(list)
    for r in held:
        by_team[r.team].append(r)
    return {team: peak(rs, start, end) for team, rs in by_team.items()}


def moments(held: Iterable[Held], start: datetime, end: datetime) -> list[dict[str, int]]:
    """Each team's use during every stretch of [start, end) between reservation boundaries (the
    use is constant within one); a window nobody holds anything in has one, empty."""
    rows = [r for r in held if r.start < end and r.end > start]
    cuts = sorted({start} | {max(r.start, start) for r in rows} | {r.end for r in rows if r.end < end})
    out = []
    for t in cuts:
        used: dict[str, int] = defaultdict(int)
        for r in rows:
            if r.start <= t < r.end:
                used[r.team] += r.gpus
        out.append(dict(used))
    return out


def cohort_free(quotas: Mapping[str, Quota], used: Mapping[str, int]) -> int:
    """What the cohort still lends: every team's lendable quota less its use beyond its guarantee."""
    lent = sum(q.lendable for q in quotas.values())
    return lent - sum(max(0, used.get(t, 0) - q.guaranteed) for t, q in quotas.items())


def available(team: str, quotas: Mapping[str, Quota], used: Mapping[str, int]) -> int:
    """Kueue's available quota of ``team`` (module docstring); 0 for a team without quota."""
    q = quotas.get(team)
    if q is None:
        return 0
    u = used.get(team, 0)
    from_cohort = cohort_free(quotas, used)
    if q.borrowing_limit is not None:
        from_cohort = min(from_cohort, q.lendable - max(0, u - q.guaranteed) + q.borrowing_limit)
    return max(0, max(0, q.guaranteed - u) + from_cohort)


def _rank(tier: str, priority: int) -> tuple[int, int]:
    return TIER_RANK.get(PriorityTier(tier), 0), priority


def reclaim(request: Request, quotas: Mapping[str, Quota], held: list[Held], policy: str) -> tuple[Held, ...] | None:
    """The reservations to preempt so that ``request`` fits (module docstring), or None when the
    policy or the candidates cannot make it fit."""
    if policy == ReclaimPolicy.NEVER:
        return None
    mine = _rank(request.tier, request.priority)
    candidates = [
        h
        for h in held
        if h.team != request.team
        and h.team in quotas
        and h.tier not in NEVER_PREEMPTED
        and (policy == ReclaimPolicy.ANY or _rank(h.tier, h.priority) < mine)
    ]
    # Kueue's order: lower priority first, then the most recently admitted.
    candidates.sort(key=lambda h: (_rank(h.tier, h.priority), -(h.admitted_at or h.start).timestamp(), -h.id))

    def fits(remaining: list[Held]) -> bool:
        return all(
            request.gpus <= available(request.team, quotas, used)
            for used in moments(remaining, request.start, request.end)
        )

    remaining = list(held)
    chosen: list[Held] = []
    for c in candidates:
        overlap = max(c.start, request.start), min(c.end, request.end)
        if peak([r for r in remaining if r.team == c.team], *overlap) <= quotas[c.team].nominal:
            continue  # its team no longer borrows while both run: Kueue leaves it alone
        remaining.remove(c)
        chosen.append(c)
        if fits(remaining):
            break
    else:
        return None
    # Fill back: give back any choice the request does not need after all, the last but one first.
    for c in reversed(chosen[:-1]):
        if fits([*remaining, c]):
            remaining.append(c)
            chosen.remove(c)
    return tuple(chosen)


def decide(request: Request, quotas: Mapping[str, Quota], held: list[Held], policy: str) -> Decision:
    """Kueue's admission of ``request`` against the committed reservations ``held`` on the pool.

    1. A team without a quota on a pool with quotas is refused (it has no ClusterQueue there).
    2. It fits the available quota: admitted, within nominal or borrowing.
    3. It does not, but stays within the team's nominal quota: reclaimed from borrowers if the
       pool's reclaimWithinCohort policy and the candidates allow.
    4. Otherwise refused, saying how many GPUs would fit and why.
    """
    q = quotas.get(request.team)
    window = f"between {request.start.isoformat()} and {request.end.isoformat()}"
    if q is None:
        return Decision(
            Admission.REFUSED,
            reason=f"{request.team} has no quota on {request.pool}; teams with one: {', '.join(sorted(quotas))}.",
        )
    # The tightest moment of the window decides (the most the team can add throughout it).
    tightest = min(moments(held, request.start, request.end), key=lambda u: available(request.team, quotas, u))
    free = available(request.team, quotas, tightest)
    mine = usage(held, request.start, request.end).get(request.team, 0)
    own_unused = max(0, q.lendable - max(0, tightest.get(request.team, 0) - q.guaranteed))
    figures: dict[str, int | None] = {
        "nominal": q.nominal,
        "borrowing_limit": q.borrowing_limit,
        "lending_limit": q.lending_limit,
        "held": mine,
        "others_unused": max(0, cohort_free(quotas, tightest) - own_unused),
        "fits": free,
    }
    after = mine + request.gpus
    if request.gpus <= free:
        kind = Admission.NOMINAL if after <= q.nominal else Admission.BORROWING
        return Decision(kind, borrowed=max(0, after - q.nominal), fits=free, figures=figures)
    if after <= q.nominal:
        victims = reclaim(request, quotas, held, policy)
        if victims:
            return Decision(Admission.RECLAIM, preempt=victims, fits=free, figures=figures)
    limit = "none" if q.borrowing_limit is None else str(q.borrowing_limit)
    reason = (
        f"{request.team} may hold at most {free} more GPUs on {request.pool} {window}: nominal {q.nominal}, "
        f"borrowing limit {limit}, holding {mine} at its peak, others' unused {figures['others_unused']}."
    )
    if after <= q.nominal:
        reason += (
            f" The rest of its nominal quota is borrowed by other teams; the pool's reclaimWithinCohort is "
            f"{policy}, so it comes back as their reservations end" + _NOT_PREEMPTED.get(policy, ".")
        )
    return Decision(Admission.REFUSED, reason=reason, fits=free, figures=figures)
