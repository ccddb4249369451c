"""Cost: what a pool's GPU-hour costs, over dates.

A price is either a rate (``rate``: a cloud, reserved or on-demand price per GPU-hour, as the
invoice states it) or derived from owned hardware (``owned``: purchase price per GPU written off
over a number of months, the site's price per kWh times the data centre's PUE, and a yearly
operations cost per GPU). The arithmetic is in fleet.cost.prices; this module keeps the inputs.

Prices have validity dates, both inclusive, so last quarter's figures keep last quarter's prices:
a price change is a new row from the day it applies, the old one closed the day before. Two
prices of one pool may not share a day (an exclusion constraint; ``full_clean`` runs it too).
Days are UTC days, as the console's TIME_ZONE.
"""

from __future__ import annotations

from datetime import date

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import BigIntegerRangeField, DateRangeField, RangeOperators
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Func, Q, Value

from fleet.capacity.models import Pool

CURRENCY_PATTERN = r"^[A-Z]{3}$"


def default_currency() -> str:
    """GOODPUT_COST_CURRENCY (EUR unless set): the currency a new price is entered in."""
    return str(settings.COST_CURRENCY)


class PriceMode(models.TextChoices):
    RATE = "rate", "Rate per GPU-hour (cloud, reserved or on-demand)"
    OWNED = "owned", "Owned hardware (depreciation, energy, operations)"


# The fields each mode needs; the other mode's fields stay empty (a rate with a purchase price
# beside it would leave a reader guessing which one the figures used).
RATE_FIELDS = ("rate_per_gpu_hour",)
OWNED_FIELDS = (
    "purchase_price_per_gpu",
    "depreciation_months",
    "energy_price_per_kwh",
    "pue",
    "yearly_operations_per_gpu",
)


class DayRange(Func):
    """PostgreSQL's ``daterange(valid_from, valid_to, '[]')``: a null ``valid_to`` is open-ended."""

    function = "DATERANGE"
    output_field = DateRangeField()


class PoolIdRange(Func):
    """``int8range(pool_id, pool_id, '[]')``: the pool as a one-value range, so the exclusion
    constraint compares it with ``&&`` under GiST's built-in range operator class and needs no
    btree_gist extension (which the migrating role might not be allowed to create)."""

    function = "INT8RANGE"
    output_field = BigIntegerRangeField()


def _money(**kwargs: object) -> models.DecimalField:
    return models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True, **kwargs)


class PoolPriceQuerySet(models.QuerySet["PoolPrice"]):
    def valid_between(self, start: date, end: date) -> PoolPriceQuerySet:
        """Prices valid on at least one day of [start, end], both inclusive, oldest first."""
        return self.filter(Q(valid_to__isnull=True) | Q(valid_to__gte=start), valid_from__lte=end).order_by(
            "valid_from"
        )


class PoolPrice(models.Model):
    """One pool's price per GPU-hour from ``valid_from`` to ``valid_to`` (both inclusive; empty:
    until a later price closes it)."""

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="prices")
    valid_from = models.DateField()
    valid_to = models.DateField(null=True, blank=True, help_text="Last day it applies; empty: still in force")
    currency = models.CharField(
        max_length=3,
        default=default_currency,
        validators=[RegexValidator(CURRENCY_PATTERN, "An ISO 4217 code: three capital letters, e.g. EUR.")],
    )
    mode = models.CharField(max_length=8, choices=PriceMode.choices)
    # mode rate
    rate_per_gpu_hour = _money(help_text="What one GPU-hour costs (rate mode)")
    # mode owned
    purchase_price_per_gpu = _money(help_text="Purchase price per GPU, its share of the node included")
    depreciation_months = models.PositiveIntegerField(
        null=True, blank=True, help_text="Months the purchase is written off over, e.g. 48"
    )
    energy_price_per_kwh = _money(help_text="The site's price per kWh")
    pue = models.DecimalField(
        max_digits=4,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Power usage effectiveness of the data centre: facility power / IT power, at least 1",
    )
    yearly_operations_per_gpu = _money(help_text="Support, spares, staff and space per GPU and year")
    # Either mode: the rate the owner compares against for own-or-rent (fleet.cost.prices).
    cloud_rate_per_gpu_hour = _money(help_text="A cloud's price per GPU-hour for the same GPU, to compare with")
    note = models.CharField(max_length=200, blank=True, help_text="Where the figures come from: a contract, a quote")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PoolPriceQuerySet.as_manager()

    class Meta:
        ordering = ["pool", "valid_from"]
        constraints = [
            ExclusionConstraint(
                name="poolprice_no_overlap",
                expressions=[
                    (PoolIdRange(F("pool"), F("pool"), Value("[]")), RangeOperators.OVERLAPS),
                    (DayRange(F("valid_from"), F("valid_to"), Value("[]")), RangeOperators.OVERLAPS),
                ],
                violation_error_message="Another price of this pool is valid on some of these days.",
            ),
            models.CheckConstraint(
                condition=Q(valid_to__isnull=True) | Q(valid_to__gte=F("valid_from")),
                name="poolprice_valid_to_after_from",
                violation_error_message="The last day comes before the first.",
            ),
            models.CheckConstraint(condition=Q(currency__regex=CURRENCY_PATTERN), name="poolprice_currency_iso"),
            models.CheckConstraint(
                condition=(
                    Q(mode=PriceMode.RATE, rate_per_gpu_hour__gt=0)
                    & Q(**{f"{name}__isnull": True for name in OWNED_FIELDS})
                )
                | (
                    Q(
                        mode=PriceMode.OWNED,
                        purchase_price_per_gpu__gt=0,
                        depreciation_months__gt=0,
                        energy_price_per_kwh__gte=0,
                        pue__gte=1,
                        yearly_operations_per_gpu__gte=0,
                    )
                    & Q(rate_per_gpu_hour__isnull=True)
                ),
                name="poolprice_mode_fields",
                violation_error_message="A rate needs its rate only; owned hardware needs all five of its figures.",
            ),
            models.CheckConstraint(
                condition=Q(cloud_rate_per_gpu_hour__isnull=True) | Q(cloud_rate_per_gpu_hour__gt=0),
                name="poolprice_cloud_rate_positive",
            ),
        ]

    def __str__(self) -> str:
        until = self.valid_to.isoformat() if self.valid_to else "open"
        return f"{self.pool} {self.valid_from.isoformat()}..{until} ({self.mode}, {self.currency})"

    def clean(self) -> None:
        """Name the field at fault, where the constraints above could only refuse the row: a
        missing figure for the mode, one that belongs to the other mode, a number out of range."""
        errors: dict[str, str] = {}
        needed, unused = (RATE_FIELDS, OWNED_FIELDS) if self.mode == PriceMode.RATE else (OWNED_FIELDS, RATE_FIELDS)
        if self.mode in PriceMode.values:
            for name in needed:
                if getattr(self, name) is None:
                    errors[name] = f"Needed for {self.get_mode_display().split(' (')[0].lower()}."
            for name in unused:
                if getattr(self, name) is not None:
                    errors[name] = "Leave it empty: it belongs to the other mode."
        for name in ("rate_per_gpu_hour", "purchase_price_per_gpu", "depreciation_months", "cloud_rate_per_gpu_hour"):
            value = getattr(self, name)
            if value is not None and value <= 0 and name not in errors:
                errors[name] = "Must be more than 0."
        for name in ("energy_price_per_kwh", "yearly_operations_per_gpu"):
            value = getattr(self, name)
            if value is not None and value < 0 and name not in errors:
                errors[name] = "May not be negative (0 where it is included elsewhere)."
        if self.valid_to is not None and self.valid_from is not None and self.valid_to < self.valid_from:
            errors["valid_to"] = "The last day comes before the first."
        if errors:
            raise ValidationError(errors)
