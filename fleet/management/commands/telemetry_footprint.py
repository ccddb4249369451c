"""Print what GPU telemetry weighs on disk: bytes per GPU per day, raw and per rollup level."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.telemetry import footprint


class Command(BaseCommand):
    help = (
        "Measure GPU telemetry's storage: pg_total_relation_size over the partitions holding rows, "
        "divided by the GPUs that report and the days the data spans, for raw samples, 1-minute and "
        "1-hour rollups; with the retention settings, what each level weighs per GPU once full."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--gpus", type=int, help="divide by this many GPUs (default: the GPUs that have reported)")

    def handle(self, *args: Any, **options: Any) -> None:
        gpus = options["gpus"]
        if gpus is not None and gpus < 1:
            raise CommandError("--gpus must be at least 1.")
        levels = footprint.measure(gpus=gpus)
        if not levels[0].gpus:
            raise CommandError("No GPUs have reported yet: nothing to divide by (or pass --gpus).")
        self.stdout.write(
            f"{'level':<6}{'tables':<44}{'partitions':>11}{'MB':>11}{'days':>9}{'B/GPU/day':>12}{'kept d':>8}"
        )
        for level in levels:
            per_day = level.bytes_per_gpu_day
            self.stdout.write(
                f"{level.level:<6}{' + '.join(t.table for t in level.tables):<44}"
                f"{sum(t.partitions for t in level.tables):>11}{level.bytes / 1e6:>11.2f}{level.days:>9.3f}"
                f"{'-' if per_day is None else f'{per_day:,.0f}':>12}{level.retention_days:>8}"
            )
        self.stdout.write(footprint.result_line(levels))
