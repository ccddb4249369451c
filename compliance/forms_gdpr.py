"""Forms of the records-of-processing page. Errors land on the field; the services' checks are the
ones the API asks too (compliance.services.gdpr)."""

from __future__ import annotations

from datetime import date
from typing import Any

from django import forms
from django.utils import timezone

from compliance.choices import RequestStatus
from compliance.models import DataAsset, SubjectRequest
from compliance.models.gdpr import RECORD_FIELDS, received_on_error
from compliance.services import gdpr


class DataAssetForm(forms.ModelForm):
    class Meta:
        model = DataAsset
        fields = list(RECORD_FIELDS)
        widgets = {
            name: forms.Textarea(attrs={"rows": 2})
            for name in (
                "purposes",
                "data_subject_categories",
                "personal_data_categories",
                "recipients",
                "third_country_transfers",
                "security_measures",
                "balancing_note",
            )
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        error = gdpr.balancing_note_error(cleaned.get("lawful_basis", ""), cleaned.get("balancing_note", ""))
        if error:
            self.add_error("balancing_note", error)
        return cleaned


class SubjectRequestForm(forms.ModelForm):
    class Meta:
        model = SubjectRequest
        fields = ["kind", "subject_reference", "received_on", "assets", "notes"]
        widgets = {
            "received_on": forms.DateInput(attrs={"type": "date"}),
            "assets": forms.CheckboxSelectMultiple,
            "notes": forms.Textarea(attrs={"rows": 2}),
        }

    def clean_received_on(self) -> date:
        value = self.cleaned_data["received_on"]
        error = received_on_error(value, timezone.localdate())
        if error:
            raise forms.ValidationError(error)
        return value


class RequestStatusForm(forms.Form):
    request = forms.ModelChoiceField(queryset=SubjectRequest.objects.all(), widget=forms.HiddenInput)
    status = forms.ChoiceField(choices=RequestStatus.choices)
