"""What the capacity pages and the overview tile read: the plan page's tables (pools with their
figures and preemptible reservations at risk, each team's use against its quota, late and upcoming
orders, power approvals, the months a site's power curtails pools) and the tile's figures.

Everything is computed by fleet.capacity.read.supply and .planning; this module only gathers it
for a page, in a number of queries that grows with the pools, not with the reservations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from fleet.capacity.models import (
    OrderStatus,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    ReservationState,
    Team,
    TeamQuota,
)
from fleet.capacity.read import planning, supply

PLAN_MONTHS = 12


@dataclass
class PoolRow:
    """One row of the pools table."""

    pool: Pool
    figures: supply.PoolNow
    at_risk: list[Reservation]
    quotas: list[dict[str, Any]]

    @property
    def at_risk_gpus(self) -> int:
        return sum(r.gpus for r in self.at_risk)


def pool_rows(*, now: datetime | None = None) -> list[PoolRow]:
    """Every pool with today's figures, the preemptible reservations that would be preempted at
    today's healthy supply, and each team's committed GPUs against its quota."""
    now = now or timezone.now()
    pools = list(Pool.objects.select_related("site").order_by("site__name", "name"))
    figures = supply.pool_figures(pools, now=now)
    team_ids = dict(Team.objects.values_list("name", "pk"))  # each quota's team links to its page
    rows = []
    for pool in pools:
        f = figures[pool.pk]
        # preemptible_at_risk recomputes the pool's figures: only ask when preemptible GPUs held now
        # exceed what healthy supply leaves after firm reservations (otherwise none is at risk).
        at_risk = supply.preemptible_at_risk(pool, now=now) if f.reserved_preemptible > f.healthy - f.reserved else []
        quotas = [_with_share(q) | {"team_id": team_ids.get(q["team"])} for q in supply.quota_use(pool, now=now)]
        rows.append(PoolRow(pool=pool, figures=f, at_risk=at_risk, quotas=quotas))
    return rows


# Sections the rooms above capacity add to the plan page beside the pools (fleet.scheduler's live
# queues): a template and its context from the pools shown, registered from the rooms' plugins.py
# (capacity cannot import them), as the job page's are (fleet.training.views.register_job_section).
_pool_sections: list[tuple[int, str, Callable[[list[Pool]], dict[str, Any]]]] = []  # (order, template, context)


def register_pool_section(template: str, context: Callable[[list[Pool]], dict[str, Any]], *, order: int) -> None:
    """Add a section; sections show by ``order``, whatever order the rooms' plugins load in."""
    if (order, template, context) not in _pool_sections:
        _pool_sections.append((order, template, context))
        _pool_sections.sort(key=lambda section: section[0])


def pool_sections(pools: list[Pool], request: Any = None, *, rows: list[PoolRow] | None = None) -> list[SafeString]:
    """The registered sections rendered for these pools, in registration order. A section's
    context may carry ``quota_notes``, {(pool id, team): {"text", "title"}}: each is set on the
    matching quota of ``rows`` as its ``queue`` (the scheduler's wait beside the team's quota),
    read from the same figures the section shows rather than a second time."""
    out = []
    quotas = {(row.pool.pk, q["team"]): q for row in rows or [] for q in row.quotas}
    for _, template, context in _pool_sections:
        data = context(pools)
        for key, note in data.get("quota_notes", {}).items():
            if key in quotas:
                quotas[key]["queue"] = note
        out.append(mark_safe(render_to_string(template, data, request=request)))  # our templates, autoescaped
    return out


# The team page's sections from the rooms above (fleet.scheduler's queue figures for the team),
# registered the same way: a template and its context from the team and the pools it holds quotas on.
_team_sections: list[tuple[int, str, Callable[[Team, list[Pool]], dict[str, Any]]]] = []  # (order, template, context)


def register_team_section(template: str, context: Callable[[Team, list[Pool]], dict[str, Any]], *, order: int) -> None:
    """Add a section; sections show by ``order``, whatever order the rooms' plugins load in."""
    if (order, template, context) not in _team_sections:
        _team_sections.append((order, template, context))
        _team_sections.sort(key=lambda section: section[0])


def team_sections(team: Team, quotas: list[dict[str, Any]], request: Any = None) -> list[SafeString]:
    """The registered team sections rendered for ``team``; as on the plan page, a section's
    ``quota_notes`` {(pool id, team): {"text", "title"}} set each quota row's ``queue``, so the
    team page's wait beside its quota is the plan page's number."""
    pools = [q["pool"] for q in quotas]
    by_pool = {q["pool"].pk: q for q in quotas}
    out = []
    for _, template, context in _team_sections:
        data = context(team, pools)
        for (pool_id, name), note in data.get("quota_notes", {}).items():
            if name == team.name and pool_id in by_pool:
                by_pool[pool_id]["queue"] = note
        out.append(mark_safe(render_to_string(template, data, request=request)))  # our templates, autoescaped
    return out


# Reservations a team page lists: those that hold or may come to hold GPUs.
TEAM_RESERVATION_STATES = (ReservationState.REQUESTED, ReservationState.APPROVED, ReservationState.ACTIVE)


def team_quotas(team: Team, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """The team's quota on each pool with its use now: the plan page's quota row for the team
    (supply.quota_use, the same figures), with its pool."""
    now = now or timezone.now()
    pools = [
        q.pool
        for q in TeamQuota.objects.filter(team=team)
        .select_related("pool__site")
        .order_by("pool__site__name", "pool__name")
    ]
    rows = []
    for pool in pools:
        mine = [q for q in supply.quota_use(pool, now=now) if q["team"] == team.name]
        rows += [{"pool": pool, **_with_share(q)} for q in mine]
    return rows


def team_reservations(team: Team, *, now: datetime | None = None) -> list[Reservation]:
    """The team's reservations not yet over that are requested, approved or active, soonest first."""
    now = now or timezone.now()
    return list(
        Reservation.objects.filter(team=team, state__in=TEAM_RESERVATION_STATES, end__gt=now)
        .select_related("pool__site", "created_by")
        .order_by("start", "pk")
    )


def _with_share(quota: dict[str, Any]) -> dict[str, Any]:
    """A quota row with the bar's figures: used as a share of nominal + borrowing limit (without
    one, what the others lend), and the nominal quota's share of it (where the bar's marker sits);
    borrowing is use beyond nominal."""
    ceiling = quota["nominal"] + quota["max_borrow"]
    used = quota["used"]
    return {
        **quota,
        "ceiling": ceiling,
        "borrowed": max(0, used - quota["nominal"]),
        "used_pct": round(min(100.0, 100.0 * used / ceiling), 1) if ceiling else (100.0 if used else 0.0),
        "nominal_pct": round(100.0 * quota["nominal"] / ceiling, 1) if ceiling else 100.0,
    }


def open_orders(today: date | None = None) -> tuple[list[ProcurementOrder], list[ProcurementOrder]]:
    """(late, upcoming) procurement orders not delivered nor cancelled: late ones have a promised
    date in the past (capacity counts them nowhere until delivered), upcoming ones land later."""
    today = today or timezone.localdate(timezone.now(), UTC)
    orders = list(
        ProcurementOrder.objects.filter(delivered_on__isnull=True)
        .exclude(status__in=[OrderStatus.CANCELLED, OrderStatus.DELIVERED])
        .select_related("pool__site", "requested_by", "approved_by", "rejected_by")
        .order_by("promised_on", "pk")
    )
    return [o for o in orders if o.promised_on < today], [o for o in orders if o.promised_on >= today]


def power_approvals() -> list[PowerApproval]:
    """Every grid or power approval, the soonest expected first."""
    return list(
        PowerApproval.objects.select_related("site", "requested_by", "approved_by", "rejected_by").order_by(
            "expected_on", "pk"
        )
    )


def conflict_months(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Per month of the plan in conflict: the month and the pools over-committed in it."""
    out = []
    for i, month in enumerate(plan["total"]):
        pools = [f"{p['site']}/{p['name']}" for p in plan["pools"] if p["months"][i]["conflict"]]
        if pools:
            out.append({"month": month["month"], "pools": pools})
    return out


def curtailed_months(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's months with GPUs dark for a site's power, a run of months that says the same
    thing folded into one: {"first", "last" (months), "pools": [{"pool", "gpus", "why"}]}."""
    out: list[dict[str, Any]] = []
    for i, month in enumerate(plan["total"]):
        pools = [
            {"pool": f"{p['site']}/{p['name']}", "gpus": row["curtailed"], "why": row["curtailed_why"]}
            for p in plan["pools"]
            if (row := p["months"][i])["curtailed"]
        ]
        if not pools:
            continue
        if out and out[-1]["pools"] == pools and out[-1]["next"] == i:
            out[-1].update(last=month["month"], next=i + 1)
        else:
            out.append({"first": month["month"], "last": month["month"], "pools": pools, "next": i + 1})
    for run in out:
        del run["next"]
    return out


def overview_tile(request: Any) -> dict[str, Any]:
    """The tile on /: energised of installed GPUs, available now, months in conflict over the next
    twelve and late orders."""
    now = timezone.now()
    pools = list(Pool.objects.select_related("site"))
    if not pools:
        return {"has_pools": False}
    figures = supply.pool_figures(pools, now=now).values()
    late, _ = open_orders(timezone.localdate(now, UTC))
    conflicts = conflict_months(planning.plan(months=PLAN_MONTHS, now=now))
    return {
        "has_pools": True,
        "installed": sum(f.installed for f in figures),
        "energised": sum(f.energised for f in figures),
        "healthy": sum(f.healthy for f in figures),
        "available": sum(f.available for f in figures),
        "conflicts": conflicts,
        "late_orders": len(late),
        "late_gpus": sum(o.count for o in late),
    }
