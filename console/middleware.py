"""Deny by default: every route needs a session or a token, except settings.OPEN_PATHS; and what
no cache may keep (settings.NO_STORE_PREFIXES)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.db import DataError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

logger = logging.getLogger(__name__)

# Machine routes answer 401 instead of redirecting to the login page; a request carrying an
# Authorization header is passed through so DRF's token authentication can decide.
MACHINE_PREFIXES = ("/api/", "/metrics")


class LoginRequiredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        if request.path in settings.OPEN_PATHS:
            return None
        try:
            authenticated = request.user.is_authenticated  # loads the session: a database read
        except (OperationalError, InterfaceError):
            return database_unavailable()
        if authenticated:
            return None
        if request.path.startswith(MACHINE_PREFIXES):
            if "HTTP_AUTHORIZATION" in request.META:
                return None
            response = JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
            response["WWW-Authenticate"] = 'Bearer realm="goodput"'
            return response
        return redirect_to_login(request.get_full_path())


class NoStoreMiddleware:
    """``Cache-Control: no-store`` on every answer under settings.NO_STORE_PREFIXES (API answers,
    compliance pages, exports and downloads, errors included), replacing any other directive."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path_info.startswith(settings.NO_STORE_PREFIXES):
            response["Cache-Control"] = "no-store"
        return response


class HostileInputMiddleware:
    """Query strings and form fields are text a person could type: a NUL (which PostgreSQL text
    cannot hold) or a lone surrogate is refused with a 400 naming the parameter, once, here,
    rather than by each view. (JSON bodies are checked by console.parsers.StrictJSONParser.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from console.parsers import text_problem

        if problem := text_problem(request.path_info):
            return bad_request(f"The path has {problem}.", field="path", path=request.path)
        for name, value in request.COOKIES.items():
            if problem := text_problem(name) or text_problem(value):
                return bad_request(f"The cookie {name[:100]!r} has {problem}.", field=name[:100], path=request.path)
        sources = [("query parameter", request.GET)]
        # Page forms only: an API view reads its own body (DRF's parsers, the ingest doors), and
        # reading request.POST here would consume the stream before it.
        if request.method == "POST" and request.content_type in FORM_TYPES and not request.path.startswith("/api/"):
            sources.append(("form field", request.POST))
        for kind, params in sources:
            for name, values in params.lists():
                for value in (name, *values):
                    if problem := text_problem(value):
                        return bad_request(
                            f"The {kind} {name[:100]!r} has {problem}.", field=name[:100], path=request.path
                        )
        return self.get_response(request)


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def bad_request(message: str, *, field: str, path: str = "/api/") -> HttpResponse:
    if path.startswith(MACHINE_PREFIXES):
        return JsonResponse({"error": message, "field": field}, status=400)
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


class DependencyDownMiddleware:
    """A page or route whose database is unreachable answers 503 with Retry-After, not a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, (OperationalError, InterfaceError)):
            return database_unavailable()
        if isinstance(exception, DataError):
            # Input the database refused (a value out of its column's range or character set)
            # that no check before it caught: the request's fault, not the server's.
            logger.warning("database refused request data on %s: %s", request.path, exception)
            return bad_request("The database refused a value in this request.", field="", path=request.path)
        return None


def database_unavailable() -> HttpResponse:
    response = JsonResponse({"error": "The database is unavailable; retry later."}, status=503)
    response["Retry-After"] = "5"
    return response
