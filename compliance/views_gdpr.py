"""The records-of-processing page (/compliance/processing/): the Art. 30 records and the log of
data-subject requests with their one-month due dates. Compliance officers and admins only."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.generic import TemplateView

from compliance.choices import RequestStatus
from compliance.forms_gdpr import DataAssetForm, RequestStatusForm, SubjectRequestForm
from compliance.models import DataAsset, SubjectRequest
from compliance.permissions import ComplianceRequiredMixin
from compliance.services import gdpr


class ProcessingView(ComplianceRequiredMixin, TemplateView):
    """POST ``action``: ``asset`` (a new record), ``request`` (a new data-subject request),
    ``status`` (a request's status), ``console-assets`` (the console's own records, where missing).
    A bad form re-renders with its errors on the fields (400) and writes nothing."""

    template_name = "compliance/gdpr/processing.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        today = timezone.localdate()
        requests = list(SubjectRequest.objects.prefetch_related("assets"))
        context.update(
            today=today,
            assets=DataAsset.objects.all(),
            requests=[{"request": r, "overdue": r.is_overdue(today)} for r in requests],
            open_count=sum(1 for r in requests if r.status in (RequestStatus.OPEN, RequestStatus.IN_PROGRESS)),
            overdue_count=sum(1 for r in requests if r.is_overdue(today)),
            statuses=RequestStatus.choices,
            missing_console_assets=sorted(
                set(gdpr.CONSOLE_ASSETS) - set(DataAsset.objects.values_list("name", flat=True))
            ),
        )
        context.setdefault("asset_form", DataAssetForm(prefix="asset"))
        context.setdefault("request_form", SubjectRequestForm(prefix="request", initial={"received_on": today}))
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        action = request.POST.get("action")
        if action == "console-assets":
            created = gdpr.ensure_console_assets()
            messages.success(request, f"Added {len(created)} record{'s' if len(created) != 1 else ''} of processing.")
        elif action == "asset":
            form = DataAssetForm(request.POST, prefix="asset")
            if not form.is_valid():
                return self.render_to_response(self.get_context_data(asset_form=form), status=400)
            asset = form.save()
            messages.success(request, f"Recorded {asset}.")
        elif action == "request":
            form = SubjectRequestForm(request.POST, prefix="request")
            if not form.is_valid():
                return self.render_to_response(self.get_context_data(request_form=form), status=400)
            with transaction.atomic():
                subject_request = form.save()
            messages.success(request, f"Logged {subject_request}, due {subject_request.due_on:%Y-%m-%d}.")
        elif action == "status":
            form = RequestStatusForm(request.POST)
            if not form.is_valid():
                return self.render_to_response(
                    self.get_context_data(action_error="Choose a request and a known status."), status=400
                )
            subject_request = gdpr.set_request_status(
                form.cleaned_data["request"], form.cleaned_data["status"], today=timezone.localdate()
            )
            messages.success(request, f"{subject_request}: {subject_request.get_status_display()}.")
        else:
            return self.render_to_response(self.get_context_data(action_error="Unknown action."), status=400)
        return redirect(reverse("compliance:processing"))
