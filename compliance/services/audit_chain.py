"""The audit log's hash chain, walked from Python: what ``manage.py verify_audit_log``, the daily
task, the compliance home page and the pack say about it.

The database seals each entry at commit (migration 0006) with an ``AuditSeal``: ``content_hash``
is the SHA-256 of the entry's content as ``content_text`` spells it, ``hash`` the SHA-256 of
``prev_hash`` followed by ``content_hash`` (both hex), and ``seq`` numbers the entries in commit
order. The walk recomputes
both hashes from the stored columns here, independently of the database's functions, so a
changed function does not change the verdict; it reads the column values as PostgreSQL prints
them (jsonb text, the address's host), which is what was hashed.

What it catches, naming the first entry that does not match:
- an edited entry (its content no longer matches its content hash), even one edited by a
  superuser with the triggers disabled;
- a removed or inserted entry (its seal left behind, a gap in ``seq``, or a ``prev_hash`` that is
  not the hash before),
  unless a purge entry written by ``goodput_audit_purge`` names the removed range and the hash it
  ended on (and that purge kept the one-year minimum);
- an entry that was never sealed (written with the sealing trigger disabled).
A whole chain rewritten by a superuser is internally consistent again: an earlier head kept
outside the database is what catches that (the hourly heads file, compliance.services.audit_heads;
a pack's ``audit_chain``; ``--head SEQ:HASH``). A head inside a range a purge removed passes only
when it is older than that purge's cutoff, since a purge never reaches younger entries.

The recorded checks (the compliance home page's "hash chain verified") are written only by the
owner's ``goodput_audit_verify`` (compliance migration 0009), the same walk in the database:
the console's role may read that table, never write it. ``manage.py verify_audit_log`` runs both
and says so if they disagree.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection, transaction

from compliance.choices import AuditAction
from compliance.models import GENESIS_HASH, AuditChainCheck, AuditEntry, AuditSeal

# Every entry with its seal, in chain order (a seal whose entry is gone, and an entry never sealed,
# included); then the content columns in the order goodput_audit_content() (migration 0006) takes.
_WALK_SQL = """
SELECT coalesce(e.id, s.entry_id), e.id IS NOT NULL, s.seq, s.content_hash, s.prev_hash, s.hash,
       e.id::text, to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), e.actor_id::text, e.actor,
       e.action, e.app_label, e.model, e.object_id, e.object_repr, e.before::text, e.after::text, e.message,
       host(e.remote_addr)
FROM compliance_auditentry e FULL JOIN compliance_auditseal s ON s.entry_id = e.id
ORDER BY s.seq NULLS LAST, e.id
"""
# A purge may not reach entries younger than this, whatever the floor setting says.
MIN_FLOOR = timedelta(days=365)
_FETCH = 5000


def content_text(fields: Iterable[str | None]) -> str:
    """Each field as ``<length>:<text>``, or ``~`` for NULL, run together."""
    return "".join("~" if value is None else f"{len(value)}:{value}" for value in fields)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chain_hash(prev_hash: str, content_hash: str) -> str:
    return sha256_hex(prev_hash + content_hash)


class Anchor(NamedTuple):
    """An earlier head the chain must still hold; ``at`` (the entry's time) where it is known."""

    seq: int
    hash: str
    at: datetime | None = None


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str
    entry_id: int
    at: datetime


@dataclass
class ChainReport:
    ok: bool = True
    entries: int = 0
    head: Head | None = None
    problem: str = ""
    first_bad_entry: int | None = None
    duration_ms: int = 0
    anchors_checked: list[int] = field(default_factory=list)

    def fail(self, entry_id: int | None, problem: str) -> None:
        if self.ok:
            self.ok, self.first_bad_entry, self.problem = False, entry_id, problem[:500]

    def summary(self) -> str:
        head = f"head_seq={self.head.seq} head_hash={self.head.hash}" if self.head else "head_seq=none"
        verdict = "ok" if self.ok else f"BROKEN first_bad_entry={self.first_bad_entry}"
        return f"RESULT entries={self.entries} heads_checked={len(self.anchors_checked)} {head} {verdict}"


@dataclass(frozen=True)
class _Span:
    """A run of entries a purge removed: seq ``lo``..``hi``, the last of which had ``last_hash``."""

    hi: int
    last_hash: str
    purge_id: int
    cutoff: datetime


def _purged_spans(report: ChainReport) -> dict[int, _Span]:
    """lo -> span, from every purge entry; a purge that reached entries under a year old is a
    problem in itself (the function never does that)."""
    spans: dict[int, _Span] = {}
    purges = AuditEntry.objects.filter(action=AuditAction.PURGE, app_label="compliance", model="auditentry")
    for entry_id, at, after in purges.order_by("id").values_list("id", "at", "after"):
        after = after if isinstance(after, dict) else {}
        try:
            cutoff = datetime.fromisoformat(str(after["cutoff"]))
            ranges = [(int(lo), int(hi), str(h)) for lo, hi, h in after["seq_ranges"]]
        except (KeyError, TypeError, ValueError):
            report.fail(entry_id, f"purge entry #{entry_id} does not say what it removed in a form the walk can read")
            continue
        if cutoff > at - MIN_FLOOR:
            report.fail(entry_id, f"purge entry #{entry_id} removed entries younger than a year (cutoff {cutoff})")
        for lo, hi, last_hash in ranges:
            spans[lo] = _Span(hi, last_hash, entry_id, cutoff)
    return spans


def _bridge(after_seq: int, next_seq: int, spans: dict[int, _Span]) -> str | None:
    """The hash the entry at ``next_seq`` must follow when purges removed every entry between
    ``after_seq`` and it; None when something else is missing."""
    cursor, last_hash = after_seq + 1, None
    while cursor < next_seq:
        span = spans.get(cursor)
        if span is None or span.hi >= next_seq:
            return None
        cursor, last_hash = span.hi + 1, span.last_hash
    return last_hash


def _anchor_problem(anchor: Anchor, seen: dict[int, str], spans: dict[int, _Span]) -> str | None:
    """Why ``anchor`` is not in the chain, or None when it is (or was purged, being old enough)."""
    seq, expected, at = anchor
    if seq in seen:
        return None if seen[seq] == expected else f"has hash {seen[seq]}"
    span = next((span for lo, span in spans.items() if lo <= seq <= span.hi), None)
    if span is None:
        return "is missing"
    if span.hi == seq:
        return None if span.last_hash == expected else f"has hash {span.last_hash}"
    if at is not None and at < span.cutoff:
        return None
    return "was purged inside a range"


def verify_chain(anchors: Sequence[tuple[int, str] | Anchor] = ()) -> ChainReport:
    """Walk every entry in chain order (one snapshot); ``anchors`` are earlier heads (seq, hash,
    and the entry's time where known), which the chain must still hold."""
    started = time.monotonic()
    report = ChainReport()
    wanted = sorted(Anchor(*anchor) for anchor in anchors)
    wanted_seqs = {anchor.seq for anchor in wanted}
    seen: dict[int, str] = {}
    with transaction.atomic():
        spans = _purged_spans(report)
        prev_seq, prev_hash, prev_id = 0, GENESIS_HASH, None
        with connection.chunked_cursor() as cursor:
            cursor.execute(_WALK_SQL)
            while rows := cursor.fetchmany(_FETCH):
                for row in rows:
                    entry_id, exists, seq, content_hash, stored_prev, stored_hash, *fields = row
                    report.entries += 1
                    if not report.ok:
                        continue  # count the rest; the first problem is the one named
                    if not exists:
                        report.fail(entry_id, f"entry #{entry_id} (seq {seq}) was removed: its seal is still there")
                        continue
                    if seq is None:
                        report.fail(entry_id, f"entry #{entry_id} was never sealed: it was written with the chain off")
                        continue
                    if sha256_hex(content_text(fields)) != content_hash:
                        report.fail(
                            entry_id,
                            f"entry #{entry_id} (seq {seq}) was changed after it was written: its content "
                            "no longer matches its content hash",
                        )
                        continue
                    if seq != prev_seq + 1:
                        bridged = _bridge(prev_seq, seq, spans)
                        if bridged is None:
                            report.fail(
                                entry_id,
                                f"entries with seq {prev_seq + 1} to {seq - 1}, before entry #{entry_id}, "
                                "are missing and no purge removed them",
                            )
                            continue
                        prev_hash = bridged
                    if stored_prev != prev_hash:
                        before = f"entry #{prev_id}" if prev_id is not None and seq == prev_seq + 1 else "the chain"
                        report.fail(
                            entry_id,
                            f"entry #{entry_id} (seq {seq}) does not follow {before}: the hash it was "
                            "chained to differs (an entry before it was changed, removed or inserted)",
                        )
                        continue
                    if chain_hash(stored_prev, content_hash) != stored_hash:
                        report.fail(entry_id, f"entry #{entry_id} (seq {seq}) carries a wrong chain hash")
                        continue
                    if seq in wanted_seqs:
                        seen[seq] = stored_hash
                    prev_seq, prev_hash, prev_id = seq, stored_hash, entry_id
        if prev_id is not None:
            head = AuditSeal.objects.filter(pk=prev_id).values_list("seq", "hash", "entry_id", "entry__at").get()
            report.head = Head(*head)
    for anchor in wanted:
        report.anchors_checked.append(anchor.seq)
        problem = _anchor_problem(anchor, seen, spans)
        if problem is not None:
            report.fail(
                None,
                f"the earlier head seq {anchor.seq} with hash {anchor.hash} is not in the chain "
                f"(seq {anchor.seq} {problem})",
            )
    report.duration_ms = int((time.monotonic() - started) * 1000)
    return report


def check_and_record(anchors: Sequence[tuple[int, str] | Anchor] = (), *, triggered_by: str) -> AuditChainCheck:
    """Walk the chain in the database with the owner's ``goodput_audit_verify`` and return the check
    it recorded: the only way a check is written."""
    wanted = [Anchor(*anchor) for anchor in anchors]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT goodput_audit_verify(%s::bigint[], %s::text[], %s::timestamptz[], %s)",
            [[a.seq for a in wanted], [a.hash for a in wanted], [a.at for a in wanted], triggered_by[:100]],
        )
        check_id = cursor.fetchone()[0]
    return AuditChainCheck.objects.get(pk=check_id)


def chain_head() -> Head | None:
    """The newest sealed entry: what the chain ends on now (committed entries are all sealed)."""
    row = AuditSeal.objects.order_by("-seq").values_list("seq", "hash", "entry_id", "entry__at").first()
    return Head(*row) if row else None


def last_check() -> AuditChainCheck | None:
    return AuditChainCheck.objects.order_by("-checked_at", "-pk").first()


def head_json(head: Head | None, check: AuditChainCheck | None) -> dict[str, Any]:
    """The chain's head and its last verification, as the pack states them."""
    return {
        "algorithm": "sha256(prev_hash + content_hash); content_hash = sha256(content)",
        "head_seq": head.seq if head else None,
        "head_hash": head.hash if head else None,
        "head_entry_id": head.entry_id if head else None,
        "head_at": head.at if head else None,
        "last_verified_at": check.checked_at if check else None,
        "last_verified_ok": check.ok if check else None,
        "last_verified_entries": check.entries if check else None,
    }
