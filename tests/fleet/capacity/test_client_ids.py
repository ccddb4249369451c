"""A reservation's client_id (the scheduler's idempotency key) is the sender's: unique within its
agent token's site, or the person who sent it. Another sender's id is out of reach and cannot be
squatted; a repeat with the same fields returns the first, one with other fields is a 409 naming
them; a blank id is a 400 (create and PATCH)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from console.models import AgentToken
from fleet.models import Pool, Reservation, Site
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, team

pytestmark = pytest.mark.django_db

URL = "/api/v1/capacity/reservations/"


@pytest.fixture
def pools(site_a: Site, site_b: Site) -> tuple[Pool, Pool]:
    add_nodes(site_a, 1)
    add_nodes(site_b, 1)
    team("alpha"), team("beta")  # teams are records an Admin adds
    return make_pool(site_a), make_pool(site_b)


def _body(pool: Pool, **overrides: Any) -> dict[str, Any]:
    return {
        "team": "alpha",
        "pool": pool.pk,
        "gpus": 4,
        "start": days_ahead(1).isoformat(),
        "end": days_ahead(3).isoformat(),
        **overrides,
    }


def _as_token(client: Client, token: str, body: dict[str, Any]) -> Any:
    return client.post(URL, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_another_sites_token_neither_reaches_nor_squats_a_client_id(client, pools, token_a, token_b) -> None:
    pool_a, pool_b = pools
    first = _as_token(client, token_b, _body(pool_b, client_id="job-42", note="B's secret plan"))
    assert first.status_code == 201
    # Site A sends B's id: its own new reservation, not B's back (nor B's note).
    other = _as_token(client, token_a, _body(pool_a, client_id="job-42"))
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert "secret" not in other.content.decode()
    # A squatting an id first leaves B's later request intact.
    squat = _as_token(client, token_a, _body(pool_a, client_id="job-43"))
    later = _as_token(client, token_b, _body(pool_b, client_id="job-43"))
    assert later.status_code == 201 and later.json()["id"] != squat.json()["id"]
    assert later.json()["pool"] == pool_b.pk
    assert Reservation.objects.filter(client_id="job-43").count() == 2


def test_two_tokens_of_one_site_share_its_ids(client, pools, site_a, token_a) -> None:
    pool_a, _ = pools
    second_token = AgentToken.issue(site=site_a, name="agent-a2")[1]
    first = _as_token(client, token_a, _body(pool_a, client_id="job-1"))
    again = _as_token(client, second_token, _body(pool_a, client_id="job-1"))
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["id"] == first.json()["id"]


def test_people_have_ids_of_their_own(pools, operator_client, admin_client) -> None:
    pool_a, _ = pools
    mine = operator_client.post(URL, _body(pool_a, client_id="r1"), content_type="application/json")
    theirs = admin_client.post(URL, _body(pool_a, client_id="r1", gpus=2), content_type="application/json")
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert theirs.json()["gpus"] == 2 and theirs.json()["created_by"] == "ada"


def test_a_repeat_with_other_fields_is_a_409_naming_them(client, pools, token_a) -> None:
    pool_a, _ = pools
    first = _as_token(client, token_a, _body(pool_a, client_id="job-7"))
    same = _as_token(client, token_a, _body(pool_a, client_id="job-7"))
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    changed = _as_token(client, token_a, _body(pool_a, client_id="job-7", gpus=5, team="beta"))
    assert changed.status_code == 409
    assert changed.json()["fields"] == ["team", "gpus"] and changed.json()["client_id"] == "job-7"
    assert "team, gpus differ" in changed.json()["detail"]
    assert Reservation.objects.get().gpus == 4


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_client_id_is_a_400_on_create_and_patch(pools, operator_client, blank) -> None:
    pool_a, _ = pools
    response = operator_client.post(URL, _body(pool_a, client_id=blank), content_type="application/json")
    assert response.status_code == 400 and "client_id" in response.json()
    assert not Reservation.objects.exists()
    created = operator_client.post(URL, _body(pool_a, client_id="ok"), content_type="application/json").json()
    patch = operator_client.patch(f"{URL}{created['id']}/", {"client_id": blank}, content_type="application/json")
    assert patch.status_code == 400 and "client_id" in patch.json()
    assert Reservation.objects.get().client_id == "ok"


def test_patching_to_an_id_the_sender_already_uses_is_a_400(pools, operator_client) -> None:
    pool_a, _ = pools
    operator_client.post(URL, _body(pool_a, client_id="one"), content_type="application/json")
    two = operator_client.post(URL, _body(pool_a, client_id="two"), content_type="application/json").json()
    patch = operator_client.patch(f"{URL}{two['id']}/", {"client_id": "one"}, content_type="application/json")
    assert patch.status_code == 400 and "client_id" in patch.json()
    assert sorted(Reservation.objects.values_list("client_id", flat=True)) == ["one", "two"]
