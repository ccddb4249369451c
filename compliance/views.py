"""The compliance home page: where each record stands, and the way to each area."""

from __future__ import annotations

from typing import Any

from django.views.generic import TemplateView

from compliance.permissions import ComplianceRequiredMixin
from compliance.services import status


class ComplianceHomeView(ComplianceRequiredMixin, TemplateView):
    template_name = "compliance/home.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["status"] = status.compliance_status()
        return context
