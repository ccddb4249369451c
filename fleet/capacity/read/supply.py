"""What each capacity pool can supply now and later, and what reservations commit of it.

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

1. procurement orders landing (approved ones only: fleet.capacity.actions.approvals): an undelivered
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
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from typing import Any

from django.db.models import Count
from django.utils import timezone

from fleet.capacity import power_budget, quotas
from fleet.capacity.models import (
    ApprovalStatus,
    OrderApproval,
    OrderStatus,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    TeamQuota,
)
from fleet.choices import PriorityTier
from fleet.inventory.models import Gpu

DEFAULT_GPUS_PER_NODE = 8


def day_start(day: date) -> datetime:
    """Midnight UTC of ``day``: supply moves on dates."""
    return datetime.combine(day, time.min, tzinfo=UTC)


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
    gpu_nodes = _gpu_nodes(site_ids)
    site_power, energised = _site_power(site_pools, gpu_nodes, _rack_energised(gpu_nodes), timezone.localdate(now, UTC))
    counted = _pool_counts(site_pools, gpu_nodes, energised, site_power)
    out = {pk: counted[pk] for pk in asked}
    _add_reserved(out, now)
    return out


SitePool = tuple[int, int, str, Any]  # pool, site, GPU model, the site's contracted power (kW)


@dataclass
class _GpuNodes:
    """The sites' GPU nodes in hostname order, their physical GPUs counted by model, and their
    racks' power budgets (a rack's budget is shared by all its GPU nodes, whatever their model)."""

    nodes: list[tuple[int, int, int | None]]  # (node, site, rack), hostname order
    models: dict[int, dict[str, int]]  # node -> GPUs by model
    budgets: dict[int | None, Any]  # rack -> its power budget (kW)
    overhead_w: float

    def watts(self, node_id: int) -> float:
        """The node at full load: its GPUs' board power plus the node overhead."""
        return sum(n * power_budget.board_power_w(m) for m, n in self.models[node_id].items()) + self.overhead_w

    def pool_gpus(self, node_id: int, site_id: int, pool_of: dict[tuple[int, str], int]) -> dict[int, int]:
        """The node's GPUs per pool (a model no pool of the site counts is left out)."""
        gpus: dict[int, int] = defaultdict(int)
        for model, count in self.models[node_id].items():
            pk = pool_of.get((site_id, model))
            if pk is not None:
                gpus[pk] += count
        return dict(gpus)


def _gpu_nodes(site_ids: set[int]) -> _GpuNodes:
    """One aggregate row per node and model, in hostname order, rather than a row per GPU."""
    found = _GpuNodes([], defaultdict(dict), {}, power_budget.node_overhead_w())
    for node_id, site_id, rack_id, budget, model, count in (
        Gpu.objects.physical()
        .filter(node__site_id__in=site_ids)
        .values_list("node_id", "node__site_id", "node__rack_id", "node__rack__power_budget_kw", "model")
        .annotate(count=Count("pk"))
        .order_by("node__hostname", "node_id", "model")
    ):
        if node_id not in found.models:
            found.nodes.append((node_id, site_id, rack_id))
            found.budgets[rack_id] = budget
        found.models[node_id][model] = count
    return found


def _rack_energised(gpu_nodes: _GpuNodes) -> list[tuple[int, int]]:
    """(node, site) of the nodes the racks' budgets run: per rack, whole nodes at full load in
    hostname order while the budget lasts; a rack with no budget, or a node in no rack, in full."""
    energised: list[tuple[int, int]] = []
    by_rack: dict[int | None, list[tuple[int, int]]] = defaultdict(list)
    for node_id, site_id, rack_id in gpu_nodes.nodes:
        by_rack[rack_id].append((node_id, site_id))
    for rack_id, members in by_rack.items():
        budget = gpu_nodes.budgets.get(rack_id) if rack_id is not None else None
        if budget is None:
            energised.extend(members)
            continue
        left = float(budget) * 1000.0
        for node_id, site_id in members:
            need = gpu_nodes.watts(node_id)
            if power_budget.energisable_nodes(left, need, 1) == 1:
                energised.append((node_id, site_id))
                left -= need
    return energised


def _approved_power(site_ids: Iterable[int]) -> dict[int, list[tuple[date, float]]]:
    """(date, W) of each site's power approvals that count as supply (approved or energised)."""
    approvals: dict[int, list[tuple[date, float]]] = defaultdict(list)
    for site_id, on, kw in PowerApproval.objects.filter(
        site_id__in=site_ids, status__in=[ApprovalStatus.APPROVED, ApprovalStatus.ENERGISED]
    ).values_list("site_id", "expected_on", "added_kw"):
        approvals[site_id].append((on, float(kw) * 1000.0))
    return approvals


def _site_power(
    site_pools: list[SitePool], gpu_nodes: _GpuNodes, rack_energised: list[tuple[int, int]], today: date
) -> tuple[dict[int, SitePowerInputs], set[int]]:
    """Each site's power rule inputs, and the nodes it runs today: the nodes the racks run, in
    power order (their first pool's rank, then hostname), at today's contracted and approved
    power. A node left dark is curtailed."""
    pool_of = {(site_id, model): pk for pk, site_id, model, _ in site_pools}
    rank = {pk: i for i, (pk, _, _, _) in enumerate(site_pools)}
    contracted = {site_id: kw for _, site_id, _, kw in site_pools}
    approvals = _approved_power(list(contracted))
    site_nodes: dict[int, list[tuple[int, power_budget.SiteNode]]] = defaultdict(list)
    for node_id, site_id in rack_energised:
        node = power_budget.SiteNode(gpu_nodes.watts(node_id), gpu_nodes.pool_gpus(node_id, site_id, pool_of))
        site_nodes[site_id].append((node_id, node))
    inputs_of: dict[int, SitePowerInputs] = {}
    energised: set[int] = set()
    for site_id, kw in contracted.items():
        ordered = sorted(  # stable: hostname order within a rank
            site_nodes[site_id], key=lambda item: min((rank[pk] for pk in item[1].gpus), default=len(rank))
        )
        inputs = SitePowerInputs(
            contract_w=None if kw is None else float(kw) * 1000.0,
            nodes=[node for _, node in ordered],
            approvals=approvals[site_id],
            pools=[pk for pk, s, _, _ in site_pools if s == site_id],
            gpu_w={},
        )
        inputs_of[site_id] = inputs
        now_state = inputs.steps(today)[0]
        energised.update(node_id for (node_id, _), on in zip(ordered, now_state.nodes_on, strict=True) if on)
    return inputs_of, energised


def _pool_counts(
    site_pools: list[SitePool], gpu_nodes: _GpuNodes, energised: set[int], site_power: dict[int, SitePowerInputs]
) -> dict[int, PoolNow]:
    """Installed, energised and healthy GPUs of every pool of the sites, and the per-GPU node power
    of GPUs landing in it: board power plus the node overhead over the pool's mean GPUs per node."""
    pool_of = {(site_id, model): pk for pk, site_id, model, _ in site_pools}
    out = {pk: PoolNow() for pk, _, _, _ in site_pools}
    per_pool_nodes: dict[int, list[int]] = defaultdict(list)  # GPUs per node of the pool's model
    for node_id, site_id, _rack in gpu_nodes.nodes:
        for model, count in gpu_nodes.models[node_id].items():
            pk = pool_of.get((site_id, model))
            if pk is None:
                continue
            out[pk].installed += count
            per_pool_nodes[pk].append(count)
            if node_id in energised:
                out[pk].energised += count
    lost = _lost_by_pool(list(site_power), pool_of, energised)
    for pk, site_id, model, _kw in site_pools:
        figures = out[pk]
        per_node = per_pool_nodes.get(pk) or [DEFAULT_GPUS_PER_NODE]
        figures.gpu_w = power_budget.board_power_w(model) + gpu_nodes.overhead_w / (sum(per_node) / len(per_node))
        figures.site_power = site_power[site_id]
        site_power[site_id].gpu_w[pk] = figures.gpu_w
        figures.healthy = max(0, figures.energised - lost[pk])
    return out


def _lost_by_pool(site_ids: Iterable[int], pool_of: dict[tuple[int, str], int], energised: set[int]) -> dict[int, int]:
    """Energised GPUs out of service, per pool: only the few GPUs the open incidents name are read."""
    lost: dict[int, int] = defaultdict(int)
    oos = out_of_service_uuids()
    if oos:
        for node_id, site_id, model in (
            Gpu.objects.physical()
            .filter(node__site_id__in=site_ids, uuid__in=oos)
            .values_list("node_id", "node__site_id", "model")
        ):
            pk = pool_of.get((site_id, model))
            if pk is not None and node_id in energised:
                lost[pk] += 1
    return lost


def _add_reserved(out: dict[int, PoolNow], now: datetime) -> None:
    """Add the committed reservations overlapping ``now`` to the pools' reserved GPUs, preemptible apart."""
    for pool_id, tier, gpus in (
        Reservation.objects.committed()
        .filter(pool_id__in=out, start__lte=now, end__gt=now)
        .values_list("pool_id", "tier", "gpus")
    ):
        if tier == PriorityTier.PREEMPTIBLE:
            out[pool_id].reserved_preemptible += gpus
        else:
            out[pool_id].reserved += gpus


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
        return [(day_start(self.today), self.energised_now)] + [
            (day_start(d), e) for d, e in zip(self.days, self.energised, strict=True)
        ]

    def installed_steps(self) -> list[tuple[datetime, int]]:
        """(time, installed from then on), today's first: the bound of preemptible reservations."""
        return [(day_start(self.today), self.installed_now)] + [
            (day_start(d), n) for d, n in zip(self.days, self.installed, strict=True)
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


# --- who holds it now -------------------------------------------------------------------------------


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
