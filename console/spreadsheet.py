"""CSV cells that a spreadsheet opens as text, never as a formula.

A cell starting with ``=``, ``+``, ``-``, ``@`` (or a tab or carriage return) is run as a formula by
Excel, LibreOffice and Sheets ("CSV injection"): a team or dataset name typed by one user would run
on the machine of whoever opens the export. Such a cell gets a leading apostrophe, which the
spreadsheet shows as text. Numbers stay numbers (a negative count is written as it is).
"""

from __future__ import annotations

from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
