from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from console.backup import BackupError, backup_database


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
        try:
            dump = backup_database(connections["default"].settings_dict, output, log=self.stdout.write)
        except BackupError as exc:
            raise CommandError(f"Backup failed: {exc}") from exc
        self.stdout.write(str(dump))
