"""API-wide behaviour: a dependency that is down is a 503 with Retry-After, never a 500."""

from __future__ import annotations

import logging
from typing import Any

from django.db import InterfaceError, OperationalError
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
    return drf_exception_handler(exc, context)
