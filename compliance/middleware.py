"""Compliance middleware: who acts. The request being served is bound to the context, so an audit
entry written anywhere while it runs (a signal, a service) names its person or token. (Compliance
answers are kept by no cache: console.middleware.NoStoreMiddleware, settings.NO_STORE_PREFIXES.)
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
