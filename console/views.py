from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache
from django.views.generic import TemplateView

from console import drain, overview, people
from console.forms import PersonalTokenForm, PersonForm, RoleForm
from console.models import PersonalToken
from console.permissions import DASHBOARD_PERMISSION, DashboardRequiredMixin


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. No dependencies are checked here, on purpose."""
    return JsonResponse({"status": "ok"})


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers, the broker does in production, and the process is not stopping."""
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
    # A process draining its websockets before it stops (console.drain) takes no new clients.
    if drain.is_draining():
        checks["draining"] = "stopping: websockets are moving to other processes"
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


class AdminRequiredMixin(DashboardRequiredMixin):
    """Pages for Admins only: anyone else gets the 403 page saying so."""

    permission_required = (DASHBOARD_PERMISSION, "auth.add_user", "auth.change_user")
    permission_denied_message = "This page is for Admins: it manages people and their roles."


@method_decorator(never_cache, name="dispatch")  # a generated password is shown on it once
class PeopleView(AdminRequiredMixin, View):
    """People and their roles (Admins only). POST, by its ``action`` field:

    - ``create``: a user with a role in one step; a blank password is generated and shown once
      (rendered, never stored in a session or a message);
    - ``role``: give the user ``id`` the role ``role`` in place of their current one;
    - ``deactivate``: no more sign-ins, personal tokens revoked, sessions and sockets ended;
    - ``reactivate``.

    Bad values re-render the page with the error on the field (400); a refusal by the state (the
    last Admin, one's own account) is shown with 409. Every change is in the audit log.
    """

    template_name = "console/people.html"

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._render(request, PersonForm())

    def post(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action")
        if action == "create":
            return self._create(request)
        if action not in ("role", "deactivate", "reactivate"):
            return self._render(request, PersonForm(), error="Unknown action.", status=400)
        pk = request.POST.get("id", "")
        if not pk.isdigit():
            return self._render(request, PersonForm(), error="Which person: the id is missing.", status=400)
        person = get_object_or_404(User, pk=int(pk))
        try:
            if action == "role":
                form = RoleForm(request.POST)
                if not form.is_valid():
                    return self._render(request, PersonForm(), error=f"Role: {form.errors['role'][0]}", status=400)
                changed = people.set_role(person, form.cleaned_data["role"], actor=request.user)
                if changed:
                    messages.success(request, f"{person.username} is now {form.cleaned_data['role']}.")
            elif action == "deactivate":
                ended = people.deactivate(person, actor=request.user)
                messages.success(
                    request,
                    f"Deactivated {person.username}: {ended['tokens']} personal token(s) revoked, "
                    f"{ended['sessions']} session(s) ended.",
                )
            else:
                people.reactivate(person, actor=request.user)
                messages.success(request, f"Reactivated {person.username}.")
        except people.PeopleConflict as exc:
            return self._render(request, PersonForm(), error=str(exc), status=409)
        return redirect("people")

    def _create(self, request: HttpRequest) -> HttpResponse:
        form = PersonForm(request.POST)
        if not form.is_valid():
            return self._render(request, form, status=400)
        generated = not form.cleaned_data["password"]
        password = form.cleaned_data["password"] or people.generate_password()
        user = people.create_person(
            username=form.cleaned_data["username"],
            email=form.cleaned_data["email"],
            role=form.cleaned_data["role"],
            password=password,
        )
        return self._render(
            request, PersonForm(), created=user, role=form.cleaned_data["role"], plain=password if generated else None
        )

    def _render(self, request: HttpRequest, form: PersonForm, *, status: int = 200, **extra: Any) -> HttpResponse:
        rows = people.people()
        context = {
            "form": form,
            "rows": rows,
            "roles": people.ROLE_CHOICES,
            "active_count": sum(1 for r in rows if r.user.is_active),
            **extra,
        }
        return render(request, self.template_name, context, status=status)
