"""Recovery detectors: functions from the recovery register (compliance.models.recovery) to the
findings true now, registered with the incident engine like the fleet's detectors.

* recovery-rpo-breached: an item's last successful backup finished longer ago than its RPO, or it
  never had one;
* recovery-rto-unproven: no verified restore test within the item's ``restore_test_every``
  (default a quarter): a backup never restored is a wish;
* recovery-backup-failing: its last three backup reports failed;
* recovery-same-site-copy: its last good copy lives on the source's own site and storage tier.

One finding per item and detector. The rules are compliance.services.recovery's, the same the
items API shows. Each detector reads the whole register in five queries (item_states); the
register holds tens to hundreds of items, not telemetry.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from compliance.services.recovery import (
    FAILING_RUNS,
    ItemState,
    backup_failing,
    item_states,
    rpo_breached,
    rto_unproven,
    same_site_copy,
)
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector

CATEGORY = "recovery"


def _hours(delta: timedelta) -> float:
    return round(delta.total_seconds() / 3600, 1)


def _labels(state: ItemState) -> dict[str, Any]:
    item = state.item
    labels: dict[str, Any] = {"recovery_item": item.name, "kind": item.kind}
    if item.source_site is not None:
        labels["site"] = item.source_site.name
    if item.source_tier:
        labels["tier"] = item.source_tier
    return labels


def _spec(detector: str, state: ItemState, severity: str, summary: str, description: str, **impact: Any) -> FindingSpec:
    return FindingSpec(
        fingerprint=f"{detector}:{state.item.pk}",
        labels=_labels(state),
        severity=severity,
        summary=summary,
        description=description,
        impact={"recovery_item": state.item.pk, **impact},
        category=CATEGORY,
    )


@detector("recovery-rpo-breached")
def recovery_rpo_breached(now: datetime) -> list[FindingSpec]:
    """An item whose last successful backup is older than its RPO (SEV3), or that never had one
    (SEV3): losing the source now loses more than the RPO allows."""
    specs = []
    for state in item_states():
        if not rpo_breached(state, now):
            continue
        item, age = state.item, state.backup_age(now)
        if age is None:
            summary = f"{item.name} has no successful backup on record (RPO {_hours(item.rpo)} h)"
        else:
            summary = f"{item.name}'s last good backup is {_hours(age)} h old (RPO {_hours(item.rpo)} h)"
        specs.append(
            _spec(
                "recovery-rpo-breached",
                state,
                Severity.SEV3,
                summary,
                "Restoring now would lose more than the RPO allows. Check the backup job's schedule and its "
                "last runs' reports.",
                rpo_hours=_hours(item.rpo),
                backup_age_hours=None if age is None else _hours(age),
            )
        )
    return specs


@detector("recovery-rto-unproven")
def recovery_rto_unproven(now: datetime) -> list[FindingSpec]:
    """An item without a verified restore test within its ``restore_test_every`` (SEV4)."""
    specs = []
    for state in item_states():
        if not rto_unproven(state, now):
            continue
        item, test = state.item, state.last_verified
        every = item.restore_test_every.days
        if test is None:
            summary = f"{item.name} has never been restored and verified (RTO {_hours(item.rto)} h unproven)"
        else:
            days = (now - test.finished).days
            summary = f"{item.name}'s last verified restore test is {days} days old (every {every} days)"
        specs.append(
            _spec(
                "recovery-rto-unproven",
                state,
                Severity.SEV4,
                summary,
                "A backup never restored is a wish: restore it somewhere, verify the copy (row counts, checksums, "
                "a model that loads), and record the test.",
                rto_hours=_hours(item.rto),
                restore_test_every_days=every,
                last_verified_test=None if test is None else test.pk,
            )
        )
    return specs


@detector("recovery-backup-failing")
def recovery_backup_failing(now: datetime) -> list[FindingSpec]:
    """An item whose last three backup reports failed (SEV3)."""
    specs = []
    for state in item_states():
        if not backup_failing(state):
            continue
        item = state.item
        specs.append(
            _spec(
                "recovery-backup-failing",
                state,
                Severity.SEV3,
                f"{item.name}: the last {FAILING_RUNS} backup runs failed",
                "The backup job keeps failing; each failed run ages the last good copy towards the RPO.",
                failed_runs=[r.external_id for r in state.recent],
            )
        )
    return specs


@detector("recovery-same-site-copy")
def recovery_same_site_copy(now: datetime) -> list[FindingSpec]:
    """An item whose last good copy is on its source's own site and tier (SEV4): no second site."""
    specs = []
    for state in item_states():
        if not same_site_copy(state):
            continue
        item, copy = state.item, state.last_good
        assert copy is not None  # same_site_copy judged it
        specs.append(
            _spec(
                "recovery-same-site-copy",
                state,
                Severity.SEV4,
                f"{item.name}'s copy is on the same site and tier as its source "
                f"({item.source_site}, {item.source_tier or 'no tier'})",
                "Losing the site or the storage tier loses the source and its copy together. Send the copy to "
                "another site or tier.",
                backup=copy.pk,
            )
        )
    return specs
