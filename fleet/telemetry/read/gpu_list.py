"""The fleet page's GPU table, paged and filtered on the server, and the health of GPUs.

At 100,000 GPUs no page holds the whole table: the HTML view (/fleet/?state=failed&page=2) and the
API (/api/v1/fleet/gpu-table/) read one page of it through the same FilterSet and the same query
parsing here, so a filter means one thing in both. A bad parameter is a TableQueryError naming it
(the API answers 400 with it, the page shows it).

A GPU's health, one definition for the site rows, the fleet totals, the table's ``state`` filter
and the worst-GPUs list:
- failed: an open XID or double-bit ECC finding (figures.gpus_with_open_xid_ecc);
- degraded: not failed, and not reporting (stale or never), clock-throttled, or at or above the
  thermal-slowdown temperature (detectors.THERMAL_TEMP_C);
- healthy: the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import django_filters
from django import forms
from django.db.models import Case, Count, F, IntegerField, Q, QuerySet, Value, When

from fleet.telemetry.detectors import THERMAL_TEMP_C
from fleet.telemetry.models import GpuState
from fleet.telemetry.read import figures

DEFAULT_SIZE = 50
MAX_SIZE = 200
MAX_PAGE = 100_000
WORST = 50  # the worst-GPUs list: bounded, whatever the fleet's size
HEALTH_FAILED, HEALTH_DEGRADED, HEALTH_HEALTHY = 0, 1, 2
HEALTH_NAMES = {HEALTH_FAILED: "failed", HEALTH_DEGRADED: "degraded", HEALTH_HEALTHY: "healthy"}

# Sort keys a client may ask for (``-temp`` descending): key -> the ORM ordering it means. Nulls
# sort last either way, so "hottest first" is not a page of GPUs that never reported a temperature.
SORTS: dict[str, tuple[str, ...]] = {
    "hostname": ("gpu__node__hostname", "gpu__index"),
    "site": ("gpu__node__site__name", "gpu__node__hostname", "gpu__index"),
    "model": ("gpu__model", "gpu__node__hostname", "gpu__index"),
    "health": ("health", "gpu__node__hostname", "gpu__index"),
    "util": ("gpu_util",),
    "temp": ("gpu_temp_c",),
    "mem_temp": ("memory_temp_c",),
    "power": ("power_w",),
    "sm_clock": ("sm_clock_mhz",),
    "xid": ("xid",),
    "ecc_dbe": ("ecc_dbe_total",),
    "ts": ("ts",),
}
DEFAULT_SORT = "hostname"
STATES = ("healthy", "degraded", "failed", "errors", "throttled", "stale")
PAGING_PARAMETERS = ("sort", "page", "size")


class TableQueryError(ValueError):
    """A bad table parameter: ``errors`` maps each parameter at fault to what is wrong with it."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class IntegerFilter(django_filters.Filter):
    field_class = forms.IntegerField


def _faulted_ids() -> list[str]:
    return list(figures.gpus_with_open_xid_ecc())


def degraded_q(cutoff: datetime) -> Q:
    """Reporting trouble short of a failure (on GpuState rows): stale, throttled or thermally hot."""
    return Q(ts__lt=cutoff) | Q(throttle_reasons__gt=1) | Q(gpu_temp_c__gte=THERMAL_TEMP_C)


def with_health(states: QuerySet[GpuState], *, faulted: list[str], cutoff: datetime) -> QuerySet[GpuState]:
    """GpuState rows annotated with ``health`` (0 failed, 1 degraded, 2 healthy): see the module."""
    return states.annotate(
        health=Case(
            When(gpu__uuid__in=faulted, then=Value(HEALTH_FAILED)),
            When(degraded_q(cutoff), then=Value(HEALTH_DEGRADED)),
            default=Value(HEALTH_HEALTHY),
            output_field=IntegerField(),
        )
    )


class GpuTableFilterSet(django_filters.FilterSet):
    """The GPU table's filters, shared by the HTML page and the API (netbox's one FilterSet)."""

    site = django_filters.CharFilter(field_name="gpu__node__site__name", help_text="site name")
    site_id = IntegerFilter(field_name="gpu__node__site_id", help_text="site id")
    hostname = django_filters.CharFilter(field_name="gpu__node__hostname", lookup_expr="icontains")
    model = django_filters.CharFilter(field_name="gpu__model", lookup_expr="icontains")
    q = django_filters.CharFilter(method="search", help_text="host, UUID or model contains")
    state = django_filters.ChoiceFilter(
        choices=[(s, s) for s in STATES], method="filter_state", help_text="health or a condition"
    )

    class Meta:
        model = GpuState
        fields = ["site", "site_id", "hostname", "model", "q", "state"]

    def search(self, queryset: QuerySet[GpuState], name: str, value: str) -> QuerySet[GpuState]:
        return queryset.filter(
            Q(gpu__node__hostname__icontains=value) | Q(gpu__uuid__icontains=value) | Q(gpu__model__icontains=value)
        )

    def filter_state(self, queryset: QuerySet[GpuState], name: str, value: str) -> QuerySet[GpuState]:
        cutoff = figures.stale_cutoff()
        if value == "errors":  # the same GPUs as the "GPUs with XID / ECC errors" figure
            return queryset.filter(gpu__uuid__in=_faulted_ids())
        if value == "throttled":
            return queryset.filter(throttle_reasons__gt=1)
        if value == "stale":
            return queryset.filter(ts__lt=cutoff)
        rank = {"failed": HEALTH_FAILED, "degraded": HEALTH_DEGRADED, "healthy": HEALTH_HEALTHY}[value]
        return with_health(queryset, faulted=_faulted_ids(), cutoff=cutoff).filter(health=rank)


FILTER_PARAMETERS = tuple(GpuTableFilterSet.base_filters)
TABLE_PARAMETERS = (*FILTER_PARAMETERS, *PAGING_PARAMETERS)


@dataclass(frozen=True)
class TableQuery:
    """One page of the table, as asked for: filters (only those given), sort, page, size."""

    filters: dict[str, str] = field(default_factory=dict)
    sort: str = DEFAULT_SORT
    page: int = 1
    size: int = DEFAULT_SIZE

    def as_params(self) -> dict[str, Any]:
        """Canonical parameters: the same view asked in any order or spelling is the same dict."""
        return {"filters": dict(sorted(self.filters.items())), "sort": self.sort, "page": self.page, "size": self.size}


def _whole(params: Any, name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    if not str(raw).isdigit() or not low <= int(raw) <= high:
        raise TableQueryError({name: f"Must be a whole number from {low} to {high}."})
    return int(raw)


def parse_query(params: Any, *, allowed_extra: tuple[str, ...] = ()) -> TableQuery:
    """The table page a query string asks for; TableQueryError names each parameter at fault. A
    parameter the table does not know is an error too (a typo would otherwise show everything)."""
    unknown = sorted(k for k in params if k not in TABLE_PARAMETERS and k not in allowed_extra)
    if unknown:
        known = ", ".join(TABLE_PARAMETERS)
        raise TableQueryError({k: f"Not a filter of the GPU table (use {known})." for k in unknown})
    filters = {k: str(params.get(k)) for k in FILTER_PARAMETERS if params.get(k) not in (None, "")}
    form = GpuTableFilterSet(filters, queryset=GpuState.objects.none()).form
    if not form.is_valid():
        raise TableQueryError({k: " ".join(str(m) for m in v) for k, v in form.errors.items()})
    sort = params.get("sort") or DEFAULT_SORT
    if sort.removeprefix("-") not in SORTS:
        raise TableQueryError({"sort": f"Unknown sort {sort[:40]!r}: one of {', '.join(SORTS)}, '-' for descending."})
    return TableQuery(
        filters=filters,
        sort=sort,
        page=_whole(params, "page", 1, 1, MAX_PAGE),
        size=_whole(params, "size", DEFAULT_SIZE, 1, MAX_SIZE),
    )


def query_from_params(params: dict[str, Any]) -> TableQuery:
    """The TableQuery of canonical parameters (TableQuery.as_params), as a live view keeps them."""
    return TableQuery(filters=dict(params["filters"]), sort=params["sort"], page=params["page"], size=params["size"])


def _ordering(sort: str) -> list[Any]:
    descending = sort.startswith("-")
    keys = SORTS[sort.removeprefix("-")]
    order = [F(k).desc(nulls_last=True) if descending else F(k).asc(nulls_last=True) for k in keys]
    return [*order, F("gpu_id").asc()]  # a stable order: paging never shows a GPU twice


def table_page(query: TableQuery) -> dict[str, Any]:
    """One page of the GPU table: ``count`` (GPUs matching the filters), the page's ``gpus`` rows
    (figures.gpu_row, with ``health``), and the query that made it. Physical GPUs only."""
    faulted = figures.gpus_with_open_xid_ecc()
    states = with_health(
        GpuState.objects.filter(gpu__parent__isnull=True), faulted=list(faulted), cutoff=figures.stale_cutoff()
    )
    states = GpuTableFilterSet(query.filters, queryset=states).qs
    count = states.count()
    start = (query.page - 1) * query.size
    rows = list(
        states.order_by(*_ordering(query.sort)).values(*figures.GPU_ROW_FIELDS, "health")[start : start + query.size]
    )
    return {
        "count": count,
        "page": query.page,
        "size": query.size,
        "pages": max(1, -(-count // query.size)),
        "sort": query.sort,
        "filters": query.filters,
        "gpus": rows_for_page(rows, faulted),
    }


def rows_for_page(rows: list[dict[str, Any]], faulted: dict[str, int]) -> list[dict[str, Any]]:
    """The page's rows as the table draws them (MIG-mode memory from the instances, health named)."""
    mig = figures.mig_memory(r["gpu_id"] for r in rows if r["fb_used_mib"] is None)
    return [{**figures.gpu_row(r, faulted=faulted, mig=mig), "health": HEALTH_NAMES[r["health"]]} for r in rows]


def worst_gpus(*, site_id: int | None = None, limit: int = WORST) -> list[dict[str, Any]]:
    """The worst GPUs, at most ``limit``: failed first, then degraded, hottest first within each,
    then the most errors (double-bit ECC, then XID). One top-N sort, whatever the fleet's size."""
    faulted = figures.gpus_with_open_xid_ecc()
    states = with_health(
        GpuState.objects.filter(gpu__parent__isnull=True), faulted=list(faulted), cutoff=figures.stale_cutoff()
    )
    if site_id is not None:
        states = states.filter(gpu__node__site_id=site_id)
    ordering = [
        F("health").asc(),
        F("gpu_temp_c").desc(nulls_last=True),
        F("ecc_dbe_total").desc(nulls_last=True),
        F("xid").desc(nulls_last=True),
        F("gpu_id").asc(),
    ]
    rows = list(states.order_by(*ordering).values(*figures.GPU_ROW_FIELDS, "health")[:limit])
    return rows_for_page(rows, faulted)


def healthy_by_site() -> dict[int, int]:
    """Per site, its healthy physical GPUs (see the module): reporting, not faulted, not degraded."""
    rows = (
        GpuState.objects.filter(gpu__parent__isnull=True)
        .exclude(gpu__uuid__in=_faulted_ids())
        .exclude(degraded_q(figures.stale_cutoff()))
        .values("gpu__node__site_id")
        .annotate(n=Count("pk"))
        .values_list("gpu__node__site_id", "n")
    )
    return dict(rows)
