"""The compliance pack API: request a pack for a period, follow its progress, download the zip.

Compliance officers and admins only (CompliancePermission), reads included. Every download is
written to the audit log.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from compliance.choices import AuditAction, PackStatus
from compliance.models import CompliancePack
from compliance.permissions import CompliancePermission
from compliance.services import audit
from compliance.services.pack import azip_chunks, period_error, request_pack, zip_chunks
from console.timebounds import BoundedDatesSerializerMixin


class CompliancePackSerializer(BoundedDatesSerializerMixin, serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = CompliancePack
        fields = [
            "id",
            "period_start",
            "period_end",
            "status",
            "progress",
            "step",
            "error",
            "sha256",
            "size",
            "created_by",
            "created_at",
            "finished_at",
            "download_url",
        ]
        read_only_fields = [f for f in fields if f not in ("period_start", "period_end")]

    def get_download_url(self, pack: CompliancePack) -> str | None:
        if pack.status != PackStatus.DONE:
            return None
        return reverse("api:compliance-api:pack-download", args=[pack.pk])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if error := period_error(attrs["period_start"], attrs["period_end"]):
            raise serializers.ValidationError({"period_end": error})
        return attrs


class CompliancePackViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Compliance packs: POST a period to queue one (202); GET its status and progress; download
    the zip once done."""

    queryset = CompliancePack.objects.select_related("created_by")
    serializer_class = CompliancePackSerializer
    permission_classes = [CompliancePermission]
    filterset_fields = ["status"]

    @extend_schema(responses={202: CompliancePackSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        pack = request_pack(**serializer.validated_data, actor=request.user)
        pack.refresh_from_db(fields=["status", "progress", "step", "error", "sha256", "size", "finished_at"])
        return Response(self.get_serializer(pack).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        responses={
            (200, "application/zip"): OpenApiTypes.BINARY,
            409: OpenApiResponse(description="The pack is not built yet (or failed)"),
        }
    )
    @action(detail=True, methods=["get"])
    def download(self, request: Request, pk: str | None = None, **kwargs: Any) -> HttpResponseBase:
        """The pack's zip, as an attachment; each download is audited. Streamed from its stored
        chunks, one at a time: a year's pack is never held whole by the web process."""
        pack = self.get_object()
        if pack.status != PackStatus.DONE:
            return Response(
                {"detail": f"The pack is {pack.get_status_display().lower()}; download it once it is done."},
                status=status.HTTP_409_CONFLICT,
            )
        audit.record(
            AuditAction.EXPORT,
            obj=pack,
            actor=request.user,
            message=f"Downloaded {pack.filename} (sha256 {pack.sha256})",
        )
        # Under ASGI a response must iterate asynchronously, or Django reads a sync iterator whole.
        chunks = azip_chunks(pack.pk) if isinstance(request._request, ASGIRequest) else zip_chunks(pack.pk)
        response = StreamingHttpResponse(chunks, content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="{pack.filename}"'
        response["Content-Length"] = str(pack.size)
        return response
