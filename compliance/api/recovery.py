"""The recovery API, under /api/v1/recovery/ (console.urls).

* ``POST backups/``: a backup or replication job reports a run, with an agent token of the item's
  source site; idempotent on the job's run id (``id``): a repeat with the same figures is 200 with
  the stored record, with other figures a 409 naming them; 201 on create.
* ``GET items/``: the register for any role (a session or a personal token): each item with its
  last good backup's age against the RPO and its last restore test.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compliance.api.strict import KnownFieldsOnly
from compliance.choices import BackupOutcome
from compliance.models import BackupReport, RecoveryItem
from compliance.services import recovery
from console.authentication import AgentTokenAuthentication
from console.permissions import IsAgent
from console.timebounds import BoundedDatesSerializerMixin
from fleet.models import Site


def _find_item(value: str) -> RecoveryItem | None:
    """By name first; a name of digits only is also tried as the id."""
    item = RecoveryItem.objects.select_related("source_site").filter(name=value).first()
    if item is None and value.isdigit():
        item = RecoveryItem.objects.select_related("source_site").filter(pk=int(value)).first()
    return item


def _find_site(value: str) -> Site | None:
    site = Site.objects.filter(name=value).first()
    if site is None and value.isdigit():
        site = Site.objects.filter(pk=int(value)).first()
    return site


class BackupReportInSerializer(KnownFieldsOnly, BoundedDatesSerializerMixin, serializers.Serializer):
    """A backup run's report. ``item`` and ``copy_site`` take an id or a name."""

    item = serializers.CharField(max_length=200, help_text="The register item's name or id")
    id = serializers.CharField(max_length=200, help_text="The backup job's run id: a repeat is the same report")
    started = serializers.DateTimeField()
    finished = serializers.DateTimeField()
    bytes = serializers.IntegerField(min_value=0, max_value=2**63 - 1, required=False, allow_null=True)
    outcome = serializers.ChoiceField(choices=BackupOutcome.choices)
    copy_site = serializers.CharField(
        max_length=200, required=False, allow_null=True, help_text="Where the copy lives: a site's name or id"
    )
    copy_tier = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")

    def validate_item(self, value: str) -> RecoveryItem:
        item = _find_item(value)
        if item is None:
            raise serializers.ValidationError(f"No recovery item is named {value!r} (or has that id).")
        return item

    def validate_copy_site(self, value: str | None) -> Site | None:
        if value is None:
            return None
        site = _find_site(value)
        if site is None:
            raise serializers.ValidationError(f"No site is named {value!r} (or has that id).")
        return site

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["finished"] < attrs["started"]:
            raise serializers.ValidationError({"finished": "Is before started."})
        if attrs["finished"] > timezone.now() + recovery.CLOCK_SKEW:
            raise serializers.ValidationError({"finished": "Is in the future: a report is of a run that has ended."})
        return attrs


class BackupReportSerializer(serializers.ModelSerializer):
    item = serializers.SlugRelatedField(slug_field="name", read_only=True)
    id = serializers.CharField(source="external_id", read_only=True)
    record = serializers.IntegerField(source="pk", read_only=True)
    copy_site = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = BackupReport
        fields = [
            "record",
            "item",
            "id",
            "started",
            "finished",
            "bytes",
            "outcome",
            "copy_site",
            "copy_tier",
            "received_at",
        ]


class BackupReportView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request=BackupReportInSerializer,
        responses={
            200: BackupReportSerializer,
            201: BackupReportSerializer,
            400: OpenApiResponse(description="Invalid input; the body names the field"),
            401: OpenApiResponse(description="Missing or invalid agent token"),
            403: OpenApiResponse(description="The item is not at the token's site"),
            409: OpenApiResponse(description="The run id was reported before with other figures; the body names them"),
        },
        description="A backup or replication job reports a run of a recovery register item (agent token of the "
        "item's source site). Idempotent on the run id.",
    )
    def post(self, request: Request) -> Response:
        incoming = BackupReportInSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        item: RecoveryItem = data["item"]
        site_id = request.auth.site_id
        if item.source_site_id != site_id:
            where = f"site {item.source_site}" if item.source_site_id else "no site (set its source site)"
            return Response(
                {"error": f"Recovery item {item.name} is at {where}; this token reports for its own site only."},
                status=403,
            )
        copy_site = data.get("copy_site")
        try:
            report, created = recovery.record_backup(
                item=item,
                external_id=data["id"],
                started=data["started"],
                finished=data["finished"],
                bytes=data.get("bytes"),
                outcome=data["outcome"],
                copy_site_id=None if copy_site is None else copy_site.pk,
                copy_tier=data.get("copy_tier", ""),
            )
        except recovery.ReportConflict as conflict:
            return Response(
                {
                    "error": f"Run {conflict.existing.external_id} of {item.name} was reported before with other "
                    f"{', '.join(conflict.fields)}; nothing was changed.",
                    "fields": conflict.fields,
                    "record": BackupReportSerializer(conflict.existing).data,
                },
                status=409,
            )
        return Response(BackupReportSerializer(report).data, status=201 if created else 200)


def _seconds(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 1)


def item_row(state: recovery.ItemState, now: datetime) -> dict[str, Any]:
    """One item of the register as the API (and, next, the page) shows it."""
    item, good, test = state.item, state.last_good, state.last_test
    return {
        "id": item.pk,
        "kind": item.kind,
        "name": item.name,
        "dataset": item.dataset_id,
        "source_site": item.source_site.name if item.source_site else None,
        "source_tier": item.source_tier,
        "method": item.method,
        "rpo_seconds": item.rpo.total_seconds(),
        "rto_seconds": item.rto.total_seconds(),
        "restore_test_every_days": item.restore_test_every.days,
        "last_good_backup": None
        if good is None
        else {
            "id": good.external_id,
            "finished": good.finished,
            "age_seconds": _seconds(good.finished, now),
            "bytes": good.bytes,
            "copy_site": good.copy_site.name if good.copy_site else None,
            "copy_tier": good.copy_tier,
        },
        "rpo_state": recovery.rpo_state(state, now),
        "backup_failing": recovery.backup_failing(state),
        "same_site_copy": recovery.same_site_copy(state),
        "last_restore_test": None
        if test is None
        else {
            "finished": test.finished,
            "duration_seconds": test.duration.total_seconds(),
            "verified": test.verified,
            "into": test.into,
        },
        "rto_proven": not recovery.rto_unproven(state, now),
    }


class RecoveryItemListView(APIView):
    """Any role reads the register (the dashboard permission: RolePermission's default for a view
    without a queryset)."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, description="The recovery register with each item's state.")
    def get(self, request: Request) -> Response:
        now = timezone.now()
        return Response({"results": [item_row(state, now) for state in recovery.item_states()]})
