"""The register pages: model versions and datasets, each a list with a create form and a detail
page with an edit form; the model page draws its lineage and records more, the dataset page
imports a crawler's per-domain CSV. A bad submit re-renders with the errors on the fields (400)
and writes nothing."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Case, Count, IntegerField, OuterRef, QuerySet, Subquery, Sum, When
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.generic import TemplateView

from compliance.choices import Modality, SourceCategory
from compliance.models.register import CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.permissions import ComplianceRequiredMixin
from compliance.register.forms import DatasetForm, DomainCsvForm, GpaiModelForm, LineageForm
from compliance.services import register

TOP_DOMAINS = 50
# The template's order (2.1 to 2.6), not the alphabet of the stored values.
_CATEGORY_ORDER = Case(*(When(source_category=value, then=i) for i, value in enumerate(SourceCategory.values)))


def _summary_url(model: GpaiModel) -> str | None:
    """The training-content summary of ``model``, when that page is installed."""
    try:
        return reverse("compliance:summary", args=[model.pk])
    except NoReverseMatch:
        return None


class ModelListView(ComplianceRequiredMixin, TemplateView):
    template_name = "compliance/register/model_list.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        form = GpaiModelForm(request.POST)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        model = form.save()
        return redirect("compliance:model-detail", pk=model.pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        today = timezone.localdate()
        models = list(
            GpaiModel.objects.select_related("base_model").annotate(datasets=Count("lineage__dataset", distinct=True))
        )
        for model in models:
            model.overdue = model.export_control_overdue(today)
        context["models"] = models
        context.setdefault("form", GpaiModelForm())
        return context


class ModelDetailView(ComplianceRequiredMixin, TemplateView):
    """One model version: its fields, the edit form (``action=edit``), the lineage graph and the
    form that records a link (``action=lineage``)."""

    template_name = "compliance/register/model_detail.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        model = get_object_or_404(GpaiModel, pk=kwargs["pk"])
        if request.POST.get("action") == "lineage":
            lineage_form = LineageForm(request.POST)
            if not lineage_form.is_valid():
                return self.render_to_response(self.get_context_data(lineage_form=lineage_form), status=400)
            register.record_lineage(model, user=request.user, **lineage_form.cleaned_data)
            return redirect(reverse("compliance:model-detail", args=[model.pk]) + "#lineage")
        form = GpaiModelForm(request.POST, instance=model)
        if not form.is_valid():
            # The instance now carries the rejected values: show the stored ones beside the form.
            return self.render_to_response(self.get_context_data(form=form), status=400)
        form.save()
        return redirect("compliance:model-detail", pk=model.pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        model = get_object_or_404(GpaiModel.objects.select_related("base_model"), pk=self.kwargs["pk"])
        context.update(
            model=model,
            content_types=[
                (m.label, text) for m in Modality if (text := getattr(model, f"content_types_{m.value}").strip())
            ],
            overdue=model.export_control_overdue(timezone.localdate()),
            lineage=model.lineage.select_related("dataset", "job", "recorded_by").order_by("dataset__name"),
            graph=register.lineage_graph(model),
            summary_url=_summary_url(model),
        )
        context.setdefault("form", GpaiModelForm(instance=model))
        context.setdefault("lineage_form", LineageForm())
        return context


class DatasetListView(ComplianceRequiredMixin, TemplateView):
    template_name = "compliance/register/dataset_list.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        form = DatasetForm(request.POST)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        dataset = form.save()
        return redirect("compliance:dataset-detail", pk=dataset.pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        # Counted in subqueries: two joined counts would multiply lineage rows by domain rows.
        context["datasets"] = Dataset.objects.annotate(
            models=_count(Lineage.objects.filter(dataset=OuterRef("pk")), "model"),
            domain_count=_count(CrawledDomain.objects.filter(dataset=OuterRef("pk")), "pk"),
        ).order_by(_CATEGORY_ORDER, "name")
        context.setdefault("form", DatasetForm())
        return context


def _count(rows: QuerySet[Any], field: str) -> Coalesce:
    """COUNT(DISTINCT field) of ``rows`` as a scalar subquery (0 when there are none)."""
    counted = rows.order_by().values("dataset").annotate(n=Count(field, distinct=True)).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


class DatasetDetailView(ComplianceRequiredMixin, TemplateView):
    """One dataset: its fields, the edit form (``action=edit``), its top domains by bytes and, for
    crawled data, the CSV import (``action=domains``) whose bad line shows on the file field."""

    template_name = "compliance/register/dataset_detail.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        dataset = get_object_or_404(Dataset, pk=kwargs["pk"])
        if request.POST.get("action") == "domains":
            csv_form = DomainCsvForm(request.POST, request.FILES)
            if csv_form.is_valid():
                try:
                    register.import_domains(dataset, csv_form.cleaned_data["file"])
                except ValidationError as exc:
                    csv_form.add_error("file", exc)
                else:
                    return redirect(reverse("compliance:dataset-detail", args=[dataset.pk]) + "#domains")
            return self.render_to_response(self.get_context_data(csv_form=csv_form), status=400)
        form = DatasetForm(request.POST, instance=dataset)
        if not form.is_valid():
            return self.render_to_response(self.get_context_data(form=form), status=400)
        form.save()
        return redirect("compliance:dataset-detail", pk=dataset.pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        # Fetched afresh: a rejected edit form holds the rejected values on its own instance.
        dataset = get_object_or_404(Dataset, pk=self.kwargs["pk"])
        totals = dataset.domains.aggregate(count=Count("pk"), bytes=Sum("bytes"))
        domains = list(dataset.domains.all()[:TOP_DOMAINS])
        for domain in domains:
            domain.share = 100 * domain.bytes / totals["bytes"] if totals["bytes"] else 0
        context.update(
            dataset=dataset,
            crawled=dataset.source_category == SourceCategory.CRAWLED,
            domains=domains,
            domain_count=totals["count"],
            domain_bytes=totals["bytes"] or 0,
            top_domains=TOP_DOMAINS,
            lineage=dataset.lineage.select_related("model", "job").order_by("model__name", "model__version"),
        )
        context.setdefault("form", DatasetForm(instance=dataset))
        context.setdefault("csv_form", DomainCsvForm())
        return context
