"""Binary COPY whose rows are formatted in C, with no Python step a row.

psycopg's ``Copy.write_row`` is two Python calls a row around its C formatter; on the GPU-sample
writer, at tens of thousands of rows a fold, those calls cost more than the formatting. Here
``format_row_binary`` (psycopg's own, in C with psycopg-binary) runs over the rows in ``map``,
and the whole binary format (signature, rows, trailer) goes to ``Copy.write`` in blocks, the way
psycopg documents for callers that send the format themselves. ``format_row_binary`` is not in
psycopg's public API: the version range in pyproject.toml and tests/console/test_pgcopy.py catch
a release that moves it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from typing import Any

from psycopg._copy_base import format_row_binary

# PostgreSQL's binary COPY header: the signature, a flags word and an empty header extension;
# and the trailer, a tuple count of -1.
SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"
BLOCK_ROWS = 2000  # rows formatted before a block is sent, so PostgreSQL parses while we format


def copy_binary(cursor: Any, statement: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Run ``statement`` (``COPY ... FROM STDIN (FORMAT BINARY)``) on the psycopg cursor with
    ``rows``, each a sequence of values of ``types`` (PostgreSQL type names) in column order."""
    with cursor.copy(statement) as copy:
        copy.set_types(types)
        transformer = copy.formatter.transformer
        block = bytearray(SIGNATURE)
        rows = iter(rows)
        while True:
            start = len(block)
            deque(map(format_row_binary, islice(rows, BLOCK_ROWS), repeat(transformer), repeat(block)), maxlen=0)
            if len(block) == start:
                break
            copy.write(block)
            block = bytearray()
        block += TRAILER
        copy.write(block)
