"""What a GPU-hour costs, and what a stretch of GPU-hours cost: pure arithmetic over PoolPrice
rows, no queries (the reads that fetch prices and usage sit beside it, thin).

Money is ``Decimal``, never float: a price is a decimal figure from a contract (0.20 EUR/kWh has
no exact binary float), sums over a year of hours must add up to the cent the way a reader adds
them by hand, and a float's representation error would surface as 0.01 differences between a
total and its parts. Every figure keeps full precision through the arithmetic; rounding happens
once, for display: amounts to the cent (``money``), a rate per GPU-hour to four places
(``rate``), as a tenth of a cent an hour over thousands of GPU-hours is money.

1. ``hourly(price, watts_per_gpu=...)``: one GPU-hour at that price, with the derivation shown.
   A rate is itself. Owned hardware costs
   - depreciation: purchase price / (months x 730 h) (730 = 8,760 h / 12),
   - energy: watts / 1000 x PUE x price per kWh,
   - operations: yearly operations cost / 8,760 h,
   and the total is their sum. The watts are the caller's: the pool's measured draw per GPU.
2. ``cost_of(prices, usage, watts_per_gpu=...)``: GPU-hours split at the prices' validity
   boundaries (UTC midnights): a month with a price change on the 16th costs the first 15 days
   at the old price and the rest at the new one. GPU-hours no price covers are counted, not
   costed as zero.
3. ``break_even_utilisation`` and ``own_or_rent``: an owned pool costs its hourly total for
   every installed GPU-hour, used or not, so a *used* GPU-hour costs ``owned / u`` at
   utilisation ``u``; renting costs the cloud rate per used GPU-hour. They are equal at
   ``u = owned / cloud``: above it owning is cheaper, below it renting is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal

from fleet.cost.models import PoolPrice, PriceMode

HOURS_PER_YEAR = Decimal(8760)  # 365 x 24
HOURS_PER_MONTH = HOURS_PER_YEAR / 12  # 730
CENT = Decimal("0.01")
RATE_PLACES = Decimal("0.0001")
_HOUR = timedelta(hours=1)


class CostError(ValueError):
    """The figures cannot be computed from these inputs (said in the message)."""


def money(amount: Decimal) -> Decimal:
    """An amount rounded to the cent, half up, as an invoice rounds it."""
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def rate(amount: Decimal) -> Decimal:
    """A price per GPU-hour rounded to four places, for display."""
    return amount.quantize(RATE_PLACES, rounding=ROUND_HALF_UP)


def _decimal(value: Decimal | float | int) -> Decimal:
    # str() first: Decimal(0.1) is 0.1000000000000000055511151231257827..., Decimal("0.1") is 0.1.
    return value if isinstance(value, Decimal) else Decimal(str(value))


@dataclass(frozen=True)
class Hourly:
    """One GPU-hour at a price: the parts (zero for a rate), the total, and how each was derived."""

    currency: str
    depreciation: Decimal
    energy: Decimal
    operations: Decimal
    total: Decimal
    derivation: tuple[str, ...]


def hourly(price: PoolPrice, *, watts_per_gpu: Decimal | float | int | None = None) -> Hourly:
    """What one GPU-hour costs at ``price``. Owned hardware needs ``watts_per_gpu`` (the pool's
    measured draw per GPU, its share of the node's overhead included if the caller counts it)."""
    cur = price.currency
    zero = Decimal(0)
    if price.mode == PriceMode.RATE:
        total = _decimal(price.rate_per_gpu_hour)
        return Hourly(cur, zero, zero, zero, total, (f"rate: {rate(total)} {cur}/GPU-h",))
    if watts_per_gpu is None:
        raise CostError(f"{price}: owned hardware needs the pool's draw per GPU (watts) for its energy cost")
    watts = _decimal(watts_per_gpu)
    if watts < 0:
        raise CostError(f"{price}: a draw of {watts} W is negative")
    purchase = _decimal(price.purchase_price_per_gpu)
    months = Decimal(price.depreciation_months)
    kwh_price = _decimal(price.energy_price_per_kwh)
    pue = _decimal(price.pue)
    yearly_ops = _decimal(price.yearly_operations_per_gpu)

    depreciation = purchase / (months * HOURS_PER_MONTH)
    energy = watts / 1000 * pue * kwh_price
    operations = yearly_ops / HOURS_PER_YEAR
    total = depreciation + energy + operations
    derivation = (
        f"depreciation: {purchase:,.2f} {cur} / ({months} months x {HOURS_PER_MONTH} h)"
        f" = {rate(depreciation)} {cur}/GPU-h",
        f"energy: {watts} W / 1000 x PUE {pue} x {kwh_price} {cur}/kWh = {rate(energy)} {cur}/GPU-h",
        f"operations: {yearly_ops:,.2f} {cur} a year / {HOURS_PER_YEAR} h = {rate(operations)} {cur}/GPU-h",
        f"total: {rate(total)} {cur}/GPU-h",
    )
    return Hourly(cur, depreciation, energy, operations, total, derivation)


@dataclass(frozen=True)
class Span:
    """``gpus`` GPUs held from ``start`` to ``end`` (a mean may be fractional: 7.5 GPUs over an hour)."""

    start: datetime
    end: datetime
    gpus: Decimal

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", _decimal(self.gpus))  # a float or int given by a caller

    @property
    def gpu_hours(self) -> Decimal:
        return self.gpus * _hours(self.end - self.start)


def _hours(delta: timedelta) -> Decimal:
    # Whole microseconds, so the division is exact where the hours are (no float seconds).
    return Decimal(delta // timedelta(microseconds=1)) / Decimal(3_600_000_000)


def spans_from_hours(gpu_hours_by_hour: Mapping[datetime, Decimal | float | int]) -> list[Span]:
    """Hourly GPU-hours (an hour's start -> the GPU-hours used in it) as one-hour spans."""
    return [Span(hour, hour + _HOUR, _decimal(used)) for hour, used in sorted(gpu_hours_by_hour.items())]


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _validity(price: PoolPrice) -> tuple[datetime, datetime | None]:
    """[first midnight, the midnight after the last day) in UTC; open-ended: None."""
    end = _midnight(price.valid_to + timedelta(days=1)) if price.valid_to else None
    return _midnight(price.valid_from), end


@dataclass(frozen=True)
class CostPart:
    """The GPU-hours one price covers, at its rate per GPU-hour."""

    price: PoolPrice
    hourly: Hourly
    gpu_hours: Decimal

    @property
    def amount(self) -> Decimal:
        return self.gpu_hours * self.hourly.total


@dataclass(frozen=True)
class Cost:
    """GPU-hours costed price by price. ``uncovered_gpu_hours``: usage on days no price covers."""

    currency: str | None
    parts: tuple[CostPart, ...]
    uncovered_gpu_hours: Decimal

    @property
    def total(self) -> Decimal:
        return sum((part.amount for part in self.parts), Decimal(0))

    @property
    def gpu_hours(self) -> Decimal:
        return sum((part.gpu_hours for part in self.parts), Decimal(0))


def cost_of(
    prices: Sequence[PoolPrice],
    usage: Iterable[Span],
    *,
    watts_per_gpu: Decimal | float | int | None = None,
) -> Cost:
    """What ``usage`` cost at one pool's ``prices``: each span's GPU-hours split at the prices'
    validity boundaries and costed at the price of each part.

    1. The prices are ordered by their first day; two that share a day are refused (the database
       refuses them too: this guards a caller's hand-made list).
    2. Each span is cut at every boundary it crosses; each piece adds its GPU-hours to its price.
    3. Prices in two currencies are refused: the console converts nothing.
    """
    ordered = sorted(prices, key=lambda p: p.valid_from)
    windows = [_validity(p) for p in ordered]
    for i in range(1, len(ordered)):
        earlier_end = windows[i - 1][1]
        if earlier_end is None or earlier_end > windows[i][0]:
            raise CostError(f"{ordered[i - 1]} and {ordered[i]} are valid on the same days")
    currencies = {p.currency for p in ordered}
    if len(currencies) > 1:
        raise CostError(
            f"the prices are in {' and '.join(sorted(currencies))}: amounts in two currencies do not add up"
        )

    covered = [Decimal(0)] * len(ordered)
    uncovered = Decimal(0)
    for span in usage:
        gpus = span.gpus
        in_prices = Decimal(0)
        for i, (start, end) in enumerate(windows):
            overlap = min(span.end, end or span.end) - max(span.start, start)
            if overlap > timedelta(0):
                gpu_hours = gpus * _hours(overlap)
                covered[i] += gpu_hours
                in_prices += gpu_hours
        uncovered += gpus * _hours(span.end - span.start) - in_prices

    parts = tuple(
        CostPart(price, hourly(price, watts_per_gpu=watts_per_gpu), gpu_hours)
        for price, gpu_hours in zip(ordered, covered, strict=True)
        if gpu_hours
    )
    return Cost(next(iter(currencies), None), parts, uncovered)


def break_even_utilisation(
    price: PoolPrice,
    *,
    cloud_rate: Decimal | float | int | None = None,
    watts_per_gpu: Decimal | float | int | None = None,
) -> Decimal:
    """The utilisation (0..1, or above 1 where owning never pays) at which the pool's hourly cost,
    paid for every installed GPU-hour, equals renting only the used GPU-hours at ``cloud_rate``
    (default: the price's own ``cloud_rate_per_gpu_hour``): ``owned hourly / cloud rate``."""
    cloud = price.cloud_rate_per_gpu_hour if cloud_rate is None else cloud_rate
    if cloud is None or _decimal(cloud) <= 0:
        raise CostError(f"{price}: no cloud rate to compare with")
    return hourly(price, watts_per_gpu=watts_per_gpu).total / _decimal(cloud)


def _percent(fraction: Decimal) -> Decimal:
    return (fraction * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class OwnOrRent:
    """Owning against renting over the same installed GPU-hours, at a utilisation: ``cheaper`` is
    "renting", "owning" or None (equal to the whole percent), ``saving`` the cheaper one's saving
    as a fraction of the dearer one's cost ("A cost N % less than B" is (B - A) / B)."""

    utilisation: Decimal
    break_even: Decimal
    cheaper: str | None
    saving: Decimal

    def sentence(self) -> str:
        """The capacity page's line, e.g. "at 43 % utilisation, renting would have cost 18 % less"."""
        at = f"at {_percent(self.utilisation)} % utilisation"
        if self.cheaper is None:
            return f"{at}, owning and renting would have cost the same"
        if self.cheaper == "renting":
            return f"{at}, renting would have cost {_percent(self.saving)} % less"
        return f"{at}, owning cost {_percent(self.saving)} % less"


def own_or_rent(
    utilisation: Decimal | float | int,
    *,
    owned_hourly: Decimal | float | int,
    cloud_rate: Decimal | float | int,
) -> OwnOrRent:
    """Per installed GPU-hour, owning costs ``owned_hourly`` whatever the use; renting the used
    share costs ``utilisation x cloud_rate``. The cheaper one and by how much."""
    u, owned, cloud = _decimal(utilisation), _decimal(owned_hourly), _decimal(cloud_rate)
    if not 0 <= u <= 1:
        raise CostError(f"a utilisation of {u} is not between 0 and 1")
    if owned <= 0 or cloud <= 0:
        raise CostError("both the owned hourly cost and the cloud rate must be more than 0")
    renting = u * cloud
    if renting < owned:
        cheaper, saving = "renting", (owned - renting) / owned
    else:
        cheaper, saving = "owning", (renting - owned) / renting
    if _percent(saving) == 0:
        cheaper = None
    return OwnOrRent(u, owned / cloud, cheaper, saving)
