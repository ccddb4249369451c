"""The records-of-processing page (/compliance/processing/): the Art. 30 records (as controller and
as processor) and the log of data-subject requests with their due dates, extensions and completion
dates. Compliance officers and admins only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.generic import TemplateView

from compliance.choices import RequestKind
from compliance.gdpr.forms import (
    SETTABLE_STATUSES,
    DataAssetForm,
    ProcessorRecordForm,
    RequestCorrectionForm,
    RequestExtensionForm,
    RequestStatusForm,
    SubjectRequestForm,
)
from compliance.models import DataAsset, ProcessorRecord, SubjectRequest
from compliance.permissions import ComplianceRequiredMixin
from compliance.services import gdpr


def _form_error(form: forms.Form) -> str:
    """A bad row form's errors as one line naming each field, for the message above the tables."""
    return " ".join(
        f"{name}: {' '.join(errors)}" if name != "__all__" else " ".join(errors) for name, errors in form.errors.items()
    )


class ProcessingView(ComplianceRequiredMixin, TemplateView):
    """POST ``action``: ``asset`` (a new record as controller), ``processor`` (a new record as
    processor), ``request`` (a new data-subject request), ``status`` (a request's status and
    completion date), ``extension`` (a request's Art. 12(3) extension), ``correct`` (a correction
    of a request's kind or date of receipt: a new request linked to it, gdpr.log_request; nothing
    else changes them), ``console-assets`` (the console's own records, where missing). A bad form
    re-renders with its errors (400) and writes nothing."""

    template_name = "compliance/gdpr/processing.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        today = timezone.localdate()
        requests = list(SubjectRequest.objects.select_related("corrected_by").prefetch_related("assets"))
        context.update(
            today=today,
            assets=DataAsset.objects.all(),
            processor_records=ProcessorRecord.objects.all(),
            requests=[{"request": r, "overdue": r.is_overdue(today), "late": r.is_late()} for r in requests],
            # The tiles count as the compliance home does (compliance.services.status): one queryset each.
            open_count=SubjectRequest.objects.open().count(),
            overdue_count=SubjectRequest.objects.overdue(today).count(),
            late_count=SubjectRequest.objects.late().count(),
            statuses=SETTABLE_STATUSES,
            kinds=RequestKind.choices,
            missing_console_assets=sorted(
                set(gdpr.CONSOLE_ASSETS) - set(DataAsset.objects.values_list("name", flat=True))
            ),
        )
        context.setdefault("asset_form", DataAssetForm(prefix="asset"))
        context.setdefault("processor_form", ProcessorRecordForm(prefix="processor"))
        context.setdefault("request_form", SubjectRequestForm(prefix="request", initial={"received_on": today}))
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        action = request.POST.get("action")
        today = timezone.localdate()
        if action == "console-assets":
            created = gdpr.ensure_console_assets()
            messages.success(request, f"Added {len(created)} record{'s' if len(created) != 1 else ''} of processing.")
        elif action in ("asset", "processor"):
            form_class = DataAssetForm if action == "asset" else ProcessorRecordForm
            form = form_class(request.POST, prefix=action)
            if not form.is_valid():
                return self.render_to_response(self.get_context_data(**{f"{action}_form": form}), status=400)
            record = form.save()
            messages.success(request, f"Recorded {record}.")
        elif action == "request":
            form = SubjectRequestForm(request.POST, prefix="request")
            if not form.is_valid():
                return self.render_to_response(self.get_context_data(request_form=form), status=400)
            subject_request = gdpr.log_request(today=today, assets=form.cleaned_data.pop("assets"), **form.cleaned_data)
            messages.success(request, f"Logged {subject_request}, due {subject_request.due_on:%Y-%m-%d}.")
        elif action == "correct":
            correction_form = RequestCorrectionForm(request.POST)
            if not correction_form.is_valid():
                return self.render_to_response(
                    self.get_context_data(action_error=_form_error(correction_form)), status=400
                )
            corrected: SubjectRequest = correction_form.cleaned_data["request"]
            try:
                subject_request = gdpr.log_request(
                    today=today,
                    corrects=corrected,
                    correction_reason=correction_form.cleaned_data["correction_reason"],
                    kind=correction_form.cleaned_data["kind"],
                    received_on=correction_form.cleaned_data["received_on"],
                    subject_reference=corrected.subject_reference,
                    notes=corrected.notes,
                    assets=list(corrected.assets.all()),
                )
            except gdpr.RequestRefused as exc:  # corrected meanwhile by someone else
                return self.render_to_response(self.get_context_data(action_error=str(exc)), status=400)
            messages.success(
                request,
                f"Logged #{subject_request.pk}, correcting #{corrected.pk}: due {subject_request.due_on:%Y-%m-%d}.",
            )
        elif action == "status":
            status_form = RequestStatusForm(request.POST)
            if not status_form.is_valid():
                return self.render_to_response(self.get_context_data(action_error=_form_error(status_form)), status=400)
            subject_request = gdpr.set_request_status(
                status_form.cleaned_data["request"],
                status_form.cleaned_data["status"],
                today=today,
                closed_on=status_form.cleaned_data["closed_on"],
            )
            messages.success(request, f"{subject_request}: {subject_request.get_status_display()}.")
        elif action == "extension":
            extension_form = RequestExtensionForm(request.POST)
            if not extension_form.is_valid():
                return self.render_to_response(
                    self.get_context_data(action_error=_form_error(extension_form)), status=400
                )
            subject_request = gdpr.extend_request(
                extension_form.cleaned_data["request"],
                reason=extension_form.cleaned_data["extension_reason"],
                notified_on=extension_form.cleaned_data["extension_notified_on"],
            )
            messages.success(request, f"{subject_request}: extended, now due {subject_request.due_on:%Y-%m-%d}.")
        else:
            return self.render_to_response(self.get_context_data(action_error="Unknown action."), status=400)
        return redirect(reverse("compliance:processing"))
