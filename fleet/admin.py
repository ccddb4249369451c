from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from fleet.capacity.actions import approvals
from fleet.capacity.actions.approvals import ConflictError
from fleet.capacity.models import (
    OrderApproval,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    Team,
    TeamQuota,
)
from fleet.choices import ClaimResolution
from fleet.cost.models import PoolPrice
from fleet.inventory import claims
from fleet.inventory.models import ClaimConflict, NodeInterface, NodeMount
from fleet.models import Endpoint, Gpu, IngestBatch, Node, PartitionDrop, Rack, ScrapeTarget, Site
from fleet.scheduler.models import SchedulerQueue
from fleet.serving.models import EndpointChange, EndpointEval


class RackInline(admin.TabularInline):
    model = Rack
    extra = 0


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ["name", "region", "contracted_power_kw"]
    search_fields = ["name", "region"]
    inlines = [RackInline]


@admin.register(Rack)
class RackAdmin(admin.ModelAdmin):
    list_display = ["name", "site", "power_budget_kw"]
    list_filter = ["site"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "site", "rack", "instance_type", "interconnect"]
    list_filter = ["site", "interconnect"]
    search_fields = ["hostname"]


class _SeenByIngest(admin.ModelAdmin):
    """Created by the ingest door on first sighting; an Operator sets only what it cannot know."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields if f.name not in self.editable]


@admin.register(NodeInterface)
class NodeInterfaceAdmin(_SeenByIngest):
    """A node's network and InfiniBand ports: its kind (node_exporter cannot tell RoCE from
    Ethernet) and which fabric it serves (the link-flap severity and /fabric/ read it)."""

    editable = ("kind", "fabric")
    list_display = ["node", "name", "kind", "fabric", "rate_bytes_per_second"]
    list_filter = ["kind", "fabric", "node__site"]
    search_fields = ["node__hostname", "name"]
    list_select_related = ["node"]


@admin.register(NodeMount)
class NodeMountAdmin(_SeenByIngest):
    """A node's mounts: its purpose (datasets, checkpoints) decides which storage detectors judge it."""

    editable = ("purpose",)
    list_display = ["node", "mountpoint", "fstype", "device", "purpose"]
    list_filter = ["purpose", "fstype", "node__site"]
    search_fields = ["node__hostname", "mountpoint"]
    list_select_related = ["node"]


@admin.register(SchedulerQueue)
class SchedulerQueueAdmin(_SeenByIngest):
    """A scheduler's queues (ClusterQueues, partitions, namespaces): the pool each admits onto and
    the team whose work it admits."""

    editable = ("pool", "team")
    list_display = ["site", "scheduler", "name", "cohort", "pool", "team"]
    list_filter = ["scheduler", "site"]
    search_fields = ["name", "cohort"]
    list_select_related = ["site", "pool__site", "team"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "node", "index", "model", "hbm_gib"]
    list_filter = ["model", "node__site"]
    search_fields = ["uuid", "node__hostname"]
    list_select_related = ["node"]


# Django adds an "s" to a model's name: "ingest batchs". The plural is a display name only, set
# here rather than in the model's Meta, which would need a migration for no change in the database.
IngestBatch._meta.verbose_name_plural = "ingest batches"


@admin.register(IngestBatch)
class IngestBatchAdmin(admin.ModelAdmin):
    list_display = ["key", "site", "samples", "received_at"]
    list_filter = ["site"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["name", "site", "framework", "model_name", "version", "region", "replicas", "created_at"]
    list_filter = ["site", "framework", "region"]
    search_fields = ["name", "model_name"]
    autocomplete_fields = ["gpus", "scrape_targets"]
    fieldsets = [
        (None, {"fields": ["site", "name", "framework", "model_name", "version", "region", "replicas"]}),
        ("Serving from", {"fields": ["gpus", "scrape_targets"]}),
        (
            "SLOs",
            {
                "fields": [
                    "ttft_threshold_ms",
                    "ttft_target_pct",
                    "itl_threshold_ms",
                    "itl_target_pct",
                    "availability_target_pct",
                    "slo_window_days",
                ]
            },
        ),
    ]


@admin.register(EndpointChange)
class EndpointChangeAdmin(admin.ModelAdmin):
    list_display = ["endpoint", "ts", "kind", "from_value", "to_value", "model_version", "created_by"]
    list_filter = ["kind", "endpoint__site"]
    search_fields = ["endpoint__name", "from_value", "to_value", "model_version", "note"]
    list_select_related = ["endpoint", "created_by"]
    raw_id_fields = ["endpoint", "created_by"]
    readonly_fields = ["created_at"]


@admin.register(EndpointEval)
class EndpointEvalAdmin(admin.ModelAdmin):
    list_display = ["endpoint", "ts", "suite", "metric", "score", "model_version", "higher_is_better"]
    list_filter = ["suite", "endpoint__site"]
    search_fields = ["endpoint__name", "suite", "metric", "model_version"]
    list_select_related = ["endpoint"]
    raw_id_fields = ["endpoint"]
    readonly_fields = ["created_at"]


@admin.register(ScrapeTarget)
class ScrapeTargetAdmin(admin.ModelAdmin):
    list_display = ["name", "site", "url", "kind", "enabled", "health", "last_scrape_at", "last_samples"]
    list_filter = ["site", "kind", "health", "enabled"]
    search_fields = ["name", "url"]
    readonly_fields = ["health", "last_scrape_at", "last_duration_ms", "last_samples", "last_error", "created_at"]


@admin.register(PartitionDrop)
class PartitionDropAdmin(admin.ModelAdmin):
    list_display = ["partition", "table", "range_start", "range_end", "rows", "bytes", "dropped_at"]
    list_filter = ["table"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "site", "gpu_model"]
    list_filter = ["site"]


@admin.register(PoolPrice)
class PoolPriceAdmin(admin.ModelAdmin):
    """A pool's price per GPU-hour over dates: a rate, or owned hardware's figures
    (fleet.cost.prices derives the rate). A price change is a new row; the old one gets its last day."""

    list_display = [
        "pool",
        "valid_from",
        "valid_to",
        "mode",
        "currency",
        "rate_per_gpu_hour",
        "cloud_rate_per_gpu_hour",
    ]
    list_filter = ["mode", "pool__site", "currency"]
    list_select_related = ["pool__site"]
    fieldsets = [
        (None, {"fields": ["pool", "valid_from", "valid_to", "currency", "mode", "note"]}),
        ("Rate", {"fields": ["rate_per_gpu_hour"]}),
        (
            "Owned hardware",
            {
                "fields": [
                    "purchase_price_per_gpu",
                    "depreciation_months",
                    "energy_price_per_kwh",
                    "pue",
                    "yearly_operations_per_gpu",
                ]
            },
        ),
        ("Own or rent", {"fields": ["cloud_rate_per_gpu_hour"]}),
    ]


class _ApprovalAdmin(admin.ModelAdmin):
    """Orders and power approvals: created requested by whoever adds them, approved or rejected
    with the actions, through fleet.capacity.actions.approvals (separation of duties). Once approved, an
    edit may not add supply (approvals.refused_changes)."""

    decision_field: str
    approval_fields = ["requested_by", "approved_by", "approved_at", "self_approved", "rejected_by", "rejected_at"]
    actions = ["approve_selected", "reject_selected"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [self.decision_field, *self.approval_fields]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        instance = obj

        class ApprovedStaysApproved(form):  # type: ignore[misc, valid-type]
            def clean(self) -> dict[str, Any]:
                cleaned = super().clean()
                if instance is not None:
                    for name, why in approvals.refused_changes(instance, cleaned).items():
                        self.add_error(name if name in self.fields else None, why)
                return cleaned

        return ApprovedStaysApproved

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:  # a request: the approval is a separate step, by someone else
            obj.requested_by = request.user
        super().save_model(request, obj, form, change)

    def _decide(self, request: HttpRequest, queryset: Any, decide: Any, verb: str) -> None:
        done, refused = 0, []
        for obj in queryset:
            try:
                decide(obj, actor=request.user)
                done += 1
            except (approvals.ApprovalRefused, ConflictError) as exc:
                refused.append(f"{obj}: {exc}")
        if done:
            self.message_user(request, f"{verb} {done}.")
        for why in refused:
            self.message_user(request, why, level=messages.ERROR)


@admin.register(ProcurementOrder)
class ProcurementOrderAdmin(_ApprovalAdmin):
    list_display = [
        "pool",
        "count",
        "ordered_on",
        "promised_on",
        "delivered_on",
        "status",
        "approval_status",
        "requested_by",
        "approved_by",
        "vendor",
        "reference",
    ]
    list_filter = ["status", "approval_status", "pool__site"]
    decision_field = "approval_status"

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            obj.approval_status = OrderApproval.REQUESTED  # the model's default is approved (ORM paths)
        super().save_model(request, obj, form, change)

    @admin.action(description="Approve selected orders (not your own)", permissions=["change"])
    def approve_selected(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, approvals.approve_order, "Approved")

    @admin.action(description="Reject selected orders", permissions=["change"])
    def reject_selected(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, approvals.reject_order, "Rejected")


@admin.register(PowerApproval)
class PowerApprovalAdmin(_ApprovalAdmin):
    list_display = ["site", "added_kw", "expected_on", "status", "requested_by", "approved_by", "reference"]
    list_filter = ["status", "site"]
    decision_field = "status"

    @admin.action(description="Approve selected power approvals (not your own)", permissions=["change"])
    def approve_selected(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, approvals.approve_power, "Approved")

    @admin.action(description="Reject selected power approvals", permissions=["change"])
    def reject_selected(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, approvals.reject_power, "Rejected")


class TeamQuotaInline(admin.TabularInline):
    model = TeamQuota
    fields = ["pool", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"]
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Teams with their members and their quotas per pool (Kueue: a ClusterQueue per pool)."""

    list_display = ["name", "created_at"]
    search_fields = ["name"]
    filter_horizontal = ["members"]
    inlines = [TeamQuotaInline]


@admin.register(TeamQuota)
class TeamQuotaAdmin(admin.ModelAdmin):
    """Quotas are set by an Admin or a Capacity approver (fleet.capacity.actions.approvals)."""

    list_display = ["team", "pool", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"]
    list_filter = ["pool"]
    autocomplete_fields = ["team"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and approvals.may_change_quota(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and approvals.may_change_quota(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and approvals.may_change_quota(request.user)


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Read-mostly: approving and changing what a reservation asks for go through the API or the
    page, where supply, quota and who may change it (its requester, fleet.capacity.actions.approvals) are
    checked; here only its note."""

    list_display = ["team", "pool", "gpus", "start", "end", "tier", "priority", "state"]
    list_filter = ["state", "tier", "pool"]
    search_fields = ["team__name", "client_id"]
    readonly_fields = [
        "team",
        "pool",
        "gpus",
        "start",
        "end",
        "tier",
        "priority",
        "client_id",
        "state",
        "approved_by",
        "approved_at",
        "self_approved",
        "created_by",
        "requested_via",
        "preempted_at",
        "preempted_by",
        "preempted_reason",
    ]


@admin.register(ClaimConflict)
class ClaimConflictAdmin(admin.ModelAdmin):
    """Another site's GPU UUID or hostname sent by a site's token: an Admin keeps it with its
    owner or moves it to the claimant (fleet.inventory.claims; both audited). Nothing else here
    changes a claim: it is recorded by the ingest doors."""

    list_display = [
        "kind",
        "value",
        "owner_site",
        "claimant_site",
        "claimant_hostname",
        "count",
        "first_seen",
        "last_seen",
        "resolution",
        "resolved_by",
        "resolved_at",
    ]
    list_filter = ["resolution", "kind", "claimant_site", "owner_site"]
    search_fields = ["value", "claimant_hostname"]
    list_select_related = ["owner_site", "claimant_site", "resolved_by"]
    actions = ["keep_with_owner", "move_to_claimant"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return [f.name for f in ClaimConflict._meta.fields]

    def _resolve(self, request, queryset, resolution: str) -> None:  # type: ignore[no-untyped-def]
        done = 0
        for conflict in queryset.order_by("pk"):
            try:
                claims.resolve(conflict, resolution=resolution, actor=request.user)
            except claims.ClaimError as exc:
                self.message_user(request, f"{conflict}: {exc}", level=messages.ERROR)
            else:
                done += 1
        if done:
            self.message_user(request, f"{done} claim(s) resolved.", level=messages.SUCCESS)

    @admin.action(description="Keep with the owning site", permissions=["change"])
    def keep_with_owner(self, request, queryset):  # type: ignore[no-untyped-def]
        self._resolve(request, queryset, ClaimResolution.KEPT)

    @admin.action(description="Move to the claiming site", permissions=["change"])
    def move_to_claimant(self, request, queryset):  # type: ignore[no-untyped-def]
        self._resolve(request, queryset, ClaimResolution.MOVED)
