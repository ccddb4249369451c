"""The recovery register's reads and its one writer.

* ``record_backup``: a backup job's report, idempotent on (item, the job's run id);
* ``item_states``: per item, its last good backup, last reports and restore tests, read in a fixed
  number of queries whatever the register's size (the items API and the detectors share it);
* the rules as plain functions of those figures (``rpo_breached``, ``rto_unproven``,
  ``backup_failing``, ``same_site_copy``), so the API's states and the findings say the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from compliance.choices import BackupOutcome, RecoveryState
from compliance.models import BackupReport, RecoveryItem, RestoreTest

# A report may finish this far ahead of the console's clock (the job's clock runs fast), no further.
CLOCK_SKEW = timedelta(minutes=5)
FAILING_RUNS = 3  # the last this many reports failed: recovery-backup-failing
# The fields of a report that a repeat with the same run id must carry unchanged.
REPORT_FIELDS = ("started", "finished", "bytes", "outcome", "copy_site_id", "copy_tier")


class ReportConflict(Exception):
    """A report repeats a run id with other figures: which fields differ."""

    def __init__(self, existing: BackupReport, fields: list[str]) -> None:
        self.existing = existing
        self.fields = fields
        super().__init__(f"run {existing.external_id} was reported with other {', '.join(fields)}")


def record_backup(*, item: RecoveryItem, external_id: str, **figures: Any) -> tuple[BackupReport, bool]:
    """Record a backup run's report; (the record, whether it is new). A repeat of the same run id
    with the same figures returns the stored record; with other figures it raises ReportConflict
    (a job that reports one run twice, differently, is a bug to see, not a record to overwrite).
    Two concurrent first reports meet at the unique constraint: the loser reads the winner's."""
    try:
        with transaction.atomic():
            return BackupReport.objects.create(item=item, external_id=external_id, **figures), True
    except IntegrityError:
        existing = BackupReport.objects.get(item=item, external_id=external_id)
    differs = [name.removesuffix("_id") for name in REPORT_FIELDS if getattr(existing, name) != figures.get(name)]
    if differs:
        raise ReportConflict(existing, differs)
    return existing, False


@dataclass
class ItemState:
    """One item and what the register knows of its copies."""

    item: RecoveryItem
    last_good: BackupReport | None = None  # the latest successful report (by finished)
    recent: list[BackupReport] = field(default_factory=list)  # the latest FAILING_RUNS reports, newest first
    last_test: RestoreTest | None = None  # the latest restore test, verified or not
    last_verified: RestoreTest | None = None  # the latest verified one

    def backup_age(self, now: datetime) -> timedelta | None:
        return None if self.last_good is None else now - self.last_good.finished


def _latest_per_item(queryset: Any) -> dict[int, Any]:
    """The newest row (by finished) per item: PostgreSQL's DISTINCT ON, one query."""
    rows = queryset.order_by("item_id", "-finished", "-pk").distinct("item_id")
    return {row.item_id: row for row in rows}


def item_states(items: Iterable[RecoveryItem] | None = None) -> list[ItemState]:
    """Every item (or those given) with its figures, in five queries."""
    items = list(
        items
        if items is not None
        else RecoveryItem.objects.select_related("source_site", "copy_site", "dataset", "job")
    )
    ids = [i.pk for i in items]
    good = _latest_per_item(
        BackupReport.objects.filter(item_id__in=ids, outcome=BackupOutcome.SUCCESS).select_related("copy_site")
    )
    tests = _latest_per_item(RestoreTest.objects.filter(item_id__in=ids).select_related("by_user"))
    verified = _latest_per_item(RestoreTest.objects.filter(item_id__in=ids, verified=True))
    recent: dict[int, list[BackupReport]] = {}
    ranked = BackupReport.objects.filter(item_id__in=ids).annotate(
        rank=Window(RowNumber(), partition_by=[F("item_id")], order_by=[F("finished").desc(), F("pk").desc()])
    )
    for report in ranked.filter(rank__lte=FAILING_RUNS).order_by("item_id", "rank"):
        recent.setdefault(report.item_id, []).append(report)
    return [
        ItemState(
            item=i,
            last_good=good.get(i.pk),
            recent=recent.get(i.pk, []),
            last_test=tests.get(i.pk),
            last_verified=verified.get(i.pk),
        )
        for i in items
    ]


# --- the rules ---------------------------------------------------------------------------------


def rpo_breached(state: ItemState, now: datetime) -> bool:
    """No successful backup ever, or the last one finished longer ago than the RPO."""
    age = state.backup_age(now)
    return age is None or age > state.item.rpo


def rpo_state(state: ItemState, now: datetime) -> str:
    """ "never" (no good backup), "breached" or "met"."""
    if state.last_good is None:
        return "never"
    return "breached" if rpo_breached(state, now) else "met"


def rto_unproven(state: ItemState, now: datetime) -> bool:
    """No verified restore test finished within the item's ``restore_test_every``."""
    test = state.last_verified
    return test is None or now - test.finished > state.item.restore_test_every


def backup_failing(state: ItemState) -> bool:
    """The last FAILING_RUNS reports all failed (fewer reports than that: not yet judged)."""
    return len(state.recent) >= FAILING_RUNS and all(r.outcome == BackupOutcome.FAILED for r in state.recent)


def same_site_copy(state: ItemState) -> bool:
    """The last good copy lives on the source's own site and tier: losing either loses both. A copy
    whose site was not reported, or an item without a source site, is not judged."""
    copy, item = state.last_good, state.item
    if copy is None or copy.copy_site_id is None or item.source_site_id is None:
        return False
    return copy.copy_site_id == item.source_site_id and copy.copy_tier == item.source_tier


def problems(state: ItemState, now: datetime) -> list[str]:
    """The RecoveryState values true of the item now, worst first; empty: it is OK. The page's
    state, its filter and the items API read this; the findings apply the same rules."""
    found = []
    if backup_failing(state):
        found.append(RecoveryState.FAILING)
    if rpo_breached(state, now):
        found.append(RecoveryState.RPO_BREACHED)
    if same_site_copy(state):
        found.append(RecoveryState.SAME_SITE)
    if rto_unproven(state, now):
        found.append(RecoveryState.RTO_UNPROVEN)
    return found


def state_of(state: ItemState, now: datetime) -> str:
    """The item's one state: its worst problem, or "ok"."""
    found = problems(state, now)
    return found[0] if found else RecoveryState.OK


def copy_location(state: ItemState) -> tuple[Any, str]:
    """(site, tier) of the copy: the last good backup's where it said, else the item's declared one."""
    good = state.last_good
    if good is not None and (good.copy_site_id is not None or good.copy_tier):
        return good.copy_site, good.copy_tier
    return state.item.copy_site, state.item.copy_tier


class RestoreConflict(Exception):
    """A restore test repeats an idempotency key with other figures: which fields differ."""

    def __init__(self, existing: RestoreTest, fields: list[str]) -> None:
        self.existing = existing
        self.fields = fields
        super().__init__(f"key {existing.external_id} was recorded with other {', '.join(fields)}")


RESTORE_FIELDS = ("backup_id", "into", "started", "finished", "verified")


def record_restore_test(
    *,
    item: RecoveryItem,
    into: str,
    started: datetime,
    finished: datetime,
    verified: bool,
    verification: str = "",
    backup: BackupReport | None = None,
    by_user: Any = None,
    by_name: str = "",
    key: str = "",
) -> tuple[RestoreTest, bool]:
    """Record a restore test; (the record, whether it is new). With ``key``, a repeat with the same
    figures returns the stored record and one with other figures raises RestoreConflict, as
    record_backup does for a run id. Audited (compliance.signals) like any register change."""
    figures = {
        "backup_id": None if backup is None else backup.pk,
        "into": into,
        "started": started,
        "finished": finished,
        "verified": verified,
    }
    fields = {**figures, "verification": verification, "by_user": by_user, "by_name": by_name}
    if not key:
        return RestoreTest.objects.create(item=item, **fields), True
    try:
        with transaction.atomic():
            return RestoreTest.objects.create(item=item, external_id=key, **fields), True
    except IntegrityError:
        existing = RestoreTest.objects.get(item=item, external_id=key)
    differs = [name.removesuffix("_id") for name in RESTORE_FIELDS if getattr(existing, name) != figures[name]]
    if differs:
        raise RestoreConflict(existing, differs)
    return existing, False


def console_database_item() -> RecoveryItem:
    """The register's item for the console's own database: the first of its kind, made (with the
    kind's defaults, backed up by `manage.py backup`) when the register has none."""
    from compliance.choices import BackupMethod, RecoveryKind

    item = RecoveryItem.objects.filter(kind=RecoveryKind.CONSOLE_DATABASE).order_by("pk").first()
    if item is None:
        item, _ = RecoveryItem.objects.get_or_create(
            name=CONSOLE_DATABASE_NAME,
            defaults={"kind": RecoveryKind.CONSOLE_DATABASE, "method": BackupMethod.MANAGE_PY_BACKUP},
        )
    return item


CONSOLE_DATABASE_NAME = "console-database"


def summary(states: list[ItemState], now: datetime) -> dict[str, int]:
    """Items in all, OK, and with each problem: the overview tile and the page's header (one
    count, one definition)."""
    counts = {value: 0 for value in RecoveryState.values}
    counts["items"] = len(states)
    for state in states:
        found = problems(state, now)
        for value in found:
            counts[value] += 1
        if not found:
            counts[RecoveryState.OK] += 1
    return counts
