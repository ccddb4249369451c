from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils import timezone

from console.backup import BackupError, backup_database
from console.signals import backup_finished


class Command(BaseCommand):
    help = (
        "Back up the console's database: a pg_dump custom-format file and a manifest of every table's "
        "row count and checksum, both taken in one snapshot. Restore with `manage.py restore`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output", type=Path, default=None, help="Directory for the dump and manifest (default DATA_DIR/backups)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        output = options["output"] or Path(settings.DATA_DIR) / "backups"
        started = timezone.now()
        try:
            dump = backup_database(connections["default"].settings_dict, output, log=self.stdout.write)
        except BackupError as exc:
            self._report(dump=None, started=started, size=None, ok=False)
            raise CommandError(f"Backup failed: {exc}") from exc
        self._report(dump=dump, started=started, size=dump.stat().st_size, ok=True)
        self.stdout.write(str(dump))

    def _report(self, *, dump: Path | None, started: Any, size: int | None, ok: bool) -> None:
        """Tell the recovery register (console.signals.backup_finished); never fails the backup."""
        for _, outcome in backup_finished.send_robust(
            sender=self.__class__, dump=dump, started=started, finished=timezone.now(), size=size, ok=ok
        ):
            if isinstance(outcome, Exception):
                self.stderr.write(f"The backup was not recorded in the recovery register: {outcome}")
