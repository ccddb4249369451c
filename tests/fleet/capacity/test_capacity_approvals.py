"""Separation of duties (issue 23, item 7), through the real API, pages and admin: an Operator
cannot approve their own reservation, order or power approval, nor change quotas; a Capacity
approver approves others'; an Admin's own approval is allowed and recorded as self-approved;
every approval records who asked and who approved, and only approved orders count as supply."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from compliance.models import AuditEntry
from console import roles
from fleet.capacity.read import supply
from fleet.models import Pool, PowerApproval, ProcurementOrder, Reservation, Site, TeamQuota
from tests.conftest import _client_for, _make_user
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, quota, reserve, team

pytestmark = pytest.mark.django_db

API = "/api/v1/capacity"


@pytest.fixture
def pool(site_a: Site) -> Pool:
    add_nodes(site_a, 2)
    team("alpha")  # teams are records an Admin adds
    return make_pool(site_a)


@pytest.fixture
def approver() -> User:
    return _make_user("cappy", roles.CAPACITY_APPROVER)


@pytest.fixture
def approver_client(approver: User) -> Client:
    return _client_for(approver)


@pytest.fixture
def other_operator_client() -> Client:
    return _client_for(_make_user("otto", roles.OPERATOR))


def _post(client: Client, path: str, body: Any = None) -> Any:
    return client.post(f"{API}/{path}", body or {}, content_type="application/json")


def _patch(client: Client, path: str, body: Any) -> Any:
    return client.patch(f"{API}/{path}", body, content_type="application/json")


def _order(pool: Pool, **extra: Any) -> dict[str, Any]:
    today = days_ahead(0).date()
    return {
        "pool": pool.pk,
        "count": 8,
        "ordered_on": str(today),
        "promised_on": str(today + timedelta(days=30)),
        **extra,
    }


def _power(site: Site, **extra: Any) -> dict[str, Any]:
    return {"site": site.name, "added_kw": "100000", "expected_on": str(days_ahead(30).date()), **extra}


def _reservation(pool: Pool) -> dict[str, Any]:
    start = days_ahead(1)
    return {
        "team": "alpha",
        "pool": pool.pk,
        "gpus": 8,
        "start": start.isoformat(),
        "end": (start + timedelta(days=2)).isoformat(),
    }


def _entries(obj: Any) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(model=obj._meta.model_name, object_id=str(obj.pk)).order_by("pk"))


# --- reservations ------------------------------------------------------------------------------


def test_an_operator_cannot_approve_their_own_reservation_but_another_operator_can(
    pool: Pool, operator_client: Client, other_operator_client: Client
) -> None:
    r = _post(operator_client, "reservations/", _reservation(pool)).json()
    own = _post(operator_client, f"reservations/{r['id']}/approve/")
    assert own.status_code == 403
    assert own.json()["rule"] == "separation-of-duties" and "someone else must approve" in own.json()["detail"]
    assert Reservation.objects.get(pk=r["id"]).state == "requested"

    ok = _post(other_operator_client, f"reservations/{r['id']}/approve/")
    assert ok.status_code == 200, ok.json()
    body = ok.json()
    assert (body["created_by"], body["approved_by"], body["self_approved"]) == ("oscar", "otto", False)
    assert body["approved_at"] is not None


def test_an_admin_approving_their_own_reservation_is_recorded_as_self_approved(
    pool: Pool, admin_client: Client
) -> None:
    r = _post(admin_client, "reservations/", _reservation(pool)).json()
    ok = _post(admin_client, f"reservations/{r['id']}/approve/")
    assert ok.status_code == 200 and ok.json()["self_approved"] is True and ok.json()["approved_by"] == "ada"
    reservation = Reservation.objects.get(pk=r["id"])
    approval = _entries(reservation)[-1]
    assert approval.after["self_approved"] is True and approval.before["self_approved"] is False
    assert "Self-approved by an Admin" in approval.message and approval.actor == "ada"


def test_the_reservations_page_refuses_approving_ones_own_with_403_naming_the_rule(
    pool: Pool, operator_client: Client
) -> None:
    r = _post(operator_client, "reservations/", _reservation(pool)).json()
    page = operator_client.post("/capacity/reservations/", {"action": "approve", "id": r["id"]})
    assert page.status_code == 403
    html = page.content.decode()
    assert "someone else must approve" in html and "separation-of-duties" in html
    assert Reservation.objects.get(pk=r["id"]).state == "requested"


def test_an_approver_cannot_change_someone_elses_requested_reservation_and_then_approve_it(
    pool: Pool, operator_client: Client, other_operator_client: Client
) -> None:
    r = _post(operator_client, "reservations/", _reservation(pool)).json()
    rewritten = _patch(other_operator_client, f"reservations/{r['id']}/", {"gpus": 16, "note": "mine now"})
    assert rewritten.status_code == 403, rewritten.json()
    assert rewritten.json()["rule"] == "separation-of-duties"
    assert "Only its requester or an Admin may change a reservation" in rewritten.json()["detail"]
    # Refused before the body is read: a bad body from a non-requester is still 403.
    assert _patch(other_operator_client, f"reservations/{r['id']}/", {"gpus": -1}).status_code == 403
    stored = Reservation.objects.get(pk=r["id"])
    assert (stored.gpus, stored.note) == (8, "")
    # What they approve is what the requester asked for.
    assert _post(other_operator_client, f"reservations/{r['id']}/approve/").json()["gpus"] == 8


def test_the_requester_changes_their_request_and_an_admin_anyones_recorded_as_such(
    pool: Pool, operator_client: Client, admin_client: Client
) -> None:
    r = _post(operator_client, "reservations/", _reservation(pool)).json()
    own = _patch(operator_client, f"reservations/{r['id']}/", {"gpus": 4})
    assert own.status_code == 200 and own.json()["gpus"] == 4
    reservation = Reservation.objects.get(pk=r["id"])
    entry = _entries(reservation)[-1]
    assert (entry.actor, entry.before["gpus"], entry.after["gpus"]) == ("oscar", 8, 4)
    assert "Admin" not in entry.message

    by_admin = _patch(admin_client, f"reservations/{r['id']}/", {"gpus": 6})
    assert by_admin.status_code == 200 and by_admin.json()["created_by"] == "oscar"
    entry = _entries(reservation)[-1]
    assert (entry.actor, entry.before["gpus"], entry.after["gpus"]) == ("ada", 4, 6)
    assert "Changed by an Admin, not its requester" in entry.message


def test_a_change_to_a_requested_reservation_is_checked_against_quota_as_a_new_request_is(
    pool: Pool, operator_client: Client
) -> None:
    quota(pool, "alpha", 8, 0)  # borrowing limit 0: alpha holds at most its nominal 8
    quota(pool, "beta", 8, 0)
    team("gamma")  # a team without quota on the pool
    later = days_ahead(10)
    reserve(pool, "alpha", 6, later, later + timedelta(days=2))
    r = _post(operator_client, "reservations/", _reservation(pool)).json()
    path = f"reservations/{r['id']}/"

    more = _patch(operator_client, path, {"gpus": 12})
    assert more.status_code == 409, more.json()
    assert more.json()["fits"] == 8 and "at most 8 more GPUs" in more.json()["gpus"]
    moved = _patch(operator_client, path, {"start": later.isoformat(), "end": (later + timedelta(days=1)).isoformat()})
    assert moved.status_code == 409 and moved.json()["fits"] == 2  # alpha holds 6 of its 8 then
    other_team = _patch(operator_client, path, {"team": "gamma"})
    assert other_team.status_code == 409 and "gamma has no quota" in other_team.json()["gpus"]
    stored = Reservation.objects.get(pk=r["id"])
    assert (stored.gpus, stored.start, stored.team_id) == (8, days_ahead(1), "alpha")  # nothing stored
    assert [e.message for e in _entries(stored)] == [""]  # only its creation

    fits = _patch(operator_client, path, {"team": "beta", "gpus": 7})
    assert fits.status_code == 200 and (fits.json()["team"], fits.json()["gpus"]) == ("beta", 7)


# --- orders --------------------------------------------------------------------------------------


def test_an_operators_order_is_requested_counts_as_no_supply_until_someone_else_approves_it(
    pool: Pool, operator_client: Client, approver_client: Client
) -> None:
    landing = days_ahead(31).date()
    created = _post(operator_client, "orders/", _order(pool))
    assert created.status_code == 201, created.json()
    order = created.json()
    assert (order["approval_status"], order["requested_by"], order["approved_by"]) == ("requested", "oscar", None)
    assert supply.supply_at(pool, landing)["installed"] == 16  # not counted while requested

    own = _post(operator_client, f"orders/{order['id']}/approve/")
    assert own.status_code == 403 and own.json()["rule"] == "approver-role"

    ok = _post(approver_client, f"orders/{order['id']}/approve/")
    assert ok.status_code == 200, ok.json()
    assert (ok.json()["approval_status"], ok.json()["approved_by"], ok.json()["self_approved"]) == (
        "approved",
        "cappy",
        False,
    )
    assert supply.supply_at(pool, landing)["installed"] == 24
    entry = _entries(ProcurementOrder.objects.get(pk=order["id"]))[-1]
    assert (entry.actor, entry.before["approval_status"], entry.after["approval_status"]) == (
        "cappy",
        "requested",
        "approved",
    )

    again = _post(approver_client, f"orders/{order['id']}/approve/")
    assert again.status_code == 409 and "approved" in again.json()["detail"]


def test_a_rejected_order_names_who_rejected_it_until_it_is_approved_again(
    pool: Pool, operator_client: Client, approver_client: Client, admin_client: Client
) -> None:
    order = _post(operator_client, "orders/", _order(pool)).json()
    rejected = _post(approver_client, f"orders/{order['id']}/reject/")
    assert rejected.status_code == 200, rejected.json()
    body = rejected.json()
    assert (body["approval_status"], body["rejected_by"], body["approved_by"]) == ("rejected", "cappy", None)
    assert body["rejected_at"] is not None
    stored = ProcurementOrder.objects.get(pk=order["id"])
    assert stored.rejected_by.username == "cappy"
    entry = _entries(stored)[-1]
    assert (entry.actor, entry.before["rejected_by"], entry.after["rejected_by"]) == (
        "cappy",
        None,
        stored.rejected_by_id,
    )

    assert "rejected by cappy" in approver_client.get("/capacity/").content.decode()  # the plan page says so

    approved = _post(admin_client, f"orders/{order['id']}/approve/").json()
    assert (approved["approval_status"], approved["approved_by"], approved["rejected_by"]) == ("approved", "ada", None)
    assert _entries(stored)[-1].before["rejected_by"] == stored.rejected_by_id  # the history stays in the log


def test_an_operator_cannot_create_an_order_already_approved(pool: Pool, operator_client: Client) -> None:
    response = _post(operator_client, "orders/", _order(pool, approval_status="approved"))
    assert response.status_code == 403 and response.json()["rule"] == "approver-role"
    assert not ProcurementOrder.objects.exists()  # nothing half-written


def test_a_capacity_approver_cannot_approve_their_own_order(
    pool: Pool, approver: User, approver_client: Client
) -> None:
    order = ProcurementOrder.objects.create(
        pool=pool,
        count=8,
        ordered_on=days_ahead(0).date(),
        promised_on=days_ahead(9).date(),
        requested_by=approver,
        approval_status="requested",
    )
    response = _post(approver_client, f"orders/{order.pk}/approve/")
    assert response.status_code == 403 and response.json()["rule"] == "separation-of-duties"
    order.refresh_from_db()
    assert order.approval_status == "requested" and order.approved_by is None


def test_an_admin_creates_an_order_approved_recorded_as_self_approved(pool: Pool, admin_client: Client) -> None:
    response = _post(admin_client, "orders/", _order(pool, approval_status="approved"))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["approval_status"], body["requested_by"], body["approved_by"], body["self_approved"]) == (
        "approved",
        "ada",
        "ada",
        True,
    )
    entry = _entries(ProcurementOrder.objects.get(pk=body["id"]))[-1]
    assert entry.after["self_approved"] is True and "self-approved" in entry.message


def test_an_approved_order_keeps_its_count_and_its_date_only_slips(
    pool: Pool, operator_client: Client, approver_client: Client
) -> None:
    order = _post(operator_client, "orders/", _order(pool)).json()
    assert _post(approver_client, f"orders/{order['id']}/approve/").status_code == 200
    more = _patch(operator_client, f"orders/{order['id']}/", {"count": 1000})
    assert more.status_code == 400 and "count" in more.json()
    sooner = _patch(operator_client, f"orders/{order['id']}/", {"promised_on": str(days_ahead(2).date())})
    assert sooner.status_code == 400 and "promised_on" in sooner.json()
    later = _patch(operator_client, f"orders/{order['id']}/", {"promised_on": str(days_ahead(60).date())})
    assert later.status_code == 200
    flip = _patch(operator_client, f"orders/{order['id']}/", {"approval_status": "requested"})
    assert flip.status_code == 400 and "approval_status" in flip.json()
    assert ProcurementOrder.objects.get(pk=order["id"]).count == 8


# --- power approvals ------------------------------------------------------------------------------


def test_an_operator_cannot_add_an_approved_100_mw_power_approval(site_a: Site, operator_client: Client) -> None:
    for status in ("approved", "energised"):
        response = _post(operator_client, "approvals/", _power(site_a, status=status))
        assert response.status_code == 403, response.json()
        assert response.json()["rule"] == "approver-role" and "Capacity approver" in response.json()["detail"]
    assert not PowerApproval.objects.exists()


def test_a_requested_power_approval_is_approved_by_someone_else_with_the_role(
    site_a: Site, operator_client: Client, other_operator_client: Client, approver_client: Client
) -> None:
    created = _post(operator_client, "approvals/", _power(site_a))
    assert created.status_code == 201 and created.json()["status"] == "requested"
    pk = created.json()["id"]
    assert created.json()["requested_by"] == "oscar"
    patched = _patch(operator_client, f"approvals/{pk}/", {"status": "approved"})
    assert patched.status_code == 400 and "status" in patched.json()
    # Another Operator lacks the approving permission.
    assert _post(other_operator_client, f"approvals/{pk}/approve/").status_code == 403
    ok = _post(approver_client, f"approvals/{pk}/approve/")
    assert ok.status_code == 200 and (ok.json()["status"], ok.json()["approved_by"]) == ("approved", "cappy")
    # approved -> energised is an edit (the grid connection went live), not an approval
    energised = _patch(operator_client, f"approvals/{pk}/", {"status": "energised"})
    assert energised.status_code == 200 and energised.json()["approved_by"] == "cappy"
    bigger = _patch(operator_client, f"approvals/{pk}/", {"added_kw": "200000"})
    assert bigger.status_code == 400 and "added_kw" in bigger.json()
    rejected = _post(approver_client, f"approvals/{pk}/reject/")
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    assert (rejected.json()["approved_by"], rejected.json()["rejected_by"]) == (None, "cappy")
    assert rejected.json()["rejected_at"] is not None
    cappy = User.objects.get(username="cappy").pk
    entry = _entries(PowerApproval.objects.get(pk=pk))[-1]
    assert (entry.before["approved_by"], entry.before["rejected_by"]) == (cappy, None)
    assert (entry.after["approved_by"], entry.after["rejected_by"]) == (None, cappy)
    messages = [e.message for e in _entries(PowerApproval.objects.get(pk=pk))]
    assert "Approved." in messages and "Rejected." in messages


def test_an_admin_adds_an_approved_power_approval_recorded_as_self_approved(site_a: Site, admin_client: Client) -> None:
    response = _post(admin_client, "approvals/", _power(site_a, status="approved"))
    assert response.status_code == 201, response.json()
    assert (response.json()["approved_by"], response.json()["self_approved"]) == ("ada", True)


# --- quotas --------------------------------------------------------------------------------------


def test_an_operator_cannot_raise_a_quota_to_a_million(
    pool: Pool, operator_client: Client, approver_client: Client
) -> None:
    body = {"team": "alpha", "pool": pool.pk, "nominal_gpus": 1_000_000}
    assert _post(operator_client, "quotas/", body).status_code == 403
    created = _post(approver_client, "quotas/", {**body, "nominal_gpus": 8})
    assert created.status_code == 201
    raised = _patch(operator_client, f"quotas/{created.json()['id']}/", {"nominal_gpus": 1_000_000})
    assert raised.status_code == 403
    assert TeamQuota.objects.get().nominal_gpus == 8
    assert _patch(approver_client, f"quotas/{created.json()['id']}/", {"nominal_gpus": 12}).status_code == 200
    entry = _entries(TeamQuota.objects.get())[-1]
    assert (entry.actor, entry.before["nominal_gpus"], entry.after["nominal_gpus"]) == ("cappy", 8, 12)


def test_quotas_in_the_admin_need_the_approving_permission(pool: Pool, admin_client: Client) -> None:
    operator = _make_user("staffop", roles.OPERATOR, is_staff=True)
    # The model permissions alone, granted by hand: the rule wants fleet.approve_capacity too.
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["change_teamquota", "add_teamquota"]))
    quota = TeamQuota.objects.create(team=team("alpha"), pool=pool, nominal_gpus=8)
    staff_op = _client_for(operator)
    response = staff_op.post(
        f"/admin/fleet/teamquota/{quota.pk}/change/",
        {"team": "alpha", "pool": pool.pk, "nominal_gpus": 1_000_000, "borrowing_limit_gpus": 0},
    )
    assert response.status_code == 403
    assert TeamQuota.objects.get().nominal_gpus == 8
    ok = admin_client.post(
        f"/admin/fleet/teamquota/{quota.pk}/change/",
        {"team": "alpha", "pool": pool.pk, "nominal_gpus": 10, "borrowing_limit_gpus": 0},
    )
    assert ok.status_code == 302 and TeamQuota.objects.get().nominal_gpus == 10


def test_the_admin_approve_action_refuses_a_capacity_approvers_own_request(
    pool: Pool, admin_user: User, admin_client: Client
) -> None:
    order = ProcurementOrder.objects.create(
        pool=pool,
        count=8,
        ordered_on=days_ahead(0).date(),
        promised_on=days_ahead(9).date(),
        approval_status="requested",
    )
    added = admin_client.post(
        "/admin/fleet/procurementorder/add/",
        {
            "pool": pool.pk,
            "count": 4,
            "ordered_on": str(days_ahead(0).date()),
            "promised_on": str(days_ahead(5).date()),
            "status": "ordered",
        },
    )
    assert added.status_code == 302
    mine = ProcurementOrder.objects.exclude(pk=order.pk).get()
    assert (mine.approval_status, mine.requested_by) == ("requested", admin_user)
    admin_client.post(
        "/admin/fleet/procurementorder/",
        {"action": "approve_selected", "_selected_action": [order.pk, mine.pk]},
    )
    order.refresh_from_db()
    mine.refresh_from_db()
    assert (order.approval_status, order.approved_by, order.self_approved) == ("approved", admin_user, False)
    assert (mine.approval_status, mine.self_approved) == ("approved", True)  # an Admin's own: recorded


def test_orders_made_in_code_count_as_before(pool: Pool) -> None:
    """The model's default (approved) keeps the simulator, imports and tests' orders as supply."""
    ProcurementOrder.objects.create(
        pool=pool, count=8, ordered_on=days_ahead(0).date(), promised_on=days_ahead(5).date()
    )
    assert supply.supply_at(pool, days_ahead(6).date())["installed"] == 24


# --- the plan page ----------------------------------------------------------------------------------


def test_the_plan_page_approves_others_orders_and_refuses_ones_own_naming_the_rule(
    pool: Pool, operator_client: Client, approver: User, approver_client: Client
) -> None:
    theirs = _post(operator_client, "orders/", _order(pool)).json()
    power = _post(operator_client, "approvals/", _power(pool.site)).json()
    mine = ProcurementOrder.objects.create(
        pool=pool,
        count=4,
        ordered_on=days_ahead(0).date(),
        promised_on=days_ahead(9).date(),
        requested_by=approver,
        approval_status="requested",
    )
    html = approver_client.get("/capacity/").content.decode()
    assert f'data-order="{theirs["id"]}"' in html and 'data-action="approve"' in html and "by oscar" in html
    assert 'data-action="approve"' not in operator_client.get("/capacity/").content.decode()  # no buttons

    refused = operator_client.post("/capacity/", {"action": "approve-order", "id": theirs["id"]})
    assert refused.status_code == 403
    own = approver_client.post("/capacity/", {"action": "approve-order", "id": mine.pk})
    assert own.status_code == 403 and "separation-of-duties" in own.content.decode()
    assert approver_client.post("/capacity/", {"action": "approve-order", "id": theirs["id"]}).status_code == 302
    assert approver_client.post("/capacity/", {"action": "approve-power", "id": power["id"]}).status_code == 302
    again = approver_client.post("/capacity/", {"action": "approve-power", "id": power["id"]})
    assert again.status_code == 409
    assert ProcurementOrder.objects.get(pk=theirs["id"]).approved_by == approver
    assert PowerApproval.objects.get(pk=power["id"]).status == "approved"
    assert ProcurementOrder.objects.get(pk=mine.pk).approval_status == "requested"
    assert "approved by cappy" in approver_client.get("/capacity/").content.decode()
