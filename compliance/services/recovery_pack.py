"""The recovery register in the compliance pack (compliance.services.pack): ``recovery_register.csv``
(every item with its targets, last good backup, last restore test and state, as the /recovery/
page shows them: the same functions of compliance.services.recovery) and ``restore_tests.csv``
(the restore-test log of the period), with a section of pack.pdf."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from compliance.models import RestoreTest
from compliance.services import recovery

CSV_FILES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "recovery_register.csv",
        "recovery_register",
        (
            "name",
            "kind",
            "dataset",
            "job",
            "cluster",
            "source_site",
            "source_tier",
            "method",
            "copy_site",
            "copy_tier",
            "rpo_hours",
            "rto_hours",
            "restore_test_every_days",
            "last_good_backup",
            "last_good_backup_finished",
            "backup_age_hours",
            "last_verified_restore_test",
            "state",
            "problems",
        ),
    ),
    (
        "restore_tests.csv",
        "restore_tests",
        ("id", "item", "by", "backup", "into", "started", "finished", "duration_seconds", "verified", "verification"),
    ),
)


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 2)


def register_rows(now: datetime) -> Iterator[dict[str, Any]]:
    """Every item of the register as of ``now``."""
    for state in recovery.item_states():
        item, good, verified = state.item, state.last_good, state.last_verified
        copy_site, copy_tier = recovery.copy_location(state)
        age = state.backup_age(now)
        yield {
            "name": item.name,
            "kind": item.kind,
            "dataset": item.dataset.name if item.dataset else "",
            "job": item.job.name if item.job else "",
            "cluster": item.cluster,
            "source_site": item.source_site.name if item.source_site else "",
            "source_tier": item.source_tier,
            "method": item.method,
            "copy_site": copy_site.name if copy_site else "",
            "copy_tier": copy_tier,
            "rpo_hours": _hours(item.rpo.total_seconds()),
            "rto_hours": _hours(item.rto.total_seconds()),
            "restore_test_every_days": item.restore_test_every.days,
            "last_good_backup": good.external_id if good else "",
            "last_good_backup_finished": good.finished if good else None,
            "backup_age_hours": None if age is None else _hours(age.total_seconds()),
            "last_verified_restore_test": verified.finished if verified else None,
            "state": recovery.state_of(state, now),
            "problems": [str(p) for p in recovery.problems(state, now)],
        }


def restore_test_rows(start: datetime, end: datetime) -> Iterator[dict[str, Any]]:
    """Every restore test that finished in [start, end), oldest first."""
    tests = (
        RestoreTest.objects.filter(finished__gte=start, finished__lt=end)
        .select_related("item", "by_user", "backup")
        .order_by("finished", "pk")
    )
    for test in tests:
        yield {
            "id": test.pk,
            "item": test.item.name,
            "by": test.by_user.get_username() if test.by_user else test.by_name,
            "backup": test.backup.external_id if test.backup else "",
            "into": test.into,
            "started": test.started,
            "finished": test.finished,
            "duration_seconds": test.duration.total_seconds(),
            "verified": test.verified,
            "verification": test.verification,
        }


def markdown(doc: dict[str, Any], table: Any) -> list[str]:
    """pack.pdf's recovery section; ``table`` is the pack's own table writer."""
    lines = ["", "## 8. Recovery register"]
    register = doc.get("recovery_register", [])
    if not register:
        lines.append("No items in the recovery register.")
    else:
        lines += table(
            ("Item", "Class", "RPO h", "Backup age h", "RTO h", "Copy", "Last verified restore", "State"),
            (
                (
                    r["name"],
                    r["kind"],
                    r["rpo_hours"],
                    r["backup_age_hours"] if r["backup_age_hours"] is not None else "never",
                    r["rto_hours"],
                    f"{r['copy_site']} {r['copy_tier']}".strip(),
                    r["last_verified_restore_test"] or "never",
                    ", ".join(r["problems"]) or "ok",
                )
                for r in register
            ),
        )
    tests = doc.get("restore_tests", [])
    lines += ["", f"### Restore tests of the period ({len(tests)})"]
    if tests:
        lines += table(
            ("Finished", "Item", "By", "Into", "Seconds", "Verified"),
            ((t["finished"], t["item"], t["by"], t["into"], t["duration_seconds"], t["verified"]) for t in tests),
        )
    return lines
