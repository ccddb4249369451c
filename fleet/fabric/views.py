"""The fabric page: a server-rendered shell whose figures come from the snapshot API
(fleet.fabric.api) over the page's range and the ``fabric`` topic's live pushes."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.fabric.read import health


class FabricDashboardView(DashboardRequiredMixin, TemplateView):
    template_name = "fabric/dashboard.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["ranges"] = list(health.PRESETS)
        context["default_range"] = health.DEFAULT_RANGE
        context["page_config"] = {"snapshot_url": reverse("api:fabric-api:snapshot"), "topic": "fabric"}
        return context
