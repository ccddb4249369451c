"""Which capacity pool and team a scheduler queue stands for: suggested from matching names, set
by an Operator (the page or PATCH /api/v1/scheduler/queues/<id>/; the save is audited by
compliance.signals like any model change).

Names are compared normalised, lowercase alphanumerics only, so ``team-alpha-h100``, ``Team_Alpha``
and ``alpha`` meet. A queue suggests the team whose name its own contains, and the pool at its
site whose name or GPU model (``h100`` of "NVIDIA H100 80GB HBM3") its name or cohort contains.
Where several match, the longest match wins (``alpha-2`` over ``alpha``); a tie suggests nothing
rather than guess. A Kueue LocalQueue is named ``namespace/name``, so a namespace or a LocalQueue
named like a team suggests it; a LocalQueue or a Slurm account takes a team only, never a pool
(SchedulerQueue.takes_pool).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet.capacity.models import Pool, Team
from fleet.scheduler.models import SchedulerQueue

_NOT_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")
# Words of a GPU model name that say who made it or how much memory it has, not which model it is.
_NOT_A_MODEL = re.compile(r"^(nvidia|amd|intel|tesla|instinct|\d+gb|hbm\d*e?|sxm\d*|pcie|nvl\d*)$")


def normalise(name: str) -> str:
    """Lowercase alphanumerics only: ``Team-Alpha_H100`` -> ``teamalphah100``."""
    return _NOT_ALPHANUMERIC.sub("", name.lower())


def gpu_model_slug(gpu_model: str) -> str:
    """The model's own word: ``h100`` of "NVIDIA H100 80GB HBM3", ``mi300x`` of "AMD Instinct MI300X"."""
    words = [w for w in _NOT_ALPHANUMERIC.split(gpu_model.lower()) if w]
    for word in words:
        if not _NOT_A_MODEL.match(word):
            return word
    return normalise(gpu_model)


def _longest(matches: Iterable[tuple[int, object]]) -> object | None:
    """The candidate of the longest match; None for no match or a tie at the longest."""
    ranked = sorted(matches, key=lambda m: m[0], reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0][0] == ranked[1][0] and ranked[0][1] != ranked[1][1]):
        return None
    return ranked[0][1]


def suggest_team(queue_name: str, teams: Sequence[Team]) -> Team | None:
    """The team whose normalised name the queue's contains (longest wins, a tie suggests none)."""
    name = normalise(queue_name)
    if not name:
        return None
    found = [(len(key), team) for team in teams if (key := normalise(team.name)) and key in name]
    return _longest(found)  # type: ignore[return-value]


def suggest_pool(queue_name: str, cohort: str, pools: Sequence[Pool]) -> Pool | None:
    """The pool (of the queue's site: the caller passes those) whose normalised name or GPU model
    slug the queue's name or cohort contains (longest wins, a tie suggests none)."""
    haystacks = [h for h in (normalise(queue_name), normalise(cohort)) if h]
    found = []
    for pool in pools:
        keys = {k for k in (normalise(pool.name), gpu_model_slug(pool.gpu_model)) if k}
        hits = [len(k) for k in keys for h in haystacks if k in h]
        if hits:
            found.append((max(hits), pool))
    return _longest(found)  # type: ignore[return-value]


@dataclass(frozen=True)
class Suggestion:
    pool: Pool | None
    team: Team | None


def suggestions(queues: Sequence[SchedulerQueue]) -> dict[int, Suggestion]:
    """queue id -> its suggested pool and team, from two queries whatever the number of queues."""
    teams = list(Team.objects.all())
    pools_by_site: dict[int, list[Pool]] = {}
    for pool in Pool.objects.filter(site__in={q.site_id for q in queues}):
        pools_by_site.setdefault(pool.site_id, []).append(pool)
    return {
        q.pk: Suggestion(
            pool=suggest_pool(q.name, q.cohort, pools_by_site.get(q.site_id, [])) if q.name and q.takes_pool else None,
            team=suggest_team(q.name, teams) if q.name else None,
        )
        for q in queues
    }


class MappingRefused(ValueError):
    """A mapping that cannot be (HTTP 400). ``detail`` names the field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.detail = {field: [message]}


def check_mapping(queue: SchedulerQueue, *, pool: Pool | None) -> None:
    """Raise MappingRefused unless ``pool`` may take the queue's work: a pool of its own site, and
    none for a queue that stands for a team only (a LocalQueue, a Slurm account)."""
    if pool is not None and not queue.takes_pool:
        raise MappingRefused(
            "pool",
            f"A {queue.get_scheduler_display()} {queue.get_kind_display()} maps to a team only: "
            "its work runs on the pool of the ClusterQueue or partition it submits to.",
        )
    if pool is not None and pool.site_id != queue.site_id:
        raise MappingRefused("pool", f"Pool {pool} is at another site than the queue ({queue.site.name}).")


def set_mapping(queue: SchedulerQueue, *, changes: Mapping[str, Pool | Team | None]) -> SchedulerQueue:
    """Map the queue to the ``pool`` and/or ``team`` in ``changes`` (None: unmapped); what is left
    out does not change. One save: compliance.signals writes the audit entry with the acting person."""
    if "pool" in changes:
        check_mapping(queue, pool=changes["pool"])  # type: ignore[arg-type]
    fields = [name for name in ("pool", "team") if name in changes]
    for name in fields:
        setattr(queue, name, changes[name])
    if fields:
        queue.save(update_fields=fields)
    return queue
