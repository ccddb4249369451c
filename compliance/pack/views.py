"""The compliance pack page: request a pack for a period, watch it build, download it.

The list is server-rendered; static/js/compliance_pack.js polls the API for the packs still
queued or running and moves their progress bars. Downloads go through the API route (the session
authenticates it), which audits each one.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.generic import TemplateView

from compliance.choices import PackStatus
from compliance.models import CompliancePack
from compliance.pack.forms import PackForm
from compliance.permissions import ComplianceRequiredMixin
from compliance.services.pack import MAX_PERIOD_DAYS, request_pack

LIST_LIMIT = 50


class PackListView(ComplianceRequiredMixin, TemplateView):
    template_name = "compliance/pack/list.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.setdefault("form", PackForm(initial=PackForm.default_period()))
        context["packs"] = CompliancePack.objects.select_related("created_by")[:LIST_LIMIT]
        context["max_period_days"] = MAX_PERIOD_DAYS
        # Packs are built one at a time (compliance.pack.tasks): say how many wait behind the one building.
        context["waiting"] = CompliancePack.objects.filter(status=PackStatus.QUEUED).count()
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        form = PackForm(request.POST)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        pack = request_pack(**form.cleaned_data, actor=request.user)
        messages.success(request, f"Compliance pack #{pack.pk} requested.")
        return redirect("compliance:pack-list")
