"""Who sets prices: Admins and capacity approvers, through /api/v1/cost/prices/ (and Admins in the
admin); every role reads them. A refused price names its field and writes nothing; a saved one is
audited with its author."""

from __future__ import annotations

import pytest

from compliance.models import AuditEntry
from console import roles
from fleet.models import Pool, PoolPrice
from tests.conftest import _client_for, _make_user

pytestmark = pytest.mark.django_db

URL = "/api/v1/cost/prices/"


@pytest.fixture
def approver_client():
    return _client_for(_make_user("cappy", roles.CAPACITY_APPROVER))


def _owned(pool: Pool, fields: dict | None = None) -> dict:
    return {
        "pool": pool.pk,
        "valid_from": "2026-01-01",
        "mode": "owned",
        "purchase_price_per_gpu": "25000",
        "depreciation_months": 48,
        "energy_price_per_kwh": "0.20",
        "pue": "1.3",
        "yearly_operations_per_gpu": "2000",
        "cloud_rate_per_gpu_hour": "2.00",
    } | (fields or {})


def test_a_capacity_approver_sets_a_price_and_it_is_audited(approver_client, h100_pool: Pool) -> None:
    answer = approver_client.post(URL, _owned(h100_pool), content_type="application/json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["currency"] == "EUR"
    # 0.713470 + 0.182 + 0.228311 at the H100's 700 W board power
    assert body["hourly"]["total"] == "1.1238"
    assert body["hourly"]["derivation"][1].startswith("energy: 700.0 W / 1000 x PUE 1.3")
    entry = AuditEntry.objects.get(model="poolprice", object_id=str(body["id"]), action="create")
    assert entry.actor == "cappy"


def test_an_admin_changes_a_price(admin_client, h100_pool: Pool) -> None:
    price = admin_client.post(URL, _owned(h100_pool), content_type="application/json").json()
    answer = admin_client.patch(f"{URL}{price['id']}/", {"valid_to": "2026-03-31"}, content_type="application/json")
    assert answer.status_code == 200 and answer.json()["valid_to"] == "2026-03-31"
    assert AuditEntry.objects.filter(model="poolprice", object_id=str(price["id"]), action="update").exists()


@pytest.mark.parametrize("who", ["viewer_client", "operator_client"])
def test_viewers_and_operators_read_prices_but_set_none(request, who, h100_pool: Pool) -> None:
    client = request.getfixturevalue(who)
    assert client.get(URL).status_code == 200
    assert client.post(URL, _owned(h100_pool), content_type="application/json").status_code == 403
    assert not PoolPrice.objects.exists()


def test_anonymous_reads_nothing(anon_client) -> None:
    assert anon_client.get(URL).status_code in (401, 403)
    assert anon_client.get("/api/v1/cost/").status_code in (401, 403)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"pue": "0.9"}, "pue"),
        ({"depreciation_months": 0}, "depreciation_months"),
        ({"purchase_price_per_gpu": None}, "purchase_price_per_gpu"),
        ({"rate_per_gpu_hour": "2.00"}, "rate_per_gpu_hour"),
        ({"currency": "euro"}, "currency"),
        ({"valid_to": "2025-12-31"}, "valid_to"),
        ({"energy_price_per_kwh": "-0.1"}, "energy_price_per_kwh"),
        ({"pool": 999999}, "pool"),
    ],
)
def test_a_refused_price_names_its_field_and_writes_nothing(approver_client, h100_pool: Pool, fields, field) -> None:
    answer = approver_client.post(URL, _owned(h100_pool, fields), content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()
    assert not PoolPrice.objects.exists()


def test_two_prices_on_one_day_are_refused_naming_the_first_day(approver_client, h100_pool: Pool) -> None:
    assert approver_client.post(URL, _owned(h100_pool), content_type="application/json").status_code == 201
    again = approver_client.post(
        URL, {"pool": h100_pool.pk, "valid_from": "2026-06-01", "mode": "rate", "rate_per_gpu_hour": "2.1"},
        content_type="application/json",
    )  # fmt: skip
    assert again.status_code == 400
    assert "Another price of this pool is valid on some of these days." in str(again.json())
    assert PoolPrice.objects.count() == 1


def test_the_cost_page_offers_prices_to_those_who_may_set_them(admin_client, viewer_client) -> None:
    assert "/admin/fleet/poolprice/" in admin_client.get("/cost/").content.decode()
    assert "/admin/fleet/poolprice/" not in viewer_client.get("/cost/").content.decode()
