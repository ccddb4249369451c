"""Own or rent from utilisation over 30 and 90 days, an incident priced through its GPU, and the
``cost`` topic's push."""

from __future__ import annotations

import math
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from fleet.cost import figures, read
from fleet.cost.usage import midnight
from fleet.models import GpuRollup1h, Pool, Site
from fleet.telemetry.partitions import GPU_ROLLUP_1H, ensure_partitions
from incidents.models import Incident

from .conftest import H100, L40S, account, job_on, node_with_gpus, owned_price, rate_price

pytestmark = pytest.mark.django_db


def _busy(gpus, *, days: int, busy_share: float) -> None:
    """Every GPU reports every hour of the last ``days`` days; the first ``busy_share`` of the GPUs busy."""
    end = figures.floor_hour(timezone.now())
    start = figures.own_or_rent_start(days)
    ensure_partitions(GPU_ROLLUP_1H, start, end)
    busy = round(len(gpus) * busy_share)
    rows = []
    for n, gpu in enumerate(gpus):
        util = 90.0 if n < busy else 0.5
        for h in range(int((end - start) / timedelta(hours=1))):
            rows.append(
                GpuRollup1h(gpu=gpu, bucket=start + timedelta(hours=h), samples=60, util_mean=util, power_mean=700.0)
            )
    GpuRollup1h.objects.bulk_create(rows)


def test_at_80_percent_owning_the_h100s_was_cheaper(site_a: Site, h100_pool: Pool) -> None:
    owned_price(h100_pool, valid_from=date(2025, 1, 1))
    _busy(node_with_gpus(site_a, H100, 5, "h-1"), days=30, busy_share=0.8)
    book = read.book_for(read.window({}))
    [row] = read.own_or_rent_rows(book)
    # renting the used 80 % at 2.00 = 1.60 per installed GPU-hour against owning's 1.1238:
    # owning cost (1.60 - 1.1238) / 1.60 = 29.8 % less. Break-even 1.1238 / 2.00 = 56.2 %.
    assert row["break_even_pct"] == 56.2 and row["hourly"] == "1.1238"
    by_days = {p["days"]: p for p in row["periods"]}
    assert by_days[30]["sentence"] == "at 80 % utilisation, owning cost 30 % less"
    # 90 days: the same busy hours over about three times the installed hours (26.7 % and a little
    # more, as today's hours so far count in both)
    now = timezone.now()
    today = (now - figures.own_or_rent_start(0, now=now)) / timedelta(hours=1)
    expected = round(80 * (30 * 24 + math.floor(today)) / (90 * 24 + today), 1)
    assert by_days[90]["utilisation_pct"] == expected and by_days[90]["cheaper"] == "renting"


def test_a_rented_pool_has_no_own_or_rent_line_but_shows_its_rate(site_a: Site, l40s_pool: Pool) -> None:
    rate_price(l40s_pool, "1.10")
    [row] = read.own_or_rent_rows(read.book_for(read.window({})))
    assert (row["mode"], row["hourly"], row["periods"], row["derivation"]) == (
        "rate",
        "1.1000",
        [],
        ["rate: 1.1000 EUR/GPU-h"],
    )


def test_an_incident_naming_a_gpu_is_priced_in_that_gpus_pool(site_a: Site, h100_pool: Pool, l40s_pool: Pool) -> None:
    owned_price(h100_pool, valid_from=date(2025, 1, 1))
    rate_price(l40s_pool, "1.00")
    gpu = node_with_gpus(site_a, L40S, 1, "l-1")[0]
    incident = Incident.objects.create(
        title="XID 79",
        severity="SEV3",
        category="gpu-health",
        group_key="gpu",
        labels={"site": "ams-1", "gpu": gpu.uuid},
        started_at=timezone.now() - timedelta(hours=2),
        gpus_out_of_service=1,
        resolved_at=timezone.now() - timedelta(hours=1),
        state="resolved",
    )
    # one GPU out of service for an hour: 1 GPU-hour at 1.00
    assert incident.current_gpu_hours() == pytest.approx(1.0)
    assert figures.incident_cost(incident.pk)["amount"] == "1.00"


def test_the_live_push_carries_the_figures_once_and_then_only_when_they_change(site_a: Site, l40s_pool: Pool) -> None:
    rate_price(l40s_pool, "1.00")
    job = job_on(site_a, node_with_gpus(site_a, L40S, 1, "l-1"))
    account(job, figures.floor_hour(timezone.now()) - timedelta(hours=3), hang_s=3600)
    push, mark = read.build_cost_delta("cost", None)
    assert push["type"] == "cost.delta" and push["total"] == "1.00"
    again, same = read.build_cost_delta("cost", mark)
    assert again is None and same == mark
    account(job, figures.floor_hour(timezone.now()) - timedelta(hours=2), hang_s=3600)
    changed, _ = read.build_cost_delta("cost", mark)
    assert changed["total"] == "2.00"


def test_a_month_with_a_price_change_is_one_csv_row_at_both_prices(
    viewer_client, site_a: Site, l40s_pool: Pool
) -> None:
    today = timezone.now().date()
    rate_price(l40s_pool, "2.00", valid_from=date(2025, 1, 1), valid_to=today - timedelta(days=2))
    rate_price(l40s_pool, "3.00", valid_from=today - timedelta(days=1))
    job = job_on(site_a, node_with_gpus(site_a, L40S, 1, "l-1"))
    now = figures.floor_hour(timezone.now())
    old_day = midnight(today - timedelta(days=3))
    account(job, old_day, hang_s=3600)  # 1 GPU-hour at 2.00
    account(job, now - timedelta(hours=1), hang_s=3600)  # 1 GPU-hour at 3.00
    rows = [
        line.split(",")
        for line in viewer_client.get("/api/v1/cost/export.csv", {"range": "7d"}).content.decode().splitlines()[1:]
    ]
    total = sum(Decimal(r[7]) for r in rows)
    assert total == Decimal("5.00")
    if old_day.month == now.month:  # the usual case: both hours in one month, one row
        assert len(rows) == 1 and rows[0][6] == "2.0"


def test_a_window_in_the_past_still_says_own_or_rent_for_the_last_30_and_90_days(site_a: Site, h100_pool: Pool) -> None:
    from console.ranges import custom_window

    owned_price(h100_pool, valid_from=date(2025, 1, 1))
    _busy(node_with_gpus(site_a, H100, 5, "h-1"), days=30, busy_share=0.8)
    now = timezone.now()
    past = read.compute_snapshot(custom_window(now - timedelta(days=60), now - timedelta(days=40), now=now))
    current = read.compute_snapshot(read.window({}), now=now)
    assert past["own_or_rent"] == current["own_or_rent"]
    assert past["own_or_rent"][0]["periods"][0]["sentence"] == "at 80 % utilisation, owning cost 30 % less"
