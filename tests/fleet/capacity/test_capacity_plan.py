"""The 12-month plan against a hand-computed one: 3 orders (one late), 1 grid approval and 6
reservations across the 3 tiers, on a site whose contracted power limits what new GPUs run."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.capacity.actions import reservations
from fleet.capacity.actions.approvals import ConflictError
from fleet.capacity.read import planning, supply
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


# month: installed, energised, healthy, reserved, on-demand, preemptible, conflict, curtailed
HAND_PLAN = [
    (0, 16, 16, 16, 0, 0, 0, False, 0),
    (1, 16, 16, None, 10, 6, 8, False, 0),  # firm 16 against 16: exactly full
    (2, 24, 21, None, 22, 0, 8, True, 3),  # 8 land, 5 of them powered: 22 > 21
    (3, 24, 24, None, 12, 0, 8, False, 0),  # +10 kW: 14.8 kW spare runs 15, the 8 new ones all run
    (4, 40, 31, None, 12, 20, 8, True, 9),  # 16 more land, 15 of 24 new run: 32 > 31
    (5, 40, 31, None, 12, 0, 0, False, 9),
    (6, 40, 31, None, 0, 0, 4, False, 9),
    (7, 40, 31, None, 0, 0, 0, False, 9),
]


def _expected(k, installed, energised, healthy, res, od, pre, conflict, curtailed):
    return {
        "month": month(k).strftime("%Y-%m"),
        "installed": installed,
        "energised": energised,
        "healthy": healthy,
        "reserved": {"reserved": res, "on-demand": od, "preemptible": pre},
        "conflict": conflict,
        "curtailed": curtailed,
    }


def _without_why(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "curtailed_why"} for row in rows]


def test_the_plan_equals_the_hand_computed_one(fixture) -> None:
    data = planning.plan(months=8)
    assert data["start"] == month(0).isoformat()
    [pool] = data["pools"]
    assert _without_why(pool["months"]) == [_expected(*row) for row in HAND_PLAN]
    assert _without_why(data["total"]) == [_expected(*row) for row in HAND_PLAN]  # one pool: the total is its figures
    # Landed GPUs the power cannot run are said to wait for power, in figures; the total says no why.
    assert [m["curtailed_why"] is not None for m in pool["months"]] == [bool(row[-1]) for row in HAND_PLAN]
    assert pool["months"][2]["curtailed_why"] == (
        "3 landed GPUs not energised: site power 20.0 kW (20.0 contracted + 0.0 approved) runs 19.9 of"
        " 22.8 kW at full load; pool 1 of 1 in the site's power order"
    )
    assert all(m["curtailed_why"] is None for m in data["total"])


def test_supply_at_follows_orders_and_power(fixture) -> None:
    assert supply.supply_at(fixture, month(2)) == {"installed": 24, "energised": 21}
    assert supply.supply_at(fixture, month(2) - timedelta(days=1)) == {"installed": 16, "energised": 16}
    assert supply.supply_at(fixture, month(4)) == {"installed": 40, "energised": 31}


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
        "curtailed": "9",
        "curtailed_why": "9 landed GPUs not energised: site power 30.0 kW (20.0 contracted + 10.0 approved) runs"
        " 29.4 of 38.0 kW at full load; pool 1 of 1 in the site's power order",
    }


@pytest.mark.parametrize("query", ["months=0", "months=37", "months=x", "start=2026-13-01"])
def test_bad_plan_arguments_are_400_naming_the_parameter(query: str, viewer_client: Client) -> None:
    response = viewer_client.get(f"/api/v1/capacity/plan?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()


# --- two pools sharing a site's power ---------------------------------------------------------------

H200 = "NVIDIA H200 141GB HBM3e"
L40S = "NVIDIA L40S"


@pytest.fixture
def two_pools(site_a: Site, settings):
    """The issue's hand check: a 16 kW contract, 16 H200 (two nodes of 8 x 700 W + 2 kW overhead,
    15.2 kW: 950 W a GPU) then 8 L40S (one node, 8 x 350 W + 2 kW = 4.8 kW) added; 8 more H200
    land next month and +8 kW is approved from month 3 (the issue's April)."""
    settings.NODE_OVERHEAD_W = 2000
    site_a.contracted_power_kw = 16
    site_a.save()
    add_nodes(site_a, 2, model=H200, prefix="h")
    h200 = make_pool(site_a, model=H200, name="h200")
    # Its hostname (ams-1-a000) sorts before the H200s': the power order is the pools', not hostnames'.
    add_nodes(site_a, 1, model=L40S, prefix="a")
    l40s = make_pool(site_a, model=L40S, name="l40s")
    today = timezone.localdate(timezone.now(), UTC)
    ProcurementOrder.objects.create(pool=h200, count=8, ordered_on=today - timedelta(days=90), promised_on=month(1))
    PowerApproval.objects.create(site=site_a, added_kw=8, expected_on=month(3), status="approved")
    return h200, l40s


def _series(pool: dict, key: str) -> list:
    return [m[key] for m in pool["months"]]


def test_approved_power_restores_curtailed_gpus_first_then_energises_arrivals(two_pools, viewer_client: Client) -> None:
    body = viewer_client.get("/api/v1/capacity/plan?months=5").json()
    h200, l40s = body["pools"]
    assert (h200["name"], l40s["name"]) == ("h200", "l40s")
    # 16 kW runs the H200 pool's two nodes (15.2 kW); the L40S node (4.8 kW) does not fit the 0.8
    # kW left, nor do the landed H200 (950 W each). From month 3, 24 kW restores the L40S node
    # (20 kW), then runs 4 of the 8 new H200 (3.8 kW).
    assert _series(h200, "installed") == [16, 24, 24, 24, 24]
    assert _series(h200, "energised") == [16, 16, 16, 20, 20]
    assert _series(h200, "curtailed") == [0, 8, 8, 4, 4]
    assert _series(l40s, "installed") == [8] * 5
    assert _series(l40s, "energised") == [0, 0, 0, 8, 8]
    assert _series(l40s, "curtailed") == [8, 8, 8, 0, 0]
    assert _series(l40s, "curtailed_why")[0] == (
        "8 installed GPUs curtailed (1 node): site power 16.0 kW (16.0 contracted + 0.0 approved) runs 15.2"
        " of 20.0 kW at full load; pool 2 of 2 in the site's power order"
    )
    assert _series(l40s, "curtailed_why")[3:] == [None, None]
    assert _series(h200, "curtailed_why")[3].startswith("4 landed GPUs not energised: site power 24.0 kW")
    assert [m["energised"] for m in body["total"]] == [16, 16, 16, 28, 28]  # all 24 installed + 4 new
    assert [m["curtailed"] for m in body["total"]] == [8, 16, 16, 4, 4]


def test_todays_figures_curtail_the_later_pool_whole(two_pools) -> None:
    h200, l40s = two_pools
    figures = supply.pool_figures([l40s])  # one pool asked: the site's other pool still counts
    assert (figures[l40s.pk].installed, figures[l40s.pk].energised, figures[l40s.pk].healthy) == (8, 0, 0)
    assert supply.pool_figures([h200, l40s])[h200.pk].energised == 16


def test_the_approval_gate_reads_the_same_site_power_as_the_plan(two_pools, operator_user) -> None:
    h200, l40s = two_pools
    m = lambda k: midnight(month(k))  # noqa: E731
    fits = reserve(h200, "alpha", 20, m(3), m(4), state="requested")
    assert reservations.approve(fits, actor=operator_user).state == "approved"
    over = reserve(h200, "beta", 1, m(3), m(4), state="requested")
    with pytest.raises(ConflictError) as exc:
        reservations.approve(over, actor=operator_user)
    assert exc.value.detail["conflict"]["supply"] == 20
    curtailed = reserve(l40s, "gamma", 1, m(1), m(2), state="requested")  # the L40S run from month 3 only
    with pytest.raises(ConflictError):
        reservations.approve(curtailed, actor=operator_user)
    later = reserve(l40s, "gamma", 8, m(3), m(4), state="requested")
    assert reservations.approve(later, actor=operator_user).state == "approved"


def test_the_csv_and_the_page_say_which_pools_are_curtailed_and_why(two_pools, viewer_client: Client) -> None:
    rows = list(csv.DictReader(io.StringIO(viewer_client.get("/api/v1/capacity/plan.csv?months=5").content.decode())))
    l40s = [r for r in rows if r["pool"] == "l40s"]
    assert [r["curtailed"] for r in l40s] == ["8", "8", "8", "0", "0"]
    assert l40s[0]["curtailed_why"].startswith("8 installed GPUs curtailed (1 node): site power 16.0 kW")
    assert l40s[3]["curtailed_why"] == ""
    assert [r["curtailed"] for r in rows if r["pool"] == "total"] == ["8", "16", "16", "4", "4"]

    html = viewer_client.get("/capacity/").content.decode()
    listed = html[html.index('id="curtailment-list"') : html.index("</ul>", html.index('id="curtailment-list"'))]
    # Three runs of months: the L40S node dark; then the landed H200 too; from month 3 half the H200.
    runs = re.findall(r'<span class="conflict-month">([^<]*)</span>', listed)
    ym = lambda k: month(k).strftime("%Y-%m")  # noqa: E731
    assert runs == [ym(0), f"{ym(1)} to {ym(2)}", f"{ym(3)} to {ym(11)}"]
    assert listed.count("<strong>ams-1/l40s</strong> 8 GPUs") == 2 and "8 installed GPUs curtailed (1 node)" in listed
    assert listed.count("<strong>ams-1/h200</strong> 8 GPUs") == 1 and "8 landed GPUs not energised" in listed
    assert listed.count("<strong>ams-1/h200</strong> 4 GPUs") == 1 and "4 landed GPUs not energised" in listed
    assert "Approved power first restores curtailed nodes" in html
    assert "the mean GPUs per node of its installed nodes, 8 when it has none" in html
