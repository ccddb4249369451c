"""Prices are entered by an Admin in the admin; the form names the refusal, and each change is
audited like the capacity records beside it."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from compliance.models import AuditEntry
from fleet.models import Pool, PoolPrice, PriceMode, Site

URL = "/admin/fleet/poolprice/add/"


def _form(pool: Pool, **fields: str) -> dict[str, str]:
    empty = dict.fromkeys(
        [
            "valid_to",
            "note",
            "rate_per_gpu_hour",
            "purchase_price_per_gpu",
            "depreciation_months",
            "energy_price_per_kwh",
            "pue",
            "yearly_operations_per_gpu",
            "cloud_rate_per_gpu_hour",
        ],
        "",
    )
    return empty | {"pool": str(pool.pk), "valid_from": "2026-01-01", "currency": "EUR"} | fields


@pytest.fixture
def pool(site_a: Site) -> Pool:
    return Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="h100")


def test_an_admin_enters_an_owned_price_and_an_overlap_is_named(admin_client, operator_client, pool: Pool) -> None:
    owned = _form(
        pool,
        mode="owned",
        valid_to="2026-06-30",
        purchase_price_per_gpu="25000",
        depreciation_months="48",
        energy_price_per_kwh="0.20",
        pue="1.3",
        yearly_operations_per_gpu="2000",
        cloud_rate_per_gpu_hour="2.00",
    )
    assert operator_client.post(URL, owned).status_code in (302, 403)
    assert not PoolPrice.objects.exists()
    assert admin_client.post(URL, owned).status_code == 302
    price = PoolPrice.objects.get()
    assert (price.mode, price.pue, price.valid_to) == (PriceMode.OWNED, Decimal("1.30"), date(2026, 6, 30))

    overlap = admin_client.post(URL, _form(pool, mode="rate", valid_from="2026-06-01", rate_per_gpu_hour="2.10"))
    assert overlap.status_code == 200
    assert "Another price of this pool is valid on some of these days." in overlap.content.decode()
    assert PoolPrice.objects.count() == 1


def test_a_price_entered_in_the_admin_is_audited(admin_client, pool: Pool) -> None:
    assert admin_client.post(URL, _form(pool, mode="rate", rate_per_gpu_hour="2.10")).status_code == 302
    price = PoolPrice.objects.get()
    entry = AuditEntry.objects.get(model="poolprice", object_id=str(price.pk), action="create")
    assert entry.actor == "ada"
