"""Compliance middleware.

- AuditActorMiddleware: who acts. The request being served is bound to the context, so an audit
  entry written anywhere while it runs (a signal, a service) names its person or token.
- NoStoreMiddleware: nothing a compliance page or API answer says is kept by a cache.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from compliance.services.audit import bind_request, reset_actor


class AuditActorMiddleware:
    """Binds the request, not its user: DRF authenticates tokens later, inside the view, so the
    actor is resolved when an entry is written. Goes after AuthenticationMiddleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = bind_request(request)
        try:
            return self.get_response(request)
        finally:
            reset_actor(token)


# Where compliance records are shown: the pages, the API and the admin's compliance section. They
# list data subjects and personal data, so no browser or proxy cache may keep a copy.
NO_STORE_PREFIXES = ("/compliance/", "/api/v1/compliance/", "/admin/compliance/")


class NoStoreMiddleware:
    """``Cache-Control: no-store`` on every answer under NO_STORE_PREFIXES (pages, API answers,
    exports and downloads, errors included), replacing any other caching directive."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path_info.startswith(NO_STORE_PREFIXES):
            response["Cache-Control"] = "no-store"
        return response
