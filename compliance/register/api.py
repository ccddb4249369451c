"""The register API: general-purpose models, datasets (with the crawler's per-domain CSV) and
lineage. Compliance officers and admins only, reads included.

Every check the database would make (a size needs its unit, a crawl ends after it starts) is made
here first, so bad input is a 400 naming the field, never a 500.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from compliance.models.register import CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.permissions import CompliancePermission
from compliance.serializers import KnownFieldsOnly
from compliance.services import register
from console.parsers import StrictJSONParser
from console.timebounds import BoundedDatesSerializerMixin
from fleet.models import Job


class CompliancePermissionMixin:
    permission_classes = [CompliancePermission]


# --- models ------------------------------------------------------------------------------------


class GpaiModelSerializer(BoundedDatesSerializerMixin, KnownFieldsOnly, serializers.ModelSerializer):
    systemic_risk = serializers.BooleanField(read_only=True, help_text="Training compute above 10^25 FLOP")
    export_control_due = serializers.SerializerMethodField(help_text="When the export-control check is next due")
    export_control_overdue = serializers.SerializerMethodField(help_text="Never checked, or the check is past due")

    class Meta:
        model = GpaiModel
        fields = "__all__"
        read_only_fields = ["created_at", "updated_at"]

    @extend_schema_field(serializers.DateField(allow_null=True))  # null: never checked
    def get_export_control_due(self, obj: GpaiModel) -> Any:
        return obj.export_control_due()

    def get_export_control_overdue(self, obj: GpaiModel) -> bool:
        return obj.export_control_overdue(timezone.localdate())

    def validate_base_model(self, value: GpaiModel | None) -> GpaiModel | None:
        if value is not None and self.instance is not None and value.pk == self.instance.pk:
            raise serializers.ValidationError("A model cannot be its own base model.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(name: str) -> Any:
            return attrs[name] if name in attrs else getattr(self.instance, name, None)

        error = register.scratch_error(
            current("trained_from_scratch"), current("base_model"), current("base_model_external") or ""
        )
        if error:
            raise serializers.ValidationError({"trained_from_scratch": error})
        return attrs


class GpaiModelViewSet(CompliancePermissionMixin, viewsets.ModelViewSet):
    """General-purpose model versions. Deleting one that others name as their base model is a 409."""

    queryset = GpaiModel.objects.all()
    serializer_class = GpaiModelSerializer
    filterset_fields = ["name", "weights_classification"]
    ordering_fields = ["name", "version", "placed_on_market", "training_compute_flop"]


# --- datasets ----------------------------------------------------------------------------------


class DatasetSerializer(KnownFieldsOnly, serializers.ModelSerializer):
    class Meta:
        model = Dataset
        fields = "__all__"
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(name: str) -> Any:
            return attrs[name] if name in attrs else getattr(self.instance, name, None)

        size, unit = current("size"), current("size_unit") or ""
        if size is not None and not unit:
            raise serializers.ValidationError({"size_unit": "A size needs its unit."})
        if unit and size is None:
            raise serializers.ValidationError({"size": "A unit needs a size."})
        started, ended = current("crawl_started"), current("crawl_ended")
        if started and ended and ended < started:
            raise serializers.ValidationError({"crawl_ended": "Must not be before crawl_started."})
        return attrs


class CrawledDomainSerializer(serializers.ModelSerializer):
    class Meta:
        model = CrawledDomain
        fields = ["domain", "bytes"]


class CsvTextParser(BaseParser):
    """A crawler export posted as the request body (text/csv): the body as text."""

    media_type = "text/csv"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> str:
        raw = stream.read(register.MAX_CSV_BYTES + 1) if stream else b""
        if len(raw) > register.MAX_CSV_BYTES:
            raise serializers.ValidationError({"csv": f"Larger than {register.MAX_CSV_BYTES // 1024 // 1024} MiB."})
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise serializers.ValidationError({"csv": f"Not UTF-8 text: {exc}."}) from None


CSV_ERROR = OpenApiResponse(
    response=inline_serializer(
        "CrawlerCsvError",
        {
            "csv": serializers.ListField(child=serializers.CharField(), required=False),
            "line": serializers.IntegerField(required=False),
            "file": serializers.ListField(child=serializers.CharField(), required=False),
            "source_category": serializers.ListField(child=serializers.CharField(), required=False),
        },
    ),
    description=(
        "The first line that cannot be imported (`csv` and `line`, 1 is the header), an unreadable "
        "`file`, or a dataset that is not crawled (`source_category`); nothing was written"
    ),
)
CSV_IMPORTED = inline_serializer("CrawlerCsvImported", {"domains": serializers.IntegerField()})


class DatasetViewSet(CompliancePermissionMixin, viewsets.ModelViewSet):
    """Training datasets, by the template's source categories (2.1-2.6). A dataset some model
    was trained on cannot be deleted (409): remove its lineage first."""

    queryset = Dataset.objects.all()
    serializer_class = DatasetSerializer
    filterset_fields = ["source_category", "modality", "personal_data"]
    ordering_fields = ["name", "size", "created_at"]

    @extend_schema(
        methods=["GET"],
        request=None,
        responses=CrawledDomainSerializer(many=True),
        description="The dataset's crawled domains, most bytes first.",
    )
    @extend_schema(
        methods=["POST"],
        request={
            "text/csv": OpenApiTypes.STR,
            "multipart/form-data": inline_serializer("CrawlerCsvUpload", {"file": serializers.FileField()}),
        },
        responses={200: CSV_IMPORTED, 400: CSV_ERROR},
        description=(
            "Replace the per-domain byte counts of a crawled dataset with a CSV (header `domain,bytes`), "
            "as the body (text/csv) or a multipart `file`. Every line is checked first: a bad one is "
            "a 400 naming it, and the old list stays."
        ),
    )
    @action(
        detail=True,
        methods=["get", "post"],
        parser_classes=[CsvTextParser, MultiPartParser, StrictJSONParser],
        filterset_fields=[],
        ordering_fields=[],
    )
    def domains(self, request: Request, pk: str | None = None) -> Response:
        dataset = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(dataset.domains.all())
            return self.get_paginated_response(CrawledDomainSerializer(page, many=True).data)
        if isinstance(request.data, str):
            text = request.data
        elif "file" in request.FILES:
            upload = request.FILES["file"]
            if upload.size > register.MAX_CSV_BYTES:
                return Response({"file": [f"Larger than {register.MAX_CSV_BYTES // 1024 // 1024} MiB."]}, status=400)
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError as exc:
                return Response({"file": [f"Not UTF-8 text: {exc}."]}, status=400)
        else:
            return Response({"csv": ["Send the CSV as text/csv, or as a multipart `file`."]}, status=400)
        try:
            count = register.import_domains(dataset, text)
        except register.CsvLineError as exc:
            return Response({"csv": exc.messages, "line": exc.line}, status=status.HTTP_400_BAD_REQUEST)
        except DjangoValidationError as exc:
            return Response({"source_category": exc.messages}, status=status.HTTP_400_BAD_REQUEST)
        return Response({"domains": count})


# --- lineage -----------------------------------------------------------------------------------


class LineageSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    job = serializers.PrimaryKeyRelatedField(
        queryset=Job.objects.all(), required=False, allow_null=True, help_text="The fleet training job, when known"
    )

    class Meta:
        model = Lineage
        fields = ["id", "model", "dataset", "job", "recorded_at", "recorded_by"]
        read_only_fields = ["recorded_at", "recorded_by"]
        validators: list[Any] = []  # recording a link twice returns the first (see create)


class LineageViewSet(CompliancePermissionMixin, viewsets.ModelViewSet):
    """Which datasets trained which model version, by which training job. POST is idempotent: the
    same model, dataset and job again returns the row already recorded (200, not 201)."""

    queryset = Lineage.objects.select_related("model", "dataset", "job")
    serializer_class = LineageSerializer
    filterset_fields = ["model", "dataset", "job"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    @extend_schema(responses={200: LineageSerializer, 201: LineageSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        row, created = register.record_lineage(user=request.user, **serializer.validated_data)
        return Response(
            LineageSerializer(row, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )
