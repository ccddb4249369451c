"""Server-side role checks for the API, the pages and the websocket."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.auth.mixins import PermissionRequiredMixin
from rest_framework import permissions

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

DASHBOARD_PERMISSION = "console.view_dashboards"


class RolePermission(permissions.DjangoModelPermissions):
    """Model permissions for every method, reads included (DRF lets any user read by default).

    Views without a queryset declare ``required_permissions`` (a dict of method -> list) or fall
    back to the dashboard permission for reads.
    """

    perms_map = {
        "GET": ["%(app_label)s.view_%(model_name)s"],
        "OPTIONS": ["%(app_label)s.view_%(model_name)s"],
        "HEAD": ["%(app_label)s.view_%(model_name)s"],
        "POST": ["%(app_label)s.add_%(model_name)s"],
        "PUT": ["%(app_label)s.change_%(model_name)s"],
        "PATCH": ["%(app_label)s.change_%(model_name)s"],
        "DELETE": ["%(app_label)s.delete_%(model_name)s"],
    }

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not user or not user.is_authenticated or not getattr(user, "is_active", False):
            return False
        required: dict[str, list[str]] | None = getattr(view, "required_permissions", None)
        if required is not None or getattr(view, "queryset", None) is None:
            needed = (required or {}).get(request.method or "GET", [DASHBOARD_PERMISSION])
            return user.has_perms(needed)
        return super().has_permission(request, view)


class IsAgent(permissions.BasePermission):
    """Only an agent token (never a browser session) may push telemetry."""

    message = "This endpoint takes an agent token (Authorization: Bearer gp_...), not a session."

    def has_permission(self, request: Request, view: Any) -> bool:
        from console.models import AgentToken

        return isinstance(request.auth, AgentToken)


def _is_agent(request: Request) -> bool:
    from console.models import AgentToken

    return isinstance(request.auth, AgentToken)


class RoleOrSiteAgentWritePermission(RolePermission):
    """People: their role's model permissions. An agent token: POSTs only (register a training job,
    send its events, report a serving change), and only for its own site's objects; it reads nothing."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if _is_agent(request):
            return request.method == "POST"
        return super().has_permission(request, view)

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        if _is_agent(request):
            return getattr(obj, "site_id", None) == request.auth.site_id
        return True


class DashboardRequiredMixin(PermissionRequiredMixin):
    """For pages: a signed-in user without a role gets 403, not a login loop."""

    permission_required = DASHBOARD_PERMISSION
    raise_exception = True
    # Shown on the 403 page (templates/403.html).
    permission_denied_message = "The console's pages need a role: Viewer, Operator, Compliance officer or Admin."
