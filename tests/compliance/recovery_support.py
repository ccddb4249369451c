"""Shared makers for the recovery register's tests."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from compliance.choices import BackupMethod, BackupOutcome, RecoveryKind
from compliance.models import BackupReport, RecoveryItem, RestoreTest
from fleet.models import Site


def make_item(site: Site | None = None, **fields: Any) -> RecoveryItem:
    fields = {"kind": RecoveryKind.DATASET, "name": "c4-en", "method": BackupMethod.REPLICATION, **fields}
    return RecoveryItem.objects.create(source_site=site, source_tier=fields.pop("source_tier", "nfs"), **fields)


def backup(
    item: RecoveryItem, ago: timedelta, outcome: str = BackupOutcome.SUCCESS, now: datetime | None = None, **fields: Any
) -> BackupReport:
    finished = (now or timezone.now()) - ago
    fields.setdefault("external_id", f"run-{BackupReport.objects.count() + 1}")
    return BackupReport.objects.create(
        item=item, started=finished - timedelta(minutes=20), finished=finished, outcome=outcome, **fields
    )


def restore(item: RecoveryItem, ago: timedelta, verified: bool = True, **fields: Any) -> RestoreTest:
    finished = timezone.now() - ago
    fields.setdefault("by_name", "ops")
    return RestoreTest.objects.create(
        item=item,
        into="scratch-nfs",
        started=finished - timedelta(hours=1),
        finished=finished,
        verified=verified,
        verification="sha256 of every shard matched" if verified else "",
        **fields,
    )
