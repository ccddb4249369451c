"""The form that requests a compliance pack: a period, by default the last 90 days."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.utils import timezone

from compliance.services.pack import period_error
from console.timebounds import BoundedDatesFormMixin

DEFAULT_PERIOD_DAYS = 90


class PackForm(BoundedDatesFormMixin, forms.Form):
    period_start = forms.DateField(label="From", widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"))
    period_end = forms.DateField(
        label="To (included)", widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
    )

    @staticmethod
    def default_period() -> dict[str, Any]:
        today = timezone.localdate()
        return {"period_start": today - timedelta(days=DEFAULT_PERIOD_DAYS - 1), "period_end": today}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        start, end = cleaned.get("period_start"), cleaned.get("period_end")
        if start and end and (error := period_error(start, end)):
            self.add_error("period_end", error)
        return cleaned
