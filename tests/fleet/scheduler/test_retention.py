"""The scheduler series are machine telemetry: a retention preview names their expired day
partitions with the GPU samples' and a run drops them whole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection

from compliance.choices import DataClass
from compliance.services import retention
from fleet.telemetry import partitions

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [name])
        return cursor.fetchone()[0] is not None


def test_expired_scheduler_partitions_are_previewed_and_dropped_as_telemetry(db) -> None:
    day = NOW - timedelta(days=400)  # past the raw and the 1-minute rollups' retention
    partitions.forget_known_partitions()
    names = []
    for table in (partitions.SCHEDULER_SAMPLES, partitions.SCHEDULER_ROLLUP_1M, partitions.PORT_SAMPLES):
        partitions.ensure_partitions(table, day, day)
        names.append(table.partition_name(table.start_of(day)))
    (preview,) = [r for r in retention.run_retention(now=NOW, dry_run=True) if r.data_class == DataClass.TELEMETRY]
    assert set(names) <= set(preview.detail["partitions"])
    retention.run_retention(now=NOW)
    assert not any(_exists(name) for name in names)
