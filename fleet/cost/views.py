"""The cost page: a server-rendered shell whose figures come from the snapshot API (fleet.cost.api)
over the page's range and the ``cost`` topic's live pushes."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.cost import read


class CostDashboardView(DashboardRequiredMixin, TemplateView):
    template_name = "cost/dashboard.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["ranges"] = list(read.PRESETS)
        context["default_range"] = read.DEFAULT_RANGE
        context["can_set_prices"] = self.request.user.has_perm("fleet.add_poolprice")
        context["page_config"] = {
            "snapshot_url": reverse("api:cost-api:snapshot"),
            "csv_url": reverse("api:cost-api:export"),
            "topic": "cost",
        }
        return context
