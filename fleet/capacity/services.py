"""Capacity: what each pool can supply now and later, and what reservations commit of it.

Figures of a pool (all in GPUs):

- **installed**: the site's physical GPUs of the pool's model (MIG instances never count).
- **energised**: what the racks' power budgets run. Per rack, whole nodes at full load
  (power_budget.energisable_nodes, nodes in hostname order, every GPU node of the rack sharing the
  budget whatever its model); a rack with no budget, or a node in no rack, counts in full. When
  the site has a contracted power (plus the approved power due by today) and those nodes together
  draw more at full load, whole nodes are curtailed by the site's power rule
  (power_budget.site_power_steps): the site's pools keep their power in the order they were added
  (the pool running longest first), nodes in hostname order within a pool, nodes of GPUs no pool
  counts last; a node that does not fit what is left is curtailed and the next one tried.
- **healthy**: energised minus the energised GPUs of the pool taken out of service by open
  incidents (the union of ``impact["gpu_uuids"]`` of their firing findings, as the engine counts).
- **reserved**: approved and active reservations overlapping now, preemptible shown apart.
- **available**: healthy minus reserved (never below zero).

Future supply (supply_at): today's figures, plus

1. procurement orders landing (approved ones only: fleet.capacity.approvals): an undelivered
   order that is not late counts from its promised
   date; a late order (promised date past, not delivered) counts nowhere until it is delivered (its
   new date is unknown; counting it would promise capacity nobody can name a day for); a
   delivered order is in the inventory already, a cancelled one never counts;
2. power: the kW of power approvals (status approved or energised) land on their expected date
   and first restore the site's curtailed nodes (same order, whole nodes); the power left then
   energises the GPUs landed and still dark, in arrival order across the site's pools, GPU by GPU
   at the pool's per-GPU node power (board power plus the node overhead over the pool's node size:
   the mean GPUs per node of its installed nodes, DEFAULT_GPUS_PER_NODE when it has none). Nothing
   energised is switched off. A site with no contracted power energises what lands in full (its
   power is not the limit the console knows of).

Only energised supply counts for commitments. Supply moves on dates (midnight UTC).
"""

from __future__ import annotations

import bisect
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, TypeVar

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Count, F, Func
from django.utils import timezone

from console import spreadsheet
from console.signals import row_changed
from fleet.capacity import power_budget, quotas
from fleet.capacity.models import (
    COMMITTED_STATES,
    ApprovalStatus,
    OrderApproval,
    OrderStatus,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    ReservationState,
    TeamQuota,
)
from fleet.choices import PriorityTier
from fleet.inventory.models import Gpu

DEFAULT_GPUS_PER_NODE = 8


class ConflictError(Exception):
    """A state change refused by the current state (HTTP 409). ``detail`` is the response body."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.detail = {"detail": message, **detail}


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


# An instant in a sweep: a datetime, or (in the plan) integer microseconds since the epoch.
Instant = TypeVar("Instant", datetime, int)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _epoch_us(t: datetime) -> int:
    return (t - _EPOCH) // _MICROSECOND


def _epoch_us_of(field_name: str) -> Func:
    """A timestamptz column read as integer epoch microseconds (exact: EXTRACT is numeric).

    The plan reads thousands of reservation windows; psycopg's timestamptz loader, wrapped by
    Django's time-zone loader, costs about 5 µs a value, most of the plan's time, where an
    integer costs a fraction of that. The sweeps only order and compare instants."""
    return Func(
        F(field_name),
        template="(EXTRACT(EPOCH FROM %(expressions)s) * 1000000)::bigint",
        output_field=BigIntegerField(),
    )


# --- today's figures -------------------------------------------------------------------------------


@dataclass
class PoolNow:
    installed: int = 0
    energised: int = 0
    healthy: int = 0
    reserved: int = 0
    reserved_preemptible: int = 0
    # For future supply: per-GPU node power (W) of GPUs landing, and the site's power rule inputs.
    gpu_w: float = 0.0
    site_power: SitePowerInputs | None = None

    @property
    def available(self) -> int:
        return max(0, self.healthy - self.reserved)

    def as_dict(self) -> dict[str, int]:
        return {
            "installed": self.installed,
            "energised": self.energised,
            "healthy": self.healthy,
            "reserved": self.reserved,
            "reserved_preemptible": self.reserved_preemptible,
            "available": self.available,
        }


@dataclass
class SitePowerInputs:
    """What the site's power rule (power_budget.site_power_steps) needs, read once by pool_figures
    and shared by the site's pools: nodes in power order, approved power, the pools in power order
    and the per-GPU node power of each (for GPUs landing)."""

    contract_w: float | None
    nodes: list[power_budget.SiteNode]
    approvals: list[tuple[date, float]]
    pools: list[int]
    gpu_w: dict[int, float]

    def steps(self, today: date, arrivals: Iterable[power_budget.Arrival] = ()) -> list[power_budget.SitePower]:
        return power_budget.site_power_steps(
            contract_w=self.contract_w,
            today=today,
            nodes=self.nodes,
            arrivals=arrivals,
            approvals=self.approvals,
            pools=self.pools,
        )


def out_of_service_uuids() -> set[str]:
    """Physical GPUs taken out of service now: named as faulty by firing findings of open incidents
    (incidents.services.cost.faulty_gpu_uuids: a job's straggler or hang does not take its gang out)."""
    from incidents.models import Finding, Incident
    from incidents.services.cost import faulty_gpu_uuids

    uuids: set[str] = set()
    impacts = Finding.objects.firing().filter(incident__in=Incident.objects.open()).values_list("impact", flat=True)
    for impact in impacts:
        uuids.update(faulty_gpu_uuids(impact))
    return uuids


def pool_figures(pools: Iterable[Pool], *, now: datetime | None = None) -> dict[int, PoolNow]:
    """Today's figures of the pools (see the module docstring), in a fixed number of queries.

    The site's power is shared by all its pools, so every pool of the pools' sites is counted
    (and the result carries the site's power rule inputs for supply_curves); only the pools
    asked for are returned."""
    now = now or timezone.now()
    today = timezone.localdate(now, UTC)
    pools = list(pools)
    asked = [p.pk for p in pools]
    if not asked:
        return {}
    site_ids = {p.site_id for p in pools}
    # Every pool of the sites, in power order: the pool added first keeps its power longest.
    site_pools = list(
        Pool.objects.filter(site_id__in=site_ids)
        .order_by("created_at", "pk")
        .values_list("pk", "site_id", "gpu_model", "site__contracted_power_kw")
    )
    out = {pk: PoolNow() for pk, _, _, _ in site_pools}
    by_key = {(site_id, model): pk for pk, site_id, model, _ in site_pools}
    rank = {pk: i for i, (pk, _, _, _) in enumerate(site_pools)}
    contracted = {site_id: kw for _, site_id, _, kw in site_pools}
    approvals: dict[int, list[tuple[date, float]]] = defaultdict(list)
    for site_id, on, kw in PowerApproval.objects.filter(
        site_id__in=site_ids, status__in=[ApprovalStatus.APPROVED, ApprovalStatus.ENERGISED]
    ).values_list("site_id", "expected_on", "added_kw"):
        approvals[site_id].append((on, float(kw) * 1000.0))
    overhead = power_budget.node_overhead_w()

    # Every GPU node of the sites, with its physical GPUs counted by model (the rack budget is
    # shared by all of them): one aggregate row per node and model, in hostname order, rather
    # than a row per GPU.
    node_models: dict[int, dict[str, int]] = defaultdict(dict)
    nodes: list[tuple[int, int, int | None]] = []  # (node, site, rack), hostname order
    budgets: dict[int | None, Any] = {}  # rack -> its power budget (kW)
    for node_id, site_id, rack_id, budget, model, count in (
        Gpu.objects.physical()
        .filter(node__site_id__in=site_ids)
        .values_list("node_id", "node__site_id", "node__rack_id", "node__rack__power_budget_kw", "model")
        .annotate(count=Count("pk"))
        .order_by("node__hostname", "node_id", "model")
    ):
        if node_id not in node_models:
            nodes.append((node_id, site_id, rack_id))
            budgets[rack_id] = budget
        node_models[node_id][model] = count

    def node_w(node_id: int) -> float:
        return sum(n * power_budget.board_power_w(m) for m, n in node_models[node_id].items()) + overhead

    energised_nodes: list[tuple[int, int]] = []  # (node, site)
    by_rack: dict[int | None, list[tuple[int, int]]] = defaultdict(list)
    for node_id, site_id, rack_id in nodes:
        by_rack[rack_id].append((node_id, site_id))
    for rack_id, members in by_rack.items():
        budget = budgets.get(rack_id) if rack_id is not None else None
        if budget is None:
            energised_nodes.extend(members)
            continue
        left = float(budget) * 1000.0
        for node_id, site_id in members:  # hostname order: whole nodes while the budget lasts
            need = node_w(node_id)
            if power_budget.energisable_nodes(left, need, 1) == 1:
                energised_nodes.append((node_id, site_id))
                left -= need

    # The site's power rule: the nodes the racks run, in power order (their first pool's rank,
    # then hostname), at today's contracted and approved power. A node left dark is curtailed.
    def node_gpus(node_id: int, site_id: int) -> dict[int, int]:
        gpus: dict[int, int] = defaultdict(int)
        for model, count in node_models[node_id].items():
            pk = by_key.get((site_id, model))
            if pk is not None:
                gpus[pk] += count
        return dict(gpus)

    site_nodes: dict[int, list[tuple[int, power_budget.SiteNode]]] = defaultdict(list)
    for node_id, site_id in energised_nodes:
        site_nodes[site_id].append((node_id, power_budget.SiteNode(node_w(node_id), node_gpus(node_id, site_id))))
    site_inputs: dict[int, SitePowerInputs] = {}
    energised_set: set[int] = set()
    for site_id in site_ids:
        ordered = sorted(  # stable: hostname order within a rank
            site_nodes[site_id], key=lambda item: min((rank[pk] for pk in item[1].gpus), default=len(rank))
        )
        kw = contracted.get(site_id)
        inputs = SitePowerInputs(
            contract_w=None if kw is None else float(kw) * 1000.0,
            nodes=[node for _, node in ordered],
            approvals=approvals[site_id],
            pools=[pk for pk, s, _, _ in site_pools if s == site_id],
            gpu_w={},
        )
        site_inputs[site_id] = inputs
        now_state = inputs.steps(today)[0]
        energised_set.update(node_id for (node_id, _), on in zip(ordered, now_state.nodes_on, strict=True) if on)

    per_pool_nodes: dict[int, list[int]] = defaultdict(list)  # GPUs per node of the pool's model
    for node_id, site_id, _rack in nodes:
        for model, count in node_models[node_id].items():
            pk = by_key.get((site_id, model))
            if pk is None:
                continue
            figures = out[pk]
            figures.installed += count
            per_pool_nodes[pk].append(count)
            if node_id in energised_set:
                figures.energised += count

    # Energised GPUs out of service, per pool: only the few GPUs the open incidents name are read.
    lost_by_pool: dict[int, int] = defaultdict(int)
    oos = out_of_service_uuids()
    if oos:
        for node_id, site_id, model in (
            Gpu.objects.physical()
            .filter(node__site_id__in=site_ids, uuid__in=oos)
            .values_list("node_id", "node__site_id", "model")
        ):
            pk = by_key.get((site_id, model))
            if pk is not None and node_id in energised_set:
                lost_by_pool[pk] += 1

    for pk, site_id, model, _kw in site_pools:
        figures = out[pk]
        per_node = per_pool_nodes.get(pk) or [DEFAULT_GPUS_PER_NODE]
        gpus_per_node = sum(per_node) / len(per_node)
        figures.gpu_w = power_budget.board_power_w(model) + overhead / gpus_per_node
        figures.site_power = site_inputs[site_id]
        site_inputs[site_id].gpu_w[pk] = figures.gpu_w
        figures.healthy = max(0, figures.energised - lost_by_pool[pk])

    out = {pk: out[pk] for pk in asked}
    for pool_id, tier, gpus in (
        Reservation.objects.committed()
        .filter(pool_id__in=out, start__lte=now, end__gt=now)
        .values_list("pool_id", "tier", "gpus")
    ):
        if tier == PriorityTier.PREEMPTIBLE:
            out[pool_id].reserved_preemptible += gpus
        else:
            out[pool_id].reserved += gpus
    return out


# --- future supply ------------------------------------------------------------------------------------


@dataclass
class SupplyCurve:
    """A pool's supply as steps: at ``days[i]`` (midnight UTC) it becomes ``installed[i]`` and
    ``energised[i]``; before the first step it is today's."""

    today: date
    installed_now: int
    energised_now: int
    days: list[date]
    installed: list[int]
    energised: list[int]
    # The site's power today, then at each of ``days`` (power_budget.site_power_steps): what the
    # site's power leaves dark of the pool, and why.
    power: list[power_budget.SitePower] = field(default_factory=list)

    def at(self, day: date) -> tuple[int, int]:
        i = bisect.bisect_right(self.days, day) - 1
        if i < 0:
            return self.installed_now, self.energised_now
        return self.installed[i], self.energised[i]

    def power_at(self, day: date) -> power_budget.SitePower | None:
        """The site's power on ``day`` (None for a curve built without it)."""
        if not self.power:
            return None
        return self.power[max(0, bisect.bisect_right(self.days, day))]

    def steps(self) -> list[tuple[datetime, int]]:
        """(time, energised from then on), today's first."""
        return [(_day_start(self.today), self.energised_now)] + [
            (_day_start(d), e) for d, e in zip(self.days, self.energised, strict=True)
        ]

    def installed_steps(self) -> list[tuple[datetime, int]]:
        """(time, installed from then on), today's first: the bound of preemptible reservations."""
        return [(_day_start(self.today), self.installed_now)] + [
            (_day_start(d), n) for d, n in zip(self.days, self.installed, strict=True)
        ]


def landing_orders(orders: Iterable[ProcurementOrder], today: date) -> list[tuple[date, int]]:
    """(date, GPUs) of the orders still to land that count as future supply (module docstring)."""
    out = []
    for o in orders:
        if o.status in (OrderStatus.CANCELLED, OrderStatus.DELIVERED) or o.delivered_on is not None:
            continue
        if o.approval_status != OrderApproval.APPROVED:  # requested or rejected: no supply (approvals.py)
            continue
        if o.promised_on < today:  # late: counts nowhere until it is delivered
            continue
        out.append((o.promised_on, o.count))
    return out


def supply_curves(
    pools: Iterable[Pool], *, today: date | None = None, figures: dict[int, PoolNow] | None = None
) -> dict[int, SupplyCurve]:
    """Every pool's supply curve from today (1 query besides pool_figures', unless given).

    Energised supply follows the site's power rule (power_budget.site_power_steps), run once per
    site over the orders of all its pools: one pool's arrivals take power another's would."""
    today = today or timezone.localdate(timezone.now(), UTC)
    pools = list(pools)
    now_figures = figures if figures is not None else pool_figures(pools)
    sites = {p.site_id: now_figures[p.pk].site_power for p in pools}
    orders: dict[int, list[ProcurementOrder]] = defaultdict(list)
    for o in ProcurementOrder.objects.filter(pool__site_id__in=sites).exclude(status=OrderStatus.CANCELLED):
        orders[o.pool_id].append(o)

    site_steps: dict[int, list[power_budget.SitePower]] = {}
    for site_id, inputs in sites.items():
        if inputs is None:  # figures built without the site's power (not by pool_figures)
            continue
        arrivals = [  # arrival order: date, then the pools' power order, then the order's own
            power_budget.Arrival(day, pk, count, inputs.gpu_w[pk])
            for pk in inputs.pools
            for day, count in landing_orders(orders[pk], today)
        ]
        arrivals.sort(key=lambda a: a.day)
        site_steps[site_id] = inputs.steps(today, arrivals)

    curves = {}
    for p in pools:
        f = now_figures[p.pk]
        landing = landing_orders(orders[p.pk], today)
        states = site_steps.get(p.site_id, [])
        days = [state.day for state in states[1:]]
        inst = [f.installed + sum(c for d, c in landing if d <= day) for day in days]
        ener = [state.energised.get(p.pk, 0) for state in states[1:]]
        energised_now = states[0].energised.get(p.pk, 0) if states else f.energised
        curves[p.pk] = SupplyCurve(today, f.installed, energised_now, days, inst, ener, states)
    return curves


def supply_at(pool: Pool, day: date, *, today: date | None = None) -> dict[str, int]:
    """The pool's installed and energised GPUs on ``day`` (module docstring: what lands when)."""
    installed, energised = supply_curves([pool], today=today)[pool.pk].at(day)
    return {"installed": installed, "energised": energised}


# --- approving a reservation ------------------------------------------------------------------------


def _sweep_events(
    reservations: Iterable[tuple[str, int, Instant, Instant]],
) -> list[tuple[Instant, int, str, int]]:
    """(time, order, team, delta) sorted; at one instant ends (order 0) come before starts (1),
    since a window is [start, end). Times are datetimes, or epoch microseconds (the plan's)."""
    events = []
    for team, gpus, start, end in reservations:
        events.append((start, 1, team, gpus))
        events.append((end, 0, team, -gpus))
    events.sort()
    return events


def first_overcommit(
    committed: list[tuple[str, int, datetime, datetime]],
    new: tuple[str, int, datetime, datetime],
    supply_steps: list[tuple[datetime, int]],
) -> tuple[datetime, datetime, list[str], int, int] | None:
    """The first interval inside the new reservation's window where committed demand plus it
    exceeds supply: (start, end, teams holding capacity in it, demand, supply), or None.

    A sweep over reservation boundaries and supply steps, O(n log n) in the reservations."""
    _, _, w_start, w_end = new
    events = _sweep_events([*committed, new])
    supply_times = [t for t, _ in supply_steps]

    def supply(t: datetime) -> int:
        i = bisect.bisect_right(supply_times, t) - 1
        return supply_steps[max(i, 0)][1]

    points = sorted({t for t, *_ in events} | {t for t in supply_times if w_start < t < w_end} | {w_start})
    demand = 0
    holders: dict[str, int] = defaultdict(int)
    ei = 0
    over: tuple[datetime, list[str], int, int] | None = None
    for i, t in enumerate(points):
        while ei < len(events) and events[ei][0] <= t:
            _, _, who, delta = events[ei]
            demand += delta
            holders[who] += delta
            ei += 1
        if t >= w_end:
            break
        nxt = points[i + 1] if i + 1 < len(points) else w_end
        if nxt <= w_start:
            continue
        s = supply(t)
        if demand > s:
            teams = sorted(k for k, v in holders.items() if v > 0)
            if over is None:
                over = (max(t, w_start), teams, demand, s)
            else:
                over = (over[0], sorted(set(over[1]) | set(teams)), max(over[2], demand), min(over[3], s))
        elif over is not None:
            return over[0], t, over[1], over[2], over[3]
    if over is not None:
        return over[0], w_end, over[1], over[2], over[3]
    return None


def quota_decision(
    pool: Pool,
    *,
    team: str,
    gpus: int,
    start: datetime,
    end: datetime,
    tier: str,
    priority: int = 0,
    exclude: int | None = None,
) -> quotas.Decision | None:
    """Kueue's admission of a request on the pool (fleet.capacity.quotas) against the committed
    reservations overlapping its window, every tier counted; None on a pool without quotas (first
    come, first served within supply). ``exclude``: the request itself, if stored."""
    team_quotas = {
        t: quotas.Quota(n, b, lend)
        for t, n, b, lend in TeamQuota.objects.filter(pool=pool).values_list(
            "team_id", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"
        )
    }
    if not team_quotas:
        return None
    held = [
        quotas.Held(*row)
        for row in Reservation.objects.committed()
        .filter(pool=pool)
        .overlapping(start, end)
        .exclude(pk=exclude)
        .values_list("pk", "team_id", "gpus", "start", "end", "tier", "priority", "approved_at")
    ]
    request = quotas.Request(team, gpus, start, end, tier, priority, pool=str(pool))
    return quotas.decide(request, team_quotas, held, pool.reclaim_within_cohort)


def _quota_refusal(decision: quotas.Decision) -> ConflictError:
    """The 409 of a refusal by quota: the reason on ``gpus``, with what would fit and the figures."""
    return ConflictError(
        "Refused by the team's quota.", gpus=decision.reason, fits=decision.fits, quota=decision.figures
    )


def _log(actor: Any, reservation: Reservation, flag: int, message: str) -> None:
    if actor is None or not getattr(actor, "pk", None):
        return  # an agent token: the reservation names it in requested_via
    LogEntry.objects.log_actions(  # type: ignore[attr-defined]
        user_id=actor.pk, queryset=[reservation], action_flag=flag, change_message=message
    )


# What a repeat of a create must match to be the same request (client_id_scope's idempotency).
REPEAT_FIELDS = ("team", "pool", "gpus", "start", "end", "tier", "priority", "note")


def client_id_scope(*, site_id: int | None = None, user_id: int | None = None) -> str:
    """Whose client ids a sender's are among: an agent token's site's, or the person's."""
    return f"site:{site_id}" if site_id is not None else f"user:{user_id}"


def create_reservation(*, actor: Any, via: str, scope: str = "", **values: Any) -> tuple[Reservation, bool]:
    """Record a reservation request (state requested): (reservation, created).

    A client id is unique within ``scope`` (client_id_scope: the token's site, or the person), so
    no sender reaches or squats another's. A repeat with the same fields returns the first one
    unchanged; a repeat that differs is a ConflictError naming the fields that differ. A request
    the team's quota refuses now (fleet.capacity.quotas: it would not fit even by reclaiming) raises
    ConflictError naming what would fit; approval checks again, with supply, since others may
    commit meanwhile.
    """
    client_id = values.get("client_id")
    if client_id is None:
        with transaction.atomic():
            return _create(actor, via, "", values), True
    try:
        with transaction.atomic():
            existing = Reservation.objects.filter(client_scope=scope, client_id=client_id).first()
            if existing is None:
                return _create(actor, via, scope, values), True
    except IntegrityError:  # a twin request committed the id meanwhile: compare with it
        existing = Reservation.objects.get(client_scope=scope, client_id=client_id)
    differing = [f for f in REPEAT_FIELDS if f in values and values[f] != getattr(existing, f)]
    if differing:
        raise ConflictError(
            f"client_id {client_id!r} was used for another request; {', '.join(differing)} differ.",
            client_id=client_id,
            fields=differing,
            reservation=existing.pk,
        )
    return existing, False


def _check_quota(values: dict[str, Any], *, exclude: int | None = None) -> None:
    """A request's check at the door (a create, or a change of what a requested one asks for):
    ConflictError naming what would fit when the team's quota refuses it now. Supply is checked
    at approval, when it is committed."""
    team = values["team"]
    decision = quota_decision(
        values["pool"],
        team=getattr(team, "name", team),
        gpus=values["gpus"],
        start=values["start"],
        end=values["end"],
        tier=values.get("tier", PriorityTier.RESERVED),
        priority=values.get("priority", 0),
        exclude=exclude,
    )
    if decision is not None and not decision.admitted:
        raise _quota_refusal(decision)


def _create(actor: Any, via: str, scope: str, values: dict[str, Any]) -> Reservation:
    _check_quota(values)
    reservation = Reservation.objects.create(
        created_by=actor if getattr(actor, "pk", None) else None, requested_via=via, client_scope=scope, **values
    )
    _log(actor, reservation, ADDITION, f"Requested {reservation.gpus} GPUs ({reservation.tier}).")
    return reservation


# What a request asks for: a change of one re-runs creation's quota check and, once approved,
# needs approving again.
ASKED_FIELDS = ("team", "pool", "gpus", "start", "end", "tier", "priority")


def update_reservation(reservation: Reservation, *, actor: Any, changes: dict[str, Any]) -> Reservation:
    """Change a reservation's fields (the API's PATCH, the page's change form), or raise
    ApprovalRefused (HTTP 403) or ConflictError (HTTP 409); nothing is stored on a refusal.

    1. Lock the pool the reservation is to be on, as approve does, and read the row again.
    2. Whatever its state, it is changed only by its requester or an Admin
       (fleet.capacity.approvals.check_editor): otherwise an approver could rewrite someone
       else's request and approve it, or anyone could reorder an approved one (issue 37).
    3. A change of what it asks for (ASKED_FIELDS) re-runs creation's quota check, itself left
       out of the pool's use: 409 naming what would fit. An approved one goes back to requested
       (its approval cleared: someone else approves what it now asks for); an active or ended
       one is refused (409 naming the field): cancel it and request anew. Its note and client id
       change in any state without a new approval: they commit no capacity.
    4. A conditional UPDATE (409 when its state moved meanwhile), then the audit entry naming the
       fields, whether it went back to requested, and whether an Admin changed someone else's.
    """
    from fleet.capacity.approvals import check_editor  # it imports this module

    with transaction.atomic():
        target = changes.get("pool", reservation.pool)
        Pool.objects.select_for_update().only("pk").get(pk=getattr(target, "pk", target))
        current = Reservation.objects.select_for_update().get(pk=reservation.pk)
        by_admin = check_editor(actor, requester_id=current.created_by_id)
        changed = {k: v for k, v in changes.items() if getattr(current, k) != v}
        if not changed:
            return current
        asked = sorted(set(changed) & set(ASKED_FIELDS))
        if asked and current.state not in (ReservationState.REQUESTED, ReservationState.APPROVED):
            why = f"Cannot change once {current.state}; cancel it and request anew."
            raise ConflictError(why, **{asked[0]: why})
        if asked:
            _check_quota({k: changes.get(k, getattr(current, k)) for k in ASKED_FIELDS}, exclude=current.pk)
        before = {k: current._meta.get_field(k).value_from_object(current) for k in changed}
        updates = dict(changed)
        reapprove = bool(asked) and current.state == ReservationState.APPROVED
        if reapprove:
            approval = {"approved_by": None, "approved_at": None, "self_approved": False}
            before |= {k: current._meta.get_field(k).value_from_object(current) for k in ("state", *approval)}
            updates |= {"state": ReservationState.REQUESTED, **approval}
        moved = Reservation.objects.filter(pk=current.pk, state=current.state).update(
            **updates, updated_at=timezone.now()
        )
        if moved != 1:
            raise ConflictError("The reservation changed meanwhile; reload it.")
        approved_by = current.approved_by
        current.refresh_from_db()
        message = f"Changed {', '.join(sorted(changed))}."
        if reapprove:
            by = f" by {approved_by.get_username()}" if approved_by else ""
            message += f" Back to requested (it was approved{by}): what it asks for now needs approving again."
        if by_admin:
            message += " Changed by an Admin, not its requester."
        _log(actor, current, CHANGE, message)
        row_changed.send(
            sender=Reservation,
            instance=current,
            before=before,
            message=message,
        )
    return current


def approve(reservation: Reservation, *, actor: Any, now: datetime | None = None) -> Reservation:
    """Approve a requested reservation, or raise ConflictError (HTTP 409).

    1. Lock the pool row: approvals on one pool run one at a time, so two that would each fit
       alone but not together cannot both pass.
    2. Refuse an approver the separation-of-duties rules refuse (fleet.capacity.approvals:
       ApprovalRefused, HTTP 403), then a reservation that is no longer requested (409).
    3. Ask the team's quota (fleet.capacity.quotas, every tier counted): admitted, admitted after
       reclaiming borrowed quota (the reservations to preempt), or refused.
    4. Refuse when, at some moment of its window, committed reservations plus this one exceed
       supply (naming the first such interval and the teams in it), the preempted ones left out:
       a firm reservation against energised supply and other firm ones (it may displace
       preemptible work), a preemptible one against installed GPUs and every committed one.
       Then refuse a quota refusal (field ``gpus``, with what would fit).
    5. Preempt the reclaimed reservations (each with its reason, an audit entry and, per borrower
       team, a SEV4 capacity incident), move this one with a conditional UPDATE (recording a
       self-approval), write the audit entry.
    """
    now = now or timezone.now()
    with transaction.atomic():
        pool = Pool.objects.select_for_update().select_related("site").get(pk=reservation.pool_id)
        current = Reservation.objects.get(pk=reservation.pk)
        # Separation of duties (fleet.capacity.approvals): 403 before any state or supply check.
        from fleet.capacity.approvals import APPROVE_RESERVATION, check_approver  # it imports this module

        self_approved = check_approver(
            actor, requester_id=current.created_by_id, permission=APPROVE_RESERVATION, what="reservation"
        )
        if current.state != ReservationState.REQUESTED:
            raise ConflictError(f"The reservation is {current.state}; only a requested one can be approved.")
        decision = quota_decision(
            pool,
            team=current.team_id,
            gpus=current.gpus,
            start=current.start,
            end=current.end,
            tier=current.tier,
            priority=current.priority,
            exclude=current.pk,
        )
        victims = decision.preempt if decision is not None else ()
        preemptible = current.tier == PriorityTier.PREEMPTIBLE
        committed_rows = (
            Reservation.objects.committed()
            .filter(pool=pool)
            .overlapping(current.start, current.end)
            .exclude(pk__in=[v.id for v in victims])
        )
        if not preemptible:
            committed_rows = committed_rows.exclude(tier=PriorityTier.PREEMPTIBLE)
        committed = list(committed_rows.values_list("team", "gpus", "start", "end"))
        new = (current.team_id, current.gpus, current.start, current.end)
        curve = supply_curves([pool], today=timezone.localdate(now, UTC))[pool.pk]
        conflict = first_overcommit(committed, new, curve.installed_steps() if preemptible else curve.steps())
        if conflict is not None:
            start, end, teams, demand, supply = conflict
            what = "installed" if preemptible else "energised"
            raise ConflictError(
                f"Over-commits the pool: {demand} GPUs reserved against {supply} {what} from "
                f"{start.isoformat()} to {end.isoformat()}.",
                conflict={
                    "start": start.isoformat(),
                    "end": end.isoformat(),
                    "teams": teams,
                    "demand": demand,
                    "supply": supply,
                },
            )
        if decision is not None and not decision.admitted:
            raise _quota_refusal(decision)
        moved = Reservation.objects.filter(pk=current.pk, state=ReservationState.REQUESTED).update(
            state=ReservationState.APPROVED,
            approved_by=actor if getattr(actor, "pk", None) else None,
            approved_at=now,
            self_approved=self_approved,
        )
        if moved != 1:
            raise ConflictError("The reservation changed meanwhile; reload it.")
        current.refresh_from_db()
        current.pool = pool  # with its site, read above: the audit entry names both
        if victims:
            _preempt(victims, by=current, actor=actor, now=now)
        message = f"Approved: {current.gpus} GPUs {current.start:%Y-%m-%d}..{current.end:%Y-%m-%d}."
        if victims:
            message += f" Reclaimed by preempting {', '.join(f'#{v.id}' for v in victims)}."
        if self_approved:
            message += " Self-approved by an Admin, its own requester."
        _log(actor, current, CHANGE, message)
        row_changed.send(
            sender=Reservation,
            instance=current,
            before={
                "state": ReservationState.REQUESTED,
                "approved_by": None,
                "approved_at": None,
                "self_approved": False,
            },
            message=message,
        )
    return current


def _preempt(victims: Iterable[quotas.Held], *, by: Reservation, actor: Any, now: datetime) -> list[Reservation]:
    """Preempt the reservations ``by`` reclaims (inside approve's transaction, pool locked): each
    moves to preempted with a conditional UPDATE (one that stopped holding capacity meanwhile is
    left alone) and its reason, and gets an audit entry; each borrower team is told by a SEV4
    incident of category ``capacity`` naming its reservations (incidents.services.engine)."""
    from incidents.choices import Severity
    from incidents.services.engine import Actor, raise_finding

    pool = by.pool
    reason = (
        f"Preempted: {by.team_id} reclaims its nominal quota on {pool} for reservation #{by.pk} "
        f"({by.gpus} GPUs {by.start:%Y-%m-%d %H:%M}..{by.end:%Y-%m-%d %H:%M} UTC); "
        f"the pool's reclaimWithinCohort is {pool.reclaim_within_cohort}."
    )
    ids = [v.id for v in victims]
    was = dict(
        Reservation.objects.select_for_update()
        .filter(pk__in=ids, state__in=COMMITTED_STATES)
        .values_list("pk", "state")
    )
    Reservation.objects.filter(pk__in=was, state__in=COMMITTED_STATES).update(
        state=ReservationState.PREEMPTED, preempted_at=now, preempted_by=by, preempted_reason=reason, updated_at=now
    )
    preempted = list(Reservation.objects.filter(pk__in=was).select_related("pool__site").order_by("pk"))
    by_team: dict[str, list[Reservation]] = defaultdict(list)
    for r in preempted:
        _log(actor, r, CHANGE, reason)
        row_changed.send(sender=Reservation, instance=r, before={"state": was[r.pk]}, message=reason)
        by_team[r.team_id].append(r)
    who = Actor.person(actor) if getattr(actor, "pk", None) else Actor.system("capacity")
    for team, rows in by_team.items():
        names = ", ".join(f"#{r.pk} ({r.gpus} GPUs, {r.tier})" for r in rows)
        raise_finding(
            f"capacity-reclaim:{by.pk}:{team}",
            {"site": pool.site.name, "pool": pool.name, "team": team, "reclaimed_by": by.team_id},
            Severity.SEV4,
            f"{team}: {len(rows)} reservation{'s' if len(rows) != 1 else ''} preempted on {pool} "
            f"({by.team_id} reclaims its quota)",
            f"{reason} Preempted reservations of {team}: {names}.",
            source="capacity",
            category="capacity",
            group_key=f"capacity-reclaim={by.pk}:{team}",
            actor=who,
        )
    return preempted


def cancel(reservation: Reservation, *, actor: Any) -> Reservation:
    """Cancel a requested, approved or active reservation (409 once expired or cancelled)."""
    with transaction.atomic():
        current = Reservation.objects.select_for_update().get(pk=reservation.pk)
        if current.state not in (ReservationState.REQUESTED, *COMMITTED_STATES):
            raise ConflictError(f"The reservation is {current.state}; it cannot be cancelled.")
        before = {"state": current.state}
        Reservation.objects.filter(pk=current.pk).update(state=ReservationState.CANCELLED, updated_at=timezone.now())
        current.refresh_from_db()
        _log(actor, current, CHANGE, "Cancelled.")
        row_changed.send(sender=Reservation, instance=current, before=before, message="Cancelled.")
    return current


def advance_states(now: datetime | None = None) -> dict[str, int]:
    """The beat task's work: approved -> active at start, approved/active -> expired at end;
    a request whose window has passed unapproved is cancelled. Conditional UPDATEs: safe to run
    anywhere, any number of times."""
    now = now or timezone.now()
    moves = {
        "expired": (Reservation.objects.committed().filter(end__lte=now), ReservationState.EXPIRED),
        "activated": (
            Reservation.objects.filter(state=ReservationState.APPROVED, start__lte=now, end__gt=now),
            ReservationState.ACTIVE,
        ),
        "lapsed": (
            Reservation.objects.filter(state=ReservationState.REQUESTED, end__lte=now),
            ReservationState.CANCELLED,
        ),
    }
    counts = {}
    for name, (due, to) in moves.items():
        with transaction.atomic():
            # Locked, then moved: the audit log gets each row's state before, and a second runner
            # skips the locked rows rather than moving them twice.
            was = dict(due.select_for_update(skip_locked=True).values_list("pk", "state"))
            counts[name] = Reservation.objects.filter(pk__in=was).update(state=to, updated_at=now)
            for reservation in Reservation.objects.filter(pk__in=was):
                before = {"state": was[reservation.pk]}
                row_changed.send(sender=Reservation, instance=reservation, before=before, message=name.title())
    return counts


def preemptible_at_risk(pool: Pool, *, now: datetime | None = None) -> list[Reservation]:
    """The preemptible reservations holding capacity now that would be preempted if supply dropped
    to healthy: non-preemptible ones keep their GPUs; preemptible ones keep theirs in priority order
    (highest first, then oldest) while healthy GPUs last; the rest are listed, lowest priority first."""
    now = now or timezone.now()
    figures = pool_figures([pool], now=now)[pool.pk]
    left = figures.healthy - figures.reserved
    running = list(
        Reservation.objects.committed()
        .filter(pool=pool, tier=PriorityTier.PREEMPTIBLE, start__lte=now, end__gt=now)
        .order_by("-priority", "start", "pk")
    )
    at_risk = []
    for r in running:
        if r.gpus <= left:
            left -= r.gpus
        else:
            left = max(left, 0)
            at_risk.append(r)
    return sorted(at_risk, key=lambda r: (r.priority, -r.start.timestamp(), -r.pk))


# --- the plan ---------------------------------------------------------------------------------------


PLAN_TIERS = [t.value for t in PriorityTier]
_FIRM = [PLAN_TIERS.index(PriorityTier.RESERVED), PLAN_TIERS.index(PriorityTier.ON_DEMAND)]
_SUPPLY = -1  # a supply step's place in a sweep event, where a reservation's has its tier's index
PlanWindow = tuple[int, int, int, int]  # tier (index in PLAN_TIERS), GPUs, start, end (epoch µs)


def _month_starts(first: date, months: int) -> list[date]:
    out, y, m = [], first.year, first.month
    for _ in range(months + 1):
        out.append(date(y, m, 1))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def _month_sweep(
    windows: list[PlanWindow], steps: list[tuple[int, int]], bounds: list[int], since: int
) -> tuple[list[list[int]], list[bool]]:
    """Per month [bounds[m], bounds[m+1]): each tier's peak of concurrent GPUs (indexed as
    PLAN_TIERS), and whether non-preemptible demand exceeds energised supply at some moment of
    the month from ``since`` on.

    One sweep over the reservations' boundaries and the supply steps: once every change at an
    instant is settled, the state holds until the next instant; that stretch raises the peaks of
    the months it meets, and marks them in conflict when firm demand exceeds supply."""
    events = [(s, k, g) for k, g, s, _ in windows] + [(e, k, -g) for k, g, _, e in windows]
    events += [(t, _SUPPLY, energised) for t, energised in steps]
    events.sort()
    months, n = len(bounds) - 1, len(events)
    peaks = [[0] * months for _ in PLAN_TIERS]
    conflict = [False] * months
    level = [0] * len(PLAN_TIERS)
    supply = steps[0][1] if steps else 0
    i = 0
    while i < n:
        t = events[i][0]
        while i < n and events[i][0] == t:
            _, k, value = events[i]
            if k == _SUPPLY:
                supply = value
            else:
                level[k] += value
            i += 1
        hi = events[i][0] if i < n else bounds[-1]  # after the last change every level is 0
        over_from = max(t, since) if sum(level[k] for k in _FIRM) > supply else hi
        m = max(0, bisect.bisect_right(bounds, t) - 1)
        while m < months and bounds[m] < hi:  # the months [t, hi) meets
            for k, gpus in enumerate(level):
                if gpus > peaks[k][m]:
                    peaks[k][m] = gpus
            if over_from < hi and bounds[m + 1] > over_from:
                conflict[m] = True
            m += 1
    return peaks, conflict


def plan(*, months: int = 12, start: date | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Per pool and in total, per month from ``start`` (default: this month):

    - installed and energised on the month's first day (supply only grows as orders and power
      land, so it is the month's least), healthy for the current month only (it is today's);
    - reserved demand by tier: the peak of concurrent approved and active GPUs over the month;
    - conflict: at some moment of the month, non-preemptible demand exceeds energised supply;
    - curtailed: on the month's first day, the pool's GPUs (installed or landed) that the site's
      power leaves dark, and ``curtailed_why``, the site's power rule in figures (None when none
      are; power_budget.SitePower.why).

    Totals add the pools' figures (peaks are per pool, so the total's peak is their sum's bound);
    a total's ``curtailed_why`` is None (each pool's says why).
    """
    now = now or timezone.now()
    today = timezone.localdate(now, UTC)
    first = (start or today).replace(day=1)
    month_days = _month_starts(first, months)
    first_instant, last_instant = _day_start(month_days[0]), _day_start(month_days[-1])
    bounds = [_epoch_us(_day_start(d)) for d in month_days]
    pools = list(Pool.objects.select_related("site").order_by("site__name", "name"))
    figures = pool_figures(pools, now=now)
    curves = supply_curves(pools, today=today, figures=figures)
    tier_index = {t: k for k, t in enumerate(PLAN_TIERS)}
    by_pool: dict[int, list[PlanWindow]] = defaultdict(list)
    for pool_id, tier, gpus, s, e in (
        Reservation.objects.committed()
        .filter(start__lt=last_instant, end__gt=first_instant)
        .values_list("pool_id", "tier", "gpus", _epoch_us_of("start"), _epoch_us_of("end"))
    ):
        by_pool[pool_id].append((tier_index[tier], gpus, s, e))
    tiers = PLAN_TIERS
    current = today.replace(day=1)

    def empty_month(d: date) -> dict[str, Any]:
        return {
            "month": d.strftime("%Y-%m"),
            "installed": 0,
            "energised": 0,
            "healthy": None,
            "reserved": dict.fromkeys(tiers, 0),
            "conflict": False,
            "curtailed": 0,
            "curtailed_why": None,
        }

    total = [empty_month(d) for d in month_days[:-1]]
    out_pools = []
    for p in pools:
        curve = curves[p.pk]
        steps = [(_epoch_us(t), e) for t, e in curve.steps()]
        peaks, conflicts = _month_sweep(by_pool[p.pk], steps, bounds, max(bounds[0], _epoch_us(_day_start(today))))
        rows = []
        for i, d in enumerate(month_days[:-1]):
            installed, energised = curve.at(max(d, today))
            row = empty_month(d)
            row.update(installed=installed, energised=energised)
            row["reserved"] = {t: peaks[k][i] for k, t in enumerate(tiers)}
            if d == current:
                row["healthy"] = figures[p.pk].healthy
            row["conflict"] = conflicts[i]
            power = curve.power_at(max(d, today))
            if power is not None:
                row.update(curtailed=power.curtailed(p.pk), curtailed_why=power.why(p.pk))
            rows.append(row)
            tot = total[i]
            tot["installed"] += installed
            tot["energised"] += energised
            if row["healthy"] is not None:
                tot["healthy"] = (tot["healthy"] or 0) + row["healthy"]
            for t in tiers:
                tot["reserved"][t] += row["reserved"][t]
            tot["conflict"] = tot["conflict"] or row["conflict"]
            tot["curtailed"] += row["curtailed"]
        out_pools.append({"id": p.pk, "name": p.name, "site": p.site.name, "gpu_model": p.gpu_model, "months": rows})
    return {"start": first.isoformat(), "months": months, "pools": out_pools, "total": total}


PLAN_CSV_COLUMNS = (
    ["month", "site", "pool", "gpu_model", "installed", "energised", "healthy"]
    + [f"reserved_{t.value.replace('-', '_')}" for t in PriorityTier]
    + ["conflict", "curtailed", "curtailed_why"]
)


def plan_csv(data: dict[str, Any]) -> str:
    """The plan as monthly rows, one per pool and month, then the totals (pool "total")."""
    buf = io.StringIO()
    w = spreadsheet.writer(buf)
    w.writerow(PLAN_CSV_COLUMNS)
    tiers = [t.value for t in PriorityTier]

    def write(row: dict[str, Any], site: str, pool: str, model: str) -> None:
        healthy = "" if row["healthy"] is None else row["healthy"]
        w.writerow(
            [row["month"], site, pool, model, row["installed"], row["energised"], healthy]
            + [row["reserved"][t] for t in tiers]
            + [int(row["conflict"]), row["curtailed"], spreadsheet.cell(row["curtailed_why"] or "")]
        )

    for p in data["pools"]:
        for row in p["months"]:
            write(row, p["site"], p["name"], p["gpu_model"])
    for row in data["total"]:
        write(row, "", "total", "")
    return buf.getvalue()


RESERVATION_CSV_COLUMNS = ["id", "team", "site", "pool", "gpus", "start", "end", "tier", "priority", "state"]


def reservations_csv(reservations: Iterable[Reservation]) -> str:
    buf = io.StringIO()
    w = spreadsheet.writer(buf)
    w.writerow(RESERVATION_CSV_COLUMNS)
    for r in reservations:
        w.writerow(
            [
                r.pk,
                r.team_id,
                r.pool.site.name,
                r.pool.name,
                r.gpus,
                r.start.isoformat(),
                r.end.isoformat(),
                r.tier,
                r.priority,
                r.state,
            ]
        )
    return buf.getvalue()


def quota_use(pool: Pool, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """Each team's committed GPUs now, every tier (Kueue counts every admitted workload), against
    its quota on the pool. ``max_borrow``: its borrowing limit, or without one what the others lend."""
    now = now or timezone.now()
    usage: dict[str, int] = defaultdict(int)
    for team, gpus in (
        Reservation.objects.committed().filter(pool=pool, start__lte=now, end__gt=now).values_list("team", "gpus")
    ):
        usage[team] += gpus
    rows = list(TeamQuota.objects.filter(pool=pool))
    lent = {q.team_id: quotas.Quota(q.nominal_gpus, None, q.lending_limit_gpus).lendable for q in rows}
    return [
        {
            "team": q.team_id,
            "nominal": q.nominal_gpus,
            "borrowing_limit": q.borrowing_limit_gpus,
            "lending_limit": q.lending_limit_gpus,
            "max_borrow": q.borrowing_limit_gpus
            if q.borrowing_limit_gpus is not None
            else sum(v for t, v in lent.items() if t != q.team_id),
            "used": usage[q.team_id],
        }
        for q in rows
    ]
