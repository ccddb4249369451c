"""The training pages: the goodput dashboard and one job. Server-rendered shells; their numbers
come from the snapshot APIs (fleet.training.api) and the live pushes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.training import read as training_read
from fleet.training.models import Job


class TrainingDashboardView(DashboardRequiredMixin, TemplateView):
    template_name = "training/dashboard.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["ranges"] = list(training_read.RANGES)
        context["default_range"] = training_read.DEFAULT_RANGE
        context["has_jobs"] = Job.objects.exists()
        context["page_config"] = {
            "overview_url": reverse("api:training-api:overview"),
            "topic": "training",
        }
        return context


# Sections the rooms above training add to the job page (fleet.correlation's hangs and stalls with
# its nodes' fabric and storage): a template and its context from the job, registered from
# their plugins.py (training cannot import them), as the node page's are.
_job_sections: list[tuple[int, str, Callable[[Job], dict[str, Any]]]] = []  # (order, template, context)


def register_job_section(template: str, context: Callable[[Job], dict[str, Any]], *, order: int) -> None:
    """Add a section; sections show by ``order``, whatever order the rooms' plugins load in."""
    if (order, template, context) not in _job_sections:
        _job_sections.append((order, template, context))
        _job_sections.sort(key=lambda section: section[0])


class JobDetailView(DashboardRequiredMixin, TemplateView):
    template_name = "training/job_detail.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        job = get_object_or_404(Job.objects.select_related("site"), pk=kwargs["pk"])
        context["job"] = job
        context["nodes"] = sorted(job.nodes.values_list("hostname", flat=True))
        context["job_sections"] = [
            mark_safe(render_to_string(template, section(job), request=self.request))  # our templates, autoescaped
            for _, template, section in _job_sections
        ]
        context["page_config"] = {
            "snapshot_url": reverse("api:training-api:job-snapshot", args=[job.pk]),
            "topic": f"job.{job.pk}",
            "job_id": job.pk,
        }
        return context
