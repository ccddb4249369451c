"""The demo's pool prices, so /cost/ shows figures on first open: the owned H100, H200 and A100
pools priced from purchase, depreciation, power (kWh price and PUE) and operations, with a cloud
rate to compare against; the L40S inference pool rented at an hourly rate. The H100 pool's energy
price changed 10 days ago (a new contract), so the demo's month shows a price change in its middle.

Figures are of the order of late-2025 list prices: an H100 SXM GPU with its share of the server
about 30,000 EUR, an H200 about 36,000, an A100 about 15,000; 0.18-0.24 EUR/kWh; PUE 1.2-1.4;
cloud on-demand about 2.5-4 EUR per H100/H200 GPU-hour, an L40S about 1.1.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction

from fleet.capacity.models import Pool
from fleet.cost.models import PoolPrice, PriceMode

HISTORY_DAYS = 400  # the first price starts before every history the demo writes
CHANGE_DAYS_AGO = 10

OWNED = {
    # pool name: (purchase per GPU, months, EUR/kWh, PUE, yearly operations per GPU, cloud rate)
    "h100": ("30000", 48, "0.20", "1.30", "2400", "2.90"),
    "h200": ("36000", 48, "0.16", "1.25", "2400", "3.60"),
    "a100": ("15000", 48, "0.20", "1.40", "1800", "1.60"),
}
RENTED = {"l40s": "1.10"}
NEW_ENERGY_PRICE = {"h100": "0.24"}  # the contract renewed CHANGE_DAYS_AGO days ago


def seed_prices(*, now: datetime) -> int:
    """Prices for the demo's pools that have none; returns how many rows were added."""
    today = now.date()
    first = today - timedelta(days=HISTORY_DAYS)
    change = today - timedelta(days=CHANGE_DAYS_AGO)
    added = 0
    with transaction.atomic():
        for pool in Pool.objects.filter(prices__isnull=True):
            if pool.name in RENTED:
                PoolPrice.objects.create(
                    pool=pool, valid_from=first, currency="EUR", mode=PriceMode.RATE,
                    rate_per_gpu_hour=Decimal(RENTED[pool.name]), note="Simulated cloud on-demand rate",
                )  # fmt: skip
                added += 1
                continue
            if pool.name not in OWNED:
                continue
            purchase, months, kwh, pue, ops, cloud = OWNED[pool.name]
            figures = {
                "currency": "EUR",
                "mode": PriceMode.OWNED,
                "purchase_price_per_gpu": Decimal(purchase),
                "depreciation_months": months,
                "energy_price_per_kwh": Decimal(kwh),
                "pue": Decimal(pue),
                "yearly_operations_per_gpu": Decimal(ops),
                "cloud_rate_per_gpu_hour": Decimal(cloud),
                "note": "Simulated purchase and power contract",
            }
            if pool.name in NEW_ENERGY_PRICE:
                PoolPrice.objects.create(pool=pool, valid_from=first, valid_to=change - timedelta(days=1), **figures)
                figures["energy_price_per_kwh"] = Decimal(NEW_ENERGY_PRICE[pool.name])
                figures["note"] = "Simulated power contract renewed"
                PoolPrice.objects.create(pool=pool, valid_from=change, **figures)
                added += 2
            else:
                PoolPrice.objects.create(pool=pool, valid_from=first, **figures)
                added += 1
    return added
