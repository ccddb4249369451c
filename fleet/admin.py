from django.contrib import admin

from fleet.models import Gpu, IngestBatch, Node, Rack, Site


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


@admin.register(IngestBatch)
class IngestBatchAdmin(admin.ModelAdmin):
    list_display = ["key", "site", "samples", "received_at"]
    list_filter = ["site"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
