"""The capacity API: figures, writes by role, bad input (400 naming the field, nothing written),
agent tokens (their own site's pools only), approve/cancel with 409, audit and CSV."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from fleet.models import Pool, PowerApproval, ProcurementOrder, Reservation, Site
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, reserve, team

pytestmark = pytest.mark.django_db

API = "/api/v1/capacity"


@pytest.fixture
def pool(site_a: Site) -> Pool:
    add_nodes(site_a, 2)
    team("alpha")  # the requests' team: teams are records an Admin adds
    return make_pool(site_a)


def _body(target: Pool, **overrides: Any) -> dict[str, Any]:
    body = {
        "team": "alpha",
        "pool": target.pk,
        "gpus": 8,
        "start": days_ahead(1).isoformat(),
        "end": days_ahead(3).isoformat(),
        "tier": "reserved",
        "priority": 2,
    }
    return {**body, **overrides}


def _post(client: Client, path: str, body: Any, **headers: str) -> Any:
    return client.post(f"{API}/{path}", body, content_type="application/json", **headers)


def test_pools_show_their_figures(pool: Pool, viewer_client: Client) -> None:
    reserve(pool, "alpha", 6, days_ahead(-1), days_ahead(1), state="active")
    [row] = viewer_client.get(f"{API}/pools/").json()["results"]
    assert {k: row[k] for k in ("installed", "energised", "healthy", "reserved", "available")} == {
        "installed": 16,
        "energised": 16,
        "healthy": 16,
        "reserved": 6,
        "available": 10,
    }
    assert viewer_client.get(f"{API}/pools/{pool.pk}/").json()["available"] == 10


def test_an_operator_requests_a_reservation_with_an_audit_entry(pool: Pool, operator_client: Client) -> None:
    response = _post(operator_client, "reservations/", _body(pool, client_id="req-1"))
    assert response.status_code == 201, response.json()
    assert response.json()["state"] == "requested" and response.json()["created_by"] == "oscar"
    reservation = Reservation.objects.get()
    assert LogEntry.objects.get(object_id=str(reservation.pk)).change_message.startswith("Requested 8 GPUs")
    # The same request again: the first reservation back, nothing new.
    again = _post(operator_client, "reservations/", _body(pool, client_id="req-1"))
    assert again.status_code == 200 and again.json()["id"] == reservation.pk and again.json()["gpus"] == 8
    assert Reservation.objects.count() == 1


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"end": days_ahead(0).isoformat()}, "end"),  # before start
        ({"end": days_ahead(1).isoformat()}, "end"),  # equal to start
        ({"gpus": 0}, "gpus"),
        ({"gpus": -4}, "gpus"),
        ({"pool": 999999}, "pool"),
        ({"tier": "platinum"}, "tier"),
        ({"start": "tomorrow"}, "start"),
        ({"team": "nobody"}, "team"),  # no such team
    ],
)
def test_bad_reservations_are_400_naming_the_field_and_write_nothing(
    pool: Pool, operator_client: Client, overrides: dict[str, Any], field: str
) -> None:
    response = _post(operator_client, "reservations/", _body(pool, **overrides))
    assert response.status_code == 400
    assert field in response.json()
    assert not Reservation.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("orders/", {"count": 0, "ordered_on": "2026-01-01", "promised_on": "2026-09-01"}, "count"),
        ("orders/", {"count": -3, "ordered_on": "2026-01-01", "promised_on": "2026-09-01"}, "count"),
        ("orders/", {"count": 8, "ordered_on": "2026-01-01", "promised_on": "2025-09-01"}, "promised_on"),
        ("approvals/", {"added_kw": "0", "expected_on": "2027-01-01"}, "added_kw"),
        ("approvals/", {"added_kw": "-5", "expected_on": "2027-01-01"}, "added_kw"),
    ],
)
def test_bad_supply_records_are_400_naming_the_field(
    pool: Pool, operator_client: Client, path: str, body: dict[str, Any], field: str
) -> None:
    body = {**body, "pool": pool.pk, "site": pool.site.name}
    response = _post(operator_client, path, body)
    assert response.status_code == 400 and field in response.json()
    assert not ProcurementOrder.objects.exists() and not PowerApproval.objects.exists()


def test_an_order_shows_its_lead_time_and_lateness(pool: Pool, operator_client: Client) -> None:
    body = {"pool": pool.pk, "count": 8, "ordered_on": "2025-01-01", "promised_on": "2025-10-01", "vendor": "X"}
    response = _post(operator_client, "orders/", body)
    assert response.status_code == 201
    assert response.json()["lead_time_days"] == 273 and response.json()["late"] is True


def test_a_viewer_cannot_write(pool: Pool, viewer_client: Client) -> None:
    assert _post(viewer_client, "reservations/", _body(pool)).status_code == 403
    r = reserve(pool, "alpha", 1, days_ahead(1), days_ahead(2), state="requested")
    assert _post(viewer_client, f"reservations/{r.pk}/approve/", {}).status_code == 403
    assert Reservation.objects.get().state == "requested"


def test_an_agent_token_requests_on_its_own_sites_pool(pool: Pool, token_a: str, anon_client: Client) -> None:
    response = _post(anon_client, "reservations/", _body(pool), HTTP_AUTHORIZATION=f"Bearer {token_a}")
    assert response.status_code == 201
    assert response.json()["requested_via"] == "agent:agent-a" and response.json()["created_by"] is None


def test_an_agent_token_of_another_site_is_403_naming_the_pool(pool: Pool, token_b: str, anon_client: Client) -> None:
    response = _post(anon_client, "reservations/", _body(pool), HTTP_AUTHORIZATION=f"Bearer {token_b}")
    assert response.status_code == 403 and "pool" in response.json()
    assert not Reservation.objects.exists()


def test_an_agent_token_reads_and_approves_nothing(pool: Pool, token_a: str, anon_client: Client) -> None:
    r = reserve(pool, "alpha", 1, days_ahead(1), days_ahead(2), state="requested")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token_a}"}
    assert anon_client.get(f"{API}/reservations/", **auth).status_code == 403
    assert _post(anon_client, f"reservations/{r.pk}/approve/", {}, **auth).status_code == 403
    assert _post(anon_client, "orders/", {}, **auth).status_code == 403


def test_approve_and_cancel_over_the_api(pool: Pool, operator_client: Client, operator_user: Any) -> None:
    reserve(pool, "beta", 10, days_ahead(1), days_ahead(4))
    fits = reserve(pool, "alpha", 6, days_ahead(2), days_ahead(3), state="requested")
    over = reserve(pool, "gamma", 1, days_ahead(2), days_ahead(6), state="requested")
    ok = _post(operator_client, f"reservations/{fits.pk}/approve/", {})
    assert ok.status_code == 200 and ok.json()["state"] == "approved" and ok.json()["approved_by"] == "oscar"
    refused = _post(operator_client, f"reservations/{over.pk}/approve/", {})
    assert refused.status_code == 409
    assert refused.json()["conflict"] == {
        "start": days_ahead(2).isoformat(),
        "end": days_ahead(3).isoformat(),
        "teams": ["alpha", "beta", "gamma"],
        "demand": 17,
        "supply": 16,
    }
    cancelled = _post(operator_client, f"reservations/{fits.pk}/cancel/", {})
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert _post(operator_client, f"reservations/{fits.pk}/cancel/", {}).status_code == 409
    messages = list(LogEntry.objects.filter(object_id=str(fits.pk)).values_list("change_message", flat=True))
    assert any(m.startswith("Approved") for m in messages) and "Cancelled." in messages
    # Cancelled capacity is free again.
    assert _post(operator_client, f"reservations/{over.pk}/approve/", {}).status_code == 200


def test_an_active_reservation_keeps_its_window_and_its_requester_changes_its_note(
    pool: Pool, operator_client: Client, operator_user: Any
) -> None:
    r = reserve(pool, "alpha", 2, days_ahead(-1), days_ahead(2), state="active", created_by=operator_user)
    response = operator_client.patch(f"{API}/reservations/{r.pk}/", {"gpus": 12}, content_type="application/json")
    assert response.status_code == 400 and "gpus" in response.json()
    ok = operator_client.patch(f"{API}/reservations/{r.pk}/", {"note": "all hands"}, content_type="application/json")
    assert ok.status_code == 200 and ok.json()["state"] == "active"
    assert (Reservation.objects.get().gpus, Reservation.objects.get().note) == (2, "all hands")


def test_reservations_csv(pool: Pool, viewer_client: Client) -> None:
    reserve(pool, "alpha", 2, days_ahead(1), days_ahead(2), tier="on-demand")
    response = viewer_client.get(f"{API}/reservations.csv")
    assert response.status_code == 200
    [row] = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert (row["team"], row["site"], row["pool"], row["gpus"], row["tier"], row["state"]) == (
        "alpha",
        "ams-1",
        "h100",
        "2",
        "on-demand",
        "approved",
    )
