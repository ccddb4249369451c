"""The retention API: policies, legal holds (placed, then released; never edited or deleted), the
record of runs (read-only), a dry-run preview and a run now. Compliance officers and admins only.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compliance.models import LegalHold, RetentionPolicy, RetentionRun
from compliance.permissions import CompliancePermission
from compliance.services import retention
from console.timebounds import BoundedDatesSerializerMixin


class RetentionPolicySerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    enforced = serializers.BooleanField(read_only=True, help_text="The console holds this data and deletes it")
    review_overdue = serializers.SerializerMethodField(help_text="An attestation whose review date has passed")

    class Meta:
        model = RetentionPolicy
        fields = [
            "id",
            "data_class",
            "tenant",
            "days",
            "action",
            "owner",
            "review_due",
            "notes",
            "enforced",
            "review_overdue",
            "created_at",
            "updated_at",
        ]

    def get_review_overdue(self, obj: RetentionPolicy) -> bool:
        return obj.review_overdue(timezone.localdate())

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(name: str, default: Any = "") -> Any:
            return attrs[name] if name in attrs else getattr(self.instance, name, default)

        errors = retention.policy_errors(
            data_class=current("data_class"),
            tenant=current("tenant"),
            days=current("days", None),
            action=current("action", RetentionPolicy._meta.get_field("action").default),
            owner=current("owner"),
            review_due=current("review_due", None),
        )
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class RetentionPolicyViewSet(viewsets.ModelViewSet):
    queryset = RetentionPolicy.objects.all()
    serializer_class = RetentionPolicySerializer
    permission_classes = [CompliancePermission]


class LegalHoldSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    placed_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    released_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    release_requested_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who asked to release a hold on the audit log"
    )
    active = serializers.SerializerMethodField()
    incident_ids = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False)

    class Meta:
        model = LegalHold
        fields = ["id", "name", "data_class", "tenant", "incident_ids", "reason", "placed_by", "placed_at"]
        fields += ["released_at", "released_by", "release_requested_by", "release_requested_at", "active"]
        read_only_fields = ["placed_at", "released_at", "release_requested_at"]

    def get_active(self, obj: LegalHold) -> bool:
        return obj.released_at is None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors = retention.hold_errors(data_class=attrs["data_class"], incident_ids=attrs.get("incident_ids", []))
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class LegalHoldViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Place a hold (POST) and release it (POST .../release/); a hold is never edited or deleted.

    A hold on the audit log takes two people: the first release asks (202, still active), a
    release by another compliance officer or admin releases it (200); the one who asked cannot
    approve (409)."""

    queryset = LegalHold.objects.select_related("placed_by", "released_by", "release_requested_by")
    serializer_class = LegalHoldSerializer
    permission_classes = [CompliancePermission]

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.save(placed_by=self.request.user)

    @extend_schema(request=None, responses={200: LegalHoldSerializer, 202: LegalHoldSerializer})
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None) -> Response:
        try:
            hold = retention.release_hold(self.get_object(), by=request.user)
        except (retention.HoldAlreadyReleased, retention.SecondPersonRequired) as exc:
            return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
        if hold.released_at is None:  # an audit hold, asked for: a second person approves
            return Response(self.get_serializer(hold).data, status=status.HTTP_202_ACCEPTED)
        return Response(self.get_serializer(hold).data)


class RetentionRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = RetentionRun
        fields = [
            "id",
            "data_class",
            "tenant",
            "policy",
            "policy_days",
            "action",
            "cutoff",
            "dry_run",
            "affected",
            "held",
            "detail",
            "started_at",
            "finished_at",
            "triggered_by",
        ]


class RetentionRunViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = RetentionRun.objects.all()
    serializer_class = RetentionRunSerializer
    permission_classes = [CompliancePermission]
    filterset_fields = ["data_class", "dry_run", "triggered_by"]


_RUNS_RESPONSE = inline_serializer("RetentionRunsResult", {"runs": RetentionRunSerializer(many=True)})


class RetentionPreviewView(APIView):
    """What a run would delete and keep now, per class: counts only; records a dry run."""

    permission_classes = [CompliancePermission]

    @extend_schema(request=None, responses={200: _RUNS_RESPONSE})
    def post(self, request: Request) -> Response:
        runs = retention.run_retention(dry_run=True, triggered_by=request.user.get_username())
        return Response({"runs": RetentionRunSerializer(runs, many=True).data})


class RetentionRunNowView(APIView):
    """Apply every console-held policy now (the daily task's work, on demand)."""

    permission_classes = [CompliancePermission]

    @extend_schema(request=None, responses={200: _RUNS_RESPONSE})
    def post(self, request: Request) -> Response:
        runs = retention.run_retention(triggered_by=request.user.get_username())
        return Response({"runs": RetentionRunSerializer(runs, many=True).data})
