"""The GDPR API: records of processing as controller (Art. 30(1)) and as processor (Art. 30(2)),
and the data-subject request log (Arts. 12(3), 15-22).

Compliance officers and admins only, reads included (CompliancePermission). A request is never
deleted through the API: it is part of the record of how the controller answered. A body naming a
field the endpoint does not take is a 400 naming it (compliance.serializers). A request's ``kind``
and ``received_on`` are fixed once logged: a PATCH that would change them is a 400 naming them
(not silently dropped, as DRF drops read-only fields: the caller must learn nothing changed); a
mistake is corrected by a new request that ``corrects`` it.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import mixins, serializers, viewsets

from compliance.choices import RequestStatus
from compliance.models import DataAsset, ProcessorRecord, SubjectRequest
from compliance.models.gdpr import PROCESSOR_FIELDS, RECORD_FIELDS
from compliance.permissions import CompliancePermission
from compliance.serializers import KnownFieldsOnly
from compliance.services import gdpr
from console.timebounds import BoundedDatesSerializerMixin


class DataAssetSerializer(BoundedDatesSerializerMixin, KnownFieldsOnly, serializers.ModelSerializer):
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
    """Records of processing as controller (Art. 30(1))."""

    queryset = DataAsset.objects.all()
    serializer_class = DataAssetSerializer
    permission_classes = [CompliancePermission]


class ProcessorRecordSerializer(BoundedDatesSerializerMixin, KnownFieldsOnly, serializers.ModelSerializer):
    class Meta:
        model = ProcessorRecord
        fields = ["id", *PROCESSOR_FIELDS, "created_at", "updated_at"]


class ProcessorRecordViewSet(viewsets.ModelViewSet):
    """Records of the processing carried out as a processor for other controllers (Art. 30(2))."""

    queryset = ProcessorRecord.objects.all()
    serializer_class = ProcessorRecordSerializer
    permission_classes = [CompliancePermission]


class SubjectRequestSerializer(BoundedDatesSerializerMixin, KnownFieldsOnly, serializers.ModelSerializer):
    overdue = serializers.SerializerMethodField(help_text="Open or in progress after its due date")
    late = serializers.SerializerMethodField(help_text="Completed or refused after its due date")
    extended = serializers.BooleanField(read_only=True, help_text="Extended by two further months (Art. 12(3))")
    assets = serializers.PrimaryKeyRelatedField(many=True, queryset=DataAsset.objects.all(), required=False)
    corrects = serializers.PrimaryKeyRelatedField(
        queryset=SubjectRequest.objects.all(),
        required=False,
        allow_null=True,
        help_text="On create: the request this one corrects (with correction_reason); it is closed as "
        "corrected if still open. Fixed afterwards.",
    )
    corrected_by = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True, help_text="The request that corrects this one, if any"
    )

    read_only_hints = {
        "due_on": "Read-only: one month after received_on, three with an extension "
        "(send extension_reason and extension_notified_on).",
    }

    class Meta:
        model = SubjectRequest
        fields = [
            "id",
            "kind",
            "subject_reference",
            "received_on",
            "due_on",
            "extended",
            "extension_reason",
            "extension_notified_on",
            "status",
            "overdue",
            "closed_on",
            "late",
            "assets",
            "notes",
            "corrects",
            "corrected_by",
            "correction_reason",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["due_on"]
        extra_kwargs = {
            "closed_on": {"help_text": "When it was completed or refused (default: today); not in the future"}
        }

    def get_overdue(self, obj: SubjectRequest) -> bool:
        return obj.is_overdue(timezone.localdate())

    def get_late(self, obj: SubjectRequest) -> bool:
        return obj.is_late()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The request as it would be saved, checked whole (gdpr.request_errors): a PATCH of one
        field is checked against the others as stored. A closed request without a completion date
        is closed today; a reopened one loses its date."""

        def current(name: str, default: Any = None) -> Any:
            return attrs[name] if name in attrs else getattr(self.instance, name, default)

        if self.instance is not None:
            fixed = [k for k in gdpr.FIXED_AT_CREATION if k in attrs and attrs[k] != getattr(self.instance, k)]
            if fixed:
                raise serializers.ValidationError({k: gdpr.FIXED for k in fixed})
        elif errors := gdpr.correction_errors(
            attrs.get("corrects"), received_on=attrs.get("received_on"), reason=attrs.get("correction_reason", "")
        ):
            raise serializers.ValidationError(errors)
        today = timezone.localdate()
        status = current("status", RequestStatus.OPEN)
        if "status" in attrs and (error := gdpr.status_error(getattr(self.instance, "status", None), status)):
            raise serializers.ValidationError({"status": error})
        given = attrs.get("closed_on")
        stored = self.instance.closed_on if self.instance is not None else None
        closed_on = gdpr.closing_date(status, given=given, current=stored, today=today)
        errors = gdpr.request_errors(
            received_on=current("received_on"),
            status=status,
            # a date sent for an open request is the error to name, not the date it would keep
            closed_on=given if given is not None else closed_on,
            extension_reason=current("extension_reason", "") or "",
            extension_notified_on=current("extension_notified_on"),
            today=today,
        )
        if errors:
            raise serializers.ValidationError(errors)
        attrs["closed_on"] = closed_on
        return attrs


class SubjectRequestViewSet(
    mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet
):  # no destroy: the log keeps every request
    """Data-subject requests of every kind (Arts. 15-22): ``due_on`` is one month after receipt,
    three with an extension (``extension_reason`` and ``extension_notified_on``, told within the
    first month); ``closed_on`` defaults to today when a request is completed or refused and may
    be corrected (not in the future); ``late`` flags one closed after its due date. ``kind`` and
    ``received_on`` are fixed once logged (400 naming them); POST a new request with ``corrects``
    and ``correction_reason`` to correct them: both stay in the log, linked both ways."""

    queryset = SubjectRequest.objects.select_related("corrected_by").prefetch_related("assets")
    serializer_class = SubjectRequestSerializer
    permission_classes = [CompliancePermission]
    filterset_fields = ["status", "kind"]

    def perform_create(self, serializer: SubjectRequestSerializer) -> None:  # type: ignore[override]
        """Through the service: a correction closes the request it corrects, in one transaction."""
        values = dict(serializer.validated_data)
        try:
            serializer.instance = gdpr.log_request(
                today=timezone.localdate(), assets=values.pop("assets", []), **values
            )
        except gdpr.RequestRefused as exc:  # corrected by someone else since the body was checked
            raise serializers.ValidationError(exc.errors) from exc
