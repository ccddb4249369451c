"""`manage.py verify_audit_log`: walk the audit log's hash chain (compliance.services.audit_chain).

Prints ``RESULT entries=<n> head_seq=<seq> head_hash=<sha256> ok`` and exits 0, or names the first
entry that does not match and exits 1. ``--head SEQ:HASH`` (repeatable) also requires an earlier
head, e.g. the ``audit_chain`` of a pack an auditor kept, to still be in the chain: a chain
rewritten from the start by a superuser is consistent again, but no longer holds that head.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from compliance.services import audit_chain

_HEAD = re.compile(r"^(\d{1,18}):([0-9a-f]{64})$")


def _head(value: str) -> tuple[int, str]:
    match = _HEAD.match(value.strip().lower())
    if not match:
        raise CommandError(f"--head {value!r}: give SEQ:HASH, e.g. 1042:{'0' * 64} (the pack's head_seq and head_hash)")
    return int(match.group(1)), match.group(2)


class Command(BaseCommand):
    help = "Walk the audit log's hash chain; exit 1 naming the first entry that does not match."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--head", action="append", default=[], metavar="SEQ:HASH", help="An earlier head the chain must still hold"
        )
        parser.add_argument("--no-record", action="store_true", help="Do not record this check (the home page's line)")

    def handle(self, *args: Any, **options: Any) -> None:
        anchors = [_head(value) for value in options["head"]]
        report = audit_chain.verify_chain(anchors)
        if not options["no_record"]:
            audit_chain.record_check(report, triggered_by="verify_audit_log")
        if report.ok:
            self.stdout.write(report.summary())
            return
        self.stderr.write(f"audit log chain BROKEN: {report.problem}")
        self.stdout.write(report.summary())
        sys.exit(1)
