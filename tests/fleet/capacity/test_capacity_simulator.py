"""The simulator's capacity data: what `make demo` shows on the capacity plan. The inventory is
the simulate command's own (sites, racks four nodes apiece, the hot rack's smaller budget), with
the simulated GPUs as the agents' first samples would register them."""

from __future__ import annotations

from datetime import UTC

import pytest
from django.test import Client
from django.utils import timezone

from fleet.capacity.read import planning, supply
from fleet.capacity.simulator import GRID_APPROVAL, LATE_ORDER, ON_TIME_ORDER, seed_capacity
from fleet.choices import PriorityTier
from fleet.management.commands.simulate import Command
from fleet.models import Gpu, Node, Pool, PowerApproval, ProcurementOrder, Reservation, TeamQuota
from fleet.telemetry import simulator

pytestmark = pytest.mark.django_db
SEED = simulator.DEFAULT_SEED


@pytest.fixture
def seeded(settings, tmp_path) -> dict[str, int]:  # type: ignore[no-untyped-def]
    settings.DATA_DIR = tmp_path  # the command keeps its agent tokens there
    settings.NODE_OVERHEAD_W = 2000
    fleet = simulator.build_fleet(simulator.DEFAULT_SITES, gpu_limit=None, seed=SEED)
    Command()._prepare_inventory(fleet, seed=SEED)
    nodes = dict(Node.objects.values_list("hostname", "pk"))
    Gpu.objects.bulk_create(
        [
            Gpu(node_id=nodes[g.hostname], uuid=g.uuid, index=g.index, model=g.model.name)
            for gpus in fleet.values()
            for g in gpus
        ]
    )
    return seed_capacity(simulator.DEFAULT_SITES, seed=SEED, now=timezone.now())


def test_it_creates_a_pool_per_site_and_gpu_model_with_team_quotas(seeded) -> None:  # type: ignore[no-untyped-def]
    pools = {(p.site.name, p.name): p for p in Pool.objects.select_related("site")}
    assert set(pools) == {("ams-1", "h100"), ("ams-1", "l40s"), ("iad-2", "h200"), ("iad-2", "a100"), ("sin-1", "l40s")}
    assert pools[("iad-2", "a100")].gpu_model == simulator.A100.name
    assert all(TeamQuota.objects.filter(pool=p).exists() for p in pools.values())


def test_the_late_order_is_late_and_the_other_is_due(seeded, viewer_user) -> None:  # type: ignore[no-untyped-def]
    today = timezone.localdate(timezone.now(), UTC)
    late, on_time = (
        ProcurementOrder.objects.get(reference=LATE_ORDER),
        ProcurementOrder.objects.get(reference=ON_TIME_ORDER),
    )
    assert late.delivered_on is None and late.promised_on < today and late.is_late(today)
    assert on_time.promised_on > today and not on_time.is_late(today)
    client = Client()
    client.force_login(viewer_user)
    flags = {o["reference"]: o["late"] for o in client.get("/api/v1/capacity/orders/").json()["results"]}
    assert flags == {LATE_ORDER: True, ON_TIME_ORDER: False}


def test_the_grid_approval_is_approved_for_a_future_date(seeded) -> None:  # type: ignore[no-untyped-def]
    approval = PowerApproval.objects.get(reference=GRID_APPROVAL)
    assert approval.site.name == "iad-2" and approval.status == "approved"
    assert approval.expected_on > timezone.localdate(timezone.now(), UTC)


def test_reservations_cover_every_tier_and_state(seeded) -> None:  # type: ignore[no-untyped-def]
    reservations = Reservation.objects.all()
    assert len(reservations) == 12
    assert {r.tier for r in reservations} == set(PriorityTier)
    assert {r.state for r in reservations} == {"requested", "approved", "active"}


def test_the_plan_shows_a_conflict_and_an_evaluation_at_risk(seeded) -> None:  # type: ignore[no-untyped-def]
    h100 = Pool.objects.get(site__name="ams-1", name="h100")
    # The hot rack's 28 kW runs three of its four H100 nodes: 120 of 128 GPUs energised.
    assert supply.pool_figures([h100])[h100.pk].energised == 120
    (at_risk,) = supply.preemptible_at_risk(h100)
    assert at_risk.team_id == "batch-eval" and at_risk.tier == PriorityTier.PREEMPTIBLE
    plan = next(p for p in planning.plan()["pools"] if p["id"] == h100.pk)
    assert any(m["conflict"] for m in plan["months"])
    others = [p for p in planning.plan()["pools"] if p["id"] != h100.pk]
    assert not any(m["conflict"] for p in others for m in p["months"])


def test_a_second_run_adds_nothing(seeded) -> None:  # type: ignore[no-untyped-def]
    assert seeded == {"teams": 4, "pools": 5, "quotas": 10, "orders": 2, "approvals": 1, "reservations": 12}
    counts = [m.objects.count() for m in (Pool, TeamQuota, ProcurementOrder, PowerApproval, Reservation)]
    again = seed_capacity(simulator.DEFAULT_SITES, seed=SEED, now=timezone.now())
    assert again == dict.fromkeys(seeded, 0)
    assert [m.objects.count() for m in (Pool, TeamQuota, ProcurementOrder, PowerApproval, Reservation)] == counts
