"""Setting a pool's price: the one write path of the API (the admin saves through the same model
checks). The row is checked whole (``full_clean``: the mode's fields, the dates, no two prices of
one pool on one day) before anything is written; the audit log records it (compliance.signals:
fleet.PoolPrice is audited on every save, with the request's user as actor)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from fleet.cost.models import PoolPrice

OVERLAP = "Another price of this pool is valid on some of these days."


def _errors(exc: ValidationError) -> dict[str, list[str]]:
    if hasattr(exc, "error_dict"):
        return {
            ("valid_from" if k == "__all__" else k): [str(m) for e in v for m in e.messages]
            for k, v in exc.error_dict.items()
        }
    return {"valid_from": [str(m) for m in exc.messages]}


class PriceRefused(ValueError):
    """The price cannot be saved: ``errors`` names each field at fault."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


def save_price(price: PoolPrice | None = None, **values: Any) -> PoolPrice:
    """Create a price (``price`` None) or change one, checked whole first: nothing half-written."""
    price = price or PoolPrice()
    for name, value in values.items():
        setattr(price, name, value)
    try:
        price.full_clean()
    except ValidationError as exc:
        raise PriceRefused(_errors(exc)) from None
    try:
        with transaction.atomic():
            price.save()
    except IntegrityError:  # a concurrent save got the days first: the constraint says so
        raise PriceRefused({"valid_from": [OVERLAP]}) from None
    return price
