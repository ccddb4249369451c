"""CSV cells that a spreadsheet opens as text, never as a formula, and the one CSV writer the
console uses.

A cell starting with ``=``, ``+``, ``-``, ``@`` (or a tab or carriage return) is run as a formula by
Excel, LibreOffice and Sheets ("CSV injection", OWASP): a team or dataset name typed by one user
would run on the machine of whoever opens the export. Such a cell gets a leading apostrophe, which
the spreadsheet shows as text. Numbers stay numbers (a negative count is written as it is): only
text cells are escaped, so a writer must hand numbers over as numbers, not as their text.

A spreadsheet may also split a line where this writer did not: on ``;`` or a tab (a locale whose
list separator is not the comma), or on a comma or line break inside a quoted cell that its
parser reads as unquoted (a quote mid-field is literal). ``ops;=1+1;`` is then the cells ``ops``,
``=1+1`` and nothing. So a formula start right after any of those delimiters gets the apostrophe
too (``ops;'=1+1;``): quoting the cell would not help, since the split happens outside the quotes.

Every CSV the console writes goes through ``writer``, so no export can forget a column.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Where a spreadsheet may start a new cell: the delimiters it may use, and line breaks.
CELL_DELIMITERS = (",", ";", "\t", "\r", "\n")
_FORMULA_AFTER_DELIMITER = re.compile(
    "(?<=[" + re.escape("".join(CELL_DELIMITERS)) + "])(?=[" + re.escape("".join(FORMULA_STARTS)) + "])"
)


def cell(value: Any) -> Any:
    """The value as a spreadsheet should read it: text that would start a formula, at its start or
    after a delimiter, escaped. Escaping twice changes nothing."""
    if not isinstance(value, str):
        return value
    value = _FORMULA_AFTER_DELIMITER.sub("'", value)
    if value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class SafeWriter:
    """``csv.writer`` with every text cell passed through ``cell``; ``writerow`` returns what the
    file's ``write`` returned (the line, for a streaming response's echo file)."""

    def __init__(self, file: Any, **kwargs: Any) -> None:
        self._writer = csv.writer(file, **kwargs)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([cell(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def writer(file: Any, **kwargs: Any) -> SafeWriter:
    """The console's CSV writer (csv.writer's arguments): formula starts in text cells escaped."""
    return SafeWriter(file, **kwargs)
