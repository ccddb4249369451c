"""The roles and the permissions each holds.

Groups are created by a data migration and kept in sync after every migrate (and after the test
runner's flush), so a role always means the permissions listed here.
"""

from __future__ import annotations

from typing import Any

VIEWER = "Viewer"
OPERATOR = "Operator"
COMPLIANCE_OFFICER = "Compliance officer"
ADMIN = "Admin"
# Separation of duties (issue 23): approves what changes capacity supply and quotas (power
# approvals, procurement orders, team quotas), never what they requested themselves.
CAPACITY_APPROVER = "Capacity approver"
APPROVE_CAPACITY = "fleet.approve_capacity"

_READ_FLEET = [
    "console.view_dashboards",
    "fleet.view_site",
    "fleet.view_rack",
    "fleet.view_node",
    "fleet.view_gpu",
    "fleet.view_nodeinterface",
    "fleet.view_nodemount",
    "fleet.view_endpoint",
    "fleet.view_endpointchange",
    "fleet.view_endpointeval",
    "fleet.view_scrapetarget",
    "fleet.view_job",
    "fleet.view_jobevent",
    "fleet.view_jobaccount",
    "fleet.view_pool",
    "fleet.view_procurementorder",
    "fleet.view_powerapproval",
    "fleet.view_team",
    "fleet.view_teamquota",
    "fleet.view_reservation",
    "fleet.view_schedulerqueue",
    "fleet.view_poolprice",
    "incidents.view_incident",
    "incidents.view_finding",
    "incidents.view_timelineentry",
    "incidents.view_actionitem",
    "incidents.view_silence",
]

# The recovery register (issue 26): read, kept and restore-tested by SREs (Operators) and
# Compliance officers; Viewers and Capacity approvers do not see it.
_RECOVERY = [
    "compliance.view_recoveryitem",
    "compliance.add_recoveryitem",
    "compliance.change_recoveryitem",
    "compliance.view_backupreport",
    "compliance.view_restoretest",
    "compliance.add_restoretest",
]

ROLE_PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _READ_FLEET,
    OPERATOR: [
        *_READ_FLEET,
        "console.operate",
        "fleet.change_node",
        "fleet.change_gpu",
        "fleet.change_nodeinterface",
        "fleet.change_nodemount",
        "fleet.change_endpoint",
        "fleet.add_endpointchange",
        "fleet.add_endpointeval",
        "fleet.add_scrapetarget",
        "fleet.change_scrapetarget",
        "fleet.delete_scrapetarget",
        "fleet.add_job",
        "fleet.change_job",
        "fleet.add_jobevent",
        "fleet.add_pool",
        "fleet.change_pool",
        "fleet.change_schedulerqueue",  # map a queue to its pool and team
        "fleet.add_procurementorder",
        "fleet.change_procurementorder",
        "fleet.add_powerapproval",
        "fleet.change_powerapproval",
        "fleet.add_reservation",
        "fleet.change_reservation",
        "incidents.change_incident",
        "incidents.add_timelineentry",
        "incidents.add_actionitem",
        "incidents.change_actionitem",
        "incidents.add_silence",
        "incidents.change_silence",
        "incidents.delete_silence",
        *_RECOVERY,
    ],
    COMPLIANCE_OFFICER: [*_READ_FLEET, "console.manage_compliance", *_RECOVERY],
    # Approves others' orders and power approvals and sets team quotas; requests nothing itself.
    CAPACITY_APPROVER: [
        *_READ_FLEET,
        APPROVE_CAPACITY,
        "fleet.change_procurementorder",
        "fleet.change_powerapproval",
        "fleet.add_teamquota",
        "fleet.change_teamquota",
        "fleet.delete_teamquota",
        # pool prices (fleet.cost): what a GPU-hour costs is the capacity lead's figure
        "fleet.add_poolprice",
        "fleet.change_poolprice",
    ],
    # Admin: every permission of the project's apps and of users and groups.
    ADMIN: ["*"],
}
# axes: an Admin sees and lifts login lockouts.
ADMIN_APPS = ("console", "fleet", "incidents", "compliance", "auth", "axes")


def is_admin(user: Any) -> bool:
    """Holds the Admin role (or is a superuser): the one role whose self-approvals are allowed,
    and recorded as such."""
    if user is None or not getattr(user, "pk", None) or not user.is_active:
        return False
    return bool(user.is_superuser or user.groups.filter(name=ADMIN).exists())


def role_of(user: Any) -> str | None:
    """The user's role: the most privileged role group they are in, None without one."""
    names = {g.name for g in user.groups.all()}
    for role in (ADMIN, CAPACITY_APPROVER, COMPLIANCE_OFFICER, OPERATOR, VIEWER):
        if role in names:
            return role
    return None


def sync_roles(apps: Any) -> None:
    """Create the role groups and set their permissions exactly (idempotent)."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    named = {code.split(".")[0] for codes in ROLE_PERMISSIONS.values() for code in codes if code != "*"}
    # One query for every permission a role may hold, not one per code: each test persona syncs.
    candidates = (
        Permission.objects.filter(content_type__app_label__in={*ADMIN_APPS, *named})
        .select_related("content_type")
        .order_by("content_type__app_label", "content_type__model", "codename")
    )
    by_code: dict[str, Any] = {}
    for perm in candidates:
        # A codename on two models of one app: the first in Permission's ordering, as .first() gave.
        by_code.setdefault(f"{perm.content_type.app_label}.{perm.codename}", perm)
    every = [perm for perm in candidates if perm.content_type.app_label in ADMIN_APPS]
    for role, codes in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        # A permission of an app not migrated yet is missing here and appears on a later sync.
        perms = every if codes == ["*"] else [by_code[code] for code in codes if code in by_code]
        group.permissions.set(perms)


def sync_roles_after_migrate(sender: Any, **kwargs: Any) -> None:
    from django.apps import apps as global_apps

    # post_migrate is sent once per app with models, in INSTALLED_APPS order, each creating that
    # app's permissions: only after the last such app's turn do all permissions exist. An app
    # without models (the goodput shell) is sent nothing, so it cannot be the one waited for.
    with_models = [config for config in global_apps.get_app_configs() if config.models_module is not None]
    if sender is not with_models[-1]:
        return
    sync_roles(kwargs.get("apps") or global_apps)
