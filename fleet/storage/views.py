"""The storage page: a server-rendered shell whose figures come from the snapshot API
(fleet.storage.api) over the page's range and the ``storage`` topic's live pushes."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.storage import read


class StorageDashboardView(DashboardRequiredMixin, TemplateView):
    template_name = "storage/dashboard.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["ranges"] = list(read.PRESETS)
        context["default_range"] = read.DEFAULT_RANGE
        context["page_config"] = {"snapshot_url": reverse("api:storage-api:snapshot"), "topic": "storage"}
        return context
