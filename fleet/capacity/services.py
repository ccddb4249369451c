"""Capacity: what each pool can supply now and later, and what reservations commit of it.

Figures of a pool (all in GPUs):

- **installed**: the site's physical GPUs of the pool's model (MIG instances never count).
- **energised**: what the racks' power budgets run. Per rack, whole nodes at full load
  (power_budget.energisable_nodes, nodes in hostname order, every GPU node of the rack sharing the
  budget whatever its model); a rack with no budget, or a node in no rack, counts in full. When
  the site has a contracted power and its energised nodes together draw more at full load, each
  pool keeps the same share of its energised GPUs as the contract covers (rounded down).
- **healthy**: energised minus the energised GPUs of the pool taken out of service by open
  incidents (the union of ``impact["gpu_uuids"]`` of their firing findings, as the engine counts).
- **reserved**: approved and active reservations overlapping now, preemptible shown apart.
- **available**: healthy minus reserved (never below zero).

Future supply (supply_at): today's figures, plus

1. procurement orders landing: an undelivered order that is not late counts from its promised
   date; a late order (promised date past, not delivered) counts nowhere until it is delivered (its
   new date is unknown; counting it would promise capacity nobody can name a day for); a
   delivered order is in the inventory already, a cancelled one never counts;
2. power: new GPUs are energised only within the site's spare power: the contracted power less the
   full-load draw of today's energised nodes, plus the kW of power approvals energised by then
   (status approved or energised, from their expected date), shared among the site's pools in
   proportion to their installed GPUs, at the pool's per-GPU node power. A site with no contracted
   power energises what lands in full (its power is not the limit the console knows of).

Only energised supply counts for commitments. Supply moves on dates (midnight UTC).
"""

from __future__ import annotations

import bisect
import io
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, TypeVar

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Count, F, Func
from django.utils import timezone

from console import spreadsheet
from console.signals import row_changed
from fleet.capacity import power_budget
from fleet.capacity.models import (
    COMMITTED_STATES,
    ApprovalStatus,
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
    # For future supply: per-GPU node power (W) and the site's spare power now (W, None: unlimited).
    gpu_w: float = 0.0
    spare_w: float | None = None

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
    """Today's figures of the pools (see the module docstring), in a fixed number of queries."""
    now = now or timezone.now()
    pools = list(pools)
    out = {p.pk: PoolNow() for p in pools}
    if not pools:
        return out
    site_ids = {p.site_id for p in pools}
    by_key = {(p.site_id, p.gpu_model): p.pk for p in pools}
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
    energised_set = {n for n, _ in energised_nodes}

    site_draw_w: dict[int, float] = defaultdict(float)
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
        if node_id in energised_set:
            site_draw_w[site_id] += node_w(node_id)

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

    contracted = {p.site_id: p.site.contracted_power_kw for p in pools}
    installed_by_site: dict[int, int] = defaultdict(int)
    for p in pools:
        installed_by_site[p.site_id] += out[p.pk].installed
    for p in pools:
        figures = out[p.pk]
        per_node = per_pool_nodes.get(p.pk) or [DEFAULT_GPUS_PER_NODE]
        gpus_per_node = sum(per_node) / len(per_node)
        figures.gpu_w = power_budget.board_power_w(p.gpu_model) + overhead / gpus_per_node
        kw = contracted[p.site_id]
        lost = lost_by_pool[p.pk]
        if kw is not None:
            contract_w, draw_w = float(kw) * 1000.0, site_draw_w[p.site_id]
            if draw_w > contract_w:  # the contract cannot run every energised node: same share each
                kept = math.floor(figures.energised * contract_w / draw_w + 1e-9)
                lost = max(0, lost - (figures.energised - kept))
                figures.energised = kept
            spare = max(0.0, contract_w - draw_w)
            total = installed_by_site[p.site_id]
            share = figures.installed / total if total else 1.0 / sum(1 for q in pools if q.site_id == p.site_id)
            figures.spare_w = spare * share
        figures.healthy = max(0, figures.energised - lost)

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

    def at(self, day: date) -> tuple[int, int]:
        i = bisect.bisect_right(self.days, day) - 1
        if i < 0:
            return self.installed_now, self.energised_now
        return self.installed[i], self.energised[i]

    def steps(self) -> list[tuple[datetime, int]]:
        """(time, energised from then on), today's first."""
        return [(_day_start(self.today), self.energised_now)] + [
            (_day_start(d), e) for d, e in zip(self.days, self.energised, strict=True)
        ]


def landing_orders(orders: Iterable[ProcurementOrder], today: date) -> list[tuple[date, int]]:
    """(date, GPUs) of the orders still to land that count as future supply (module docstring)."""
    out = []
    for o in orders:
        if o.status in (OrderStatus.CANCELLED, OrderStatus.DELIVERED) or o.delivered_on is not None:
            continue
        if o.promised_on < today:  # late: counts nowhere until it is delivered
            continue
        out.append((o.promised_on, o.count))
    return out


def supply_curves(
    pools: Iterable[Pool], *, today: date | None = None, figures: dict[int, PoolNow] | None = None
) -> dict[int, SupplyCurve]:
    """Every pool's supply curve from today (2 queries besides pool_figures', unless given)."""
    today = today or timezone.localdate(timezone.now(), UTC)
    pools = list(pools)
    now_figures = figures if figures is not None else pool_figures(pools)
    orders: dict[int, list[ProcurementOrder]] = defaultdict(list)
    for o in ProcurementOrder.objects.filter(pool__in=pools).exclude(status=OrderStatus.CANCELLED):
        orders[o.pool_id].append(o)
    approvals: dict[int, list[tuple[date, float]]] = defaultdict(list)
    for site_id, on, kw in PowerApproval.objects.filter(
        site_id__in={p.site_id for p in pools}, status__in=[ApprovalStatus.APPROVED, ApprovalStatus.ENERGISED]
    ).values_list("site_id", "expected_on", "added_kw"):
        approvals[site_id].append((max(on, today), float(kw) * 1000.0))
    installed_by_site: dict[int, int] = defaultdict(int)
    pools_by_site: dict[int, int] = defaultdict(int)
    for p in pools:
        installed_by_site[p.site_id] += now_figures[p.pk].installed
        pools_by_site[p.site_id] += 1

    curves = {}
    for p in pools:
        f = now_figures[p.pk]
        landing = landing_orders(orders[p.pk], today)
        total = installed_by_site[p.site_id]
        share = f.installed / total if total else 1.0 / pools_by_site[p.site_id]
        power_steps = [(d, w * share) for d, w in approvals[p.site_id]]
        days = sorted({d for d, _ in landing} | {d for d, _ in power_steps})
        inst, ener = [], []
        for day in days:
            arrived = sum(c for d, c in landing if d <= day)
            inst.append(f.installed + arrived)
            if f.spare_w is None:
                ener.append(f.energised + arrived)
            else:
                spare = f.spare_w + sum(w for d, w in power_steps if d <= day)
                runnable = math.floor(spare / f.gpu_w + 1e-9) if f.gpu_w > 0 else arrived
                ener.append(f.energised + min(arrived, runnable))
        curves[p.pk] = SupplyCurve(today, f.installed, f.energised, days, inst, ener)
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


def quota_breach(
    committed: list[tuple[str, int, datetime, datetime]],
    new: tuple[str, int, datetime, datetime],
    quotas: dict[str, tuple[int, int]],
) -> dict[str, Any] | None:
    """Kueue's rule at every moment of the new reservation's window: the team holds at most
    nominal + borrowing limit, and what it holds beyond its nominal quota fits in the other teams'
    unused nominal quota (less what they already borrow). None when it fits."""
    team, _, w_start, w_end = new
    nominal, limit = quotas.get(team, (0, 0))
    usage: dict[str, int] = defaultdict(int)
    others_unused = sum(n for t, (n, _) in quotas.items() if t != team)  # unused less borrowed, others
    events = _sweep_events([*committed, new])
    for i, (t, _, who, delta) in enumerate(events):
        if who != team:
            others_unused -= delta  # n - u of that team moves by -delta
        usage[who] += delta
        if i + 1 < len(events) and events[i + 1][0] == t:
            continue  # settle every event at this instant first
        if t < w_start or t >= w_end:
            continue
        held = usage[team]
        if held > nominal + limit:
            return {
                "at": t,
                "gpus": f"The team {team} would hold {held} GPUs at {t.isoformat()}, over its nominal quota "
                f"({nominal}) plus borrowing limit ({limit}).",
            }
        borrowed = max(0, held - nominal)
        if borrowed > others_unused:
            return {
                "at": t,
                "gpus": f"The team {team} would borrow {borrowed} GPUs at {t.isoformat()}; other teams have "
                f"{max(0, others_unused)} unused nominal GPUs to lend.",
            }
    return None


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
    unchanged; a repeat that differs is a ConflictError naming the fields that differ.
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


def _create(actor: Any, via: str, scope: str, values: dict[str, Any]) -> Reservation:
    reservation = Reservation.objects.create(
        created_by=actor if getattr(actor, "pk", None) else None, requested_via=via, client_scope=scope, **values
    )
    _log(actor, reservation, ADDITION, f"Requested {reservation.gpus} GPUs ({reservation.tier}).")
    return reservation


def approve(reservation: Reservation, *, actor: Any, now: datetime | None = None) -> Reservation:
    """Approve a requested reservation, or raise ConflictError (HTTP 409).

    1. Lock the pool row: approvals on one pool run one at a time, so two that would each fit
       alone but not together cannot both pass.
    2. Refuse a reservation that is no longer requested (someone else moved it first).
    3. Unless preemptible: refuse when, at some moment of its window, approved and active
       non-preemptible reservations plus this one exceed energised supply (naming the first such
       interval and the teams in it), or when the team's quota refuses it (field ``gpus``).
    4. Move it with a conditional UPDATE, write the audit entry.
    """
    now = now or timezone.now()
    with transaction.atomic():
        pool = Pool.objects.select_for_update().select_related("site").get(pk=reservation.pool_id)
        current = Reservation.objects.get(pk=reservation.pk)
        if current.state != ReservationState.REQUESTED:
            raise ConflictError(f"The reservation is {current.state}; only a requested one can be approved.")
        if current.tier != PriorityTier.PREEMPTIBLE:
            committed = list(
                Reservation.objects.committed()
                .filter(pool=pool)
                .exclude(tier=PriorityTier.PREEMPTIBLE)
                .overlapping(current.start, current.end)
                .values_list("team", "gpus", "start", "end")
            )
            new = (current.team, current.gpus, current.start, current.end)
            curve = supply_curves([pool], today=timezone.localdate(now, UTC))[pool.pk]
            conflict = first_overcommit(committed, new, curve.steps())
            if conflict is not None:
                start, end, teams, demand, supply = conflict
                raise ConflictError(
                    f"Over-commits the pool: {demand} GPUs reserved against {supply} energised from "
                    f"{start.isoformat()} to {end.isoformat()}.",
                    conflict={
                        "start": start.isoformat(),
                        "end": end.isoformat(),
                        "teams": teams,
                        "demand": demand,
                        "supply": supply,
                    },
                )
            quotas = {
                t: (n, b)
                for t, n, b in TeamQuota.objects.filter(pool=pool).values_list(
                    "team", "nominal_gpus", "borrowing_limit_gpus"
                )
            }
            if quotas:  # a pool without quotas is first come, first served within supply
                breach = quota_breach(committed, new, quotas)
                if breach is not None:
                    raise ConflictError("Refused by the team's quota.", gpus=breach["gpus"])
        moved = Reservation.objects.filter(pk=current.pk, state=ReservationState.REQUESTED).update(
            state=ReservationState.APPROVED, approved_by=actor if getattr(actor, "pk", None) else None, approved_at=now
        )
        if moved != 1:
            raise ConflictError("The reservation changed meanwhile; reload it.")
        current.refresh_from_db()
        current.pool = pool  # with its site, read above: the audit entry names both
        message = f"Approved: {current.gpus} GPUs {current.start:%Y-%m-%d}..{current.end:%Y-%m-%d}."
        _log(actor, current, CHANGE, message)
        row_changed.send(
            sender=Reservation,
            instance=current,
            before={"state": ReservationState.REQUESTED, "approved_by": None, "approved_at": None},
            message=message,
        )
    return current


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
    - conflict: at some moment of the month, non-preemptible demand exceeds energised supply.

    Totals add the pools' figures (peaks are per pool, so the total's peak is their sum's bound).
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
            rows.append(row)
            tot = total[i]
            tot["installed"] += installed
            tot["energised"] += energised
            if row["healthy"] is not None:
                tot["healthy"] = (tot["healthy"] or 0) + row["healthy"]
            for t in tiers:
                tot["reserved"][t] += row["reserved"][t]
            tot["conflict"] = tot["conflict"] or row["conflict"]
        out_pools.append({"id": p.pk, "name": p.name, "site": p.site.name, "gpu_model": p.gpu_model, "months": rows})
    return {"start": first.isoformat(), "months": months, "pools": out_pools, "total": total}


PLAN_CSV_COLUMNS = (
    ["month", "site", "pool", "gpu_model", "installed", "energised", "healthy"]
    + [f"reserved_{t.value.replace('-', '_')}" for t in PriorityTier]
    + ["conflict"]
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
            + [int(row["conflict"])]
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
                r.team,
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
    """Each team's committed non-preemptible GPUs now against its quota on the pool."""
    now = now or timezone.now()
    usage: dict[str, int] = defaultdict(int)
    for team, gpus in (
        Reservation.objects.committed()
        .filter(pool=pool, start__lte=now, end__gt=now)
        .exclude(tier=PriorityTier.PREEMPTIBLE)
        .values_list("team", "gpus")
    ):
        usage[team] += gpus
    return [
        {"team": q.team, "nominal": q.nominal_gpus, "borrowing_limit": q.borrowing_limit_gpus, "used": usage[q.team]}
        for q in TeamQuota.objects.filter(pool=pool)
    ]
