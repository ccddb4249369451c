"""List the GPU batches the ingest writers gave up on, or put them back on the queue."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.services import ingest_stream


class Command(BaseCommand):
    help = (
        "List the dead letters of the GPU ingest queue (batches that failed on their own), or with "
        "--replay put them back on the queue once the cause is fixed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--replay", action="store_true", help="put the dead letters back on the queue")
        parser.add_argument("--count", type=int, help="at most this many (default: all to replay, 100 to list)")

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        if settings.EAGER_TASKS:
            raise CommandError("Embedded mode has no ingest queue: batches are written as they arrive.")
        count = options["count"]
        if count is not None and count < 1:
            raise CommandError("--count must be at least 1.")
        if options["replay"]:
            moved = ingest_stream.replay_dead_letters(count)
            self.stdout.write(f"Put {moved} batch(es) back on the ingest queue; a drain is scheduled.")
            return
        letters = ingest_stream.dead_letters(count or 100)
        if not letters:
            self.stdout.write("No dead letters.")
            return
        for entry_id, fields in letters:
            self.stdout.write(f"{entry_id}  site {fields['site']}  {fields['samples']} samples  {fields['key']}")
            self.stdout.write(f"    {fields['error']}")
        self.stdout.write(f"{len(letters)} shown. Fix the cause, then: manage.py replay_dead_letters --replay")
