"""Forms of the retention page: a policy, and a legal hold. The checks are the service's, so the
page and the API refuse the same things on the same field."""

from __future__ import annotations

from typing import Any

from django import forms

from compliance.models import LegalHold, RetentionPolicy
from compliance.services import retention
from console.timebounds import BoundedDatesFormMixin


class RetentionPolicyForm(BoundedDatesFormMixin, forms.ModelForm):
    class Meta:
        model = RetentionPolicy
        fields = ["data_class", "tenant", "days", "action", "owner", "review_due", "notes"]
        widgets = {"review_due": forms.DateInput(attrs={"type": "date"}), "notes": forms.Textarea(attrs={"rows": 2})}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "data_class" in cleaned:
            errors = retention.policy_errors(
                data_class=cleaned["data_class"],
                tenant=cleaned.get("tenant", ""),
                days=cleaned.get("days"),
                action=cleaned.get("action", ""),
                owner=cleaned.get("owner", ""),
                review_due=cleaned.get("review_due"),
            )
            for field, message in errors.items():
                self.add_error(field, message)
        return cleaned


class LegalHoldForm(BoundedDatesFormMixin, forms.ModelForm):
    incident_ids = forms.CharField(
        required=False, help_text="Incident numbers, comma-separated; empty holds them all", label="Incidents"
    )

    class Meta:
        model = LegalHold
        fields = ["name", "data_class", "tenant", "incident_ids", "reason"]
        widgets = {"reason": forms.Textarea(attrs={"rows": 2})}

    def clean_incident_ids(self) -> list[int]:
        raw = self.cleaned_data.get("incident_ids") or ""
        try:
            ids = [int(part) for part in raw.replace(" ", "").split(",") if part]
        except ValueError:
            raise forms.ValidationError("Give incident numbers separated by commas, e.g. 12, 40.") from None
        if any(i < 1 for i in ids):
            raise forms.ValidationError("Incident numbers are positive.")
        return ids

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "data_class" in cleaned and "incident_ids" in cleaned:
            for field, message in retention.hold_errors(
                data_class=cleaned["data_class"], incident_ids=cleaned["incident_ids"]
            ).items():
                self.add_error(field, message)
        return cleaned
