"""What is audited: the create, change and delete of the models below, plus changes of users'
roles (the m2m ``user.groups``) and permissions, and sign-ins: each sign-in, sign-out, failed
sign-in and django-axes lock-out (before, only axes' own tables knew of them).

Receivers are connected per sender, so a model not listed here (telemetry samples, latest GPU
state, rollups) pays nothing: Django skips a signal with no receiver for its sender. An audited
update costs one SELECT of the old row (pre_save) and one INSERT.

Queryset ``.update()`` sends no signal; the services that change audited rows that way (incident,
reservation and token transitions) send ``console.signals.row_changed`` after it, received here.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from compliance.choices import AuditAction
from compliance.services.audit import (
    AuditSpec,
    needs_before,
    normalised,
    record,
    record_delete,
    record_save,
    snapshot,
    stored_snapshot,
)
from console.signals import row_changed

_PLAIN = AuditSpec()
_TOKEN = AuditSpec(secret=frozenset({"secret_hash"}), ignored=frozenset({"last_used_at"}))
# Scrape bookkeeping is the scraper's, not a change anyone made.
_SCRAPE_STATE = frozenset(
    {"next_scrape_at", "last_scrape_at", "last_duration_ms", "last_samples", "last_error", "health"}
)

AUDITED: dict[str, AuditSpec] = {
    # compliance records (not AuditEntry itself)
    "compliance.GpaiModel": _PLAIN,
    "compliance.Dataset": _PLAIN,
    # CrawledDomain rows are not audited one by one (a re-import replaces thousands): the import
    # writes one entry on its dataset with the counts before and after (services.register).
    "compliance.Lineage": _PLAIN,
    "compliance.SummaryVersion": _PLAIN,
    "compliance.DataAsset": _PLAIN,
    "compliance.ProcessorRecord": _PLAIN,
    "compliance.SubjectRequest": _PLAIN,
    "compliance.RetentionPolicy": _PLAIN,
    "compliance.LegalHold": _PLAIN,
    "compliance.RetentionRun": _PLAIN,
    # The recovery register and its restore tests; backup reports are machines' telemetry, not edits.
    "compliance.RecoveryItem": _PLAIN,
    "compliance.RestoreTest": _PLAIN,
    # A pack build saves its progress many times: only a status change is worth an entry.
    "compliance.CompliancePack": AuditSpec(only=frozenset({"status"})),  # its zip is in CompliancePackChunk
    # incidents and routing (a webhook URL or integration key is a credential)
    "incidents.Incident": _PLAIN,
    "incidents.TimelineEntry": _PLAIN,
    "incidents.ActionItem": _PLAIN,
    "incidents.Silence": _PLAIN,
    "incidents.NotificationChannel": AuditSpec(secret=frozenset({"url", "routing_key"})),
    "incidents.MaintenanceWindow": _PLAIN,
    # reservations and capacity
    "fleet.Reservation": _PLAIN,
    "fleet.Pool": _PLAIN,
    "fleet.PoolPrice": _PLAIN,
    "fleet.ProcurementOrder": _PLAIN,
    "fleet.PowerApproval": _PLAIN,
    "fleet.TeamQuota": _PLAIN,
    "fleet.Team": _PLAIN,
    # inventory: ingest creates nodes and GPUs with bulk_create (no signal), and GPU state and
    # samples live in other tables, so only changes made by people reach these receivers.
    "fleet.Site": _PLAIN,
    "fleet.Rack": _PLAIN,
    "fleet.Node": _PLAIN,
    "fleet.Gpu": _PLAIN,
    "fleet.NodeInterface": AuditSpec(ignored=frozenset({"rate_bytes_per_second"})),
    "fleet.NodeMount": AuditSpec(ignored=frozenset({"fstype", "device"})),
    # Ingest registers queues with bulk_create and follows their cohort with update(): only a
    # person's change (the pool a queue admits onto) reaches the receivers.
    "fleet.SchedulerQueue": _PLAIN,
    "fleet.ClaimConflict": AuditSpec(ignored=frozenset({"last_seen", "count", "claimant_hostname"})),
    "fleet.ScrapeTarget": AuditSpec(ignored=_SCRAPE_STATE),
    "fleet.Endpoint": _PLAIN,
    # people, roles and credentials
    "auth.User": AuditSpec(secret=frozenset({"password"}), ignored=frozenset({"last_login"})),
    "auth.Group": _PLAIN,
    "console.AgentToken": _TOKEN,
    "console.PersonalToken": _TOKEN,
}

# m2m relations whose changes are a change of their owner: (model, field).
AUDITED_M2M = [
    ("auth.User", "groups"),
    ("auth.User", "user_permissions"),
    ("auth.Group", "permissions"),
    ("fleet.Team", "members"),
]

_specs: dict[type[models.Model], AuditSpec] = {}
_m2m_fields: dict[type[models.Model], models.ManyToManyField] = {}  # type: ignore[type-arg]


def _before_save(sender: type[models.Model], instance: models.Model, raw: bool, using: str, **kwargs: Any) -> None:
    spec = _specs[sender]
    if raw or instance._state.adding or instance.pk is None:
        return
    if needs_before(instance, spec, kwargs.get("update_fields")):
        instance._audit_before = stored_snapshot(instance, spec, using)  # type: ignore[attr-defined]


def _after_save(sender: type[models.Model], instance: models.Model, created: bool, raw: bool, **kwargs: Any) -> None:
    if raw:
        return
    update_fields = kwargs.get("update_fields")
    spec = _specs[sender]
    if not created and not needs_before(instance, spec, update_fields):
        return
    before = instance.__dict__.pop("_audit_before", None)
    record_save(instance, spec, created=created, before=before, update_fields=update_fields)


def _row_changed(
    sender: type[models.Model], instance: models.Model, before: dict[str, Any], message: str = "", **kwargs: Any
) -> None:
    """A conditional UPDATE by a service: the row before is the row now with ``before`` put back."""
    spec = _specs.get(sender)
    if spec is None:
        return
    was = snapshot(instance, spec)
    for name, value in before.items():
        f = instance._meta.get_field(name)
        was[f.name] = normalised(f, value)
    record_save(instance, spec, created=False, before=was, message=message)


def _after_delete(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    record_delete(instance, _specs[sender])


def _members(field: models.ManyToManyField, owner_ids: list[Any]) -> dict[Any, list[str]]:  # type: ignore[type-arg]
    """Owner id -> sorted names of what it is linked to, e.g. a user's group names."""
    through = field.remote_field.through
    owner, target = field.m2m_field_name(), field.m2m_reverse_field_name()
    members: dict[Any, list[str]] = {pk: [] for pk in owner_ids}
    for link in through.objects.filter(**{f"{owner}__in": owner_ids}).select_related(target):
        members[getattr(link, f"{owner}_id")].append(str(getattr(link, target)))
    return {pk: sorted(names) for pk, names in members.items()}


def _m2m_owner_ids(field: Any, instance: models.Model, reverse: bool, pk_set: set[Any] | None) -> list[Any]:
    if not reverse:
        return [instance.pk]
    if pk_set is not None:
        return sorted(pk_set)
    through = field.remote_field.through  # group.user_set.clear(): whoever is linked now
    return list(
        through.objects.filter(**{field.m2m_reverse_field_name(): instance.pk}).values_list(
            f"{field.m2m_field_name()}_id", flat=True
        )
    )


def _m2m(
    sender: Any, instance: models.Model, action: str, reverse: bool, pk_set: set[Any] | None, **kwargs: Any
) -> None:
    """A role or permission given or taken: an update of the user (or group) with the list before
    and after. The list before is read in ``pre_*`` and kept on the instance for ``post_*``."""
    field = _m2m_fields[sender]
    key = f"_audit_m2m_{field.name}"
    if action in ("pre_add", "pre_remove", "pre_clear"):
        owners = _m2m_owner_ids(field, instance, reverse, pk_set)
        instance.__dict__[key] = _members(field, owners)
        return
    before: dict[Any, list[str]] = instance.__dict__.pop(key, {})
    after = _members(field, list(before))
    changed = [pk for pk in before if before[pk] != after[pk]]
    owners = [instance] if not reverse else list(field.model._base_manager.filter(pk__in=changed))
    for owner in owners:
        if owner.pk in changed:
            record(
                AuditAction.UPDATE,
                obj=owner,
                before={field.name: before[owner.pk]},
                after={field.name: after[owner.pk]},
            )


# -- Sign-ins ---------------------------------------------------------------------------------


def _client_address(request: Any) -> str | None:
    """The address django-axes counts (the client's behind the proxy), else the peer's."""
    if request is None:
        return None
    return getattr(request, "axes_ip_address", None) or request.META.get("REMOTE_ADDR") or None


def _attempted(username: Any) -> str:
    return str(username or "")[:150] or "(blank)"


def _signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    record(AuditAction.SIGN_IN, obj=user, actor=user, message="signed in", remote_addr=_client_address(request))


def _signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        record(AuditAction.SIGN_OUT, obj=user, actor=user, message="signed out", remote_addr=_client_address(request))


def _sign_in_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """Django hands over the credentials with the password already masked; only the name is kept."""
    name = _attempted(credentials.get("username"))
    record(
        AuditAction.SIGN_IN_FAILED,
        actor=name,
        after={"username": name},
        message="sign-in failed",
        remote_addr=_client_address(request),
    )


def _locked_out(sender: Any, request: Any, username: Any, ip_address: Any, **kwargs: Any) -> None:
    name = _attempted(username)
    failures = getattr(request, "axes_failures_since_start", None)
    record(
        AuditAction.LOCKOUT,
        actor=name,
        after={"username": name, "failures": failures},
        message=f"sign-in locked out{f' after {failures} failures' if failures else ''}",
        remote_addr=str(ip_address) if ip_address else _client_address(request),
    )


def connect() -> None:
    """Connect the receivers to each audited model (from ComplianceConfig.ready)."""
    from axes.signals import user_locked_out
    from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed

    user_logged_in.connect(_signed_in, dispatch_uid="compliance.audit.signed_in")
    user_logged_out.connect(_signed_out, dispatch_uid="compliance.audit.signed_out")
    user_login_failed.connect(_sign_in_failed, dispatch_uid="compliance.audit.sign_in_failed")
    user_locked_out.connect(_locked_out, dispatch_uid="compliance.audit.locked_out")
    for label, spec in AUDITED.items():
        model = apps.get_model(label)
        _specs[model] = spec
        uid = f"compliance.audit.{label}"
        pre_save.connect(_before_save, sender=model, dispatch_uid=uid)
        post_save.connect(_after_save, sender=model, dispatch_uid=uid)
        post_delete.connect(_after_delete, sender=model, dispatch_uid=uid)
    row_changed.connect(_row_changed, dispatch_uid="compliance.audit.row_changed")
    for label, name in AUDITED_M2M:
        field = apps.get_model(label)._meta.get_field(name)
        through = field.remote_field.through  # type: ignore[union-attr]
        _m2m_fields[through] = field  # type: ignore[assignment]
        m2m_changed.connect(_m2m, sender=through, dispatch_uid=f"compliance.audit.{label}.{name}")
