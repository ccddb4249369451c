from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.generic import TemplateView

from console import overview
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
