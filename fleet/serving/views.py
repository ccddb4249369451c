"""The serving pages: the SLO overview and one endpoint. Server-rendered shells whose numbers come
from the snapshot APIs (fleet.serving.api) and the live pushes; the endpoint page also
carries the form that sets the endpoint's SLOs (Operators; fleet.change_endpoint)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.serving import read as serving_read
from fleet.serving.models import Endpoint

CHANGE_PERMISSION = "fleet.change_endpoint"


class EndpointSettingsForm(forms.ModelForm):
    """What SREs set on an endpoint: what it serves and its SLOs. The model's validators judge the
    values (ModelForm runs them): a target outside (0, 100) is an error on that field."""

    class Meta:
        model = Endpoint
        fields = list(serving_read.SETTINGS_FIELDS)
        labels = {
            "model_name": "Model",
            "ttft_threshold_ms": "TTFT threshold (ms)",
            "ttft_target_pct": "TTFT target (%)",
            "itl_threshold_ms": "ITL threshold (ms)",
            "itl_target_pct": "ITL target (%)",
            "availability_target_pct": "Availability target (%)",
            "slo_window_days": "SLO window (days)",
        }
        widgets = {
            "ttft_threshold_ms": forms.NumberInput(attrs={"step": "any"}),
            "ttft_target_pct": forms.NumberInput(attrs={"step": "any"}),
            "itl_threshold_ms": forms.NumberInput(attrs={"step": "any"}),
            "itl_target_pct": forms.NumberInput(attrs={"step": "any"}),
            "availability_target_pct": forms.NumberInput(attrs={"step": "any"}),
        }


class ServingDashboardView(DashboardRequiredMixin, TemplateView):
    template_name = "serving/dashboard.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["has_endpoints"] = Endpoint.objects.exists()
        context["burn_windows"] = serving_read.BURN_WINDOW_NAMES
        context["page_config"] = {"overview_url": reverse("api:serving-api:overview"), "topic": "serving"}
        return context


class EndpointDetailView(DashboardRequiredMixin, TemplateView):
    """GET: the page. POST: the settings form, for users with fleet.change_endpoint (403 otherwise,
    whatever the page showed); invalid values re-render the form with the errors, nothing saved."""

    template_name = "serving/endpoint_detail.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.has_perm(CHANGE_PERMISSION):
            raise PermissionDenied("Changing an endpoint's SLOs needs the Operator role.")
        endpoint = get_object_or_404(Endpoint, pk=kwargs["pk"])
        # The form works on its own copy: an invalid value must not show in the page's header.
        form = EndpointSettingsForm(request.POST, instance=Endpoint.objects.get(pk=endpoint.pk))
        if form.is_valid():
            values = {name: form.cleaned_data[name] for name in serving_read.SETTINGS_FIELDS}
            try:
                changed = serving_read.update_endpoint_settings(endpoint.pk, actor=request.user, values=values)
            except ValidationError as exc:  # a concurrent change the form did not see
                form.add_error(None, exc)
            else:
                if changed:
                    messages.success(request, f"Saved {endpoint.name}: {', '.join(form[f].label for f in changed)}.")
                else:
                    messages.info(request, "Nothing changed.")
                return redirect("serving:endpoint_detail", pk=endpoint.pk)
        return self.render_to_response(self.get_context_data(form=form, **kwargs), status=400)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        endpoint = get_object_or_404(Endpoint.objects.select_related("site"), pk=kwargs["pk"])
        can_edit = self.request.user.has_perm(CHANGE_PERMISSION)
        context["endpoint"] = endpoint
        context["can_edit"] = can_edit
        if can_edit:
            context.setdefault("form", EndpointSettingsForm(instance=endpoint))
        context["ranges"] = list(serving_read.RANGES)
        context["default_range"] = serving_read.DEFAULT_RANGE
        context["burn_windows"] = serving_read.BURN_WINDOW_NAMES
        context["page_config"] = {
            "snapshot_url": reverse("api:serving-api:endpoint-snapshot", args=[endpoint.pk]),
            "topic": f"endpoint.{endpoint.pk}",
            "endpoint_id": endpoint.pk,
        }
        return context
