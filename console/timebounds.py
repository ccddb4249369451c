"""The one bound on client-supplied dates and times: ten years either side of today.

A reservation for year 9999 or a model change dated year 1 is a typo or a probe, never a plan;
past the bound, arithmetic on it overflows (a 36-month plan starting in 9997 reaches year 10000,
which Python's date cannot hold). Every door that takes a date or a time from a client checks
it here and answers 400 naming the field: DRF serializers and Django forms through the mixins,
query parameters through ``moment_problem``. (Telemetry doors keep their own, narrower windows.)
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone
from rest_framework import serializers

YEARS = 10


def _shifted(day: date, years: int) -> date:
    try:
        return day.replace(year=day.year + years)
    except ValueError:  # 29 February in a year without one
        return day.replace(year=day.year + years, day=28)


def bounds(today: date | None = None) -> tuple[date, date]:
    """The first and last day accepted (UTC)."""
    today = today or timezone.now().date()
    return _shifted(today, -YEARS), _shifted(today, YEARS)


def moment_problem(value: date | datetime, today: date | None = None) -> str | None:
    """Why ``value`` is refused, or None. Compared by calendar day, as given (a time near year 1 or
    9999 may have no UTC form to convert to)."""
    day = value.date() if isinstance(value, datetime) else value
    first, last = bounds(today)
    if day < first:
        return f"Is before {first.isoformat()}: at most {YEARS} years back are accepted."
    if day > last:
        return f"Is after {last.isoformat()}: at most {YEARS} years ahead are accepted."
    return None


def validate_moment(value: Any) -> None:
    """A field validator (Django forms and DRF both take it)."""
    if isinstance(value, date) and (problem := moment_problem(value)):
        raise ValidationError(problem, code="out_of_bounds")


_FORM_FIELDS = (forms.DateField, forms.DateTimeField)
_API_FIELDS = (serializers.DateField, serializers.DateTimeField)


class BoundedDatesFormMixin:
    """A form whose every date and time field is bounded (validate_moment)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():  # type: ignore[attr-defined]
            if isinstance(field, _FORM_FIELDS):
                field.validators = [*field.validators, validate_moment]


class BoundedDatesSerializerMixin:
    """A serializer whose every writable date and time field is bounded (validate_moment)."""

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()  # type: ignore[misc]
        for field in fields.values():
            if isinstance(field, _API_FIELDS) and not field.read_only:
                field.validators = [*field.validators, validate_moment]
        return fields
