"""The compliance records in Django's admin. Published summaries and the audit log are read-only
here as everywhere (the database refuses changes to them anyway)."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from compliance.models import (
    AuditEntry,
    BackupReport,
    CompliancePack,
    CrawledDomain,
    DataAsset,
    Dataset,
    GpaiModel,
    LegalHold,
    Lineage,
    ProcessorRecord,
    RecoveryItem,
    RestoreTest,
    RetentionPolicy,
    RetentionRun,
    SubjectRequest,
    SummaryVersion,
)
from compliance.services import gdpr


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, never added, changed or deleted here: what happened (runs, packs) and what is frozen
    (published summaries, audit entries; their tables' triggers refuse changes from any path).
    Every field is read-only, except those a subclass ``exclude``s."""

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return [f.name for f in self.model._meta.fields if f.name not in (self.exclude or ())]

    def has_add_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


# --- summary: published versions are frozen (the table's trigger refuses UPDATE and DELETE) ---


@admin.register(SummaryVersion)
class SummaryVersionAdmin(ReadOnlyAdmin):
    """Read-only: a published summary is published through the summary page, never edited."""

    list_display = ["model", "version", "last_update", "sha256", "published_by"]
    list_filter = ["model"]


# --- gdpr and retention: records of processing, requests, policies, holds; runs are read-only ---


@admin.register(DataAsset)
class DataAssetAdmin(admin.ModelAdmin):
    list_display = ["name", "data_class", "lawful_basis", "updated_at"]
    list_filter = ["data_class", "lawful_basis"]
    search_fields = ["name", "purposes"]


@admin.register(ProcessorRecord)
class ProcessorRecordAdmin(admin.ModelAdmin):
    list_display = ["name", "processor", "updated_at"]
    search_fields = ["name", "processor", "controllers"]


class SubjectRequestAdminForm(forms.ModelForm):
    def clean_status(self) -> str:
        status = self.cleaned_data["status"]
        current = self.instance.status if self.instance.pk else None
        error = gdpr.status_error(current, status)
        if error:
            raise forms.ValidationError(error)
        return status


@admin.register(SubjectRequest)
class SubjectRequestAdmin(admin.ModelAdmin):
    """Kind and date of receipt are fixed once logged, and corrections are logged on the records-of-
    processing page or through the API (gdpr.log_request closes the corrected request with them):
    here both, and the links, are read-only."""

    form = SubjectRequestAdminForm
    list_display = ["subject_reference", "kind", "received_on", "due_on", "status", "closed_on", "late"]
    list_filter = ["kind", "status"]
    readonly_fields = ["due_on", "corrects", "correction_reason"]
    filter_horizontal = ["assets"]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        if obj is None:
            return self.readonly_fields
        return [*self.readonly_fields, "kind", "received_on"]

    @admin.display(boolean=True, description="Late")
    def late(self, obj: SubjectRequest) -> bool:
        return obj.is_late()


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    list_display = ["data_class", "tenant", "days", "action", "owner", "review_due"]
    list_filter = ["data_class", "action"]


@admin.register(LegalHold)
class LegalHoldAdmin(admin.ModelAdmin):
    """A hold is placed here or on the retention page, and released only there (two people for
    the audit log's): once placed, it is read-only here and never deleted."""

    list_display = ["name", "data_class", "tenant", "placed_by", "placed_at", "released_at"]
    list_filter = ["data_class"]
    readonly_fields = ["placed_by", "placed_at", "released_at", "released_by", "release_requested_by"]
    readonly_fields += ["release_requested_at"]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        if obj is None:
            return self.readonly_fields
        return [f.name for f in self.model._meta.fields]

    def has_delete_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


@admin.register(RetentionRun)
class RetentionRunAdmin(ReadOnlyAdmin):
    """Read-only: a run is what happened."""

    list_display = ["started_at", "data_class", "tenant", "dry_run", "affected", "held", "triggered_by"]
    list_filter = ["data_class", "dry_run", "triggered_by"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """Read-only: no add, change or delete here (a POST to those views gets 403), and the database
    trigger refuses an UPDATE or DELETE from any other path."""

    list_display = ["at", "actor", "action", "app_label", "model", "object_id", "object_repr"]
    list_filter = ["action", "app_label", "model"]
    search_fields = ["actor", "object_id", "object_repr", "message"]
    date_hierarchy = "at"


@admin.register(CompliancePack)
class CompliancePackAdmin(ReadOnlyAdmin):
    """Read-only: packs are requested and downloaded on the pack page (which audits downloads);
    the zip itself is not shown here."""

    list_display = ["pk", "period_start", "period_end", "status", "progress", "size", "created_by", "created_at"]
    list_filter = ["status"]


# --- register: models, datasets with their crawled domains, lineage ---


@admin.register(GpaiModel)
class GpaiModelAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "provider_name", "placed_on_market", "training_compute_flop", "systemic_risk"]
    list_filter = ["weights_classification"]
    search_fields = ["name", "version", "provider_name"]
    autocomplete_fields = ["base_model"]

    @admin.display(boolean=True, description="Systemic risk")
    def systemic_risk(self, obj: GpaiModel) -> bool:
        return obj.systemic_risk


class CrawledDomainInline(admin.TabularInline):
    """Most bytes first; a crawl holds thousands, so imports go through the CSV on the dataset page."""

    model = CrawledDomain
    extra = 0
    ordering = ["-bytes", "domain"]


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "source_category", "modality", "size", "size_unit", "personal_data", "lawful_basis"]
    list_filter = ["source_category", "modality", "personal_data"]
    search_fields = ["name", "description", "licence"]
    inlines = [CrawledDomainInline]


@admin.register(Lineage)
class LineageAdmin(admin.ModelAdmin):
    list_display = ["model", "dataset", "job", "recorded_at", "recorded_by"]
    list_filter = ["model"]
    raw_id_fields = ["job"]
    readonly_fields = ["recorded_at", "recorded_by"]
    autocomplete_fields = ["model", "dataset"]


# --- the recovery register: items and restore tests are entered on /recovery/ or here (a blank RPO or
# RTO takes the class's default); backup reports come from the jobs themselves (POST
# /api/v1/recovery/backups/, Velero's metrics) and are shown, not edited ---


@admin.register(RecoveryItem)
class RecoveryItemAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "source_site", "source_tier", "method", "copy_site", "schedule", "rpo", "rto"]
    list_filter = ["kind", "method"]
    search_fields = ["name", "location", "schedule", "cluster"]
    raw_id_fields = ["job"]


@admin.register(BackupReport)
class BackupReportAdmin(ReadOnlyAdmin):
    list_display = ["item", "external_id", "finished", "outcome", "copy_site", "copy_tier"]
    list_filter = ["outcome"]


@admin.register(RestoreTest)
class RestoreTestAdmin(admin.ModelAdmin):
    list_display = ["item", "finished", "verified", "into"]
    list_filter = ["verified"]
