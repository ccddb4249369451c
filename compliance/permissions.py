"""Compliance records are for compliance officers and admins only: one permission,
``console.manage_compliance``, gates every page, API route, export and the pack, for reads too
(viewers and operators get 403)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.auth.mixins import PermissionRequiredMixin
from rest_framework import permissions

if TYPE_CHECKING:
    from rest_framework.request import Request

COMPLIANCE_PERMISSION = "console.manage_compliance"


def may_manage_compliance(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(COMPLIANCE_PERMISSION))


class ComplianceRequiredMixin(PermissionRequiredMixin):
    """For pages: a signed-in user without the role gets 403 (LoginRequiredMiddleware has sent
    anyone signed out to the login page already)."""

    permission_required = COMPLIANCE_PERMISSION
    raise_exception = True
    permission_denied_message = "Compliance records need the Compliance officer or Admin role."


class CompliancePermission(permissions.BasePermission):
    """For the API: every method needs the compliance role (sessions and personal tokens; agent
    tokens never hold it)."""

    message = ComplianceRequiredMixin.permission_denied_message

    def has_permission(self, request: Request, view: Any) -> bool:
        return may_manage_compliance(request.user)


# The recovery register: SREs (Operators), Compliance officers and Admins read it, keep it and
# record restore tests (console.roles._RECOVERY); the other roles do not see it.
RECOVERY_VIEW = "compliance.view_recoveryitem"
RECOVERY_ADD = "compliance.add_recoveryitem"
RECOVERY_CHANGE = "compliance.change_recoveryitem"
RESTORE_TEST_ADD = "compliance.add_restoretest"


class RecoveryRequiredMixin(PermissionRequiredMixin):
    """For the recovery pages: a signed-in user without the permission gets 403."""

    permission_required = RECOVERY_VIEW
    raise_exception = True
    permission_denied_message = "The recovery register needs the Operator, Compliance officer or Admin role."
