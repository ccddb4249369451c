"""console.pgcopy: rows formatted in C and sent as psycopg's block-mode binary COPY arrive as
psycopg's own row-by-row COPY would write them (NULLs, every block size, no rows at all)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from console import pgcopy

TYPES = ["int8", "timestamptz", "float4", "int8", "text"]


def _rows(n: int) -> list[tuple]:
    start = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)
    return [
        (i, start + timedelta(seconds=i), None if i % 3 == 0 else i / 4, None if i % 5 == 0 else 2**40 + i, f"r{i}")
        for i in range(n)
    ]


@pytest.fixture
def table():  # type: ignore[no-untyped-def]
    # Created inside the test's transaction, so its rollback drops it (even after a failed COPY).
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE pgcopy_t (id int8, ts timestamptz, v float4, n int8, s text)")
        yield cursor.cursor


@pytest.mark.django_db
@pytest.mark.parametrize("count", [0, 1, pgcopy.BLOCK_ROWS, pgcopy.BLOCK_ROWS * 2 + 7])
def test_rows_arrive_as_written(table, count: int) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(count)
    pgcopy.copy_binary(table, "COPY pgcopy_t (id, ts, v, n, s) FROM STDIN (FORMAT BINARY)", TYPES, iter(rows))
    table.execute("SELECT id, ts, v, n, s FROM pgcopy_t ORDER BY id")
    assert table.fetchall() == rows  # quarters are exact in float4


@pytest.mark.django_db
def test_a_value_of_the_wrong_type_fails_the_copy(table) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        pgcopy.copy_binary(
            table, "COPY pgcopy_t (id, ts, v, n, s) FROM STDIN (FORMAT BINARY)", TYPES, [("x", None, None, None, None)]
        )
