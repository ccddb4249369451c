"""The audit chain's heads, kept outside the database: a file the database roles cannot rewrite.

A chain rewritten from its start by someone with the owner's rights is consistent again, and only
an earlier head catches it (compliance.services.audit_chain). A worker appends the head here every
hour (the "keep-audit-head" beat task) and whenever a pack is built, one line a head:

    <seq> <hash> <entry time> <kept at> <source>

The file is opened for appending only and fsync'd after each line (and its folder when the file is
new), so a head once written survives a crash. A head is written only when the chain has moved on
since the last one. ``manage.py verify_audit_log`` and the daily check require every head in the
file to still be in the chain. Keep GOODPUT_AUDIT_HEADS_DIR on storage the database's
administrators cannot rewrite; several workers may share it (each line is one small append).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from compliance.services.audit_chain import Anchor, Head

logger = logging.getLogger(__name__)

FILE_NAME = "audit-heads.log"
_LINE = re.compile(r"^(\d{1,18}) ([0-9a-f]{64}) (\S+) (\S+) ([a-z_-]{1,40})$")
# The tail read to find the last head: lines are under 200 bytes.
_TAIL = 4096


class HeadsFileError(ValueError):
    """A line of the heads file that is not a head: the file was damaged or written by hand."""


@dataclass(frozen=True)
class KeptHead:
    seq: int
    hash: str
    at: datetime
    kept_at: datetime
    source: str
    line: int

    def anchor(self) -> Anchor:
        return Anchor(self.seq, self.hash, self.at)


def heads_path() -> Path:
    return Path(settings.AUDIT_HEADS_DIR) / FILE_NAME


def _parse(text: str, number: int, path: Path) -> KeptHead:
    match = _LINE.match(text)
    try:
        if not match:
            raise ValueError("not <seq> <hash> <entry time> <kept at> <source>")
        return KeptHead(
            int(match.group(1)),
            match.group(2),
            datetime.fromisoformat(match.group(3)),
            datetime.fromisoformat(match.group(4)),
            match.group(5),
            number,
        )
    except ValueError as exc:
        raise HeadsFileError(f"{path}, line {number}: {exc}") from exc


def kept_heads(path: Path | None = None) -> list[KeptHead]:
    """Every head in the file, in the order kept (none where there is no file yet)."""
    path = path or heads_path()
    try:
        with path.open(encoding="ascii") as handle:
            return [_parse(line.rstrip("\n"), n, path) for n, line in enumerate(handle, 1) if line.strip()]
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as exc:
        raise HeadsFileError(f"{path}: not a heads file ({exc})") from exc


def _last_seq(path: Path) -> int | None:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _TAIL))
            lines = handle.read().decode("ascii", "replace").splitlines()
    except FileNotFoundError:
        return None
    last = lines[-1].split(" ", 1)[0] if lines else ""
    return int(last) if last.isdigit() else None


def keep_head(head: Head | None, *, source: str) -> bool:
    """Append ``head`` to the heads file unless it is already the last one kept; True if written."""
    if head is None:
        return False
    path = heads_path()
    if _last_seq(path) == head.seq:
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    line = f"{head.seq} {head.hash} {head.at.astimezone(UTC).isoformat()} {datetime.now(UTC).isoformat()} {source}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        new = os.fstat(fd).st_size == 0
        os.write(fd, line.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:  # the file's name in its folder must survive a crash too
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    logger.info("audit chain head kept: seq %s in %s", head.seq, path)
    return True
