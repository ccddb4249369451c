"""The recovery API, under /api/v1/recovery/ (goodput.urls).

* ``POST backups/``: a backup or replication job reports a run, with an agent token of the item's
  source site; idempotent on the job's run id (``id``): a repeat with the same figures is 200 with
  the stored record, with other figures a 409 naming them; 201 on create.
* ``GET items/``: the register for the roles that read it (compliance.view_recoveryitem: Operators,
  Compliance officers, Admins; a session or a personal token): each item with its last good
  backup's age against the RPO, its last restore test and its state.
* ``POST restore-tests/``: a restore test, from a person with compliance.add_restoretest or an agent
  token of the item's source site; idempotent on ``key``: a repeat with the same figures is 200
  with the stored record, with other figures a 409 naming them; 201 on create.

To an agent token, another site's items do not exist: the same 400 as a name nobody has, so a
token cannot learn what other sites back up, nor where.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compliance.choices import BackupOutcome
from compliance.models import BackupReport, RecoveryItem, RestoreTest
from compliance.permissions import RECOVERY_VIEW, RESTORE_TEST_ADD
from compliance.serializers import KnownFieldsOnly
from compliance.services import recovery
from console.authentication import AgentOrPersonalTokenAuthentication, AgentTokenAuthentication
from console.models import AgentToken
from console.permissions import IsAgent, RoleOrSiteAgentWritePermission, RolePermission
from console.timebounds import BoundedDatesSerializerMixin
from fleet.models import Site


def _find_item(value: str, *, site_id: int | None = None) -> RecoveryItem | None:
    """By name first; a name of digits only is also tried as the id. With ``site_id`` (an agent
    token's site), only that site's items are looked at: the site is checked before the name."""
    items = RecoveryItem.objects.select_related("source_site")
    if site_id is not None:
        items = items.filter(source_site_id=site_id)
    item = items.filter(name=value).first()
    if item is None and value.isdigit():
        item = items.filter(pk=int(value)).first()
    return item


def _validate_item(value: str, context: dict[str, Any]) -> RecoveryItem:
    """The item ``value`` names, as the caller may see it: an agent token (``context["site_id"]``)
    gets the same answer for another site's item as for a name nobody has."""
    site_id = context.get("site_id")
    item = _find_item(value, site_id=site_id)
    if item is None:
        where = " at this token's site" if site_id is not None else ""
        raise serializers.ValidationError(f"No recovery item{where} is named {value!r} (or has that id).")
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
        return _validate_item(value, self.context)

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
            400: OpenApiResponse(
                description="Invalid input, or no item of that name at the token's site; the body names the field"
            ),
            401: OpenApiResponse(description="Missing or invalid agent token"),
            409: OpenApiResponse(description="The run id was reported before with other figures; the body names them"),
        },
        description="A backup or replication job reports a run of a recovery register item (agent token of the "
        "item's source site). Idempotent on the run id.",
    )
    def post(self, request: Request) -> Response:
        incoming = BackupReportInSerializer(data=request.data, context={"site_id": request.auth.site_id})
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        item: RecoveryItem = data["item"]
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
        "state": recovery.state_of(state, now),
        "problems": recovery.problems(state, now),
        "copy": _copy(state),
        "job": item.job_id,
        "cluster": item.cluster,
        "schedule": item.schedule,
    }


def _copy(state: recovery.ItemState) -> dict[str, Any]:
    """Where the copy lives: the last good backup's report, else the item's declared location."""
    site, tier = recovery.copy_location(state)
    return {"site": site.name if site else None, "tier": tier}


class LastGoodBackupSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="the backup run's id")
    finished = serializers.DateTimeField()
    age_seconds = serializers.FloatField()
    bytes = serializers.IntegerField(allow_null=True)
    copy_site = serializers.CharField(allow_null=True)
    copy_tier = serializers.CharField()


class LastRestoreTestSerializer(serializers.Serializer):
    finished = serializers.DateTimeField()
    duration_seconds = serializers.FloatField()
    verified = serializers.BooleanField()
    into = serializers.CharField()


class CopyLocationSerializer(serializers.Serializer):
    site = serializers.CharField(allow_null=True)
    tier = serializers.CharField()


class RecoveryItemRowSerializer(serializers.Serializer):
    """One item of the register (item_row): its objectives, last good backup and restore test, and state."""

    id = serializers.IntegerField()
    kind = serializers.CharField()
    name = serializers.CharField()
    dataset = serializers.IntegerField(allow_null=True)
    source_site = serializers.CharField(allow_null=True)
    source_tier = serializers.CharField()
    method = serializers.CharField()
    rpo_seconds = serializers.FloatField()
    rto_seconds = serializers.FloatField()
    restore_test_every_days = serializers.IntegerField()
    last_good_backup = LastGoodBackupSerializer(allow_null=True)
    rpo_state = serializers.ChoiceField(choices=["never", "breached", "met"])
    backup_failing = serializers.BooleanField()
    same_site_copy = serializers.BooleanField()
    last_restore_test = LastRestoreTestSerializer(allow_null=True)
    rto_proven = serializers.BooleanField()
    state = serializers.CharField(help_text="the worst problem, or ok")
    problems = serializers.ListField(child=serializers.CharField(), help_text="worst first; empty: OK")
    copy = CopyLocationSerializer()
    job = serializers.IntegerField(allow_null=True)
    cluster = serializers.CharField()
    schedule = serializers.CharField()


class RecoveryItemListView(APIView):
    """The roles that read the register (compliance.view_recoveryitem), as the /recovery/ page."""

    permission_classes = [RolePermission]
    required_permissions = {"GET": [RECOVERY_VIEW]}

    @extend_schema(
        responses={200: inline_serializer("RecoveryRegister", {"results": RecoveryItemRowSerializer(many=True)})},
        description="The recovery register with each item's state.",
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        return Response({"results": [item_row(state, now) for state in recovery.item_states()]})


class RestoreTestInSerializer(KnownFieldsOnly, BoundedDatesSerializerMixin, serializers.Serializer):
    """A restore test. ``item`` takes a name or an id; ``backup`` the run id of one of its reports."""

    item = serializers.CharField(max_length=200, help_text="The register item's name or id")
    key = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="Idempotency key: a repeat is the same test",
    )
    backup = serializers.CharField(
        max_length=200, required=False, allow_null=True, help_text="The run id of the backup it restored"
    )
    into = serializers.CharField(max_length=500, help_text="Where the copy was restored to")
    started = serializers.DateTimeField()
    finished = serializers.DateTimeField()
    verified = serializers.BooleanField()
    verification = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    by = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", help_text="Who restored it (an agent's caller)"
    )

    def validate_item(self, value: str) -> RecoveryItem:
        return _validate_item(value, self.context)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["finished"] < attrs["started"]:
            raise serializers.ValidationError({"finished": "Is before started."})
        if attrs["finished"] > timezone.now() + recovery.CLOCK_SKEW:
            raise serializers.ValidationError({"finished": "Is in the future: a test is recorded once it has ended."})
        run = attrs.get("backup")
        attrs["backup_report"] = None
        if run:
            report = BackupReport.objects.filter(item=attrs["item"], external_id=run).first()
            if report is None:
                raise serializers.ValidationError({"backup": f"{attrs['item'].name} has no backup run {run!r}."})
            attrs["backup_report"] = report
        return attrs


class RestoreTestSerializer(serializers.ModelSerializer):
    item = serializers.SlugRelatedField(slug_field="name", read_only=True)
    record = serializers.IntegerField(source="pk", read_only=True)
    key = serializers.CharField(source="external_id", read_only=True)
    backup = serializers.SlugRelatedField(slug_field="external_id", read_only=True, allow_null=True)
    by = serializers.SerializerMethodField()
    duration_seconds = serializers.SerializerMethodField()

    class Meta:
        model = RestoreTest
        fields = [
            "record",
            "item",
            "key",
            "backup",
            "into",
            "started",
            "finished",
            "duration_seconds",
            "verified",
            "verification",
            "by",
            "created_at",
        ]

    def get_by(self, test: RestoreTest) -> str:
        return test.by_user.get_username() if test.by_user is not None else test.by_name

    def get_duration_seconds(self, test: RestoreTest) -> float:
        return test.duration.total_seconds()


class RestoreTestView(APIView):
    authentication_classes = [AgentOrPersonalTokenAuthentication, SessionAuthentication]
    permission_classes = [RoleOrSiteAgentWritePermission]
    required_permissions = {"POST": [RESTORE_TEST_ADD]}

    @extend_schema(
        request=RestoreTestInSerializer,
        responses={
            200: RestoreTestSerializer,
            201: RestoreTestSerializer,
            400: OpenApiResponse(
                description="Invalid input, or (an agent token) no item of that name at its site; the body names "
                "the field"
            ),
            401: OpenApiResponse(description="No session or token"),
            403: OpenApiResponse(description="The role may not record restore tests"),
            409: OpenApiResponse(description="The key was recorded before with other figures; the body names them"),
        },
        description="Record a restore test of a recovery register item: a person with the right role, or an agent "
        "token of the item's source site. Idempotent on key.",
    )
    def post(self, request: Request) -> Response:
        agent = isinstance(request.auth, AgentToken)
        context = {"site_id": request.auth.site_id} if agent else {}
        incoming = RestoreTestInSerializer(data=request.data, context=context)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        item: RecoveryItem = data["item"]
        try:
            test, created = recovery.record_restore_test(
                item=item,
                backup=data["backup_report"],
                into=data["into"],
                started=data["started"],
                finished=data["finished"],
                verified=data["verified"],
                verification=data["verification"],
                by_user=None if agent else request.user,
                by_name=data["by"] or (f"agent token {request.auth.name}" if agent else ""),
                key=data["key"],
            )
        except recovery.RestoreConflict as conflict:
            return Response(
                {
                    "error": f"Restore test {conflict.existing.external_id} of {item.name} was recorded before with "
                    f"other {', '.join(conflict.fields)}; nothing was changed.",
                    "fields": conflict.fields,
                    "record": RestoreTestSerializer(conflict.existing).data,
                },
                status=409,
            )
        return Response(RestoreTestSerializer(test).data, status=201 if created else 200)
