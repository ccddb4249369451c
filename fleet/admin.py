from django.contrib import admin, messages

from fleet.capacity.models import Pool, PowerApproval, ProcurementOrder, Reservation, TeamQuota
from fleet.choices import ClaimResolution
from fleet.inventory import claims
from fleet.inventory.models import ClaimConflict
from fleet.models import Endpoint, Gpu, IngestBatch, Node, PartitionDrop, Rack, ScrapeTarget, Site
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


@admin.register(ProcurementOrder)
class ProcurementOrderAdmin(admin.ModelAdmin):
    list_display = ["pool", "count", "ordered_on", "promised_on", "delivered_on", "status", "vendor", "reference"]
    list_filter = ["status", "pool__site"]


@admin.register(PowerApproval)
class PowerApprovalAdmin(admin.ModelAdmin):
    list_display = ["site", "added_kw", "expected_on", "status", "reference"]
    list_filter = ["status", "site"]


@admin.register(TeamQuota)
class TeamQuotaAdmin(admin.ModelAdmin):
    list_display = ["team", "pool", "nominal_gpus", "borrowing_limit_gpus"]
    list_filter = ["pool"]


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Read-mostly: approving goes through the API or the page, where supply and quota are checked."""

    list_display = ["team", "pool", "gpus", "start", "end", "tier", "priority", "state"]
    list_filter = ["state", "tier", "pool"]
    search_fields = ["team", "client_id"]
    readonly_fields = ["state", "approved_by", "approved_at", "created_by", "requested_via"]


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
