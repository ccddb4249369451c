from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.backup import BackupError, params_from_url, restore_database


class Command(BaseCommand):
    help = (
        "Restore a `manage.py backup` dump into an empty database, after checking its SHA-256, and "
        "compare every table's row count and checksum with the manifest."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dump", type=Path, help="A goodput-<timestamp>.dump; its .manifest.json must sit beside it")
        parser.add_argument(
            "--database-url",
            required=True,
            help=(
                "The empty target database, postgres://user@host:port/name; on a unix socket (the embedded "
                "server's, var/pgdata): postgres://user@/name?host=/path/to/var/pgdata"
            ),
        )
        parser.add_argument(
            "--verify",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="Recount and re-checksum every table after the restore (default on)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            target = params_from_url(options["database_url"])
        except ValueError as exc:
            raise CommandError(f"--database-url cannot be parsed: {exc}") from exc
        try:
            result = restore_database(options["dump"], target, verify=options["verify"], log=self.stdout.write)
        except BackupError as exc:
            raise CommandError(f"Restore failed: {exc}") from exc
        for mismatch in result.mismatches:
            self.stderr.write(f"MISMATCH {mismatch}")
        self.stdout.write(f"RESULT tables={result.tables} rows={result.rows} mismatches={len(result.mismatches)}")
        if result.mismatches:
            raise CommandError(f"The restored database differs from the backup in {len(result.mismatches)} tables.")
