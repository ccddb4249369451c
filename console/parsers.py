"""One JSON parser for every DRF write: what no field type catches is refused here, with a 400
naming the field, instead of a 500 deeper down.

* nesting deeper than MAX_DEPTH, refused before any decoder recurses into it (``too_deep``: Python's
  json and msgspec raise RecursionError near 1,000 levels, and anything past a few levels is not a
  request this API takes); the Alertmanager door, which decodes with msgspec, checks it too;
* NUL characters (PostgreSQL text and jsonb cannot hold them);
* lone UTF-16 surrogates such as "\\ud800" (valid JSON escapes, but not encodable as UTF-8,
  so the database driver fails on them).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils.json import strict_constant  # NaN and Infinity are not JSON

MAX_DEPTH = 32

# A JSON string (escapes included), whose brackets are text, not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Does the JSON text nest arrays and objects deeper than ``limit``? Read without decoding it,
    in C but for one pass over the brackets, so no decoder ever recurses into a hostile body."""
    if body.count(b"[") + body.count(b"{") <= limit:  # the usual body: nothing to scan
        return False
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:
        return False
    steps = brackets.translate(_STEPS)
    return max(accumulate(1 if step == 1 else -1 for step in steps)) > limit


def find_bad_value(value: Any, path: str = "$", depth: int = 0) -> tuple[str, str] | None:
    """(path, problem) of the first value no column can hold, or None. Keys are checked too."""
    if depth > MAX_DEPTH:
        return path, f"nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, str):
        return (path, problem) if (problem := text_problem(value)) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{key!r}]"
            if problem := text_problem(str(key)):
                return where, f"a key with {problem}"
            if found := find_bad_value(item, where, depth + 1):
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if found := find_bad_value(item, f"{path}[{index}]", depth + 1):
                return found
    return None


def text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not valid Unicode text)"
    return None


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        body = stream.read()
        if too_deep(body):
            raise ParseError(f"JSON parse error: nested deeper than {MAX_DEPTH} levels.")
        try:
            data = json.loads(body.decode(encoding), parse_constant=strict_constant)
        except RecursionError:
            raise ParseError(f"JSON parse error: nested deeper than {MAX_DEPTH} levels.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error: {exc}") from None
        if found := find_bad_value(data):
            path, problem = found
            field = path.removeprefix("$.").removeprefix("$")
            raise ParseError({"error": f"{path}: {problem}.", "field": field or None})
        return data
