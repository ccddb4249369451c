"""Writing the audit log. ``record`` is the one way an entry is written; the actor is the person
(or token) of the request being served, else "system" (Celery tasks, management commands).

Who: ``AuditActorMiddleware`` binds the request to this context and the actor is resolved only
when an entry is written, because DRF authenticates a token inside the view, after the
middleware has run (it then sets the Django request's ``user`` and ``auth``).
What: ``compliance.signals`` calls ``record_save`` / ``record_delete`` for the audited models.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, connections, models
from django.http import HttpRequest
from django.utils import timezone
from django.utils.duration import duration_iso_string

from compliance.choices import AuditAction
from compliance.models import AuditEntry
from console.models import AgentToken

Actor = tuple[int | None, str, str | None]  # (user id or None, name shown, remote address or None)

# Either an explicit actor (set_actor) or the request being served (bind_request), resolved late.
_actor: ContextVar[Actor | HttpRequest | None] = ContextVar("goodput_audit_actor", default=None)

REDACTED = "[redacted]"


def set_actor(actor: Any, remote_addr: str | None = None) -> Token[Actor | HttpRequest | None]:
    """Make ``actor`` (a user, or a label such as a token's name) the actor of what follows in this
    context; returns the token to reset it with."""
    if isinstance(actor, str):
        return _actor.set((None, actor, remote_addr))
    return _actor.set((actor.pk, actor.get_username(), remote_addr))


def bind_request(request: HttpRequest) -> Token[Actor | HttpRequest | None]:
    """Make whoever ``request`` turns out to act for the actor of what follows (the middleware)."""
    return _actor.set(request)


def reset_actor(token: Token[Actor | HttpRequest | None]) -> None:
    _actor.reset(token)


def _request_actor(request: HttpRequest) -> Actor:
    """The person of a session or personal token, else the agent token, else "anonymous".

    DRF's Request sets ``user`` and ``auth`` on the Django request it wraps, so both are seen here
    once the view has authenticated; an agent token's user is a principal without a primary key.
    """
    remote_addr = request.META.get("REMOTE_ADDR") or None
    auth = getattr(request, "auth", None)
    if isinstance(auth, AgentToken):
        return None, f"agent:{auth.name}", remote_addr
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.pk is not None:
        return user.pk, user.get_username(), remote_addr
    return None, "anonymous", remote_addr


def current_actor() -> Actor:
    bound = _actor.get()
    if bound is None:
        return None, "system", None
    if isinstance(bound, tuple):
        return bound
    return _request_actor(bound)


def _json_safe(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):  # a recovery item's RPO and RTO: ISO 8601 (P1DT00H00M00S)
        return duration_iso_string(value)
    if isinstance(value, Decimal):
        # Fixed-point, without exponent or trailing zeros: 3E+24 and the database's
        # 3000000000000000000000000.00 are one value, so they must not read as a change.
        return format(value.normalize(), "f") if value.is_finite() else str(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return f"<{len(value)} bytes>"
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return value


def record(
    action: AuditAction | str,
    *,
    obj: models.Model | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    message: str = "",
    actor: Any = None,
    remote_addr: str | None = None,
) -> AuditEntry:
    """Append one entry. ``actor`` overrides the context's (a user or a label), ``remote_addr``
    the request's address (a sign-in gives the client's, as django-axes counts it)."""
    if actor is None:
        actor_id, actor_name, context_addr = current_actor()
    elif isinstance(actor, str):
        actor_id, actor_name, context_addr = None, actor, current_actor()[2]
    else:
        actor_id, actor_name, context_addr = actor.pk, actor.get_username(), current_actor()[2]
    remote_addr = remote_addr or context_addr
    meta = obj._meta if obj is not None else None
    return AuditEntry.objects.create(
        at=timezone.now(),
        actor_id=actor_id,
        actor=actor_name[:200],
        action=str(action),
        app_label=meta.app_label if meta else "",
        model=meta.model_name if meta else "",
        object_id=str(obj.pk) if obj is not None and obj.pk is not None else "",
        object_repr=str(obj)[:300] if obj is not None else "",
        before=_json_safe(before),
        after=_json_safe(after),
        message=message[:500],
        remote_addr=remote_addr,
    )


# -- Model changes (called by compliance.signals) ---------------------------------------------


@dataclass(frozen=True)
class AuditSpec:
    """How one model is audited.

    - ``secret``: written as "[redacted]", so an entry says that a password or token hash changed
      but never what it is;
    - ``omit``: left out of the entry entirely (binary content);
    - ``ignored``: a save changing only these (and ``auto_now`` stamps) writes nothing, e.g. a
      user's ``last_login``;
    - ``only``: when set, an update is written only if one of these changed (a pack's status, not
      each step of its progress).
    """

    secret: frozenset[str] = field(default_factory=frozenset)
    omit: frozenset[str] = field(default_factory=frozenset)
    ignored: frozenset[str] = field(default_factory=frozenset)
    only: frozenset[str] | None = None


def _fields(instance: models.Model, spec: AuditSpec) -> list[models.Field]:  # type: ignore[type-arg]
    return [f for f in instance._meta.concrete_fields if f.name not in spec.omit]


def normalised(f: models.Field, value: Any) -> Any:  # type: ignore[type-arg]
    """The value as the database would give it back, so that a date assigned as a string does not
    read as a change."""
    try:
        return _json_safe(f.to_python(value))
    except (ValidationError, TypeError, ValueError):
        return _json_safe(value)


def snapshot(instance: models.Model, spec: AuditSpec) -> dict[str, Any]:
    """The instance's concrete fields by name (foreign keys as ids), secrets still in clear: only
    ``_redact`` output is ever written."""
    return {f.name: normalised(f, f.value_from_object(instance)) for f in _fields(instance, spec)}


def stored_snapshot(instance: models.Model, spec: AuditSpec, using: str) -> dict[str, Any] | None:
    """The row as it is in the database now (one SELECT), or None when there is none."""
    fields = _fields(instance, spec)
    row = type(instance)._base_manager.using(using).filter(pk=instance.pk).values(*[f.attname for f in fields]).first()
    if row is None:
        return None
    return {f.name: normalised(f, row[f.attname]) for f in fields}


def _redact(values: dict[str, Any], spec: AuditSpec) -> dict[str, Any]:
    return {k: (REDACTED if k in spec.secret and v not in (None, "") else v) for k, v in values.items()}


def _quiet_fields(instance: models.Model, spec: AuditSpec) -> set[str]:
    stamps = {f.name for f in instance._meta.concrete_fields if getattr(f, "auto_now", False)}
    return stamps | set(spec.ignored)


def needs_before(instance: models.Model, spec: AuditSpec, update_fields: Any) -> bool:
    """Whether a save is worth the SELECT of the old row: not for a save of ignored fields only."""
    if update_fields is None:
        return True
    return not set(update_fields) <= _quiet_fields(instance, spec)


def record_save(
    instance: models.Model,
    spec: AuditSpec,
    *,
    created: bool,
    before: dict[str, Any] | None,
    update_fields: Any = None,
    message: str = "",
) -> AuditEntry | None:
    """Write the create or update of ``instance``; nothing when no audited field changed."""
    after = snapshot(instance, spec)
    if created or before is None:
        return record(AuditAction.CREATE, obj=instance, after=_redact(after, spec), message=message)
    if update_fields is not None:
        # Only these columns were written; the rest of a stale instance is not what the row holds.
        names = {instance._meta.get_field(n).name for n in update_fields}
        after = {k: (after[k] if k in names else v) for k, v in before.items()}
    changed = {k for k in after if before.get(k) != after[k]} - _quiet_fields(instance, spec)
    if not changed or (spec.only is not None and not changed & spec.only):
        return None
    return record(
        AuditAction.UPDATE, obj=instance, before=_redact(before, spec), after=_redact(after, spec), message=message
    )


def record_delete(instance: models.Model, spec: AuditSpec) -> AuditEntry:
    return record(AuditAction.DELETE, obj=instance, before=_redact(snapshot(instance, spec), spec))


def field_diff(entry: AuditEntry) -> list[tuple[str, Any, Any]]:
    """(field, before, after) for the fields an entry changed; every field of a create or delete."""
    before, after = entry.before or {}, entry.after or {}
    names = list(dict.fromkeys([*before, *after]))
    if entry.before is None or entry.after is None:
        return [(n, before.get(n), after.get(n)) for n in names]
    return [(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]


# -- Purging past the audit policy ------------------------------------------------------------


def floor_days() -> int:
    """No audit entry younger than this is ever deleted (GOODPUT_AUDIT_RETENTION_FLOOR_DAYS, at
    least 365; the database's purge function holds its own copy, written by migrate)."""
    return int(settings.AUDIT_RETENTION_FLOOR_DAYS)


def write_floor(using: str = "default") -> None:
    """Put the deployment's floor where the purge function reads it (after each migrate, as the
    owner: the console's role may only read that table)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT to_regclass('goodput_audit_settings') IS NOT NULL")
        if cursor.fetchone()[0]:
            cursor.execute(
                "UPDATE goodput_audit_settings SET floor_days = %s WHERE id = 1 AND floor_days <> %s",
                [floor_days(), floor_days()],
            )


def purge_entries_before(cutoff: datetime, *, actor: str = "system") -> int:
    """Delete the entries older than ``cutoff`` and than the floor; returns how many.

    The only way an entry is deleted: ``goodput_audit_purge``, the owner's SECURITY DEFINER
    function, created with SET search_path = pg_catalog, pg_temp and every name schema-qualified
    (migration 0009), so no function the console's role could plant runs inside it. It seals
    what is pending, deletes, never the newest entry, and
    writes its own entry (action "purge") naming the sequence ranges it removed.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT goodput_audit_purge(%s, %s)", [cutoff, actor[:200]])
        return int(cursor.fetchone()[0])


def seal_pending() -> int:
    """Seal this transaction's entries now rather than at commit (a test, or a pack that names the
    chain's head while entries of its own transaction are still pending); returns how many."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT goodput_audit_seal_pending()")
        return int(cursor.fetchone()[0])
