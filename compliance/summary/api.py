"""The training-content summary API, under /api/v1/compliance/models/<pk>/summary/: the live draft,
publishing, the published versions (read-only: a frozen version has no PUT, PATCH or DELETE), each
version's exports (Markdown, JSON, PDF; every download audited) and its diff against the one before.
Compliance officers and admins only, reads included."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compliance.models import GpaiModel, SummaryVersion
from compliance.permissions import CompliancePermission
from compliance.services import summary


class SummaryVersionSerializer(serializers.ModelSerializer):
    verified = serializers.SerializerMethodField(help_text="The stored text still hashes to sha256")
    published_by = serializers.StringRelatedField()

    class Meta:
        model = SummaryVersion
        fields = ["version", "last_update", "published_at", "published_by", "sha256", "verified", "document", "text"]
        read_only_fields = fields

    def get_verified(self, obj: SummaryVersion) -> bool:
        return obj.verify()


class _SummaryAPIView(APIView):
    permission_classes = [CompliancePermission]

    def get_model(self) -> GpaiModel:
        return get_object_or_404(GpaiModel, pk=self.kwargs["pk"])

    def get_version(self) -> SummaryVersion:
        return get_object_or_404(
            SummaryVersion.objects.select_related("model", "published_by"),
            model_id=self.kwargs["pk"],
            version=self.kwargs["version"],
        )


DRAFT = inline_serializer("SummaryDraft", {"document": serializers.JSONField(), "markdown": serializers.CharField()})
UNCHANGED = OpenApiResponse(description="Nothing changed since the latest version: nothing published")


class SummaryDraftView(_SummaryAPIView):
    """The unpublished draft, built from the register now."""

    @extend_schema(responses=DRAFT)
    def get(self, request: Request, pk: int) -> Response:
        document = summary.build_document(self.get_model())
        text = summary.render_markdown(document, version=None, last_update=timezone.localdate())
        return Response({"document": document, "markdown": text})


class SummaryPublishView(_SummaryAPIView):
    """Freeze the draft as the next version (409 when nothing changed since the latest)."""

    @extend_schema(request=None, responses={201: SummaryVersionSerializer, 409: UNCHANGED})
    def post(self, request: Request, pk: int) -> Response:
        try:
            version = summary.publish(self.get_model(), user=request.user)
        except summary.SummaryUnchanged as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(SummaryVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class SummaryVersionListView(generics.ListAPIView):
    """The model's published versions, newest first."""

    permission_classes = [CompliancePermission]
    serializer_class = SummaryVersionSerializer
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[SummaryVersion]:
        model = get_object_or_404(GpaiModel, pk=self.kwargs["pk"])
        return model.summaries.select_related("published_by").order_by("-version")


class SummaryVersionDetailView(_SummaryAPIView):
    """One published version, with ``verified``: its hash recomputed now. Read-only."""

    @extend_schema(responses=SummaryVersionSerializer)
    def get(self, request: Request, pk: int, version: int) -> Response:
        return Response(SummaryVersionSerializer(self.get_version()).data)


EXPORT_JSON = inline_serializer(
    "SummaryExport",
    {
        "model": serializers.CharField(),
        "version": serializers.IntegerField(),
        "last_update": serializers.DateField(),
        "sha256": serializers.CharField(help_text="of the published Markdown text"),
        "document": serializers.JSONField(help_text="the template's sections, as published"),
    },
)


class SummaryExportView(_SummaryAPIView):
    """One published version as Markdown (the hashed text), JSON or PDF; each download is audited."""

    @extend_schema(
        operation_id="v1_compliance_models_summary_versions_export_retrieve",
        responses={
            (200, "text/markdown"): OpenApiTypes.STR,
            (200, "application/json"): EXPORT_JSON,
            (200, "application/pdf"): OpenApiTypes.BINARY,
            409: OpenApiResponse(description="The PDF is still being rendered by a worker: try again (Retry-After)"),
        },
    )
    def get(self, request: Request, pk: int, version: int, fmt: str) -> HttpResponse:
        if fmt not in summary.EXPORT_FORMATS:
            raise Http404(f"No export as {fmt}: one of {', '.join(summary.EXPORT_FORMATS)}.")
        obj = self.get_version()
        try:
            body = summary.export(obj, fmt, actor=request.user)
        except summary.PdfNotReady as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT, headers={"Retry-After": "5"})
        response = HttpResponse(body, content_type=summary.EXPORT_FORMATS[fmt])
        # A header value: only characters no name can turn into a second header or a broken one.
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"summary-{obj.model.name}-{obj.model.version}-v{obj.version}")
        filename = f"{stem}.{fmt}"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response


DIFF = inline_serializer(
    "SummaryDiff",
    {
        "from_version": serializers.IntegerField(allow_null=True),
        "to_version": serializers.IntegerField(),
        "diff": serializers.CharField(),
    },
)


class SummaryDiffView(_SummaryAPIView):
    """The version's unified diff against the one before (version 1: against nothing)."""

    @extend_schema(responses=DIFF)
    def get(self, request: Request, pk: int, version: int) -> Response:
        obj = self.get_version()
        before = summary.previous(obj)
        return Response(
            {
                "from_version": before.version if before else None,
                "to_version": obj.version,
                "diff": summary.diff(before, obj),
            }
        )
