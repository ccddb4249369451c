"""The manual's nginx block for request bodies (docs/production.md) refuses exactly what the
console's door refuses (console.limits, settings.REQUEST_BODY_LIMITS): the same patterns in the
same order, the same sizes, the same default. Read from the manual, so the two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from console import limits

PRODUCTION = Path(__file__).resolve().parents[2] / "docs" / "production.md"
LOCATION = re.compile(r"^location ~ (?P<pattern>\S+) \{ client_max_body_size (?P<size>\d+)m; proxy_pass \S+; \}$")
DEFAULT = re.compile(r"^client_max_body_size (?P<size>\d+)m;")
MiB = 1024 * 1024


def _proxy_block() -> list[str]:
    """The nginx block under the manual's "Request bodies" heading, line by line."""
    text = PRODUCTION.read_text()
    section = text[text.index("## Request bodies") :]
    start = section.index("```nginx\n") + len("```nginx\n")
    return section[start : section.index("\n```", start)].splitlines()


def _proxy_limits() -> tuple[int, list[tuple[str, int]]]:
    lines = _proxy_block()
    default = DEFAULT.match(lines[0])
    assert default, lines[0]
    locations = []
    for line in lines[1:]:
        match = LOCATION.match(line)
        assert match, f"not a `location ~ <regex> {{ client_max_body_size <n>m; ... }}` line: {line}"
        locations.append((match["pattern"], int(match["size"]) * MiB))
    return int(default["size"]) * MiB, locations


def test_the_manuals_proxy_block_has_the_consoles_routes_and_sizes_in_its_order() -> None:
    default, locations = _proxy_limits()
    assert default == settings.REQUEST_MAX_BYTES
    assert locations == [(pattern, limit) for pattern, limit in settings.REQUEST_BODY_LIMITS]


def test_the_proxy_and_the_door_give_every_route_the_same_limit() -> None:
    """nginx takes the first regex location that matches, else the server's size; so does the door."""
    default, locations = _proxy_limits()
    paths = [
        "/api/v1/ingest/prometheus",
        "/api/v1/training/jobs/7/events",
        "/api/v1/alertmanager",
        "/api/v1/compliance/datasets/3/domains/",
        "/api/v1/compliance/datasets/3/",  # the dataset itself: 1 MiB, not the import's 20
        "/api/v1/compliance/datasets/3/lineage/",
        "/compliance/datasets/3/",
        "/compliance/datasets/3/edit/",
        "/api/v1/capacity/reservations/",
    ]
    for path in paths:
        proxy = next((size for pattern, size in locations if re.search(pattern, path)), default)
        assert proxy == limits.limit_for(path), path
    assert limits.limit_for("/api/v1/compliance/datasets/3/lineage/") == settings.REQUEST_MAX_BYTES
