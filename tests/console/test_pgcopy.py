"""console.pgcopy: rows formatted in C away from any connection, then sent as block-mode binary
COPY, arrive as psycopg's own row-by-row COPY would write them (NULLs, split anywhere between
rows, no rows at all), and the row ends let a reader pick single rows out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from console import pgcopy

TYPES = ["int8", "timestamptz", "float4", "int8", "text"]
COPY = "COPY pgcopy_t (id, ts, v, n, s) FROM STDIN (FORMAT BINARY)"


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
@pytest.mark.parametrize("count", [0, 1, 2, 2007])
def test_rows_arrive_as_written_in_blocks_cut_between_rows(table, count: int) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(count)
    data, ends = pgcopy.format_rows(TYPES, iter(rows))
    assert len(ends) == count and ends == sorted(ends) and (ends[-1] if ends else 0) == len(data)
    cut = ends[count // 2] if count else 0  # two blocks, split after a row
    pgcopy.copy_formatted(table, COPY, [data[:cut], data[cut:]])
    table.execute("SELECT id, ts, v, n, s FROM pgcopy_t ORDER BY id")
    assert table.fetchall() == rows  # quarters are exact in float4


@pytest.mark.django_db
def test_a_single_row_picked_by_its_ends_is_that_row(table) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(7)
    data, ends = pgcopy.format_rows(TYPES, rows)
    pgcopy.copy_formatted(table, COPY, [data[ends[3] : ends[4]]])
    table.execute("SELECT id, ts, v, n, s FROM pgcopy_t")
    assert table.fetchall() == [rows[4]]


def test_a_value_of_the_wrong_type_fails_the_formatting() -> None:
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        pgcopy.format_rows(TYPES, [("x", None, None, None, None)])
