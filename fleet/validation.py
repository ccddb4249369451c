"""What every door of the fleet app shares: the error that names the item and field at fault, the
identity patterns, and reading a body within the size limit. The JSON batch door (fleet.ingest),
job events (fleet.training) and serving changes all answer bad input the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.request import Request
from rest_framework.response import Response

from console import counters

UUID_PATTERN = r"^(GPU|MIG)-[0-9A-Za-z-]{6,60}$"
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$"


@dataclass
class IngestError(Exception):
    """A rejected request: HTTP status and a message naming the item and field at fault."""

    status: int
    message: str
    item: int | None = None
    field: str | None = None

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.message}
        if self.item is not None:
            body["item"] = self.item
        if self.field is not None:
            body["field"] = self.field
        return body


def read_body(request: Request) -> bytes:
    """The request's body, or 413 naming the limit: from its Content-Length when it has one, and
    while reading when it has none (a chunked body, which Django refuses past
    DATA_UPLOAD_MAX_MEMORY_SIZE with a bare 400 of its own)."""
    declared = request.META.get("CONTENT_LENGTH")
    if declared and declared.isdigit() and int(declared) > settings.INGEST_MAX_BYTES:
        raise IngestError(413, f"Body is {declared} bytes; the limit is {settings.INGEST_MAX_BYTES} bytes.")
    try:
        body = request.body
    except RequestDataTooBig:
        raise IngestError(
            413, f"Body is larger than the limit of {settings.INGEST_MAX_BYTES} bytes (sent without Content-Length)."
        ) from None
    if len(body) > settings.INGEST_MAX_BYTES:
        raise IngestError(413, f"Body is {len(body)} bytes; the limit is {settings.INGEST_MAX_BYTES} bytes.")
    return body


def rejected(exc: IngestError) -> Response:
    counters.increment("goodput_ingest_rejected_total", reason=f"http_{exc.status}")
    return Response(exc.as_dict(), status=exc.status)
