"""Forms of the records-of-processing page. Errors land on the field; the services' checks are the
ones the API asks too (compliance.services.gdpr)."""

from __future__ import annotations

from datetime import date
from typing import Any

from django import forms
from django.utils import timezone

from compliance.choices import RequestKind, RequestStatus
from compliance.models import DataAsset, ProcessorRecord, SubjectRequest
from compliance.models.gdpr import PROCESSOR_FIELDS, RECORD_FIELDS, received_on_error
from compliance.services import gdpr
from console.timebounds import BoundedDatesFormMixin

_DATE = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")


class DataAssetForm(BoundedDatesFormMixin, forms.ModelForm):
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


class ProcessorRecordForm(BoundedDatesFormMixin, forms.ModelForm):
    class Meta:
        model = ProcessorRecord
        fields = list(PROCESSOR_FIELDS)
        widgets = {
            name: forms.Textarea(attrs={"rows": 2})
            for name in ("controllers", "processing_categories", "third_country_transfers", "security_measures")
        }


class SubjectRequestForm(BoundedDatesFormMixin, forms.ModelForm):
    """A new request. Its kind and date of receipt are fixed once logged: no form changes them
    (RequestCorrectionForm logs a correction instead)."""

    class Meta:
        model = SubjectRequest
        fields = ["kind", "subject_reference", "received_on", "assets", "notes"]
        widgets = {
            "received_on": _DATE,
            "assets": forms.CheckboxSelectMultiple,
            "notes": forms.Textarea(attrs={"rows": 2}),
        }

    def clean_received_on(self) -> date:
        value = self.cleaned_data["received_on"]
        error = received_on_error(value, timezone.localdate())
        if error:
            raise forms.ValidationError(error)
        return value


class _RequestActionForm(BoundedDatesFormMixin, forms.Form):
    """A change to one logged request, checked whole with gdpr.request_errors."""

    request = forms.ModelChoiceField(queryset=SubjectRequest.objects.all(), widget=forms.HiddenInput)

    def _check(self, **changes: Any) -> None:
        request: SubjectRequest = self.cleaned_data["request"]
        values = {
            "received_on": request.received_on,
            "status": request.status,
            "closed_on": None,
            "extension_reason": request.extension_reason,
            "extension_notified_on": request.extension_notified_on,
            **changes,
        }
        for name, error in gdpr.request_errors(**values, today=timezone.localdate()).items():
            self.add_error(name if name in self.fields else None, error)


# The statuses set by hand: "corrected" is set by a correction only (gdpr.status_error).
SETTABLE_STATUSES = [(value, label) for value, label in RequestStatus.choices if value != RequestStatus.CORRECTED]


class RequestStatusForm(_RequestActionForm):
    """A request's status and, when it is completed or refused, the date it was (default: the date
    it already has, else today)."""

    status = forms.ChoiceField(choices=SETTABLE_STATUSES)
    closed_on = forms.DateField(required=False, widget=_DATE, label="Completed on")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "request" in cleaned and "status" in cleaned:
            error = gdpr.status_error(cleaned["request"].status, cleaned["status"])
            if error:
                self.add_error("status", error)
            else:
                self._check(status=cleaned["status"], closed_on=cleaned.get("closed_on"))
        return cleaned


class RequestCorrectionForm(BoundedDatesFormMixin, forms.Form):
    """A correction of a logged request (``request``): its right kind and date of receipt, and what
    was wrong. Logged as a new request that corrects it (gdpr.log_request), carrying over its
    subject, records and notes; the date may move earlier, never later (gdpr.correction_errors)."""

    request = forms.ModelChoiceField(queryset=SubjectRequest.objects.all(), widget=forms.HiddenInput)
    kind = forms.ChoiceField(choices=RequestKind.choices)
    received_on = forms.DateField(widget=_DATE, label="Received on")
    correction_reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), label="What was wrong")

    def clean_received_on(self) -> date:
        value = self.cleaned_data["received_on"]
        error = received_on_error(value, timezone.localdate())
        if error:
            raise forms.ValidationError(error)
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if {"request", "received_on", "correction_reason"} <= set(cleaned):
            errors = gdpr.correction_errors(
                cleaned["request"], received_on=cleaned["received_on"], reason=cleaned["correction_reason"]
            )
            for name, error in errors.items():
                self.add_error("request" if name == "corrects" else name, error)
        return cleaned


class RequestExtensionForm(_RequestActionForm):
    """The Art. 12(3) extension: why, and when the data subject was told (within the first month)."""

    extension_reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), label="Reason")
    extension_notified_on = forms.DateField(widget=_DATE, label="Data subject told on")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if {"request", "extension_reason", "extension_notified_on"} <= set(cleaned):
            self._check(
                extension_reason=cleaned["extension_reason"], extension_notified_on=cleaned["extension_notified_on"]
            )
        return cleaned
