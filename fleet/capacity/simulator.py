"""The simulated fleet's capacity data, so `make demo` shows the capacity plan with something in it.

An operator enters pools, orders, grid approvals, quotas and reservations by hand, so they are
written here through the ORM, like the simulate command's racks and nodes, not posted by agents:

* a pool per site and GPU model of the simulated fleet, with team quotas; each team is a record
  with one member, its lead (``<team>-lead``, no usable password: a name to show, not a sign-in);
* a procurement order arriving late (ams-1 H100: promised three weeks ago, not delivered) and one
  on time (iad-2 H200, promised in about ten weeks), and a grid approval for iad-2 expected in
  about four months;
* a dozen reservations across the three tiers, requested, approved and active. On ams-1's H100
  pool (120 GPUs energised: the hot rack's budget runs three of its four nodes) the research
  team's 96 reserved GPUs and a preemptible evaluation run of 32 hold more than the pool runs, so
  the evaluation is at risk of preemption; in two months llm-pretrain's 48 reserved GPUs, approved
  when the late order was still due, over-commit the pool, a conflict month on the plan.

Idempotent: every row has a fixed key (the order and approval references, the reservations'
client ids), so a restarted simulator adds nothing and leaves what operators changed alone.
Dates are relative to the first run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction

from fleet.capacity.models import (
    ApprovalStatus,
    OrderStatus,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    ReservationState,
    Team,
    TeamQuota,
)
from fleet.choices import PriorityTier
from fleet.inventory.models import Site
from fleet.telemetry.simulator import SiteSpec

LATE_ORDER = "SIM-PO-ams1-h100"
ON_TIME_ORDER = "SIM-PO-iad2-h200"
GRID_APPROVAL = "SIM-GRID-iad2"
REQUESTED_VIA = "simulator"

# (site, pool name): (team, nominal GPUs, borrowing limit) for each team with a quota there.
QUOTAS: dict[tuple[str, str], tuple[tuple[str, int, int], ...]] = {
    ("ams-1", "h100"): (("research", 64, 48), ("llm-pretrain", 48, 16), ("batch-eval", 8, 32)),
    ("ams-1", "l40s"): (("inference", 24, 8),),
    ("iad-2", "h200"): (("research", 48, 16), ("llm-pretrain", 32, 16), ("batch-eval", 8, 16)),
    ("iad-2", "a100"): (("inference", 48, 16),),
    ("sin-1", "l40s"): (("inference", 48, 16), ("batch-eval", 8, 16)),
}


@dataclass(frozen=True)
class SimReservation:
    key: str  # its client id is sim-<seed>-<key>
    site: str
    pool: str
    team: str
    gpus: int
    tier: PriorityTier
    state: str  # a ReservationState
    start_days: float  # from the first run
    end_days: float
    priority: int = 0


RESERVATIONS = (
    SimReservation("research-h100", "ams-1", "h100", "research", 96, PriorityTier.RESERVED, "active", -10, 150, 5),
    SimReservation("eval-h100", "ams-1", "h100", "batch-eval", 32, PriorityTier.PREEMPTIBLE, "active", -2, 20),
    SimReservation("pretrain-h100", "ams-1", "h100", "llm-pretrain", 48, PriorityTier.RESERVED, "approved", 60, 90, 5),
    SimReservation("chat-l40s", "ams-1", "l40s", "inference", 16, PriorityTier.ON_DEMAND, "active", -5, 60, 3),
    SimReservation("chat-l40s-2", "ams-1", "l40s", "inference", 8, PriorityTier.ON_DEMAND, "requested", 7, 37, 3),
    SimReservation("research-h200", "iad-2", "h200", "research", 64, PriorityTier.RESERVED, "approved", 14, 120, 5),
    SimReservation("pretrain-h200", "iad-2", "h200", "llm-pretrain", 32, PriorityTier.RESERVED, "requested", 80, 200),
    SimReservation("eval-h200", "iad-2", "h200", "batch-eval", 16, PriorityTier.PREEMPTIBLE, "active", -1, 6),
    SimReservation("search-a100", "iad-2", "a100", "inference", 32, PriorityTier.ON_DEMAND, "active", -20, 40, 3),
    SimReservation("embed-a100", "iad-2", "a100", "inference", 16, PriorityTier.PREEMPTIBLE, "approved", 3, 30, 1),
    SimReservation("chat-sin", "sin-1", "l40s", "inference", 24, PriorityTier.ON_DEMAND, "active", -3, 90, 3),
    SimReservation("eval-sin", "sin-1", "l40s", "batch-eval", 16, PriorityTier.PREEMPTIBLE, "requested", 2, 16),
)


def seed_teams(names: Iterable[str]) -> int:
    """A Team per name, each with its lead as member; returns how many teams this call created."""
    User = get_user_model()
    created = 0
    for name in sorted(set(names)):
        team, new = Team.objects.get_or_create(name=name)
        created += new
        if new:
            lead, made = User.objects.get_or_create(username=f"{name}-lead")
            if made:
                lead.set_unusable_password()
                lead.save(update_fields=["password"])
            team.members.add(lead)
    return created


def pool_name(model_name: str) -> str:
    """A pool's short name from its GPU model's: "NVIDIA A100-SXM4-80GB" -> "a100"."""
    return model_name.split()[1].split("-")[0].lower()


def seed_capacity(sites: Iterable[SiteSpec], *, seed: int, now: datetime) -> dict[str, int]:
    """Pools, quotas, orders, the grid approval and reservations of the simulated ``sites`` (those
    already in the inventory); returns how many rows of each kind this call created."""
    created = dict.fromkeys(("teams", "pools", "quotas", "orders", "approvals", "reservations"), 0)
    today = now.date()
    with transaction.atomic():
        created["teams"] = seed_teams([t for q in QUOTAS.values() for t, *_ in q] + [r.team for r in RESERVATIONS])
        pools: dict[tuple[str, str], Pool] = {}
        for spec in sites:
            site = Site.objects.filter(name=spec.name).first()
            if site is None:
                continue
            for group in spec.groups:
                name = pool_name(group.model.name)
                pool, new = Pool.objects.get_or_create(site=site, gpu_model=group.model.name, defaults={"name": name})
                pools[(spec.name, name)] = pool
                created["pools"] += new
        for key, quotas in QUOTAS.items():
            if key not in pools:
                continue
            for team, nominal, limit in quotas:
                _, new = TeamQuota.objects.get_or_create(
                    pool=pools[key], team_id=team, defaults={"nominal_gpus": nominal, "borrowing_limit_gpus": limit}
                )
                created["quotas"] += new
        orders = (
            (LATE_ORDER, ("ams-1", "h100"), 16, 300, -21, OrderStatus.SHIPPED),
            (ON_TIME_ORDER, ("iad-2", "h200"), 32, 200, 75, OrderStatus.ORDERED),
        )
        for reference, key, count, ordered_ago, promised_in, status in orders:
            if key not in pools:
                continue
            _, new = ProcurementOrder.objects.get_or_create(
                reference=reference,
                defaults={
                    "pool": pools[key],
                    "count": count,
                    "ordered_on": today - timedelta(days=ordered_ago),
                    "promised_on": today + timedelta(days=promised_in),
                    "status": status,
                    "vendor": "Simulated OEM",
                },
            )
            created["orders"] += new
        iad = next((p.site for (site, _), p in pools.items() if site == "iad-2"), None)
        if iad is not None:
            _, new = PowerApproval.objects.get_or_create(
                reference=GRID_APPROVAL,
                defaults={
                    "site": iad,
                    "added_kw": 200,
                    "expected_on": today + timedelta(days=120),
                    "status": ApprovalStatus.APPROVED,
                },
            )
            created["approvals"] += new
        for r in RESERVATIONS:
            if (r.site, r.pool) not in pools:
                continue
            _, new = Reservation.objects.get_or_create(
                client_id=f"sim-{seed}-{r.key}",
                defaults={
                    "pool": pools[(r.site, r.pool)],
                    "team_id": r.team,
                    "gpus": r.gpus,
                    "tier": r.tier,
                    "priority": r.priority,
                    "state": r.state,
                    "start": now + timedelta(days=r.start_days),
                    "end": now + timedelta(days=r.end_days),
                    "requested_via": REQUESTED_VIA,
                    "approved_at": None if r.state == ReservationState.REQUESTED else now,
                },
            )
            created["reservations"] += new
    return created
