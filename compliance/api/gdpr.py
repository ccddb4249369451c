"""The GDPR API: records of processing (Art. 30) and the data-subject request log.

Compliance officers and admins only, reads included (CompliancePermission). A request is never
deleted through the API: it is part of the record of how the controller answered.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.utils import timezone
from rest_framework import mixins, serializers, viewsets

from compliance.models import DataAsset, SubjectRequest
from compliance.models.gdpr import RECORD_FIELDS, received_on_error
from compliance.permissions import CompliancePermission
from compliance.services import gdpr


class DataAssetSerializer(serializers.ModelSerializer):
    class Meta:
        model = DataAsset
        fields = [
            "id",
            *RECORD_FIELDS,
            "created_at",
            "updated_at",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(name: str) -> str:
            return attrs.get(name, getattr(self.instance, name, "") if self.instance else "")

        error = gdpr.balancing_note_error(current("lawful_basis"), current("balancing_note"))
        if error:
            raise serializers.ValidationError({"balancing_note": error})
        return attrs


class DataAssetViewSet(viewsets.ModelViewSet):
    queryset = DataAsset.objects.all()
    serializer_class = DataAssetSerializer
    permission_classes = [CompliancePermission]


class SubjectRequestSerializer(serializers.ModelSerializer):
    overdue = serializers.SerializerMethodField(help_text="Open or in progress after its due date")
    assets = serializers.PrimaryKeyRelatedField(many=True, queryset=DataAsset.objects.all(), required=False)

    class Meta:
        model = SubjectRequest
        fields = [
            "id",
            "kind",
            "subject_reference",
            "received_on",
            "due_on",
            "status",
            "overdue",
            "closed_on",
            "assets",
            "notes",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["due_on", "closed_on"]

    def get_overdue(self, obj: SubjectRequest) -> bool:
        return obj.is_overdue(timezone.localdate())

    def validate_received_on(self, value: date) -> date:
        error = received_on_error(value, timezone.localdate())
        if error:
            raise serializers.ValidationError(error)
        return value


class SubjectRequestViewSet(
    mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet
):  # no destroy: the log keeps every request
    queryset = SubjectRequest.objects.prefetch_related("assets")
    serializer_class = SubjectRequestSerializer
    permission_classes = [CompliancePermission]
    filterset_fields = ["status", "kind"]

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        request = serializer.save()
        gdpr.set_request_status(request, request.status, today=timezone.localdate())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        request = serializer.save()
        gdpr.set_request_status(request, request.status, today=timezone.localdate())
