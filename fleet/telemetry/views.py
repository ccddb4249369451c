from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe
from django.views.generic import TemplateView

from console.permissions import DashboardRequiredMixin
from fleet.inventory.models import ClaimConflict, Gpu, Node, Site
from fleet.telemetry.fields import GPU_SAMPLE_FIELDS, MIG_INSTANCE_FIELDS, Field
from fleet.telemetry.forms import ScrapeTargetForm
from fleet.telemetry.models import ScrapeTarget
from fleet.telemetry.read import figures, gpu_list
from fleet.telemetry.xid import describe_throttle, describe_xid


def format_metric(field: Field, value: float | None) -> str:
    """A metric as a person reads it: units, separators, kWh for energy, % for ratios, XIDs named."""
    if value is None:
        return "–"
    if field.name == "xid":
        return describe_xid(int(value))
    if field.name == "throttle_reasons":
        return f"{describe_throttle(int(value))} (0x{int(value):x})"
    if field.name == "energy_mj":
        return f"{value / 3.6e9:,.1f} kWh"
    if field.unit == "µs":  # cumulative time throttled
        return f"{value / 1e6:,.1f} s"
    if field.unit == "ratio":
        return f"{value * 100:.0f} %"
    text = f"{value:,.0f}" if field.kind is int or float(value).is_integer() else f"{value:,.1f}"
    return f"{text} {field.unit}".strip()


# The GPU table's columns: (sort key or None, heading, numeric).
GPU_COLUMNS = [
    ("hostname", "Host", False),
    (None, "GPU", False),
    ("model", "Model", False),
    ("site", "Site", False),
    ("health", "Health", False),
    ("util", "Util %", True),
    (None, "Mem %", True),
    ("temp", "°C", True),
    ("mem_temp", "HBM °C", True),
    ("power", "W", True),
    ("sm_clock", "SM MHz", True),
    ("xid", "XID", True),
    ("ecc_dbe", "DBE", True),
    ("ts", "Last sample", False),
]
STATE_LABELS = {
    "healthy": "Healthy",
    "degraded": "Degraded",
    "failed": "Failed",
    "errors": "XID / ECC errors",
    "throttled": "Throttled",
    "stale": "Stale",
}


class FleetDashboardView(DashboardRequiredMixin, TemplateView):
    """The fleet page: sites, aggregates, the worst GPUs and one page of the GPU table, filtered by
    the query string through the same FilterSet as /api/v1/fleet/gpu-table/ (a bad filter: 400,
    named on the page)."""

    template_name = "fleet/dashboard.html"

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = self.get_context_data(**kwargs)
        return self.render_to_response(context, status=400 if context["table_errors"] else 200)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["ranges"] = list(figures.RANGES)
        context["default_range"] = figures.DEFAULT_RANGE
        context["stale_seconds"] = settings.FLEET_STALE_SECONDS
        # Samples held back until an Admin resolves who owns a GPU or node (fleet.inventory.claims).
        context["pending_claims"] = ClaimConflict.objects.pending().count()
        context.update(columns=GPU_COLUMNS, state_choices=list(STATE_LABELS.items()), page_sizes=[25, 50, 100, 200])
        context["site_choices"] = list(Site.objects.order_by("name").values("id", "name"))
        try:
            query = gpu_list.parse_query(self.request.GET, allowed_extra=("range", "from", "to"))
        except gpu_list.TableQueryError as exc:
            context.update(table=None, table_errors=exc.errors, table_query=gpu_list.TableQuery().as_params())
            return context
        context["table"] = gpu_list.table_page(query)
        context["table_total"] = Gpu.objects.physical().count()
        context["table_errors"] = {}
        context["table_query"] = query.as_params()
        return context


class GpuDetailView(DashboardRequiredMixin, TemplateView):
    template_name = "fleet/gpu_detail.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        gpu = get_object_or_404(Gpu.objects.select_related("node__site", "node__rack", "parent"), uuid=kwargs["uuid"])
        state = getattr(gpu, "state", None)
        context["gpu"] = gpu
        # A MIG instance has only its own fields; the rest are its physical GPU's.
        fields = [f for f in GPU_SAMPLE_FIELDS if not gpu.is_mig_instance or f.name in MIG_INSTANCE_FIELDS]
        instances = list(gpu.mig_instances.select_related("state").order_by("mig_instance_id", "uuid"))
        values = {f.name: getattr(state, f.name) if state else None for f in fields}
        from_instances = set()
        if instances and values.get("fb_used_mib") is None:
            # In MIG mode the GPU reports no framebuffer of its own: it is its instances' (as in
            # the fleet table, figures.mig_memory).
            used, free = figures.mig_memory([gpu.pk]).get(gpu.pk, (None, None))
            values.update(fb_used_mib=used, fb_free_mib=free)
            from_instances = {"fb_used_mib", "fb_free_mib"}
        context["metrics"] = [
            {
                "field": f,
                "text": format_metric(f, values[f.name])
                + (
                    f" (its {len(instances)} MIG instances)"
                    if f.name in from_instances and values[f.name] is not None
                    else ""
                ),
            }
            for f in fields
        ]
        context["instances"] = instances
        context["state"] = state
        context["ranges"] = list(figures.RANGES)
        context["default_range"] = figures.DEFAULT_RANGE
        # What gpu.js needs: where the snapshot is, which topic to follow, which charts to draw.
        context["page_config"] = {
            "series_url": reverse("api:fleet-api:gpu-series", args=[gpu.uuid]),
            "topic": f"gpu.{gpu.pk}",
            "mig": gpu.is_mig_instance,
        }
        return context


# Sections the rooms above telemetry add to the node page (fabric's ports, storage's mounts): a
# template and its context from the node, registered from the rooms' plugins.py (telemetry cannot
# import them).
_node_sections: list[tuple[int, str, Callable[[Node], dict[str, Any]]]] = []  # (order, template, context)


def register_node_section(template: str, context: Callable[[Node], dict[str, Any]], *, order: int) -> None:
    """Add a section; sections show by ``order``, whatever order the rooms' plugins load in."""
    if (order, template, context) not in _node_sections:
        _node_sections.append((order, template, context))
        _node_sections.sort(key=lambda section: section[0])


class NodeDetailView(DashboardRequiredMixin, TemplateView):
    template_name = "fleet/node_detail.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        node = get_object_or_404(Node.objects.select_related("site", "rack"), hostname=kwargs["hostname"])
        context["node"] = node
        gpus = list(node.gpus.select_related("state").order_by("index", "mig_instance_id", "uuid"))
        physical = [g for g in gpus if g.parent_id is None]
        for gpu in physical:  # MIG instances listed under their GPU
            gpu.instances = [g for g in gpus if g.parent_id == gpu.pk]
        context["gpus"] = physical
        context["incidents"] = figures.node_incidents(node)
        context["node_sections"] = [
            mark_safe(render_to_string(template, section(node), request=self.request))  # our templates, autoescaped
            for _, template, section in _node_sections
        ]
        context["ranges"] = list(figures.RANGES)
        context["default_range"] = figures.DEFAULT_RANGE
        context["page_config"] = {
            "series_url": reverse("api:fleet-api:node-series", args=[node.hostname]),
            "topic": f"node.{node.pk}",
        }
        return context


class ScrapeTargetListView(DashboardRequiredMixin, TemplateView):
    """Like Prometheus' targets page: each target's health, last scrape, duration, samples, error.

    Operators add targets here (POST); everyone with a role can read it.
    """

    template_name = "fleet/targets.html"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.has_perm("fleet.add_scrapetarget"):
            raise PermissionDenied("Adding scrape targets needs the Operator role.")
        form = ScrapeTargetForm(request.POST)
        if form.is_valid():
            target = form.save()
            messages.success(request, f"Added {target.name}; its first scrape runs within a few seconds.")
            return redirect("fleet:targets")
        return self.render_to_response(self.get_context_data(form=form))

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        targets = list(ScrapeTarget.objects.select_related("site").order_by("site__name", "name"))
        context["targets"] = targets
        context["counts"] = {
            health: sum(1 for t in targets if t.health == health) for health in ("up", "down", "unknown")
        }
        context["can_edit"] = self.request.user.has_perm("fleet.add_scrapetarget")
        context.setdefault("form", ScrapeTargetForm())
        return context
