"""`manage.py verify_audit_log`: walk the audit log's hash chain (compliance.services.audit_chain).

Prints ``RESULT entries=<n> heads_checked=<n> head_seq=<seq> head_hash=<sha256> ok`` and exits 0,
or names the first entry (or kept head) that does not match and exits 1.

Every head kept in GOODPUT_AUDIT_HEADS_DIR (compliance.services.audit_heads) must still be in the
chain: a chain rewritten from the start by someone with the owner's rights is consistent again,
but no longer holds them. ``--head SEQ:HASH`` (repeatable) adds one, e.g. the ``audit_chain`` of a
pack an auditor kept; ``--heads-file`` reads another copy of the heads file.

The walk here is Python's, independent of the database's functions; unless ``--no-record``, the
owner's ``goodput_audit_verify`` then walks it too and records its verdict (the compliance home
page's line). Should the two disagree, the command says so and exits 1.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from compliance.services import audit_chain, audit_heads

_HEAD = re.compile(r"^(\d{1,18}):([0-9a-f]{64})$")


def _head(value: str) -> audit_chain.Anchor:
    match = _HEAD.match(value.strip().lower())
    if not match:
        raise CommandError(f"--head {value!r}: give SEQ:HASH, e.g. 1042:{'0' * 64} (the pack's head_seq and head_hash)")
    return audit_chain.Anchor(int(match.group(1)), match.group(2))


class Command(BaseCommand):
    help = "Walk the audit log's hash chain against every kept head; exit 1 naming the first that does not match."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--head", action="append", default=[], metavar="SEQ:HASH", help="An earlier head the chain must still hold"
        )
        parser.add_argument(
            "--heads-file", type=Path, help="A heads file to check against (default: GOODPUT_AUDIT_HEADS_DIR's)"
        )
        parser.add_argument("--no-record", action="store_true", help="Do not record this check (the home page's line)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            kept = audit_heads.kept_heads(options["heads_file"])
        except audit_heads.HeadsFileError as exc:
            raise CommandError(f"the heads file is damaged: {exc}") from exc
        if options["heads_file"] and not options["heads_file"].exists():
            raise CommandError(f"--heads-file {options['heads_file']}: no such file")
        anchors = [head.anchor() for head in kept] + [_head(value) for value in options["head"]]
        report = audit_chain.verify_chain(anchors)
        summary = report.summary()
        verdicts_differ = False
        if not options["no_record"]:
            check = audit_chain.check_and_record(anchors, triggered_by="verify_audit_log")
            if (check.ok, check.first_bad_entry) != (report.ok, report.first_bad_entry):
                verdicts_differ = True
                self.stderr.write(
                    "the database's walk (goodput_audit_verify) disagrees with this one: it says "
                    f"{'ok' if check.ok else check.problem!r}. Its function may have been replaced."
                )
        if report.ok and not verdicts_differ:
            self.stdout.write(summary)
            return
        if not report.ok:
            self.stderr.write(f"audit log chain BROKEN: {report.problem}")
        self.stdout.write(summary)
        sys.exit(1)
