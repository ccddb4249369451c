"""Two operators approving conflicting reservations at the same moment, on two real database
connections: the pool row lock serialises them, so one wins and the other gets 409."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from fleet.models import Reservation, Site
from tests.conftest import _make_user
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, reserve, team

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_conflicting_approvals_at_once_one_wins_the_other_gets_409(site_a: Site) -> None:
    add_nodes(site_a, 2)  # 16 GPUs: either reservation fits alone, not both
    pool = make_pool(site_a)
    first = reserve(pool, "alpha", 10, days_ahead(1), days_ahead(5), state="requested")
    second = reserve(pool, "beta", 10, days_ahead(3), days_ahead(7), state="requested")
    operators = [_make_user("oscar", "Operator"), _make_user("olga", "Operator")]
    barrier = threading.Barrier(2)
    results: dict[int, Any] = {}

    def approve(i: int, reservation_id: int) -> None:
        client = Client()
        client.force_login(operators[i])
        try:
            barrier.wait(timeout=10)
            response = client.post(f"/api/v1/capacity/reservations/{reservation_id}/approve/")
            results[i] = (response.status_code, response.json())
        finally:
            connection.close()  # this thread's own connection

    threads = [
        threading.Thread(target=approve, args=(0, first.pk)),
        threading.Thread(target=approve, args=(1, second.pk)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(code for code, _ in results.values()) == [200, 409]
    loser = next(body for code, body in results.values() if code == 409)
    assert loser["conflict"]["start"] == days_ahead(3).isoformat()
    assert loser["conflict"]["end"] == days_ahead(5).isoformat()
    assert loser["conflict"]["teams"] == ["alpha", "beta"]
    assert Reservation.objects.filter(state="approved").count() == 1
    assert Reservation.objects.filter(state="requested").count() == 1


def test_twin_creates_with_one_client_id_store_one_reservation(site_a: Site) -> None:
    """A scheduler retrying at once: the (scope, client_id) unique index decides, the loser reads
    the winner's row (fleet.capacity.actions.reservations.create_reservation), and every answer
    names the same reservation."""
    from console.models import AgentToken

    add_nodes(site_a, 1)
    pool = make_pool(site_a)
    token = AgentToken.issue(site=site_a, name="scheduler")[1]
    team("alpha")
    body = {"team": "alpha", "pool": pool.pk, "gpus": 2, "client_id": "twin", "start": days_ahead(1).isoformat()}
    body["end"] = days_ahead(2).isoformat()
    barrier = threading.Barrier(4)
    results: dict[int, Any] = {}

    def create(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            response = Client().post(
                "/api/v1/capacity/reservations/",
                body,
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {token}",
            )
            results[i] = (response.status_code, response.json()["id"])
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(code for code, _ in results.values()) == [200, 200, 200, 201]
    assert len({pk for _, pk in results.values()}) == 1 and Reservation.objects.count() == 1
