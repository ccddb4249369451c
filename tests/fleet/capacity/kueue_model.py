"""A small model of Kueue's admission for ClusterQueues of one cohort and one resource, written
from Kueue's documentation, independent of fleet.capacity.quotas (which it is checked against in
test_kueue_model.py). One moment, no time windows: what Kueue decides for a pending workload now.

From kueue.sigs.k8s.io, concepts/cluster_queue and concepts/preemption:

- ``nominalQuota``: what the ClusterQueue is entitled to.
- ``borrowingLimit``: how much beyond its nominal quota it may use; empty: up to the sum of the
  nominal quotas of the cohort's queues.
- ``lendingLimit``: the most of its unused nominal quota the others may borrow; the rest,
  nominalQuota - lendingLimit, stays its own. Empty: all of it may be lent.
- A workload is admitted when it fits: its queue's usage with it stays within nominal plus the
  borrowing limit, and what the cohort's queues use beyond the parts they keep to themselves does
  not exceed what they lend. Kueue avoids preemptions when a workload fits by borrowing.
- ``reclaimWithinCohort`` (Never, LowerPriority, Any): a workload that does not fit but whose
  queue would stay within its nominal quota may preempt workloads of other queues of the cohort
  that use more than their nominal quota (LowerPriority: only those of lower priority).
  Candidates are ordered by lowest priority, then the most recently admitted; Kueue takes them in
  turn, passing over one whose queue no longer borrows, until the workload fits without
  borrowing, then goes back over the targets in reverse and gives back each one the workload
  still fits without.

The model states the fit as the constraints above (no "available quota" arithmetic), so that an
error in that arithmetic in the product shows up as a disagreement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Queue:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def kept(self) -> int:
        """The part of the nominal quota never lent (nominalQuota - lendingLimit)."""
        return 0 if self.lending_limit is None else self.nominal - self.lending_limit


@dataclass(frozen=True)
class Workload:
    id: int
    queue: str
    gpus: int
    priority: int = 0
    admitted: int = 0  # admission order: higher is more recent


@dataclass(frozen=True)
class Outcome:
    kind: str  # "admit", "borrow", "reclaim", "pending"
    preempted: frozenset[int] = frozenset()


def usage(workloads: Sequence[Workload]) -> dict[str, int]:
    used: dict[str, int] = {}
    for w in workloads:
        used[w.queue] = used.get(w.queue, 0) + w.gpus
    return used


def fits(
    queue: str, gpus: int, queues: Mapping[str, Queue], used: Mapping[str, int], *, borrowing: bool = True
) -> bool:
    """Whether ``gpus`` more for ``queue`` keep every rule of the cohort."""
    after = {name: used.get(name, 0) for name in queues}
    after[queue] += gpus
    q = queues[queue]
    if q.borrowing_limit is not None and after[queue] > q.nominal + q.borrowing_limit:
        return False
    if not borrowing and after[queue] > q.nominal:
        return False
    lent = sum(qq.nominal - qq.kept for qq in queues.values())
    drawn = sum(max(0, after[name] - qq.kept) for name, qq in queues.items())
    return drawn <= lent


def admit(
    pending: Workload, queues: Mapping[str, Queue], admitted: Sequence[Workload], reclaim: str = "Never"
) -> Outcome:
    """Kueue's decision for ``pending`` with ``admitted`` running."""
    q = queues[pending.queue]
    used = usage(admitted)
    if fits(pending.queue, pending.gpus, queues, used):
        borrows = used.get(pending.queue, 0) + pending.gpus > q.nominal
        return Outcome("borrow" if borrows else "admit")
    if reclaim == "Never" or used.get(pending.queue, 0) + pending.gpus > q.nominal:
        return Outcome("pending")

    def borrowing(name: str, running: Sequence[Workload]) -> bool:
        return usage(running).get(name, 0) > queues[name].nominal

    candidates = [
        w
        for w in admitted
        if w.queue != pending.queue
        and borrowing(w.queue, admitted)
        and (reclaim == "Any" or w.priority < pending.priority)
    ]
    candidates.sort(key=lambda w: (w.priority, -w.admitted))
    running = list(admitted)
    targets: list[Workload] = []
    for w in candidates:
        if not borrowing(w.queue, running):
            continue
        running.remove(w)
        targets.append(w)
        if fits(pending.queue, pending.gpus, queues, usage(running), borrowing=False):
            break
    else:
        return Outcome("pending")
    for w in reversed(targets[:-1]):
        if fits(pending.queue, pending.gpus, queues, usage([*running, w]), borrowing=False):
            running.append(w)
            targets.remove(w)
    return Outcome("reclaim", frozenset(w.id for w in targets))
