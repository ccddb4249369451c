"""What GPU telemetry costs on disk: bytes per GPU per day, raw and at each rollup level.

For each level (raw samples, 1-minute rollups, 1-hour rollups) the tables of that level are
measured partition by partition: ``pg_total_relation_size`` (heap, indexes and TOAST) of every
partition that holds rows, divided by the GPUs that report and by the days the data spans. With
the retention settings that gives the steady-state size of a fleet:
``bytes_per_gpu_day x GPUs x retention days`` per level (docs/scaling.md).

The span is read from the rows themselves (the oldest row of the oldest partition holding data to
the newest row of the newest one, plus one bucket), so a database that has run for an hour is
measured over that hour rather than over the whole day its partition could hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection

from fleet.telemetry import partitions
from fleet.telemetry.partitions import PartitionedTable

DAY = timedelta(days=1)


@dataclass(frozen=True)
class Level:
    name: str
    time_column: str
    bucket: timedelta  # the width one row stands for (a raw sample: none)
    per_gpu: PartitionedTable  # rows per GPU
    per_group: PartitionedTable | None = None  # the same level's node/rack/site/fleet rows


LEVELS = (
    Level("raw", "ts", timedelta(0), partitions.SAMPLES),
    Level("1m", "bucket", timedelta(minutes=1), partitions.GPU_ROLLUP_1M, partitions.GROUP_ROLLUP_1M),
    Level("1h", "bucket", timedelta(hours=1), partitions.GPU_ROLLUP_1H, partitions.GROUP_ROLLUP_1H),
)


@dataclass(frozen=True)
class TableFootprint:
    table: str
    partitions: int  # partitions holding rows
    bytes: int
    first: datetime | None
    last: datetime | None


@dataclass(frozen=True)
class LevelFootprint:
    level: str
    tables: tuple[TableFootprint, ...]
    bytes: int
    days: float  # the span of the level's per-GPU data
    gpus: int
    retention_days: int

    @property
    def bytes_per_gpu_day(self) -> float | None:
        if not self.gpus or self.days <= 0:
            return None
        return self.bytes / self.gpus / self.days

    @property
    def steady_state_bytes_per_gpu(self) -> float | None:
        """What one GPU's data at this level weighs once retention has reached its limit."""
        per_day = self.bytes_per_gpu_day
        return None if per_day is None else per_day * self.retention_days


def reporting_gpus() -> int:
    """GPUs that have reported (one latest-state row each); the inventory's count if none has."""
    from fleet.inventory.models import Gpu
    from fleet.telemetry.models import GpuState

    return GpuState.objects.count() or Gpu.objects.count()


def measure_table(table: PartitionedTable, time_column: str) -> TableFootprint:
    """Size and time span of one partitioned table's partitions that hold rows.

    Only the oldest and the newest non-empty partitions are scanned (for their first and last
    row); the others are only sized.
    """
    names = [name for name, _ in sorted(partitions.existing_partitions(table).items(), key=lambda item: item[1][0])]
    size, holding = 0, []
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'SELECT EXISTS (SELECT 1 FROM "{name}")')
            if not cursor.fetchone()[0]:
                continue
            cursor.execute("SELECT pg_total_relation_size(%s::regclass)", [name])
            size += cursor.fetchone()[0]
            holding.append(name)
        first = last = None
        if holding:
            cursor.execute(f'SELECT min("{time_column}") FROM "{holding[0]}"')
            first = cursor.fetchone()[0]
            cursor.execute(f'SELECT max("{time_column}") FROM "{holding[-1]}"')
            last = cursor.fetchone()[0]
    return TableFootprint(table.name, len(holding), size, first, last)


def measure(*, gpus: int | None = None) -> list[LevelFootprint]:
    """Bytes per GPU per day at each level (module docstring). ``gpus`` overrides the count of
    GPUs that report (for a database whose inventory holds more GPUs than sent samples)."""
    from django.conf import settings

    gpus = reporting_gpus() if gpus is None else gpus
    result = []
    for level in LEVELS:
        tables = [measure_table(level.per_gpu, level.time_column)]
        if level.per_group is not None:
            tables.append(measure_table(level.per_group, level.time_column))
        per_gpu = tables[0]
        days = 0.0
        if per_gpu.first is not None and per_gpu.last is not None:
            days = (per_gpu.last - per_gpu.first + level.bucket) / DAY
        retention = getattr(settings, level.per_gpu.retention_setting)
        result.append(
            LevelFootprint(
                level=level.name,
                tables=tuple(tables),
                bytes=sum(t.bytes for t in tables),
                days=days,
                gpus=gpus,
                retention_days=int(retention),
            )
        )
    return result


def result_line(levels: list[LevelFootprint]) -> str:
    """One ``RESULT`` line, as the benchmarks print theirs."""
    parts = [f"gpus={levels[0].gpus if levels else 0}"]
    for level in levels:
        per_day = level.bytes_per_gpu_day
        steady = level.steady_state_bytes_per_gpu
        parts += [
            f"{level.level}_bytes_per_gpu_day=" + ("-" if per_day is None else f"{per_day:.0f}"),
            f"{level.level}_days={level.days:.3f}",
            f"{level.level}_kept_days={level.retention_days}",
            f"{level.level}_steady_mb_per_gpu=" + ("-" if steady is None else f"{steady / 1e6:.2f}"),
        ]
    return "RESULT storage " + " ".join(parts)
