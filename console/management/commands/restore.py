from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from console.backup import BackupError, params_from_url, restore_database
from console.signals import restore_finished


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
        started = timezone.now()
        try:
            result = restore_database(options["dump"], target, verify=options["verify"], log=self.stdout.write)
        except BackupError as exc:
            raise CommandError(f"Restore failed: {exc}") from exc
        for mismatch in result.mismatches:
            self.stderr.write(f"MISMATCH {mismatch}")
        self.stdout.write(f"RESULT tables={result.tables} rows={result.rows} mismatches={len(result.mismatches)}")
        if options["verify"]:
            verification = (
                f"manage.py restore: {result.tables} tables, {result.rows} rows compared with the manifest; "
                f"{len(result.mismatches)} mismatches"
            )
        else:
            verification = "manage.py restore --no-verify: not compared with the manifest"
        where = target.get("host", "")
        for _, outcome in restore_finished.send_robust(
            sender=self.__class__,
            dump=options["dump"],
            target=f"{where}/{target.get('dbname', '')}" if where else target.get("dbname", ""),
            started=started,
            finished=timezone.now(),
            verified=options["verify"] and not result.mismatches,
            verification=verification,
        ):
            if isinstance(outcome, Exception):
                self.stderr.write(f"The restore test was not recorded in the recovery register: {outcome}")
        if result.mismatches:
            raise CommandError(f"The restored database differs from the backup in {len(result.mismatches)} tables.")
