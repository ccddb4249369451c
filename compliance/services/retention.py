"""Retention: which policy governs each class of data, and its enforcement on what the console holds.

Policies. A class the console holds (choices.CONSOLE_HELD) is enforced; any other class is an
attestation (an owner reviews it by a date). A class with no policy follows DEFAULT_DAYS. A
tenant's own policy beats the all-tenants one; incidents carry their tenant as the ``tenant``
label (the way Alertmanager alerts do), and the other console-held records have none, so only
incidents take tenant policies.

Enforcement, per class (``run_retention``; every application, dry runs included, writes one
RetentionRun and one audit entry):

1. Incidents: resolved incidents whose ``resolved_at`` is older than the cutoff are deleted with
   their timeline entries, findings, action items and notifications. An active legal hold on
   incidents (all, or those in its ``incident_ids``, for its tenant or all) keeps them, counted as
   ``held``; so is an incident that a kept incident was merged into (the merge link protects it).
   Their timeline entries go through ``goodput_purge_incident_timeline``, the owner's SECURITY
   DEFINER function (migration 0006): the timeline's trigger refuses every other DELETE.
2. Audit entries older than the cutoff and older than the audit floor (``audit.floor_days()``,
   7 years unless the deployment says otherwise, never under one), deleted by the database's purge
   function, which also keeps the floor and records itself. Any active hold on audit keeps them
   all; so does the day after an audit hold was released or an audit policy changed
   (``AUDIT_PURGE_WAIT``), and releasing an audit hold takes two people (``release_hold``).
3. Telemetry and serving samples live in daily partitions that fleet.telemetry.partitions drops
   whole, at the deployment's retention settings (RAW_RETENTION_DAYS for samples, the rollup
   settings for rollups). The simplest correct way to enforce them here is to call its
   ``drop_expired_partitions`` rather than a second, competing deletion: so a policy on these
   classes must say RAW_RETENTION_DAYS (``policy_errors`` refuses any other figure, since the
   record would otherwise claim what the console does not do). One call drops both classes'
   tables, so an active hold on either skips the drop for both (said in each run's detail). Each
   PartitionDrop row this call makes is named in its run's detail; drops made elsewhere (the hourly
   fleet task) become runs of their own with ``triggered_by="partition-drop"``
   (``record_partition_drops``, idempotent), and until then ``timeline`` lists them beside the runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from compliance.choices import CONSOLE_HELD, AuditAction, DataClass, RetentionAction
from compliance.models import AuditEntry, LegalHold, RetentionPolicy, RetentionRun
from compliance.services import audit
from fleet.models import PartitionDrop
from fleet.telemetry import partitions
from incidents.models import Finding, Incident, TimelineEntry

# Defaults where no policy says otherwise (REFERENCE.md, "GDPR facts"): incidents two years,
# audit entries seven years, inference content 30 days. The partitioned classes: see raw_days().
DEFAULT_DAYS: dict[str, int] = {
    DataClass.INCIDENTS: 730,
    DataClass.AUDIT: 2555,
    DataClass.INFERENCE_CONTENT: 30,
}
PARTITIONED = (DataClass.TELEMETRY, DataClass.SERVING_SAMPLES)
# Console-held classes in the order a run applies them.
ENFORCED_ORDER = (DataClass.TELEMETRY, DataClass.SERVING_SAMPLES, DataClass.INCIDENTS, DataClass.AUDIT)
_TABLE_CLASS = {
    partitions.SAMPLES.name: DataClass.TELEMETRY,
    partitions.GPU_ROLLUP_1M.name: DataClass.TELEMETRY,
    partitions.GROUP_ROLLUP_1M.name: DataClass.TELEMETRY,
    partitions.GPU_ROLLUP_1H.name: DataClass.TELEMETRY,
    partitions.GROUP_ROLLUP_1H.name: DataClass.TELEMETRY,
    partitions.SERVING_SAMPLES.name: DataClass.SERVING_SAMPLES,
    partitions.SERVING_ROLLUP_1M.name: DataClass.SERVING_SAMPLES,
    partitions.SERVING_ROLLUP_1H.name: DataClass.SERVING_SAMPLES,
    # node_exporter's and the schedulers' series: machine telemetry, dropped with the GPU samples.
    partitions.PORT_SAMPLES.name: DataClass.TELEMETRY,
    partitions.PORT_ROLLUP_1M.name: DataClass.TELEMETRY,
    partitions.FABRIC_ROLLUP_1M.name: DataClass.TELEMETRY,
    partitions.MOUNT_SAMPLES.name: DataClass.TELEMETRY,
    partitions.MOUNT_ROLLUP_1M.name: DataClass.TELEMETRY,
    partitions.DISK_SAMPLES.name: DataClass.TELEMETRY,
    partitions.DISK_ROLLUP_1M.name: DataClass.TELEMETRY,
    partitions.SCHEDULER_SAMPLES.name: DataClass.TELEMETRY,
    partitions.SCHEDULER_ROLLUP_1M.name: DataClass.TELEMETRY,
}
PARTITION_DROP = "partition-drop"
# After an audit hold is released, or an audit policy is made or changed, the purge waits this
# long: one officer cannot release and purge the audit log in one sitting.
AUDIT_PURGE_WAIT = timedelta(hours=24)
# Any 64-bit key of our own: serialises record_partition_drops between concurrent runs.
_DROP_IMPORT_LOCK = 0x7265_7465_6E74


def raw_days() -> int:
    """The partitioned samples' retention: a deployment setting, not a database record."""
    return int(settings.RAW_RETENTION_DAYS)


def default_days(data_class: str) -> int | None:
    if data_class in PARTITIONED:
        return raw_days()
    if data_class == DataClass.AUDIT:
        return max(DEFAULT_DAYS[DataClass.AUDIT], audit.floor_days())
    return DEFAULT_DAYS.get(data_class)


@dataclass(frozen=True)
class Effective:
    """The policy that governs one class for one tenant (blank: all), or the default (policy None)."""

    data_class: str
    tenant: str
    days: int
    policy: RetentionPolicy | None

    @property
    def label(self) -> str:
        return DataClass(self.data_class).label


def effective_policies() -> list[Effective]:
    """What run_retention applies: each console-held class's policies, plus the default for a
    class with no all-tenants policy."""
    by_class: dict[str, list[RetentionPolicy]] = {c: [] for c in ENFORCED_ORDER}
    for policy in RetentionPolicy.objects.filter(data_class__in=ENFORCED_ORDER):
        by_class[policy.data_class].append(policy)
    result = []
    for data_class in ENFORCED_ORDER:
        policies = sorted(by_class[data_class], key=lambda p: p.tenant)
        if not any(p.tenant == "" for p in policies):
            result.append(Effective(data_class, "", default_days(data_class) or 0, None))
        result += [Effective(data_class, p.tenant, p.days, p) for p in policies]
    return result


# The longest policy taken: beyond it a cutoff falls off the calendar (and means "forever" anyway).
MAX_POLICY_DAYS = 36_500


def policy_errors(
    *, data_class: str, tenant: str, days: int | None, action: str, owner: str, review_due: date | None
) -> dict[str, str]:
    """Field -> message for a policy the console could not honour as written (forms and the API
    both ask this, so a bad policy is refused the same way at each door)."""
    errors: dict[str, str] = {}
    if days is not None and days > MAX_POLICY_DAYS:
        errors["days"] = f"At most {MAX_POLICY_DAYS} days (100 years)."
    if data_class == DataClass.AUDIT and days is not None and days < audit.floor_days():
        errors["days"] = (
            f"At least {audit.floor_days()} days: audit entries are kept for GOODPUT_AUDIT_RETENTION_FLOOR_DAYS "
            f"({audit.floor_days()} days), a deployment setting no policy goes below."
        )
    if data_class in CONSOLE_HELD:
        if action != RetentionAction.DELETE:
            errors["action"] = "The console deletes what it holds; anonymise applies to attested stores."
        if tenant and data_class != DataClass.INCIDENTS:
            errors["tenant"] = "Only incidents carry a tenant (their 'tenant' label); leave it blank."
        if data_class in PARTITIONED and days is not None and days != raw_days():
            errors["days"] = (
                f"Samples live in daily partitions dropped after RAW_RETENTION_DAYS ({raw_days()} days, "
                "a deployment setting); change the setting, then record the policy with that figure."
            )
    else:
        if not owner.strip():
            errors["owner"] = "An attestation needs an owner: the console does not hold this data."
        if review_due is None:
            errors["review_due"] = "An attestation needs a review date."
    return errors


def _record(run: RetentionRun) -> RetentionRun:
    audit.record(
        AuditAction.ACTION,
        obj=run,
        after={"affected": run.affected, "held": run.held, "dry_run": run.dry_run, "cutoff": run.cutoff},
        message=f"retention {'dry run' if run.dry_run else 'run'}: {run.get_data_class_display()}"
        f"{' (' + run.tenant + ')' if run.tenant else ''}, {run.affected} affected, {run.held} held",
    )
    return run


def _new_run(eff: Effective, *, cutoff: datetime, started: datetime, dry_run: bool, triggered_by: str, **fields: Any):
    return _record(
        RetentionRun.objects.create(
            data_class=eff.data_class,
            tenant=eff.tenant,
            policy=eff.policy,
            policy_days=eff.days,
            cutoff=cutoff,
            dry_run=dry_run,
            started_at=started,
            finished_at=timezone.now(),
            triggered_by=triggered_by[:100],
            **fields,
        )
    )


# --- incidents -----------------------------------------------------------------------------------


def _hold_filter(holds: Iterable[LegalHold]) -> Q | None:
    """The incidents the active holds keep, or None when none does."""
    q: Q | None = None
    for hold in holds:
        part = Q()
        if hold.tenant:
            part &= Q(labels__tenant=hold.tenant)
        if hold.incident_ids:
            part &= Q(pk__in=[int(i) for i in hold.incident_ids])
        q = part if q is None else q | part
    return q


def _apply_incidents(eff: Effective, tenants_with_policy: set[str], *, now: datetime, dry_run: bool, by: str):
    started = timezone.now()
    cutoff = now - timedelta(days=eff.days)
    due = Incident.objects.resolved().filter(resolved_at__lt=cutoff)
    if eff.tenant:
        due = due.filter(labels__tenant=eff.tenant)
    elif tenants_with_policy:
        # Not "labels->tenant NOT IN (...)": that is NULL, so false, for incidents with no tenant label.
        due = due.exclude(Q(labels__has_key="tenant") & Q(labels__tenant__in=sorted(tenants_with_policy)))
    hold_q = _hold_filter(LegalHold.objects.active().filter(data_class=DataClass.INCIDENTS))
    due_ids = set(due.values_list("pk", flat=True))
    held_ids = set(due.filter(hold_q).values_list("pk", flat=True)) if hold_q is not None and due_ids else set()
    deletable = due_ids - held_ids
    # An incident that a surviving incident was merged into stays too (the link protects it).
    kept_for_merge: set[int] = set()
    while deletable:
        blocked = set(
            Incident.objects.filter(merged_into__in=deletable)
            .exclude(pk__in=deletable)
            .values_list("merged_into", flat=True)
        )
        if not blocked:
            break
        deletable -= blocked
        kept_for_merge |= blocked
    detail: dict[str, Any] = {"tenant_label": eff.tenant or None}
    if held_ids:
        detail["held_ids"] = sorted(held_ids)
    if kept_for_merge:
        detail["kept_as_merge_targets"] = sorted(kept_for_merge)
    detail["timeline_entries"] = TimelineEntry.objects.filter(incident__in=deletable).count()
    detail["findings"] = Finding.objects.filter(incident__in=deletable).count()
    if deletable and not dry_run:
        with transaction.atomic(), connection.cursor() as cursor:
            # The one door through the timeline's append-only trigger (migration 0006).
            cursor.execute("SELECT goodput_purge_incident_timeline(%s)", [sorted(deletable)])
            Finding.objects.filter(incident__in=deletable).delete()
            Incident.objects.filter(pk__in=deletable).update(merged_into=None)
            Incident.objects.filter(pk__in=deletable).delete()  # action items, notifications cascade
    return _new_run(
        eff,
        cutoff=cutoff,
        started=started,
        dry_run=dry_run,
        triggered_by=by,
        affected=len(deletable),
        held=len(held_ids) + len(kept_for_merge),
        detail=detail,
    )


# --- audit ---------------------------------------------------------------------------------------


def audit_purge_waits_until(now: datetime) -> tuple[datetime, str] | None:
    """When the audit purge may run again, and why, while an audit hold's release or an audit
    policy's change is under a day old; None when nothing holds it back."""
    since = now - AUDIT_PURGE_WAIT
    reasons: list[tuple[datetime, str]] = [
        (hold.released_at, f"legal hold '{hold.name}' on audit entries was released")
        for hold in LegalHold.objects.filter(data_class=DataClass.AUDIT, released_at__gt=since)
        if hold.released_at is not None
    ]
    reasons += [
        (policy.updated_at, f"the audit policy ({policy.days} days) was set")
        for policy in RetentionPolicy.objects.filter(data_class=DataClass.AUDIT, updated_at__gt=since)
    ]
    if not reasons:
        return None
    at, why = max(reasons)
    return at + AUDIT_PURGE_WAIT, f"{why} at {at:%Y-%m-%d %H:%M} UTC; the purge waits until a day after"


def _apply_audit(eff: Effective, *, now: datetime, dry_run: bool, by: str) -> RetentionRun:
    started = timezone.now()
    floor = audit.floor_days()
    cutoff = now - timedelta(days=max(eff.days, floor))
    due = AuditEntry.objects.filter(at__lt=cutoff)
    hold = LegalHold.objects.active().filter(data_class=DataClass.AUDIT).first()
    count = due.count()
    detail: dict[str, Any] = {"floor_days": floor}
    if hold is not None:
        detail["skipped"] = f"legal hold '{hold.name}' on audit entries"
    elif waiting := audit_purge_waits_until(now):
        detail["skipped"], detail["waits_until"] = waiting[1], waiting[0].isoformat()
    if "skipped" in detail:
        return _new_run(
            eff, cutoff=cutoff, started=started, dry_run=dry_run, triggered_by=by, held=count, detail=detail
        )
    if count and not dry_run:
        count = audit.purge_entries_before(cutoff, actor=by)
    return _new_run(
        eff, cutoff=cutoff, started=started, dry_run=dry_run, triggered_by=by, affected=count, detail=detail
    )


# --- partitioned telemetry -----------------------------------------------------------------------


def _expired_partitions(now: datetime) -> dict[str, list[dict[str, Any]]]:
    """Per class, the partitions drop_expired_partitions would drop now, with their row counts."""
    expired: dict[str, list[dict[str, Any]]] = {c: [] for c in PARTITIONED}
    for table in partitions.TABLES:
        cutoff = now - table.retention
        for name, (_start, end) in sorted(partitions.existing_partitions(table).items()):
            if end > cutoff:
                continue
            with connection.cursor() as cursor:
                cursor.execute(f'SELECT count(*) FROM "{name}"')
                rows = cursor.fetchone()[0]
            expired[_TABLE_CLASS[table.name]].append({"partition": name, "rows": rows})
    return expired


def _apply_partitions(effs: list[Effective], *, now: datetime, dry_run: bool, by: str) -> list[RetentionRun]:
    started = timezone.now()
    cutoff = now - timedelta(days=raw_days())
    holds = list(LegalHold.objects.active().filter(data_class__in=PARTITIONED))
    runs = []
    if dry_run or holds:
        expired = _expired_partitions(now)
        skipped = ", ".join(f"'{h.name}' ({h.get_data_class_display()})" for h in holds)
        for eff in effs:
            found = expired[eff.data_class]
            rows = sum(p["rows"] for p in found)
            detail: dict[str, Any] = {"partitions": [p["partition"] for p in found]}
            if holds:
                detail["skipped"] = f"legal hold {skipped}: one drop serves every telemetry table, so none ran"
            runs.append(
                _new_run(
                    eff,
                    cutoff=cutoff,
                    started=started,
                    dry_run=dry_run,
                    triggered_by=by,
                    affected=0 if holds else rows,
                    held=rows if holds else 0,
                    detail=detail,
                )
            )
        return runs
    dropped = partitions.drop_expired_partitions(now=now)
    names = [str(d["partition"]) for d in dropped]
    drops = list(PartitionDrop.objects.filter(partition__in=names, dropped_at__gte=started))
    for eff in effs:
        mine = [d for d in drops if _TABLE_CLASS.get(d.table) == eff.data_class]
        runs.append(
            _new_run(
                eff,
                cutoff=cutoff,
                started=started,
                dry_run=False,
                triggered_by=by,
                affected=sum(d.rows for d in mine),
                detail={"partitions": [d.partition for d in mine], "partition_drop_ids": [d.pk for d in mine]},
            )
        )
    return runs


def _recorded_drop_ids() -> set[int]:
    ids: set[int] = set()
    for detail in (
        RetentionRun.objects.filter(data_class__in=PARTITIONED)
        .filter(Q(detail__has_key="partition_drop_id") | Q(detail__has_key="partition_drop_ids"))
        .values_list("detail", flat=True)
    ):
        if "partition_drop_id" in detail:
            ids.add(int(detail["partition_drop_id"]))
        ids.update(int(i) for i in detail.get("partition_drop_ids", ()))
    return ids


def unrecorded_partition_drops() -> list[PartitionDrop]:
    """Partition drops not yet shown by any run (made by the hourly fleet task since the last run)."""
    recorded = _recorded_drop_ids()
    return [d for d in PartitionDrop.objects.order_by("dropped_at", "pk") if d.pk not in recorded]


def record_partition_drops() -> list[RetentionRun]:
    """Make each partition drop no run names yet into a run of its own (idempotent: a transaction
    advisory lock keeps two concurrent callers from recording one drop twice)."""
    retention_of = {t.name: getattr(settings, t.retention_setting) for t in partitions.TABLES}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_DROP_IMPORT_LOCK])
        runs = RetentionRun.objects.bulk_create(
            RetentionRun(
                data_class=_TABLE_CLASS.get(drop.table, DataClass.TELEMETRY),
                policy_days=retention_of.get(drop.table),
                cutoff=drop.range_end,
                affected=drop.rows,
                started_at=drop.dropped_at,
                finished_at=drop.dropped_at,
                triggered_by=PARTITION_DROP,
                detail={
                    "partition_drop_id": drop.pk,
                    "table": drop.table,
                    "partition": drop.partition,
                    "bytes": drop.bytes,
                },
            )
            for drop in unrecorded_partition_drops()
        )
        if runs:
            audit.record(AuditAction.ACTION, message=f"retention: {len(runs)} partition drops recorded as runs")
    return runs


# --- legal holds --------------------------------------------------------------------------------


def hold_errors(*, data_class: str, incident_ids: list[int]) -> dict[str, str]:
    """Field -> message for a hold that would not hold what it says."""
    if incident_ids and data_class != DataClass.INCIDENTS:
        return {"incident_ids": "Only a hold on incidents names incidents; leave it empty."}
    return {}


class HoldAlreadyReleased(Exception):
    """A release of a hold someone released already (409 at the API)."""


class SecondPersonRequired(Exception):
    """The person who asked for an audit hold's release tried to approve it too (409 at the API)."""


def release_hold(hold: LegalHold, *, by: Any, now: datetime | None = None) -> LegalHold:
    """Release an active hold; its ``released_at`` stays None while an audit hold waits for its
    second person.

    A hold on the audit log takes two people: the first call asks (``release_requested_by``),
    and a call by another compliance officer or admin releases it (``released_by``). Every step
    is a conditional UPDATE, so two callers cannot both win, and each is audited.
    """
    now = now or timezone.now()
    active = LegalHold.objects.filter(pk=hold.pk, released_at__isnull=True)
    if hold.data_class == DataClass.AUDIT:
        if active.filter(release_requested_by__isnull=True).update(release_requested_by=by, release_requested_at=now):
            hold.refresh_from_db()
            audit.record(
                AuditAction.ACTION,
                obj=hold,
                after={"release_requested_by": by.get_username(), "release_requested_at": now},
                message=f"release of legal hold requested: {hold} (another compliance officer or an admin approves)",
            )
            return hold
        hold.refresh_from_db()
        if hold.released_at is None and hold.release_requested_by_id == by.pk:
            raise SecondPersonRequired(
                f"You asked for the release of legal hold '{hold.name}': another compliance officer or an admin "
                "approves it."
            )
        active = active.filter(release_requested_by=hold.release_requested_by_id).exclude(release_requested_by=by)
    if not active.update(released_at=now, released_by=by):
        raise HoldAlreadyReleased(f"Legal hold '{hold.name}' was released already.")
    hold.refresh_from_db()
    after: dict[str, Any] = {"released_at": now, "released_by": by.get_username()}
    if hold.release_requested_by_id is not None:
        after["release_requested_by_id"] = hold.release_requested_by_id
    audit.record(AuditAction.ACTION, obj=hold, after=after, message=f"legal hold released: {hold}")
    return hold


# --- the run -------------------------------------------------------------------------------------


def run_retention(
    *, dry_run: bool = False, now: datetime | None = None, triggered_by: str = "beat"
) -> list[RetentionRun]:
    """Apply every console-held policy (the defaults where none is set), in ENFORCED_ORDER; return
    the runs recorded. A dry run counts the same rows and changes nothing but the run records."""
    now = now or timezone.now()
    effs = effective_policies()
    runs = _apply_partitions(
        [e for e in effs if e.data_class in PARTITIONED], now=now, dry_run=dry_run, by=triggered_by
    )
    incident_tenants = {e.tenant for e in effs if e.data_class == DataClass.INCIDENTS and e.tenant}
    for eff in effs:
        if eff.data_class == DataClass.INCIDENTS:
            runs.append(_apply_incidents(eff, incident_tenants, now=now, dry_run=dry_run, by=triggered_by))
        elif eff.data_class == DataClass.AUDIT:
            runs.append(_apply_audit(eff, now=now, dry_run=dry_run, by=triggered_by))
    if not dry_run:
        record_partition_drops()
    return runs


# --- what the pages show -------------------------------------------------------------------------


@dataclass(frozen=True)
class Attestation:
    """A class the console does not hold: its policy (or the default with no owner yet)."""

    data_class: str
    label: str
    policy: RetentionPolicy | None
    days: int | None
    overdue: bool


def attestations(today: date) -> list[Attestation]:
    """Every attested class with its policies; a class with none shows its default, overdue (no
    owner has reviewed it)."""
    result = []
    policies = RetentionPolicy.objects.exclude(data_class__in=CONSOLE_HELD)
    by_class: dict[str, list[RetentionPolicy]] = {}
    for policy in policies:
        by_class.setdefault(policy.data_class, []).append(policy)
    for data_class in DataClass:
        if data_class in CONSOLE_HELD:
            continue
        mine = by_class.get(data_class, [])
        if not mine:
            result.append(Attestation(data_class, data_class.label, None, default_days(data_class), True))
        result += [Attestation(data_class, data_class.label, p, p.days, p.review_overdue(today)) for p in mine]
    return result


@dataclass(frozen=True)
class TimelineItem:
    at: datetime
    run: RetentionRun | None
    drop: PartitionDrop | None


def timeline(limit: int = 100) -> list[TimelineItem]:
    """The latest runs, with the partition drops no run names yet, newest first."""
    items = [TimelineItem(r.started_at, r, None) for r in RetentionRun.objects.select_related("policy")[:limit]]
    items += [TimelineItem(d.dropped_at, None, d) for d in unrecorded_partition_drops()[-limit:]]
    items.sort(key=lambda i: i.at, reverse=True)
    return items[:limit]
