"""Teams as records: quotas name an existing team, Kueue's limits are validated at the edge, and an
Admin keeps teams with their members (and quotas) in the admin."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from fleet.models import Pool, Site, Team, TeamQuota
from tests.fleet.capacity import add_nodes, make_pool, team

pytestmark = pytest.mark.django_db

QUOTAS = "/api/v1/capacity/quotas/"


@pytest.fixture
def pool(site_a: Site) -> Pool:
    add_nodes(site_a, 2)
    team("alpha")
    return make_pool(site_a)


def _post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(QUOTAS, body, content_type="application/json")


def test_a_quota_without_limits_borrows_and_lends_without_limit(pool: Pool, admin_client: Client) -> None:
    response = _post(admin_client, {"team": "alpha", "pool": pool.pk, "nominal_gpus": 8})
    assert response.status_code == 201, response.json()
    assert (response.json()["borrowing_limit_gpus"], response.json()["lending_limit_gpus"]) == (None, None)
    assert TeamQuota.objects.get().team_id == "alpha"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"team": "nobody", "nominal_gpus": 8}, "team"),  # teams are records
        ({"team": "alpha", "nominal_gpus": 8, "lending_limit_gpus": 9}, "lending_limit_gpus"),  # Kueue: <= nominal
        ({"team": "alpha", "nominal_gpus": -1}, "nominal_gpus"),
        ({"team": "alpha", "nominal_gpus": 8, "borrowing_limit_gpus": -2}, "borrowing_limit_gpus"),
    ],
)
def test_bad_quotas_are_400_naming_the_field_and_write_nothing(
    pool: Pool, admin_client: Client, body: dict[str, Any], field: str
) -> None:
    response = _post(admin_client, {"pool": pool.pk, **body})
    assert response.status_code == 400 and field in response.json(), response.json()
    assert not TeamQuota.objects.exists()


def test_an_admin_adds_a_team_with_members_and_a_quota(pool: Pool, admin_client: Client, operator_user: User) -> None:
    form = {
        "name": "beta",
        "members": [operator_user.pk],
        "quotas-TOTAL_FORMS": "1",
        "quotas-INITIAL_FORMS": "0",
        "quotas-0-pool": pool.pk,
        "quotas-0-nominal_gpus": "6",
        "quotas-0-borrowing_limit_gpus": "",
        "quotas-0-lending_limit_gpus": "2",
    }
    assert admin_client.get("/admin/fleet/team/add/").status_code == 200
    response = admin_client.post("/admin/fleet/team/add/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    beta = Team.objects.get(name="beta")
    assert list(beta.members.all()) == [operator_user]
    q = TeamQuota.objects.get(team=beta)
    assert (q.pool, q.nominal_gpus, q.borrowing_limit_gpus, q.lending_limit_gpus) == (pool, 6, None, 2)
    assert "beta" in admin_client.get("/admin/fleet/team/").content.decode()


def test_a_team_in_use_cannot_be_deleted(pool: Pool) -> None:
    from django.db.models import ProtectedError

    TeamQuota.objects.create(team=Team.objects.get(name="alpha"), pool=pool, nominal_gpus=1)
    with pytest.raises(ProtectedError):
        Team.objects.get(name="alpha").delete()
