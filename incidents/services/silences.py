"""Creating silences: one way in for the page and the API, which refuses a duplicate (the same
matchers over an overlapping time), as Alertmanager users expect."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from incidents.models import Silence


class DuplicateSilence(Exception):
    """A silence with the same matchers already covers part of this time."""

    def __init__(self, existing: Silence) -> None:
        super().__init__(
            f"Silence #{existing.pk} ({existing}) already silences these matchers until "
            f"{existing.ends_at:%Y-%m-%d %H:%M} UTC; extend it rather than adding another."
        )
        self.existing = existing


def _key(matchers: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    """Matchers compare as a set: their order does not change what a silence matches."""
    return sorted((m["name"], m["op"], m["value"]) for m in matchers)


def find_duplicate(
    matchers: list[dict[str, str]], starts_at: datetime, ends_at: datetime, *, exclude: int | None = None
) -> Silence | None:
    key = _key(matchers)
    overlapping = Silence.objects.filter(starts_at__lt=ends_at, ends_at__gt=starts_at)
    if exclude is not None:
        overlapping = overlapping.exclude(pk=exclude)
    return next((s for s in overlapping if _key(s.matchers) == key), None)


def lock_matchers(matchers: list[dict[str, str]]) -> None:
    """Serialise, until the transaction ends, every create or edit of a silence with these
    matchers, so that two at once cannot both pass the duplicate check."""
    digest = hashlib.blake2b(json.dumps(_key(matchers)).encode(), digest_size=8).digest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest, "big", signed=True)])


def create_silence(
    *, matchers: list[dict[str, str]], starts_at: datetime, ends_at: datetime, comment: str, created_by: Any
) -> Silence:
    """Create a silence, or raise DuplicateSilence. Matchers must be validated already.

    Two identical requests at once are serialised by an advisory lock on the matchers, so the
    second sees the first's row and is refused.
    """
    with transaction.atomic():
        lock_matchers(matchers)
        if (existing := find_duplicate(matchers, starts_at, ends_at)) is not None:
            raise DuplicateSilence(existing)
        return Silence.objects.create(
            matchers=matchers, starts_at=starts_at, ends_at=ends_at, comment=comment, created_by=created_by
        )
