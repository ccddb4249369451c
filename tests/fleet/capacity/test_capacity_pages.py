"""The capacity pages: the plan (chart data, pools, conflicts, quotas, orders), the reservations list
with the Operator's forms (request, approve, cancel; refusals shown, never a 500), and the overview
tile. A fixture site of 16 energised GPUs with orders (one late), a grid approval and reservations
that over-commit two months."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.test import Client
from django.utils import timezone

from fleet.capacity.read import planning
from fleet.choices import PriorityTier
from fleet.models import Pool, PowerApproval, ProcurementOrder, Reservation, ReservationState, Site
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, midnight, quota, reserve

pytestmark = pytest.mark.django_db

PLAN = "/capacity/"
RESERVATIONS = "/capacity/reservations/"
RES, OD, PRE = PriorityTier.RESERVED, PriorityTier.ON_DEMAND, PriorityTier.PREEMPTIBLE


def month(k: int) -> date:
    """The first day of the k-th month from this one."""
    today = timezone.localdate(timezone.now(), UTC)
    y, m = divmod(today.month - 1 + k, 12)
    return date(today.year + y, m + 1, 1)


@pytest.fixture
def pool(site_a: Site) -> Pool:
    """16 GPUs on a 20 kW contract (5 new GPUs fit until +10 kW lands in month 3); firm demand
    exceeds energised supply in months 2 and 4 (as in test_capacity_plan's hand-computed plan)."""
    site_a.contracted_power_kw = 20
    site_a.save()
    add_nodes(site_a, 2)
    pool = make_pool(site_a)
    today = timezone.localdate(timezone.now(), UTC)
    ProcurementOrder.objects.create(
        pool=pool, count=8, ordered_on=today - timedelta(days=250), promised_on=month(2), vendor="Acme"
    )
    ProcurementOrder.objects.create(pool=pool, count=16, ordered_on=today - timedelta(days=200), promised_on=month(4))
    ProcurementOrder.objects.create(
        pool=pool,
        count=8,
        ordered_on=today - timedelta(days=300),
        promised_on=today - timedelta(days=10),
        reference="PO-LATE",
    )
    PowerApproval.objects.create(site=site_a, added_kw=10, expected_on=month(3), status="approved", reference="GRID-7")
    m = lambda k: midnight(month(k))  # noqa: E731
    reserve(pool, "alpha", 4, days_ahead(-1), m(1), tier=RES)  # held now, ends before next month
    reserve(pool, "alpha", 10, m(1), m(3), tier=RES)
    reserve(pool, "beta", 6, m(1) + timedelta(days=14), m(2), tier=OD)
    reserve(pool, "beta", 12, m(2), m(6), tier=RES)
    reserve(pool, "gamma", 8, m(1), m(5), tier=PRE)
    reserve(pool, "alpha", 20, m(4), m(5), tier=OD)
    quota(pool, "alpha", 12, 4)
    quota(pool, "beta", 4, 0)
    return pool


def _page_config(html: str) -> dict:
    found = re.search(r'<script id="page-config" type="application/json">(.*?)</script>', html, re.S)
    assert found, "the page carries its chart data in a json_script"
    return json.loads(found.group(1))


def _section(html: str, element_id: str) -> str:
    """The HTML of the element with this id, up to the next card (enough to assert on)."""
    start = html.index(f'id="{element_id}"')
    end = re.compile(r'class="(card|section)[ "]').search(html, start)
    return html[start : end.start() if end else len(html)]


# --- the plan page ------------------------------------------------------------------------------


def test_the_plan_page_draws_the_plan_the_api_serves_and_the_pools_figures(viewer_client: Client, pool: Pool) -> None:
    response = viewer_client.get(PLAN)
    assert response.status_code == 200
    html = response.content.decode()
    config = _page_config(html)
    assert config["plan"] == json.loads(json.dumps(planning.plan()))
    assert config["plan"]["total"][2]["energised"] == 21  # the fixture's plan, not an empty one
    assert config["tiers"] == ["reserved", "on-demand", "preemptible"]
    assert "/static/vendor/plotly.min." in html and "/static/js/capacity." in html and 'id="chart-plan"' in html
    row = re.search(rf'<tr data-pool="{pool.pk}"[^>]*>(.*?)</tr>', html, re.S)
    assert row is not None
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
    # site, pool, model, installed, energised, healthy, reserved, preemptible, available, at risk
    assert cells[:9] == ["ams-1", "h100", "NVIDIA H100 80GB HBM3", "16", "16", "16", "4", "0", "12"]
    assert cells[9] == "none"


def test_conflict_months_are_marked_in_the_list_and_the_monthly_table(viewer_client: Client, pool: Pool) -> None:
    html = viewer_client.get(PLAN).content.decode()
    listed = re.findall(r'<li data-month="([0-9-]+)">', _section(html, "conflict-list"))
    assert listed == [month(2).strftime("%Y-%m"), month(4).strftime("%Y-%m")]
    assert "over-committed: ams-1/h100" in html
    marked = re.findall(r'<tr class="row-bad" data-month="([0-9-]+)">', html)
    assert marked == listed  # month 1 is exactly full: not a conflict
    assert "Months in conflict" in html and "first: " + month(2).strftime("%Y-%m") in html


def test_late_orders_are_listed_apart_from_upcoming_ones_with_their_lead_time(
    viewer_client: Client, pool: Pool
) -> None:
    html = viewer_client.get(PLAN).content.decode()
    late = _section(html, "late-orders")
    today = timezone.localdate(timezone.now(), UTC)
    assert "PO-LATE" in late and (today - timedelta(days=10)).isoformat() in late and ">10 d<" in late
    assert month(2).isoformat() not in late
    upcoming = _section(html, "upcoming-orders")
    assert "PO-LATE" not in upcoming
    weeks = round((month(2) - (today - timedelta(days=250))).days / 7)
    assert month(2).isoformat() in upcoming and f"{weeks} wk" in upcoming
    approvals = _section(html, "power-approvals")
    assert "GRID-7" in approvals and "10 kW" in approvals and month(3).isoformat() in approvals


def test_each_team_use_is_shown_against_its_quota(viewer_client: Client, pool: Pool) -> None:
    # beta holds 6 now against a nominal 4: 2 borrowed out of alpha's unused nominal quota.
    reserve(pool, "beta", 6, days_ahead(-2), days_ahead(3), tier=OD)
    html = viewer_client.get(PLAN).content.decode()
    rows = {
        team: [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)]
        for team, body in re.findall(r'<tr data-team="(\w+)" data-pool="\d+">(.*?)</tr>', html, re.S)
    }
    assert rows["alpha"][1:5] == ["alpha", "12", "4", "4"]
    assert rows["beta"][1:5] == ["beta", "4", "0", "6 (2 borrowed)"]
    assert 'data-pct="25.0" data-mark="75.0"' in html  # alpha: 4 of 16, nominal at 12 of 16
    assert 'data-pct="100.0" data-mark="100.0"' in html  # beta: over its nominal, no limit left


def test_preemptible_reservations_at_risk_are_named_in_the_pools_table(viewer_client: Client, pool: Pool) -> None:
    # 16 healthy, 4 firm: 12 left for preemptible work now; 8 + 6 held, the lower priority goes first.
    reserve(pool, "spot-a", 8, days_ahead(-1), days_ahead(2), tier=PRE, priority=5)
    reserve(pool, "spot-b", 6, days_ahead(-1), days_ahead(2), tier=PRE, priority=1)
    html = viewer_client.get(PLAN).content.decode()
    row = re.search(rf'<tr data-pool="{pool.pk}" class="row-warn">(.*?)</tr>', html, re.S)
    assert row is not None
    assert "1 reservation, 6 GPUs:" in row.group(1) and "spot-b (6)" in row.group(1)
    assert "spot-a" not in row.group(1)


def test_without_pools_the_plan_page_says_how_to_create_them(viewer_client: Client) -> None:
    response = viewer_client.get(PLAN)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="capacity-empty"' in html and "POST /api/v1/capacity/pools/" in html
    assert "plotly" not in html and 'id="page-config"' not in html


def test_the_csv_exports_linked_from_the_page_take_the_session(viewer_client: Client, pool: Pool) -> None:
    html = viewer_client.get(PLAN).content.decode()
    for url in ("/api/v1/capacity/plan.csv", "/api/v1/capacity/reservations.csv"):
        assert f'href="{url}"' in html
        response = viewer_client.get(url)
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert b"alpha" in viewer_client.get("/api/v1/capacity/reservations.csv").content


# --- the reservations page ----------------------------------------------------------------------


@pytest.fixture
def bare_pool(site_a: Site) -> Pool:
    """16 GPUs, installed and energised, no orders and no reservations."""
    add_nodes(site_a, 2)
    return make_pool(site_a)


@pytest.fixture
def delta(pool: Pool) -> None:
    """The form's team, with a nominal quota of 4 on the pool (a team without one is refused)."""
    quota(pool, "delta", 4)


def _form(on: Pool, **overrides: object) -> dict[str, object]:
    values = {
        "action": "request",
        "team": "delta",
        "pool": on.pk,
        "gpus": 4,
        "start": days_ahead(40).strftime("%Y-%m-%dT%H:%M"),
        "end": days_ahead(45).strftime("%Y-%m-%dT%H:%M"),
        "tier": RES,
        "priority": 3,
    }
    values.update(overrides)
    return values


def test_an_operator_requests_a_reservation_through_the_form(
    operator_client: Client, operator_user, pool: Pool, delta: None
) -> None:
    response = operator_client.post(RESERVATIONS, _form(pool))
    assert response.status_code == 302 and response["Location"] == RESERVATIONS
    r = Reservation.objects.get(team="delta")
    assert (r.pool, r.gpus, r.start, r.end, r.tier, r.priority) == (pool, 4, days_ahead(40), days_ahead(45), RES, 3)
    assert r.state == ReservationState.REQUESTED and r.created_by == operator_user
    assert r.requested_via == operator_user.username
    entry = LogEntry.objects.get(object_id=str(r.pk))
    assert entry.action_flag == ADDITION and entry.user == operator_user
    html = operator_client.get(RESERVATIONS).content.decode()
    assert f"Requested #{r.pk}" in html
    row = re.search(rf'<tr data-reservation="{r.pk}"[^>]*>(.*?)</tr>', html, re.S)
    assert row is not None and 'data-action="approve"' in row.group(1) and 'data-action="cancel"' in row.group(1)


def test_an_operator_approves_then_cancels_a_reservation(
    operator_client: Client, operator_user, bare_pool: Pool
) -> None:
    r = reserve(bare_pool, "delta", 4, days_ahead(40), days_ahead(45), state=ReservationState.REQUESTED)
    response = operator_client.post(RESERVATIONS + "?state=requested", {"action": "approve", "id": r.pk})
    assert response.status_code == 302 and response["Location"] == RESERVATIONS + "?state=requested"
    r.refresh_from_db()
    assert r.state == ReservationState.APPROVED and r.approved_by == operator_user
    assert LogEntry.objects.filter(
        object_id=str(r.pk), action_flag=CHANGE, change_message__startswith="Approved"
    ).exists()
    assert operator_client.post(RESERVATIONS, {"action": "cancel", "id": r.pk}).status_code == 302
    r.refresh_from_db()
    assert r.state == ReservationState.CANCELLED
    # Cancelled once, a second cancel is refused on the page, not with a 500.
    again = operator_client.post(RESERVATIONS, {"action": "cancel", "id": r.pk})
    assert again.status_code == 409 and "it cannot be cancelled" in again.content.decode()


def test_an_over_committing_approval_shows_the_window_and_teams_and_changes_nothing(
    operator_client: Client, bare_pool: Pool
) -> None:
    reserve(bare_pool, "alpha", 10, days_ahead(31), days_ahead(35), tier=RES)
    reserve(bare_pool, "beta", 4, days_ahead(33), days_ahead(38), tier=RES)
    new = reserve(bare_pool, "gamma", 4, days_ahead(32), days_ahead(60), state=ReservationState.REQUESTED)
    logged = LogEntry.objects.count()
    response = operator_client.post(RESERVATIONS, {"action": "approve", "id": new.pk})
    assert response.status_code == 409
    html = response.content.decode()
    refusal = _section(html, "refusal")
    assert "Over-commits the pool: 18 GPUs reserved against 16 energised" in refusal
    window = f"{days_ahead(33):%Y-%m-%d} 00:00 → {days_ahead(35):%Y-%m-%d} 00:00 UTC"
    assert window in refusal
    assert re.search(r'data-field="teams">alpha, beta, gamma<', refusal)
    new.refresh_from_db()
    assert new.state == ReservationState.REQUESTED and new.approved_by is None
    assert LogEntry.objects.count() == logged


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"end": days_ahead(39).strftime("%Y-%m-%dT%H:%M")}, "end", "Must be after the start."),
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": -3}, "gpus", "greater than or equal to"),
        ({"pool": 999_999}, "pool", "Select a valid choice"),
        ({"team": ""}, "team", "This field is required."),
        ({"team": "nobody"}, "team", "Select a valid choice"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(
    operator_client: Client, pool: Pool, delta: None, overrides: dict, field: str, message: str
) -> None:
    before, logged = Reservation.objects.count(), LogEntry.objects.count()
    response = operator_client.post(RESERVATIONS, _form(pool, **overrides))
    assert response.status_code == 400
    errors = re.findall(r'data-error-for="(\w+)">([^<]*)<', response.content.decode())
    assert [name for name, _ in errors] == [field]
    assert message in errors[0][1]
    assert (Reservation.objects.count(), LogEntry.objects.count()) == (before, logged)


def test_a_viewer_sees_the_list_without_forms_and_cannot_post(viewer_client: Client, pool: Pool) -> None:
    r = reserve(pool, "delta", 4, days_ahead(40), days_ahead(45), state=ReservationState.REQUESTED)
    response = viewer_client.get(RESERVATIONS)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-reservation="{r.pk}"' in html
    assert '<form method="post"' not in html.split("</header>", 1)[1]  # only the sign-out form, in the header
    assert 'id="reservation-form"' not in html and "data-action=" not in html
    before = Reservation.objects.count()
    assert viewer_client.post(RESERVATIONS, _form(pool)).status_code == 403
    assert viewer_client.post(RESERVATIONS, {"action": "approve", "id": r.pk}).status_code == 403
    assert viewer_client.post(RESERVATIONS, {"action": "cancel", "id": r.pk}).status_code == 403
    r.refresh_from_db()
    assert r.state == ReservationState.REQUESTED and Reservation.objects.count() == before


def test_the_list_filters_by_state_pool_and_team(viewer_client: Client, pool: Pool) -> None:
    requested = reserve(pool, "delta", 4, days_ahead(40), days_ahead(45), state=ReservationState.REQUESTED)
    html = viewer_client.get(RESERVATIONS + "?state=requested").content.decode()
    assert re.findall(r'data-reservation="(\d+)"', html) == [str(requested.pk)]
    html = viewer_client.get(RESERVATIONS + "?team=beta").content.decode()
    shown = {int(pk) for pk in re.findall(r'data-reservation="(\d+)"', html)}
    assert shown == set(Reservation.objects.filter(team="beta").values_list("pk", flat=True)) and len(shown) == 2
    other = make_pool(pool.site, model="NVIDIA A100-SXM4-80GB", name="a100")
    html = viewer_client.get(RESERVATIONS + f"?pool={other.pk}").content.decode()
    assert "No reservation matches these filters." in html


# --- the overview tile --------------------------------------------------------------------------


def test_the_overview_tile_shows_supply_availability_conflicts_and_late_orders(
    viewer_client: Client, pool: Pool
) -> None:
    html = viewer_client.get("/").content.decode()
    tile = _section(html, "capacity-tile")
    assert re.search(r"Energised GPUs</div><div class=\"stat-value\">16<small> of 16</small>", tile)
    assert re.search(r"Available now</div><div class=\"stat-value\">12<", tile)
    assert re.search(r"Conflicts, next 12 months</div><div class=\"stat-value\">2<small> months", tile)
    assert f"{month(2):%Y-%m}: ams-1/h100" in tile
    assert re.search(r"Late orders</div><div class=\"stat-value\">1<", tile) and "8 GPUs past" in tile
