"""Prices and their arithmetic, against figures worked out by hand in the comments.

The owned H100 pool used throughout: 25,000 EUR per GPU written off over 48 months, 700 W per GPU
at PUE 1.3 and 0.20 EUR/kWh, 2,000 EUR a year of operations per GPU. One GPU-hour:
    depreciation 25,000 / (48 x 730 h) = 25,000 / 35,040      = 0.713470...  EUR
    energy       700 / 1000 x 1.3 x 0.20 = 0.7 x 0.26         = 0.182        EUR
    operations   2,000 / 8,760 h                               = 0.228310...  EUR
    total                                                      = 1.123780...  EUR (1.12 shown)
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import override_settings

from fleet.cost import prices
from fleet.cost.prices import CostError, Span
from fleet.models import Pool, PoolPrice, PriceMode, Site

D = Decimal


def _pool(site: Site | None = None, name: str = "h100") -> Pool:
    """A saved pool when given a saved site, else an unsaved one for the pure arithmetic."""
    site = site or Site(name="ams-1")
    pool = Pool(site=site, gpu_model="NVIDIA H100 80GB HBM3" if name == "h100" else name, name=name)
    if site.pk:
        pool.save()
    return pool


def owned(pool: Pool | None = None, *, valid_from=date(2026, 1, 1), valid_to=None, **figures) -> PoolPrice:
    defaults = {
        "purchase_price_per_gpu": D("25000"),
        "depreciation_months": 48,
        "energy_price_per_kwh": D("0.20"),
        "pue": D("1.3"),
        "yearly_operations_per_gpu": D("2000"),
        "cloud_rate_per_gpu_hour": D("2.00"),
        "currency": "EUR",
    }
    return PoolPrice(
        pool=pool or _pool(), mode=PriceMode.OWNED, valid_from=valid_from, valid_to=valid_to, **(defaults | figures)
    )


def rented(pool: Pool | None = None, *, valid_from=date(2026, 1, 1), valid_to=None, **figures) -> PoolPrice:
    defaults = {"rate_per_gpu_hour": D("2.00"), "currency": "EUR"}
    return PoolPrice(
        pool=pool or _pool(), mode=PriceMode.RATE, valid_from=valid_from, valid_to=valid_to, **(defaults | figures)
    )


def at(day: int, hour: int = 0, minute: int = 0, month: int = 7) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


# --- one GPU-hour ---------------------------------------------------------------------------


def test_an_owned_gpu_hour_is_depreciation_plus_energy_plus_operations() -> None:
    h = prices.hourly(owned(), watts_per_gpu=700)
    assert prices.rate(h.depreciation) == D("0.7135")  # 25,000 / 35,040 = 0.71347...
    assert h.energy == D("0.182")  # 0.7 kW x 1.3 x 0.20, exact
    assert prices.rate(h.operations) == D("0.2283")  # 2,000 / 8,760 = 0.22831...
    assert prices.money(h.total) == D("1.12")  # 0.71347 + 0.182 + 0.22831 = 1.12378...
    assert prices.rate(h.total) == D("1.1238")


def test_the_derivation_shows_every_input() -> None:
    lines = prices.hourly(owned(), watts_per_gpu=700).derivation
    assert lines == (
        "depreciation: 25,000.00 EUR / (48 months x 730 h) = 0.7135 EUR/GPU-h",
        "energy: 700 W / 1000 x PUE 1.3 x 0.20 EUR/kWh = 0.1820 EUR/GPU-h",
        "operations: 2,000.00 EUR a year / 8760 h = 0.2283 EUR/GPU-h",
        "total: 1.1238 EUR/GPU-h",
    )


def test_a_rate_is_its_own_hourly_cost_whatever_the_draw() -> None:
    h = prices.hourly(rented(rate_per_gpu_hour=D("1.10")), watts_per_gpu=350)
    assert (h.total, h.depreciation, h.energy, h.operations) == (D("1.10"), 0, 0, 0)
    assert h.derivation == ("rate: 1.1000 EUR/GPU-h",)


def test_owned_hardware_without_its_draw_is_refused_not_costed_without_energy() -> None:
    with pytest.raises(CostError, match="watts"):
        prices.hourly(owned())


# --- GPU-hours over time --------------------------------------------------------------------


def test_a_month_of_an_owned_pool_costs_its_gpu_hours_to_the_cent() -> None:
    # 8 GPUs all April (30 days, 720 h): 5,760 GPU-h.
    # 5,760 x (275/292 + 0.182) = 5,424.657534... + 1,048.32 = 6,472.977534... -> 6,472.98 EUR
    # (275/292 = depreciation + operations: 625/876 + 200/876 = 825/876.)
    april = [Span(at(1, month=4), at(1, month=5), D(8))]
    cost = prices.cost_of([owned()], april, watts_per_gpu=700)
    assert cost.gpu_hours == 5760
    assert prices.money(cost.total) == D("6472.98")
    assert cost.currency == "EUR" and cost.uncovered_gpu_hours == 0


def test_a_cloud_pool_costs_its_rate_per_gpu_hour_from_hourly_buckets() -> None:
    # An L40S pool at 1.10 EUR/GPU-h; one day of hourly GPU-hours: 23 hours of 16 and one of 7.5.
    # 23 x 16 + 7.5 = 375.5 GPU-h x 1.10 = 413.05 EUR.
    day = {at(1, hour): 16 for hour in range(24)} | {at(1, 13): 7.5}
    cost = prices.cost_of([rented(rate_per_gpu_hour=D("1.10"))], prices.spans_from_hours(day))
    assert cost.gpu_hours == D("375.5")
    assert prices.money(cost.total) == D("413.05")


def test_a_price_change_on_the_16th_costs_each_part_of_the_month_at_its_own_price() -> None:
    # 10 GPUs all July (31 days). 2.00 EUR until the 15th, 2.40 from the 16th:
    #   1-15 July:  15 days x 24 h x 10 = 3,600 GPU-h x 2.00 = 7,200.00
    #  16-31 July:  16 days x 24 h x 10 = 3,840 GPU-h x 2.40 = 9,216.00
    #  total                                                  16,416.00 (not 7,440 x either price)
    old = rented(valid_to=date(2026, 7, 15))
    new = rented(valid_from=date(2026, 7, 16), rate_per_gpu_hour=D("2.40"))
    cost = prices.cost_of([new, old], [Span(at(1), at(1, month=8), D(10))])
    assert [(p.price, p.gpu_hours, prices.money(p.amount)) for p in cost.parts] == [
        (old, 3600, D("7200.00")),
        (new, 3840, D("9216.00")),
    ]
    assert prices.money(cost.total) == D("16416.00")


def test_an_owned_pool_whose_energy_price_rises_on_the_16th() -> None:
    # 8 GPUs all July; from the 16th the site pays 0.30 EUR/kWh: energy 0.7 x 1.3 x 0.30 = 0.273.
    #   1-15 July:  2,880 GPU-h x 1.123780... = 3,236.488767...
    #  16-31 July:  3,072 GPU-h x 1.214780... = 3,731.806684...
    #  total                                    6,968.295452... -> 6,968.30 EUR
    before = owned(valid_to=date(2026, 7, 15))
    after = owned(valid_from=date(2026, 7, 16), energy_price_per_kwh=D("0.30"))
    cost = prices.cost_of([before, after], [Span(at(1), at(1, month=8), D(8))], watts_per_gpu=700)
    assert prices.money(cost.total) == D("6968.30")


def test_a_span_across_the_boundary_midnight_is_split_inside_it() -> None:
    # 4 GPUs from 23:30 on the 15th to 00:30 on the 16th: 2 GPU-h at 2.00 and 2 at 2.40 = 8.80.
    old, new = rented(valid_to=date(2026, 7, 15)), rented(valid_from=date(2026, 7, 16), rate_per_gpu_hour=D("2.40"))
    cost = prices.cost_of([old, new], [Span(at(15, 23, 30), at(16, 0, 30), D(4))])
    assert [p.gpu_hours for p in cost.parts] == [2, 2]
    assert cost.total == D("8.80")


def test_gpu_hours_no_price_covers_are_counted_apart_not_costed_as_zero() -> None:
    # The price starts on 2 July; 6 GPUs for all of 1 and 2 July: 144 GPU-h uncovered, 144 costed.
    cost = prices.cost_of([rented(valid_from=date(2026, 7, 2))], [Span(at(1), at(3), D(6))])
    assert cost.uncovered_gpu_hours == 144
    assert cost.gpu_hours == 144 and cost.total == D("288.00")


def test_prices_in_two_currencies_or_on_the_same_days_are_refused() -> None:
    with pytest.raises(CostError, match="EUR and USD"):
        prices.cost_of([rented(valid_to=date(2026, 6, 30)), rented(valid_from=date(2026, 7, 1), currency="USD")], [])
    with pytest.raises(CostError, match="same days"):
        prices.cost_of([rented(valid_to=date(2026, 7, 16)), rented(valid_from=date(2026, 7, 16))], [])


# --- own or rent ----------------------------------------------------------------------------


def test_break_even_is_the_owned_hourly_cost_over_the_cloud_rate() -> None:
    # 1.123780... / 2.00 = 0.561890...: at 56 % used, a used GPU-hour costs what the cloud charges.
    u = prices.break_even_utilisation(owned(), watts_per_gpu=700)
    assert u.quantize(D("0.0001")) == D("0.5619")
    # Against a cloud at 1.00 EUR/GPU-h owning never pays: more than 100 % would be needed.
    assert prices.break_even_utilisation(owned(), cloud_rate=1, watts_per_gpu=700) > 1


def test_below_break_even_renting_would_have_cost_less() -> None:
    # At 43 %: renting the used hours costs 0.43 x 2.00 = 0.86 per installed GPU-hour against
    # owning's 1.123780...: (1.123780 - 0.86) / 1.123780 = 0.2347 -> 23 % less.
    owned_hourly = prices.hourly(owned(), watts_per_gpu=700).total
    verdict = prices.own_or_rent(D("0.43"), owned_hourly=owned_hourly, cloud_rate=D("2.00"))
    assert verdict.cheaper == "renting"
    assert verdict.sentence() == "at 43 % utilisation, renting would have cost 23 % less"


def test_above_break_even_owning_cost_less() -> None:
    # At 70 %: renting 1.40 against owning's 1.123780...: (1.40 - 1.123780) / 1.40 = 0.1973 -> 20 % less.
    owned_hourly = prices.hourly(owned(), watts_per_gpu=700).total
    verdict = prices.own_or_rent(D("0.70"), owned_hourly=owned_hourly, cloud_rate=D("2.00"))
    assert verdict.cheaper == "owning"
    assert verdict.sentence() == "at 70 % utilisation, owning cost 20 % less"


def test_at_break_even_neither_is_cheaper_to_the_percent() -> None:
    # At 56 %: renting 1.12 against 1.123780...: 0.3 % apart, which rounds to the same.
    verdict = prices.own_or_rent(D("0.56"), owned_hourly=D("1.12378"), cloud_rate=D("2.00"))
    assert verdict.cheaper is None
    assert verdict.sentence() == "at 56 % utilisation, owning and renting would have cost the same"


def test_a_price_without_a_cloud_rate_has_no_break_even() -> None:
    with pytest.raises(CostError, match="no cloud rate"):
        prices.break_even_utilisation(owned(cloud_rate_per_gpu_hour=None), watts_per_gpu=700)


# --- the prices themselves ------------------------------------------------------------------


@pytest.fixture
def pool(site_a: Site) -> Pool:
    return _pool(site_a)


def _messages(exc: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return exc.value.message_dict


def test_two_prices_of_one_pool_may_not_share_a_day(pool: Pool) -> None:
    owned(pool, valid_to=date(2026, 6, 30)).save()
    overlapping = rented(pool, valid_from=date(2026, 6, 30))
    with pytest.raises(ValidationError) as exc:
        overlapping.full_clean()
    assert "Another price of this pool is valid on some of these days." in exc.value.messages
    with pytest.raises(IntegrityError), transaction.atomic():
        overlapping.save()
    # The next day is free, and another pool's price may share the days.
    rented(pool, valid_from=date(2026, 7, 1)).full_clean()
    rented(_pool(pool.site, name="l40s"), valid_from=date(2026, 6, 1)).save()


def test_an_open_ended_price_overlaps_every_later_one(pool: Pool) -> None:
    owned(pool, valid_from=date(2026, 1, 1)).save()
    with pytest.raises(IntegrityError), transaction.atomic():
        rented(pool, valid_from=date(2027, 1, 1)).save()


def test_a_pue_below_one_is_refused(pool: Pool) -> None:
    price = owned(pool, pue=D("0.9"))
    with pytest.raises(ValidationError) as exc:
        price.full_clean()
    assert "pue" in _messages(exc)
    with pytest.raises(IntegrityError), transaction.atomic():
        price.save()


def test_negative_and_zero_figures_are_refused_by_name(pool: Pool) -> None:
    with pytest.raises(ValidationError) as exc:
        owned(pool, purchase_price_per_gpu=D("-1"), energy_price_per_kwh=D("-0.01")).full_clean()
    assert _messages(exc)["purchase_price_per_gpu"] == ["Must be more than 0."]
    assert "energy_price_per_kwh" in _messages(exc)
    with pytest.raises(ValidationError) as exc:
        rented(pool, rate_per_gpu_hour=D("0")).full_clean()
    assert _messages(exc)["rate_per_gpu_hour"] == ["Must be more than 0."]
    with pytest.raises(IntegrityError), transaction.atomic():
        rented(pool, rate_per_gpu_hour=D("-2")).save()


def test_each_mode_needs_its_figures_and_only_those(pool: Pool) -> None:
    with pytest.raises(ValidationError) as exc:
        rented(pool, purchase_price_per_gpu=D("25000")).full_clean()
    assert _messages(exc)["purchase_price_per_gpu"] == ["Leave it empty: it belongs to the other mode."]
    with pytest.raises(ValidationError) as exc:
        owned(pool, depreciation_months=None).full_clean()
    assert "depreciation_months" in _messages(exc)


def test_the_last_day_may_not_come_before_the_first(pool: Pool) -> None:
    with pytest.raises(ValidationError) as exc:
        rented(pool, valid_from=date(2026, 7, 1), valid_to=date(2026, 6, 30)).full_clean()
    assert "valid_to" in _messages(exc)


@override_settings(COST_CURRENCY="USD")
def test_the_currency_defaults_to_the_setting_and_must_be_iso_like(pool: Pool) -> None:
    price = PoolPrice(pool=pool, mode=PriceMode.RATE, valid_from=date(2026, 1, 1), rate_per_gpu_hour=D("3"))
    assert price.currency == "USD"
    price.currency = "eur"
    with pytest.raises(ValidationError) as exc:
        price.full_clean()
    assert "currency" in _messages(exc)
    with pytest.raises(IntegrityError), transaction.atomic():
        price.save()
