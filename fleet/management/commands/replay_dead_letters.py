"""List the GPU batches and Prometheus pushes the ingest writers gave up on, or queue them again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.ingest import push_queue
from fleet.ingest import stream as ingest_stream


class Command(BaseCommand):
    help = (
        "List the dead letters of the ingest queues (GPU batches and Prometheus pushes that failed on "
        "their own data), or with --replay put them back on the queue once the cause is fixed."
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
            left = None if count is None else count - moved
            pushes = push_queue.replay_dead_letters(left) if left is None or left > 0 else 0
            self.stdout.write(
                f"Put {moved} GPU batch(es) back on the ingest queue (a drain is scheduled) and "
                f"{pushes} Prometheus push(es) back on theirs."
            )
            return
        letters = ingest_stream.dead_letters(count or 100)
        pushes = push_queue.dead_letters(count or 100)
        if not letters and not pushes:
            self.stdout.write("No dead letters.")
            return
        for entry_id, fields in letters:
            self.stdout.write(f"{entry_id}  site {fields['site']}  {fields['samples']} samples  {fields['key']}")
            self.stdout.write(f"    {fields['error']}")
        for entry_id, fields in pushes:
            self.stdout.write(
                f"{entry_id}  site {fields['site']}  Prometheus push, {fields['samples']} samples  {fields['key']}"
            )
            self.stdout.write(f"    {fields['error']}")
        shown = len(letters) + len(pushes)
        self.stdout.write(f"{shown} shown. Fix the cause, then: manage.py replay_dead_letters --replay")
