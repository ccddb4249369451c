"""Binary COPY whose rows are formatted in C, with no Python step a row.

psycopg's ``Copy.write_row`` is two Python calls a row around its C formatter; at the GPU
samples' rates those calls cost more than the formatting. Here ``format_row_binary`` (psycopg's
own, in C with psycopg-binary) runs over the rows in ``map``, away from any connection
(``format_rows``: where the rows are validated, in another process than the writer's), and the
whole binary format (signature, rows, trailer) goes to ``Copy.write`` later, block by block
(``copy_formatted``), the way psycopg documents for callers that send the format themselves.
``format_row_binary`` is not in psycopg's public API: the version range in pyproject.toml and
tests/console/test_pgcopy.py catch a release that moves it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from itertools import repeat, starmap
from operator import itemgetter
from typing import Any

from psycopg import pq
from psycopg._copy_base import format_row_binary
from psycopg.adapt import Transformer
from psycopg.postgres import types as pg_types

# PostgreSQL's binary COPY header: the signature, a flags word and an empty header extension;
# and the trailer, a tuple count of -1.
SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"

_local = threading.local()  # a transformer per thread and column types: it keeps the dumpers


def _transformer(types: tuple[str, ...]) -> Transformer:
    cache = _local.__dict__.setdefault("transformers", {})
    transformer = cache.get(types)
    if transformer is None:
        transformer = Transformer()  # the default adapters: no connection is needed for these types
        transformer.set_dumper_types([pg_types[name].oid for name in types], pq.Format.BINARY)
        cache[types] = transformer
    return transformer


def format_rows(types: Sequence[str], rows: Iterable[Sequence[Any]]) -> tuple[bytes, list[int]]:
    """``rows`` as binary COPY rows (no signature or trailer) and where each row ends in them, so
    that a reader can pick single rows out. All in C: ``zip`` pulls a row's formatting, then the
    length of what is formatted so far."""
    transformer = _transformer(tuple(types))
    out = bytearray()
    formatted = map(format_row_binary, rows, repeat(transformer), repeat(out))
    lengths = starmap(out.__len__, repeat(()))  # endless: zip stops with the rows
    ends = list(map(itemgetter(1), zip(formatted, lengths, strict=False)))
    return bytes(out), ends


def copy_formatted(cursor: Any, statement: str, blocks: Iterable[bytes]) -> None:
    """Run ``statement`` (``COPY ... FROM STDIN (FORMAT BINARY)``) with rows already formatted
    (``format_rows``) for its columns, block by block."""
    with cursor.copy(statement) as copy:
        copy.write(SIGNATURE)
        for block in blocks:
            if block:
                copy.write(block)
        copy.write(TRAILER)
