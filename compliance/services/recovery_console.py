"""The console's own database in the recovery register: `manage.py backup` reports each run as a
backup of the register's console-database item, and `manage.py restore` records each restore as a
restore test of it, verified when the manifest comparison found every table equal.

The commands live in ``console`` (which knows no compliance model) and send
console.signals.backup_finished / restore_finished; the receivers here write the records.
"""

from __future__ import annotations

import getpass
from datetime import datetime
from pathlib import Path
from typing import Any

from compliance.choices import BackupOutcome
from compliance.models import BackupReport
from compliance.services import recovery


def _who() -> str:
    """The operating-system user who ran the command (no console user runs a management command)."""
    try:
        return f"{getpass.getuser()} (manage.py)"
    except (OSError, KeyError):
        return "manage.py"


def backup_finished(
    sender: Any, *, dump: Path | None, started: datetime, finished: datetime, size: int | None, ok: bool, **_: Any
) -> BackupReport:
    """Record a `manage.py backup` run against the console-database item; the dump's file name is
    the run id (a failed run: its start time)."""
    item = recovery.console_database_item()
    run = dump.name if dump is not None else f"failed-{started.isoformat()}"
    report, _created = recovery.record_backup(
        item=item,
        external_id=run,
        started=started,
        finished=finished,
        bytes=size,
        outcome=BackupOutcome.SUCCESS if ok else BackupOutcome.FAILED,
        copy_site_id=item.copy_site_id,
        copy_tier=item.copy_tier,
    )
    return report


def restore_finished(
    sender: Any,
    *,
    dump: Path,
    target: str,
    started: datetime,
    finished: datetime,
    verified: bool,
    verification: str,
    **_: Any,
) -> Any:
    """Record a `manage.py restore` as a restore test of the console-database item, linked to the
    backup it restored where that backup reported in (its dump's file name is the run id)."""
    item = recovery.console_database_item()
    backup = BackupReport.objects.filter(item=item, external_id=Path(dump).name).first()
    test, _created = recovery.record_restore_test(
        item=item,
        backup=backup,
        into=target,
        started=started,
        finished=finished,
        verified=verified,
        verification=f"{Path(dump).name}: {verification}",
        by_name=_who(),
    )
    return test


def connect() -> None:
    from console import signals

    signals.backup_finished.connect(backup_finished, dispatch_uid="compliance.recovery.backup_finished")
    signals.restore_finished.connect(restore_finished, dispatch_uid="compliance.recovery.restore_finished")
