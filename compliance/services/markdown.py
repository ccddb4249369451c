"""The Markdown subset compliance documents are written in (the summary, the pack's PDF), and how
free text goes into it.

Free text (a model's name, a description, a provider's contact) is escaped with backslashes before
it stands in a line, so nothing an officer or an API client types can become markup in the
published text or in whatever renders it: no raw HTML (``<img src=x onerror=…>``), no link or
image (``[x](javascript:…)``), no emphasis, code span or table cell boundary. CommonMark reads
``\\X`` as the character X for any ASCII punctuation X; the PDF renderer and the summary page
(compliance.services.pdf, compliance.summary.views) undo the escapes the same way. Line breaks are
folded, so free text cannot start a heading or a bullet either.
"""

from __future__ import annotations

import re
import string

# What Markdown or HTML gives a meaning inside a line: the escape itself, code spans, emphasis and
# strikethrough, links and images, raw HTML and autolinks, entity references, table cells.
SPECIAL = frozenset("\\`*_~[]<>&|")
_ESCAPED = re.compile(r"\\([" + re.escape(string.punctuation) + r"])")
_BOLD = "**"


def escape(text: str) -> str:
    """``text`` as it may stand in one line of a document: whitespace runs (line breaks included)
    folded to one space, and each character Markdown or HTML would read as markup escaped."""
    folded = " ".join(text.split())
    return "".join("\\" + c if c in SPECIAL else c for c in folded)


def unescape(text: str) -> str:
    """The characters a reader sees: each backslash escape of ASCII punctuation resolved."""
    return _ESCAPED.sub(r"\1", text)


def _unescaped_positions(text: str, token: str) -> list[int]:
    """Where ``token`` starts in ``text`` outside a backslash escape."""
    found, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(token, i):
            found.append(i)
            i += len(token)
        else:
            i += 1
    return found


def spans(text: str) -> list[tuple[str, bool]]:
    """A line's text as (text, bold) runs: ``**`` outside an escape toggles bold, escapes are
    resolved. Only the document's own labels are bold; escaped free text never toggles it."""
    out: list[tuple[str, bool]] = []
    bold, start = False, 0
    for at in _unescaped_positions(text, _BOLD):
        if at > start:
            out.append((unescape(text[start:at]), bold))
        bold, start = not bold, at + len(_BOLD)
    if start < len(text):
        out.append((unescape(text[start:]), bold))
    return out


def cells(line: str) -> list[str]:
    """A table row's cells, split on the pipes outside escapes and left escaped."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    out, start = [], 0
    for at in _unescaped_positions(body, "|"):
        out.append(body[start:at].strip())
        start = at + 1
    out.append(body[start:].strip())
    return out


def is_rule(row: list[str]) -> bool:
    """The ``|---|---|`` line under a table's header."""
    return all(set(c) <= set("-: ") for c in row)
