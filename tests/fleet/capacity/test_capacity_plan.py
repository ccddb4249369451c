"""The 12-month plan against a hand-computed one: 3 orders (one late), 1 grid approval and 6
reservations across the 3 tiers, on a site whose contracted power limits what new GPUs run."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.capacity import services as capacity
from fleet.choices import PriorityTier
from fleet.models import PowerApproval, ProcurementOrder, Site
from tests.fleet.capacity import add_nodes, make_pool, midnight, reserve

pytestmark = pytest.mark.django_db

RES, OD, PRE = PriorityTier.RESERVED, PriorityTier.ON_DEMAND, PriorityTier.PREEMPTIBLE


def month(k: int) -> date:
    """The first day of the k-th month from this one."""
    today = timezone.localdate(timezone.now(), UTC)
    y, m = divmod(today.month - 1 + k, 12)
    return date(today.year + y, m + 1, 1)


@pytest.fixture
def fixture(site_a: Site):
    # 16 GPUs draw 2 x (8 x 700 + 2000) = 15.2 kW of a 20 kW contract: 4.8 kW spare, and a new
    # H100 needs 700 + 2000/8 = 950 W, so 5 new GPUs can run until the grid approval adds 10 kW.
    site_a.contracted_power_kw = 20
    site_a.save()
    add_nodes(site_a, 2)
    pool = make_pool(site_a)
    today = timezone.localdate(timezone.now(), UTC)
    ProcurementOrder.objects.create(pool=pool, count=8, ordered_on=today - timedelta(days=250), promised_on=month(2))
    ProcurementOrder.objects.create(pool=pool, count=16, ordered_on=today - timedelta(days=200), promised_on=month(4))
    ProcurementOrder.objects.create(  # late: counts nowhere until delivered
        pool=pool, count=8, ordered_on=today - timedelta(days=300), promised_on=today - timedelta(days=10)
    )
    PowerApproval.objects.create(site=site_a, added_kw=10, expected_on=month(3), status="approved")
    PowerApproval.objects.create(site=site_a, added_kw=500, expected_on=month(1), status="requested")  # not yet
    m = lambda k: midnight(month(k))  # noqa: E731
    reserve(pool, "alpha", 10, m(1), m(3), tier=RES)
    reserve(pool, "beta", 6, m(1) + timedelta(days=14), m(2), tier=OD)
    reserve(pool, "beta", 12, m(2), m(6), tier=RES)
    reserve(pool, "gamma", 8, m(1), m(5), tier=PRE)
    reserve(pool, "alpha", 20, m(4), m(5), tier=OD)
    reserve(pool, "gamma", 4, m(6) + timedelta(days=3), m(7), tier=PRE)
    reserve(pool, "delta", 99, m(1), m(7), tier=RES, state="requested")  # not committed: not counted
    return pool


# month: installed, energised, healthy, reserved, on-demand, preemptible, conflict
HAND_PLAN = [
    (0, 16, 16, 16, 0, 0, 0, False),
    (1, 16, 16, None, 10, 6, 8, False),  # firm 16 against 16: exactly full
    (2, 24, 21, None, 22, 0, 8, True),  # 8 land, 5 of them powered: 22 > 21
    (3, 24, 24, None, 12, 0, 8, False),  # +10 kW: 14.8 kW spare runs 15, the 8 new ones all run
    (4, 40, 31, None, 12, 20, 8, True),  # 16 more land, 15 of 24 new run: 32 > 31
    (5, 40, 31, None, 12, 0, 0, False),
    (6, 40, 31, None, 0, 0, 4, False),
    (7, 40, 31, None, 0, 0, 0, False),
]


def _expected(k, installed, energised, healthy, res, od, pre, conflict):
    return {
        "month": month(k).strftime("%Y-%m"),
        "installed": installed,
        "energised": energised,
        "healthy": healthy,
        "reserved": {"reserved": res, "on-demand": od, "preemptible": pre},
        "conflict": conflict,
    }


def test_the_plan_equals_the_hand_computed_one(fixture) -> None:
    data = capacity.plan(months=8)
    assert data["start"] == month(0).isoformat()
    [pool] = data["pools"]
    assert pool["months"] == [_expected(*row) for row in HAND_PLAN]
    assert data["total"] == [_expected(*row) for row in HAND_PLAN]  # one pool: the total is its figures


def test_supply_at_follows_orders_and_power(fixture) -> None:
    assert capacity.supply_at(fixture, month(2)) == {"installed": 24, "energised": 21}
    assert capacity.supply_at(fixture, month(2) - timedelta(days=1)) == {"installed": 16, "energised": 16}
    assert capacity.supply_at(fixture, month(4)) == {"installed": 40, "energised": 31}


def test_the_plan_api_and_its_csv_agree(fixture, viewer_client: Client) -> None:
    body = viewer_client.get("/api/v1/capacity/plan?months=8").json()
    assert body["pools"][0]["months"][2]["conflict"] is True
    response = viewer_client.get("/api/v1/capacity/plan.csv?months=8")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 16  # 8 months of the pool, then 8 of the total
    may = [r for r in rows if r["pool"] == "h100"][4]
    assert may == {
        "month": month(4).strftime("%Y-%m"),
        "site": "ams-1",
        "pool": "h100",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "installed": "40",
        "energised": "31",
        "healthy": "",
        "reserved_reserved": "12",
        "reserved_on_demand": "20",
        "reserved_preemptible": "8",
        "conflict": "1",
    }


@pytest.mark.parametrize("query", ["months=0", "months=37", "months=x", "start=2026-13-01"])
def test_bad_plan_arguments_are_400_naming_the_parameter(query: str, viewer_client: Client) -> None:
    response = viewer_client.get(f"/api/v1/capacity/plan?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()
