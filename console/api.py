"""API-wide behaviour: a dependency that is down is a 503 with Retry-After, a delete blocked by
what depends on the object is a 409 naming it, a page past the bounds is a 400; never a 500."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DataError, InterfaceError, OperationalError
from django.db.models import ProtectedError, RestrictedError
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5


def unavailable(message: str, retry_after: int = RETRY_AFTER_SECONDS) -> Response:
    response = Response({"error": message}, status=503)
    response["Retry-After"] = str(retry_after)
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, (OperationalError, InterfaceError)):
        logger.warning("database unavailable: %s", exc)
        return unavailable("The database is unavailable; retry later.")
    if isinstance(exc, (ProtectedError, RestrictedError)):
        return Response({"error": blocked_by(exc)}, status=409)
    if isinstance(exc, DataError):  # a value the database refused and no field check caught
        logger.warning("database refused request data: %s", exc)
        return Response({"error": "The database refused a value in this request."}, status=400)
    return drf_exception_handler(exc, context)


def blocked_by(exc: ProtectedError | RestrictedError) -> str:
    """'Cannot delete: 3 nodes (gpu-a-001, gpu-a-002, ...) still belong to it.'"""
    objects = list(exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects)
    kinds: dict[str, list[str]] = {}
    for obj in objects:
        kinds.setdefault(str(obj._meta.verbose_name_plural), []).append(str(obj))
    parts = []
    for kind, names in kinds.items():
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{len(names)} {kind} ({shown})")
    return f"Cannot delete: {'; '.join(parts)} still depend on it. Delete or move them first."


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """limit and offset are whole numbers within bounds, else a 400 naming the parameter (a limit
    of 1e20 would otherwise reach PostgreSQL as an out-of-range LIMIT)."""

    max_limit = 1000
    MAX_OFFSET = 10_000_000

    def get_limit(self, request: Any) -> int | None:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return self._bounded(raw, self.limit_query_param, 1, self.max_limit)

    def get_offset(self, request: Any) -> int:
        raw = request.query_params.get(self.offset_query_param)
        return 0 if raw is None else self._bounded(raw, self.offset_query_param, 0, self.MAX_OFFSET)

    @staticmethod
    def _bounded(raw: str, name: str, low: int, high: int) -> int:
        if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= high:
            raise ValidationError({name: f"Must be a whole number from {low} to {high}."})
        return int(raw)
