"""GPU-hours priced, against figures worked out by hand.

The owned H100 price (conftest.owned_price) at the board power of an H100 (700 W, no rollups):
    depreciation 25,000 / (48 x 730 h)      = 0.713470...  EUR
    energy       0.7 kW x 1.3 x 0.20         = 0.182        EUR
    operations   2,000 / 8,760 h             = 0.228310...  EUR
    total                                    = 1.123780...  EUR per GPU-hour
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from fleet.cost import figures
from fleet.cost.figures import price_book
from fleet.models import Pool, Reservation, Site, Team

from .conftest import H100, L40S, account, at, job_on, node_with_gpus, owned_price, rate_price, rollup

pytestmark = pytest.mark.django_db

OWNED_HOURLY_700W = Decimal(25000) / Decimal(35040) + Decimal("0.182") + Decimal(2000) / Decimal(8760)


def same(a: Decimal, b: Decimal) -> bool:
    """Equal to 18 places: Decimal keeps 28 significant digits, so the order of the operations
    shows in the last ones."""
    return abs(a - b) < Decimal("1e-18")


def _total(items) -> Decimal:
    return sum((i.amount for i in items), Decimal(0))


def test_an_hour_of_hang_on_the_owned_pool_costs_depreciation_power_and_operations(
    site_a: Site, h100_pool: Pool
) -> None:
    owned_price(h100_pool)
    job = job_on(site_a, node_with_gpus(site_a, H100, 8, "h-1"))
    account(job, at(10, 5), hang_s=8 * 3600)  # 8 GPUs x 1 h = 8 GPU-hours
    items = figures.training_items(price_book(at(1), at(1, month=2)))
    assert [(i.cause, i.gpu_hours, i.job_id, i.team) for i in items] == [("hang", Decimal(8), job.pk, "research")]
    # 8 x 1.123780... = 8.990246...
    assert round(_total(items), 2) == Decimal("8.99")
    assert same(_total(items), 8 * OWNED_HOURLY_700W)


def test_the_cloud_pool_costs_its_rate(site_a: Site, l40s_pool: Pool) -> None:
    rate_price(l40s_pool, "2.50")
    job = job_on(site_a, node_with_gpus(site_a, L40S, 4, "l-1"), name="ft", team="apps")
    account(job, at(3, 1), disruption_s=4 * 3600, productive_s=100)
    account(job, at(3, 2), disruption_s=4 * 3600)
    items = figures.training_items(price_book(at(1), at(1, month=2)))
    # 8 GPU-hours of disruption x 2.50 = 20.00; productive time is not badput
    assert {i.cause for i in items} == {"disruption"}
    assert _total(items) == Decimal("20.00")


def test_a_price_change_in_the_middle_of_a_month_prices_each_part_at_its_own_price(
    site_a: Site, l40s_pool: Pool
) -> None:
    rate_price(l40s_pool, "2.00", valid_to=date(2026, 1, 15))
    rate_price(l40s_pool, "3.00", valid_from=date(2026, 1, 16))
    job = job_on(site_a, node_with_gpus(site_a, L40S, 2, "l-1"))
    account(job, at(10, 3), idle_s=10 * 3600)  # 10 GPU-hours at 2.00 = 20.00
    account(job, at(20, 3), idle_s=10 * 3600)  # 10 GPU-hours at 3.00 = 30.00
    book = price_book(at(1), at(1, month=2))
    assert book.segments() == [(at(1), at(16)), (at(16), at(1, month=2))]
    items = figures.training_items(book)
    assert sorted(i.amount for i in items) == [Decimal("20.00"), Decimal("30.00")]
    assert {i.month for i in items} == {"2026-01"}


def test_months_are_their_own_rows_and_hours_without_a_price_are_counted_not_costed(
    site_a: Site, l40s_pool: Pool
) -> None:
    rate_price(l40s_pool, "2.00", valid_from=date(2026, 2, 1))
    job = job_on(site_a, node_with_gpus(site_a, L40S, 1, "l-1"))
    account(job, at(31, 23), hang_s=3600)
    account(job, at(1, 0, month=2), hang_s=3600)
    items = figures.training_items(price_book(at(1), at(1, month=3)))
    by_month = {i.month: (i.amount, i.uncovered_gpu_hours) for i in items}
    assert by_month == {"2026-01": (Decimal(0), Decimal(1)), "2026-02": (Decimal("2.00"), Decimal(0))}


def test_idle_energised_gpus_use_the_pools_measured_draw_and_leave_out_hours_a_job_held(
    site_a: Site, h100_pool: Pool
) -> None:
    owned_price(h100_pool)
    gpus = node_with_gpus(site_a, H100, 3, "h-1")
    for hour in range(10):
        rollup(gpus[0], at(5, hour), util=1.0, power=100.0)  # idle
        rollup(gpus[1], at(5, hour), util=2.0, power=100.0)  # idle
        rollup(gpus[2], at(5, hour), util=3.0, power=100.0)  # idle, but a job held it
    job = job_on(site_a, [gpus[2]])
    for hour in range(10):
        account(job, at(5, hour), idle_s=3600)
    book = price_book(at(5), at(6))
    assert book.watts[h100_pool.pk] == Decimal("100.0")
    items = figures.idle_items(book)
    # 20 GPU-hours at 0.713470... + 0.1 x 1.3 x 0.20 + 0.228310... = 0.967780... -> 19.355616...
    assert [i.gpu_hours for i in items] == [Decimal(20)]
    hourly_100w = Decimal(25000) / Decimal(35040) + Decimal("0.026") + Decimal(2000) / Decimal(8760)
    assert same(_total(items), 20 * hourly_100w)
    assert round(_total(items), 2) == Decimal("19.36")


def test_a_reservation_the_team_did_not_use_is_costed_for_that_team(site_a: Site, l40s_pool: Pool) -> None:
    rate_price(l40s_pool, "1.00")
    Team.objects.create(name="apps")
    Reservation.objects.create(team_id="apps", pool=l40s_pool, gpus=4, start=at(2), end=at(2, 10), state="expired")
    job = job_on(site_a, node_with_gpus(site_a, L40S, 2, "l-1"), team="apps")
    for hour in range(10):
        account(job, at(2, hour), productive_s=2 * 3600)  # used 2 of the 4 reserved GPUs
    items = figures.reserved_items(price_book(at(1), at(3)))
    # 40 reserved - 20 used = 20 GPU-hours x 1.00
    assert [(i.team, i.gpu_hours, i.amount) for i in items] == [("apps", Decimal(20), Decimal(20))]


def test_gpus_kueue_admitted_on_the_teams_queues_count_as_used_when_more_than_its_jobs_held(
    site_a: Site, l40s_pool: Pool
) -> None:
    from datetime import timedelta

    from django.db import connection

    from fleet.models import SchedulerQueue
    from fleet.telemetry import partitions

    rate_price(l40s_pool, "1.00")
    team = Team.objects.create(name="apps")
    Reservation.objects.create(team_id="apps", pool=l40s_pool, gpus=4, start=at(2), end=at(2, 10), state="expired")
    job = job_on(site_a, node_with_gpus(site_a, L40S, 2, "l-1"), team="apps")
    for hour in range(10):
        account(job, at(2, hour), productive_s=2 * 3600)  # the jobs held 2 of the 4 GPUs: 20 GPU-hours
    queue = SchedulerQueue.objects.create(site=site_a, scheduler="kueue", name="apps-cq", pool=l40s_pool, team=team)
    other = SchedulerQueue.objects.create(site=site_a, scheduler="kueue", name="ml-cq", pool=l40s_pool)
    partitions.ensure_partitions(partitions.SCHEDULER_ROLLUP_1M, at(2), at(2, 10))
    with connection.cursor() as cursor:
        for q, series, usage in (
            (queue.pk, 'flavor="l40s",resource="nvidia.com/gpu"', 3.0),  # Kueue admitted 3 GPUs throughout
            (queue.pk, 'flavor="l40s",resource="cpu"', 96.0),  # not GPUs
            (other.pk, 'flavor="l40s",resource="nvidia.com/gpu"', 4.0),  # not the team's queue
        ):
            cursor.execute(
                "INSERT INTO fleet_schedulerrollup_1m (queue_id, series, quantity, bucket, samples, min, max, last)"
                " SELECT %s, %s, 'resource_usage', b, 4, %s, %s, %s FROM generate_series(%s::timestamptz,"
                " %s::timestamptz, interval '1 minute') b",
                [q, series, usage, usage, usage, at(2), at(2, 10) - timedelta(minutes=1)],
            )
    items = figures.reserved_items(price_book(at(1), at(3)))
    # 40 reserved - max(20 held by jobs, 30 admitted by Kueue) = 10 GPU-hours x 1.00
    assert [(i.team, i.gpu_hours, i.amount) for i in items] == [("apps", Decimal(10), Decimal(10))]


def test_a_cancelled_or_requested_reservation_costs_nothing(site_a: Site, l40s_pool: Pool) -> None:
    rate_price(l40s_pool, "1.00")
    Team.objects.create(name="apps")
    Reservation.objects.create(team_id="apps", pool=l40s_pool, gpus=4, start=at(2), end=at(3), state="cancelled")
    Reservation.objects.create(team_id="apps", pool=l40s_pool, gpus=4, start=at(2), end=at(3), state="requested")
    assert figures.reserved_items(price_book(at(1), at(4))) == []


def test_a_job_without_gpus_recorded_falls_in_its_sites_only_pool(site_a: Site, l40s_pool: Pool, site_b: Site) -> None:
    from fleet.models import Job

    alone = Job.objects.create(site=site_a, name="a", team="t", gang_size=1, scheduler_id="a")
    nowhere = Job.objects.create(site=site_b, name="b", team="t", gang_size=1, scheduler_id="b")
    assert figures.job_pools() == {alone.pk: l40s_pool.pk, nowhere.pk: None}
