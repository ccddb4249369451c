from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache
from django.views.generic import TemplateView

from console import overview
from console.forms import PersonalTokenForm
from console.models import PersonalToken
from console.permissions import DashboardRequiredMixin


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. No dependencies are checked here, on purpose."""
    return JsonResponse({"status": "ok"})


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers, and the broker does in production."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure means "not ready", and says why
        checks["database"] = f"error: {exc.__class__.__name__}"
    if not settings.EAGER_TASKS:
        import redis

        try:
            redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1).ping()
            checks["broker"] = "ok"
        except Exception as exc:
            checks["broker"] = f"error: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


class HomeView(DashboardRequiredMixin, TemplateView):
    """The overview: each app contributes its section (fleet totals now; incidents, goodput... later)."""

    template_name = "console/home.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sections"] = overview.render_sections(self.request)
        return context


@method_decorator(never_cache, name="dispatch")  # the page that shows a new token must not be cached
class PersonalTokenListView(DashboardRequiredMixin, View):
    """A person's own API tokens: make one (shown once), see when each was last used, revoke."""

    template_name = "console/personal_tokens.html"

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._render(request, PersonalTokenForm())

    def post(self, request: HttpRequest) -> HttpResponse:
        form = PersonalTokenForm(request.POST)
        if not form.is_valid():
            return self._render(request, form)
        token, plain = PersonalToken.issue(user=request.user, name=form.cleaned_data["name"])
        # Rendered, not redirected: the plain token must not wait in a session or a message store.
        return self._render(request, PersonalTokenForm(), new_token=token, plain=plain)

    def _render(self, request: HttpRequest, form: PersonalTokenForm, **extra: Any) -> HttpResponse:
        tokens = PersonalToken.objects.filter(user=request.user)
        context = {"form": form, "tokens": tokens, "api_url": request.build_absolute_uri("/api/v1/"), **extra}
        return render(request, self.template_name, context)


class PersonalTokenRevokeView(DashboardRequiredMixin, View):
    """Revoke one of one's own tokens (an Admin revokes anyone's in the admin)."""

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        token = get_object_or_404(PersonalToken, pk=pk, user=request.user)
        if token.revoke(actor=request.user):
            messages.success(request, f"Revoked the token {token.name!r} ({token.display_prefix}).")
        return redirect("personal_tokens")
