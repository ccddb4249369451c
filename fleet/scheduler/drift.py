"""Quota drift: where the quota a scheduler enforces differs from the console's TeamQuota.

For each queue mapped to a pool and a team, Kueue's latest ``nominal_quota``, ``borrowing_limit``
and ``lending_limit`` for ``nvidia.com/gpu`` (summed over the queue's flavors; +Inf, Kueue's "no
limit", stays no limit) are set beside the TeamQuota of that team on that pool. A queue the
scheduler reports no GPU quota for, or a team with no quota on the pool, is drift too.

An Admin or a Capacity approver (the console's quota rule, fleet.capacity.actions.approvals) may import
the scheduler's values into TeamQuota: created or updated with one save, audited by
compliance.signals, refused where TeamQuota would refuse them (a lending limit above the nominal
quota, a fraction of a GPU).

Queues are compared one by one: two queues mapped to the same team and pool are each set beside
the same TeamQuota.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.capacity.actions import approvals
from fleet.capacity.models import TeamQuota
from fleet.scheduler.models import SchedulerQueue, SchedulerRollup1m

GPU_RESOURCE = "nvidia.com/gpu"
QUOTA_QUANTITIES = ("nominal_quota", "borrowing_limit", "lending_limit")
# How far back the latest reported quota is looked for: Kueue reports its gauges every scrape, so a
# queue silent for a day has no quota the console can trust.
LOOKBACK = timedelta(days=1)
# Where a reporting queue's newest quota minute is looked for first: Kueue is scraped every 15 to
# 60 s, so ten minutes is many scrapes (fleet.scheduler.read.GAUGE_FRESH reads gauges so too).
RECENT = timedelta(minutes=10)
# TeamQuota's own bound (fleet.capacity.api.TeamQuotaSerializer).
MAX_GPUS = 1_000_000
# The console's field for each of the scheduler's quantities.
FIELDS = {
    "nominal_quota": "nominal_gpus",
    "borrowing_limit": "borrowing_limit_gpus",
    "lending_limit": "lending_limit_gpus",
}


@dataclass(frozen=True)
class SchedulerQuota:
    """A queue's GPU quota as the scheduler reports it; None for a limit: unset (+Inf, no limit)."""

    nominal: float
    borrowing_limit: float | None
    lending_limit: float | None
    reported_at: datetime


@dataclass
class Drift:
    """One mapped queue set beside its team's quota on its pool. ``differences``: the console's
    field -> (the scheduler's value, the console's), None meaning no limit; empty when they agree."""

    queue: SchedulerQueue
    scheduler: SchedulerQuota | None
    console: TeamQuota | None
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.scheduler is None and self.console is None:
            return "missing-both"
        if self.scheduler is None:
            return "missing-in-scheduler"
        if self.console is None:
            return "missing-in-console"
        return "drift" if self.differences else "match"

    @property
    def drifted(self) -> bool:
        return self.status != "match"

    def as_dict(self) -> dict[str, Any]:
        q = self.queue
        s = self.scheduler
        c = self.console
        return {
            "queue": q.pk,
            "queue_name": q.name,
            "site": q.site.name,
            "scheduler": q.scheduler,
            "pool": q.pool_id,
            "pool_name": q.pool.name if q.pool else None,
            "team": q.team.name if q.team else None,
            "status": self.status,
            "scheduler_quota": None
            if s is None
            else {
                "nominal_gpus": number(s.nominal),
                "borrowing_limit_gpus": number(s.borrowing_limit),
                "lending_limit_gpus": number(s.lending_limit),
                "reported_at": s.reported_at,
            },
            "console_quota": None
            if c is None
            else {
                "id": c.pk,
                "nominal_gpus": c.nominal_gpus,
                "borrowing_limit_gpus": c.borrowing_limit_gpus,
                "lending_limit_gpus": c.lending_limit_gpus,
            },
            "differences": {k: {"scheduler": number(a), "console": b} for k, (a, b) in self.differences.items()},
        }


def number(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def _sum(values: list[float]) -> float | None:
    """Summed over flavors; any flavor without a limit makes the queue's limit none."""
    return None if any(math.isinf(v) for v in values) else sum(values)


def _latest_quota_rows(queue_ids: list[int], since: datetime) -> list[tuple[int, str, datetime, float]]:
    """(queue, quantity, minute, last) of each GPU quota series' newest minute since ``since``."""
    if not queue_ids:
        return []
    return list(
        SchedulerRollup1m.objects.filter(
            queue_id__in=queue_ids,
            quantity__in=QUOTA_QUANTITIES,
            series__contains=f'resource="{GPU_RESOURCE}"',
            bucket__gte=since,
        )
        .order_by("queue_id", "quantity", "series", "-bucket")
        .distinct("queue_id", "quantity", "series")
        .values_list("queue_id", "quantity", "bucket", "last")
    )


def scheduler_quotas(queue_ids: list[int], *, now: datetime | None = None) -> dict[int, SchedulerQuota]:
    """queue id -> its latest reported GPU quota. Per queue and quantity, the flavors of the latest
    minute reported (a flavor removed from the ClusterQueue drops out with its last minute).

    Two statements at most: the last RECENT minutes for every queue, then the day only for the
    queues with no nominal quota among them. A day of every queue's series is a few hundred
    thousand rows to sort (230 ms for 50 ClusterQueues, bench/scheduler.py), and this runs on the
    capacity page and the overview; a queue that reports keeps all its quota gauges in each scrape,
    so its newest minute lies within the recent ones."""
    now = now or timezone.now()
    latest = _latest_quota_rows(queue_ids, now - RECENT)
    reporting = {queue_id for queue_id, quantity, _, _ in latest if quantity == "nominal_quota"}
    latest += _latest_quota_rows([q for q in queue_ids if q not in reporting], now - LOOKBACK)
    newest: dict[tuple[int, str], datetime] = {}
    values: dict[tuple[int, str], list[tuple[datetime, float]]] = {}
    for queue_id, quantity, bucket, last in latest:
        key = (queue_id, quantity)
        newest[key] = max(newest.get(key, bucket), bucket)
        values.setdefault(key, []).append((bucket, last))
    out = {}
    for queue_id in queue_ids:
        if (queue_id, "nominal_quota") not in values:
            continue  # no nominal quota: the scheduler holds no GPU quota for it
        figures: dict[str, float | None] = {}
        for quantity in QUOTA_QUANTITIES:
            key = (queue_id, quantity)
            current = [v for b, v in values.get(key, []) if b == newest.get(key)]
            # Kueue reports +Inf for an unset limit; a limit it did not report at all is unset too.
            figures[quantity] = _sum(current) if current else (0.0 if quantity == "nominal_quota" else None)
        out[queue_id] = SchedulerQuota(
            nominal=figures["nominal_quota"] or 0.0,
            borrowing_limit=figures["borrowing_limit"],
            lending_limit=figures["lending_limit"],
            reported_at=newest[(queue_id, "nominal_quota")],
        )
    return out


def _differences(s: SchedulerQuota, c: TeamQuota) -> dict[str, tuple[Any, Any]]:
    pairs = {
        "nominal_gpus": (s.nominal, c.nominal_gpus),
        "borrowing_limit_gpus": (s.borrowing_limit, c.borrowing_limit_gpus),
        "lending_limit_gpus": (s.lending_limit, c.lending_limit_gpus),
    }
    return {k: (a, b) for k, (a, b) in pairs.items() if a != b}


def mapped_queues() -> list[SchedulerQueue]:
    return list(
        SchedulerQueue.objects.filter(pool__isnull=False, team__isnull=False).select_related("site", "pool", "team")
    )


def quota_drift(*, queues: list[SchedulerQueue] | None = None, now: datetime | None = None) -> list[Drift]:
    """Every queue mapped to a pool and a team, set beside its team's quota on the pool; the
    caller filters on ``drifted``. Three or four statements whatever the number of queues."""
    queues = mapped_queues() if queues is None else queues
    reported = scheduler_quotas([q.pk for q in queues], now=now)
    quotas = {
        (tq.team_id, tq.pool_id): tq
        for tq in TeamQuota.objects.filter(
            pool__in={q.pool_id for q in queues}, team__in={q.team.name for q in queues if q.team}
        )
    }
    rows = []
    for q in queues:
        s = reported.get(q.pk)
        c = quotas.get((q.team.name, q.pool_id)) if q.team else None
        rows.append(Drift(queue=q, scheduler=s, console=c, differences=_differences(s, c) if s and c else {}))
    return rows


class ImportRefused(ValueError):
    """The scheduler's values cannot become a TeamQuota (HTTP 400, or 409 for ``conflict``)."""

    def __init__(self, detail: dict[str, Any], *, conflict: bool = False) -> None:
        super().__init__(str(detail))
        self.detail = detail
        self.conflict = conflict


def _whole_gpus(field_name: str, value: float | None) -> int | None:
    if value is None:
        return None
    if not float(value).is_integer() or value < 0 or value > MAX_GPUS:
        raise ImportRefused(
            {field_name: [f"The scheduler reports {value}: not a whole number of GPUs up to {MAX_GPUS}."]}
        )
    return int(value)


def import_quota(queue: SchedulerQueue, *, actor: Any, now: datetime | None = None) -> TeamQuota:
    """Make the team's quota on the queue's pool the scheduler's (create or update it).

    1. The console's quota rule: an Admin or a Capacity approver (approvals.ApprovalRefused, 403).
    2. The queue must be mapped to a pool and a team, and the scheduler must report its GPU quota.
    3. TeamQuota's rules: whole GPUs, a lending limit within the nominal quota.
    4. One save in a transaction: compliance.signals audits it with the acting person.
    """
    approvals.check_quota_change(actor)
    if queue.pool_id is None or queue.team_id is None:
        missing = "pool" if queue.pool_id is None else "team"
        raise ImportRefused({missing: ["Map the queue to a pool and a team first."]})
    reported = scheduler_quotas([queue.pk], now=now).get(queue.pk)
    if reported is None:
        raise ImportRefused(
            {"queue": [f"The scheduler reports no {GPU_RESOURCE} quota for this queue in the last day."]}, conflict=True
        )
    values = {
        "nominal_gpus": _whole_gpus("nominal_gpus", reported.nominal),
        "borrowing_limit_gpus": _whole_gpus("borrowing_limit_gpus", reported.borrowing_limit),
        "lending_limit_gpus": _whole_gpus("lending_limit_gpus", reported.lending_limit),
    }
    lending, nominal = values["lending_limit_gpus"], values["nominal_gpus"]
    if lending is not None and nominal is not None and lending > nominal:
        raise ImportRefused({"lending_limit_gpus": ["Must not exceed nominal_gpus (as in Kueue)."]})
    with transaction.atomic():
        quota = TeamQuota.objects.select_for_update().filter(team=queue.team.name, pool=queue.pool_id).first()
        if quota is None:
            quota = TeamQuota(team=queue.team, pool=queue.pool)
        for name, value in values.items():
            setattr(quota, name, value)
        quota.save()
    return quota
