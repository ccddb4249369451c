"""Who changes a reservation, and what a change after approval does (issue 37, item 8), through
the real API and page: only its requester or an Admin changes it, in any state (an Operator who is
not the requester gets 403 on both doors, a Viewer too); once approved, a change of what it asks
for (priority, tier, GPUs, window, pool) sends it back to requested with an audit entry, to be
approved again; its note alone changes without that; once active, what it asks for is fixed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client

from compliance.models import AuditEntry
from console import roles
from fleet.capacity.actions import reservations
from fleet.capacity.actions.approvals import ConflictError
from fleet.models import Pool, Reservation, ReservationState, Site
from tests.conftest import _client_for, _make_user
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, quota, reserve, team

pytestmark = pytest.mark.django_db

API = "/api/v1/capacity/reservations"
PAGE = "/capacity/reservations/"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def pool(site_a: Site) -> Pool:
    add_nodes(site_a, 2)
    add_nodes(site_a, 1, model=A100, prefix="a")
    team("alpha")
    make_pool(site_a, model=A100, name="a100")
    return make_pool(site_a)


@pytest.fixture
def other_operator() -> User:
    return _make_user("otto", roles.OPERATOR)


@pytest.fixture
def other_operator_client(other_operator: User) -> Client:
    return _client_for(other_operator)


@pytest.fixture
def approved(pool: Pool, operator_client: Client, other_operator_client: Client) -> Reservation:
    """Oscar's request for 8 GPUs, approved by Otto."""
    start = days_ahead(1)
    body = {
        "team": "alpha",
        "pool": pool.pk,
        "gpus": 8,
        "start": start.isoformat(),
        "end": (start + timedelta(days=2)).isoformat(),
    }
    created = operator_client.post(f"{API}/", body, content_type="application/json")
    assert created.status_code == 201, created.json()
    pk = created.json()["id"]
    assert other_operator_client.post(f"{API}/{pk}/approve/").status_code == 200
    return Reservation.objects.get(pk=pk)


def _patch(client: Client, reservation: Reservation, body: dict[str, Any]) -> Any:
    return client.patch(f"{API}/{reservation.pk}/", body, content_type="application/json")


def _page_form(reservation: Reservation, **changes: Any) -> dict[str, Any]:
    """The page's change form for ``reservation`` as a browser posts it, with ``changes``."""
    body = {
        "action": "change",
        "id": reservation.pk,
        "team": reservation.team_id,
        "pool": reservation.pool_id,
        "gpus": reservation.gpus,
        "start": reservation.start.strftime("%Y-%m-%dT%H:%M"),
        "end": reservation.end.strftime("%Y-%m-%dT%H:%M"),
        "tier": reservation.tier,
        "priority": reservation.priority,
        "note": reservation.note,
    }
    return {**body, **changes}


def _entries(reservation: Reservation) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(model="reservation", object_id=str(reservation.pk)).order_by("pk"))


def _unchanged(reservation: Reservation) -> None:
    stored = Reservation.objects.get(pk=reservation.pk)
    assert (stored.state, stored.priority, stored.note, stored.approved_by_id) == (
        ReservationState.APPROVED,
        0,
        "",
        reservation.approved_by_id,
    )


# --- who may change it ---------------------------------------------------------------------------


@pytest.mark.parametrize("body", [{"priority": 1000}, {"note": "ours now"}, {"priority": 1000, "note": "x"}])
def test_an_operator_who_is_not_the_requester_cannot_change_an_approved_reservation_over_the_api(
    approved: Reservation, other_operator_client: Client, body: dict[str, Any]
) -> None:
    """The finding as reported: Otto (who approved it) reorders Oscar's approved reservation."""
    response = _patch(other_operator_client, approved, body)
    assert response.status_code == 403, response.json()
    assert response.json()["rule"] == "separation-of-duties"
    assert "Only its requester or an Admin may change a reservation" in response.json()["detail"]
    _unchanged(approved)


def test_an_operator_who_is_not_the_requester_cannot_change_it_on_the_page(
    approved: Reservation, other_operator_client: Client
) -> None:
    response = other_operator_client.post(PAGE, _page_form(approved, priority=1000, note="ours now"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "Not changed" in html and "separation-of-duties" in html
    _unchanged(approved)
    # Nor is the form offered to them.
    listing = other_operator_client.get(f"{PAGE}?change={approved.pk}").content.decode()
    assert 'id="reservation-change-form"' not in listing and 'data-action="change"' not in listing


def test_a_viewer_cannot_change_it_on_either_door(approved: Reservation, viewer_client: Client) -> None:
    assert _patch(viewer_client, approved, {"note": "x"}).status_code == 403
    assert viewer_client.post(PAGE, _page_form(approved, note="x")).status_code == 403
    _unchanged(approved)


# --- what a change after approval does -----------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"priority": 5},
        {"tier": "preemptible"},
        {"gpus": 4},
        {"end": "4 days ahead"},
        {"pool": "a100"},
    ],
    ids=["priority", "tier", "size", "window", "pool"],
)
def test_the_requesters_change_after_approval_sends_it_back_to_requested_and_is_audited(
    approved: Reservation, operator_client: Client, other_operator_client: Client, change: dict[str, Any]
) -> None:
    if change.get("pool") == "a100":
        change = {"pool": Pool.objects.get(name="a100").pk}
    if "end" in change:  # from the day it runs, as the reservation's: a run across midnight collects the day before
        change = {"end": days_ahead(4).isoformat()}
    response = _patch(operator_client, approved, change)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["state"], body["approved_by"], body["approved_at"], body["created_by"]) == (
        "requested",
        None,
        None,
        "oscar",
    )
    [field] = change
    entry = _entries(approved)[-1]
    assert entry.actor == "oscar"
    assert (entry.before["state"], entry.after["state"]) == ("approved", "requested")
    assert entry.before["approved_by"] == approved.approved_by_id and entry.after["approved_by"] is None
    assert field in entry.before and field in entry.after
    assert f"Changed {field}." in entry.message and "Back to requested (it was approved by otto)" in entry.message
    assert LogEntry.objects.filter(object_id=str(approved.pk), change_message=entry.message).exists()
    # What it asks for now is approved again by someone else, as any request is.
    again = other_operator_client.post(f"{API}/{approved.pk}/approve/")
    assert again.status_code == 200 and again.json()["state"] == "approved"


def test_the_requesters_note_alone_keeps_it_approved_and_is_audited(
    approved: Reservation, operator_client: Client
) -> None:
    response = _patch(operator_client, approved, {"note": "training run 7"})
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["approved_by"]) == ("approved", "otto")
    entry = _entries(approved)[-1]
    assert (entry.actor, entry.before["note"], entry.after["note"]) == ("oscar", "", "training run 7")
    assert entry.before["state"] == entry.after["state"] == "approved"
    assert entry.message == "Changed note."


def test_an_admin_may_change_anyones_and_it_is_recorded_as_such(approved: Reservation, admin_client: Client) -> None:
    response = _patch(admin_client, approved, {"priority": 3, "note": "moved up"})
    assert response.status_code == 200 and response.json()["state"] == "requested"
    entry = _entries(approved)[-1]
    assert entry.actor == "ada" and "Changed by an Admin, not its requester" in entry.message


def test_a_change_the_quota_refuses_leaves_it_approved(
    pool: Pool, approved: Reservation, operator_client: Client
) -> None:
    quota(pool, "alpha", 8, 0)  # alpha holds at most its nominal 8, and holds them now
    response = _patch(operator_client, approved, {"gpus": 12})
    assert response.status_code == 409 and "gpus" in response.json()
    stored = Reservation.objects.get(pk=approved.pk)
    assert (stored.state, stored.gpus) == (ReservationState.APPROVED, 8)


def test_the_requester_changes_it_on_the_page_and_it_goes_back_to_requested(
    approved: Reservation, operator_client: Client
) -> None:
    page = operator_client.get(f"{PAGE}?change={approved.pk}").content.decode()
    assert 'id="reservation-change-form"' in page and f'href="?change={approved.pk}#change"' in page
    response = operator_client.post(PAGE, _page_form(approved, priority=5, note="urgent"), follow=True)
    assert response.status_code == 200
    assert "requested again, to be approved anew" in response.content.decode()
    stored = Reservation.objects.get(pk=approved.pk)
    assert (stored.state, stored.priority, stored.note, stored.approved_by) == ("requested", 5, "urgent", None)
    assert "Back to requested" in _entries(approved)[-1].message


def test_the_requesters_note_on_the_page_keeps_it_approved(approved: Reservation, operator_client: Client) -> None:
    assert operator_client.post(PAGE, _page_form(approved, note="urgent")).status_code == 302
    stored = Reservation.objects.get(pk=approved.pk)
    assert (stored.state, stored.note) == (ReservationState.APPROVED, "urgent")


# --- once active -----------------------------------------------------------------------------------


@pytest.fixture
def active(pool: Pool, operator_user: User) -> Reservation:
    return reserve(pool, "alpha", 2, days_ahead(-1), days_ahead(2), state="active", created_by=operator_user)


def test_once_active_what_it_asks_for_is_fixed_on_every_door(
    active: Reservation, operator_client: Client, operator_user: User
) -> None:
    api = _patch(operator_client, active, {"priority": 9})
    assert api.status_code == 400 and "priority" in api.json()
    page = operator_client.post(PAGE, _page_form(active, priority=9))
    assert page.status_code == 409 and 'data-error-for="priority"' in page.content.decode()
    with pytest.raises(ConflictError) as refused:  # the service, should a door miss it
        reservations.update_reservation(active, actor=operator_user, changes={"priority": 9})
    assert "priority" in refused.value.detail
    stored = Reservation.objects.get(pk=active.pk)
    assert (stored.state, stored.priority) == (ReservationState.ACTIVE, 0)
