"""API answers carry ``Cache-Control: no-store``, as the compliance pages do (issue 37, item 10):
fleet state, incidents and what a token may see are no more a shared cache's to keep than the
compliance records are. Every GET route of /api/v1/ is walked through the URL resolver and
requested, as an Admin, as nobody and with an agent token; errors must carry it too."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db

_REGEX_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>[^)]*\)")
_ROUTE_PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")
VALUES = {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "hostname": "gpu-x-001", "fmt": "md"}


def _walk(patterns: list[URLPattern | URLResolver], prefix: str) -> Iterator[str]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern).removeprefix("^")
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif "format" not in route:  # DRF's format-suffix variants answer as their base route
            yield route


def api_paths() -> list[str]:
    """Every route under /api/v1/, its parameters filled with values no object has (or a real one
    for the few that need a shape: a GPU UUID, a hostname)."""
    (api,) = [p for p in get_resolver().url_patterns if isinstance(p, URLResolver) and str(p.pattern) == "api/v1/"]
    paths = set()
    for route in _walk(api.url_patterns, "api/v1/"):
        path = _REGEX_GROUP.sub(lambda m: VALUES.get(m["name"], "1"), route)
        path = _ROUTE_PARAMETER.sub(lambda m: VALUES.get(m["name"], "1"), path)
        paths.add("/" + path.removesuffix("$").replace("/?", "/").replace("\\.", "."))
    return sorted(paths)


def test_every_api_get_answer_is_no_store(admin_client: Client) -> None:
    paths = api_paths()
    assert "/api/v1/fleet/gpus/" in paths and "/api/v1/incidents/" in paths and len(paths) > 60
    statuses: dict[str, int] = {}
    for path in paths:
        response = admin_client.get(path)
        statuses[path] = response.status_code
        assert response["Cache-Control"] == "no-store", (path, response.status_code)
    # The header is checked on real answers, not only on errors: every list answers 200 (the
    # rest: 404 for an id no object has, 405 for a POST-only door, 400 for a missing parameter).
    answered = [path for path, code in statuses.items() if code == 200]
    assert len(answered) >= len(paths) // 3, statuses


def test_refusals_and_agent_answers_are_no_store_too(client: Client, viewer_client: Client, token_a: str) -> None:
    answers = {
        "signed out": client.get("/api/v1/fleet/gpus/"),
        "forbidden": viewer_client.get("/api/v1/compliance/packs/"),
        "no such route": viewer_client.get("/api/v1/nothing-here/"),
        "agent token": client.get("/api/v1/fleet/gpus/", HTTP_AUTHORIZATION=f"Bearer {token_a}"),
        "agent POST": client.post(
            "/api/v1/ingest/gpu-samples",
            {"samples": []},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token_a}",
        ),
        "schema": viewer_client.get("/api/schema/"),
    }
    assert {what: r.status_code for what, r in answers.items()} == {
        "signed out": 401,
        "forbidden": 403,
        "no such route": 404,
        "agent token": 401,  # an agent token reads nothing: the dashboards are for people
        "agent POST": 400,
        "schema": 200,
    }
    for what, response in answers.items():
        assert response["Cache-Control"] == "no-store", what


def test_pages_outside_compliance_keep_their_own_caching(viewer_client: Client) -> None:
    response = viewer_client.get("/fleet/")
    assert response.status_code == 200 and "no-store" not in response.get("Cache-Control", "")
