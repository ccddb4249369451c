"""People: the Admin's services behind the People page (console.views.PeopleView).

Each change is one transaction and leaves its audit entries through the compliance receivers: a
user's create and change (``auth.User``, password redacted), their role (the ``user.groups`` m2m,
before and after), each personal token revoked (``console.PersonalToken``).

A person has one role here (one of console.roles' groups); setting it replaces any other role group
and leaves non-role groups alone. Admins are staff (the Django admin is theirs), nobody else is.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from console import roles, sockets
from console.models import PersonalToken

# Offered on the page, least privileged first.
ROLE_CHOICES = [roles.VIEWER, roles.OPERATOR, roles.CAPACITY_APPROVER, roles.COMPLIANCE_OFFICER, roles.ADMIN]


class PeopleConflict(Exception):
    """A change refused by the current state (HTTP 409): the last Admin, one's own account."""


def teams_of(user: Any) -> list[str]:
    """The names of the teams ``user`` is a member of (fleet.capacity Team records), in name order;
    read from a ``teams`` prefetch when the caller made one."""
    return sorted(team.name for team in user.teams.all())


@dataclass
class PersonRow:
    user: User
    role: str | None
    teams: list[str]
    active_personal_tokens: int
    team_records: list[Any] = field(default_factory=list)  # the Team records, each linking to its page

    @property
    def last_sign_in(self) -> datetime | None:
        return self.user.last_login


def people() -> list[PersonRow]:
    """Every user with their role, teams and active personal-token count (4 queries)."""
    users = (
        User.objects.order_by("username")
        .prefetch_related("groups", "teams")
        .annotate(active_tokens=Count("personal_tokens", filter=Q(personal_tokens__revoked_at__isnull=True)))
    )
    return [
        PersonRow(
            u,
            roles.role_of(u),
            teams_of(u),
            u.active_tokens,  # type: ignore[attr-defined]
            sorted(u.teams.all(), key=lambda team: team.name),
        )
        for u in users
    ]


def generate_password() -> str:
    """A password to hand over once: 20 URL-safe characters (about 120 bits)."""
    return secrets.token_urlsafe(15)


def _set_role_groups(user: User, role: str) -> None:
    role_groups = list(Group.objects.filter(name__in=roles.ROLE_PERMISSIONS))
    keep = [g for g in user.groups.all() if g.name not in roles.ROLE_PERMISSIONS]
    user.groups.set([*keep, *(g for g in role_groups if g.name == role)])


def create_person(*, username: str, email: str, role: str, password: str) -> User:
    """Create an active user with ``role`` in one step (validated by the form first)."""
    if role not in ROLE_CHOICES:
        raise ValueError(role)
    with transaction.atomic():
        user = User.objects.create_user(username=username, email=email, password=password)
        if role == roles.ADMIN:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        _set_role_groups(user, role)
    return user


def _is_last_admin(user: User) -> bool:
    admins = User.objects.filter(is_active=True).filter(Q(is_superuser=True) | Q(groups__name=roles.ADMIN))
    return not admins.exclude(pk=user.pk).exists()


def set_role(user: User, role: str, *, actor: User) -> bool:
    """Give ``user`` the role ``role`` in place of their current one; False when unchanged.
    An Admin cannot take the Admin role from the last active Admin (the console would have none)."""
    if role not in ROLE_CHOICES:
        raise ValueError(role)
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        current = roles.role_of(user)
        if current == role:
            return False
        if current == roles.ADMIN and _is_last_admin(user):
            raise PeopleConflict(f"{user.username} is the last active Admin: make someone else an Admin first.")
        _set_role_groups(user, role)
        if user.is_staff != (role == roles.ADMIN) and not user.is_superuser:
            user.is_staff = role == roles.ADMIN
            user.save(update_fields=["is_staff"])
    return True


def end_sessions(user: User) -> int:
    """Delete the user's sessions (the database session store) and close their websockets after
    commit; returns how many sessions ended. Sessions are signed blobs keyed by a random id, so
    the live ones are decoded to find the user's: a scan the size of the signed-in population."""
    ended = 0
    if settings.SESSION_ENGINE == "django.contrib.sessions.backends.db":
        for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
            if str(session.get_decoded().get("_auth_user_id")) == str(user.pk):
                session.delete()
                ended += 1
    sockets.end_sockets(user.pk)
    return ended


def deactivate(user: User, *, actor: User) -> dict[str, int]:
    """Deactivate ``user``: they can no longer sign in, their personal tokens are revoked and their
    sessions and sockets end. Agent tokens belong to sites, not people: they are left alone."""
    if user.pk == actor.pk:
        raise PeopleConflict("You cannot deactivate your own account: another Admin can.")
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        if not user.is_active:
            raise PeopleConflict(f"{user.username} is already inactive.")
        if roles.role_of(user) == roles.ADMIN and _is_last_admin(user):
            raise PeopleConflict(f"{user.username} is the last active Admin: make someone else an Admin first.")
        user.is_active = False
        user.save(update_fields=["is_active"])
        revoked = sum(token.revoke(actor=actor) for token in PersonalToken.objects.active().filter(user=user))
        sessions = end_sessions(user)
    return {"tokens": revoked, "sessions": sessions}


def reactivate(user: User, *, actor: User) -> None:
    """Let ``user`` sign in again (their revoked tokens stay revoked)."""
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        if user.is_active:
            raise PeopleConflict(f"{user.username} is already active.")
        user.is_active = True
        user.save(update_fields=["is_active"])
