from __future__ import annotations

from typing import Any

from django import forms

from console.timebounds import BoundedDatesFormMixin
from fleet.capacity.models import Pool, Reservation


class ReservationForm(BoundedDatesFormMixin, forms.ModelForm):
    """An Operator's request for GPUs on a pool for one of the teams (an Admin adds teams). The
    model's validators judge the count (at least one GPU); the window is checked here so that an
    end before the start is an error on ``end``; the team's quota is checked by the service when
    the request is recorded. Times are UTC, as the console shows them."""

    class Meta:
        model = Reservation
        fields = ["team", "pool", "gpus", "start", "end", "tier", "priority"]
        labels = {"gpus": "GPUs", "start": "Start (UTC)", "end": "End (UTC)"}
        widgets = {
            "gpus": forms.NumberInput(attrs={"min": 1}),
            "start": forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
            "end": forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["pool"].queryset = Pool.objects.select_related("site").order_by("site__name", "name")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        start, end = cleaned.get("start"), cleaned.get("end")
        if start is not None and end is not None and end <= start:
            self.add_error("end", "Must be after the start.")
        return cleaned


class ReservationChangeForm(ReservationForm):
    """A change to a reservation by its requester or an Admin (the page's ``change`` action): what
    it asks for and its note. The service decides what the change does (back to requested once
    approved, refused once active) and writes the audit entry; this form only reads the values."""

    class Meta(ReservationForm.Meta):
        fields = [*ReservationForm.Meta.fields, "note"]
        widgets = {**ReservationForm.Meta.widgets, "note": forms.Textarea(attrs={"rows": 2})}
