"""Alertmanager-style label matchers: =, !=, =~, !~ (regexes anchored at both ends)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

OPS = ("=", "!=", "=~", "!~")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MatcherError(ValueError):
    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(f"matchers[{index}].{field}: {message}")
        self.index, self.field = index, field


def validate_matchers(matchers: Any, *, allow_empty: bool = False) -> list[dict[str, str]]:
    """Check a list of {"name", "op", "value"}; raise MatcherError naming the item and field."""
    if not isinstance(matchers, list) or (not matchers and not allow_empty):
        raise MatcherError(0, "matchers", "must be a non-empty list of {name, op, value}")
    clean = []
    for i, m in enumerate(matchers):
        if not isinstance(m, dict):
            raise MatcherError(i, "matcher", "must be an object with name, op and value")
        unknown = set(m) - {"name", "op", "value"}
        if unknown:
            raise MatcherError(i, sorted(unknown)[0], "unknown field")
        name, op, value = m.get("name"), m.get("op", "="), m.get("value")
        if not isinstance(name, str) or not LABEL_NAME.match(name):
            raise MatcherError(i, "name", "must be a label name such as hostname or severity")
        if op not in OPS:
            raise MatcherError(i, "op", f"must be one of {', '.join(OPS)}")
        if not isinstance(value, str):
            raise MatcherError(i, "value", "must be a string")
        if op in ("=~", "!~"):
            try:
                _regex(value)  # exactly what matching compiles: "(?i)x" is valid alone, not inside it
            except re.error as exc:
                raise MatcherError(i, "value", f"is not a valid regular expression ({exc})") from None
        clean.append({"name": name, "op": op, "value": value})
    return clean


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(f"^(?:{pattern})$")


def matches(matcher: dict[str, str], labels: dict[str, Any]) -> bool:
    actual = str(labels.get(matcher["name"], ""))  # a missing label matches as the empty string
    op, value = matcher["op"], matcher["value"]
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    found = bool(_regex(value).match(actual))
    return found if op == "=~" else not found


def matches_all(matchers: list[dict[str, str]], labels: dict[str, Any]) -> bool:
    return all(matches(m, labels) for m in matchers)
