"""The power page: a server-rendered shell whose figures come from the snapshot API
(fleet.power.api) and the ``power`` topic's live pushes."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.inventory.models import Site
from fleet.power import read as power


class PowerDashboardView(DashboardRequiredMixin, TemplateView):
    template_name = "power/dashboard.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["has_sites"] = Site.objects.exists()
        context["idle_util_pct"] = power.IDLE_UTIL_PCT
        context["node_overhead_w"] = power.power_budget.node_overhead_w()
        context["page_config"] = {"snapshot_url": reverse("api:power-api:snapshot"), "topic": "power"}
        return context
