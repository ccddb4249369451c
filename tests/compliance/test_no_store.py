"""Compliance pages and API answers carry ``Cache-Control: no-store`` (issue 22, item 13): they list
data subjects and personal data, so neither a browser nor a proxy may keep a copy. Every route of
the compliance URL modules is requested, with real objects behind its ids, and the errors too."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, reverse

from compliance import api_urls, urls
from compliance.models import GpaiModel
from compliance.services import summary

pytestmark = pytest.mark.django_db


def named_routes(patterns: list[URLPattern | URLResolver]) -> Iterator[tuple[str, list[str]]]:
    """(name, its URL keyword arguments) of every named route, format-suffix variants left out."""
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from named_routes(p.url_patterns)
            continue
        kwargs = list(getattr(p.pattern, "converters", {}) or re.compile(p.pattern.regex.pattern).groupindex)
        if p.name and "format" not in kwargs:
            yield p.name, kwargs


def route_urls(model: GpaiModel) -> list[str]:
    """Every compliance route with ids of objects that exist (the model, its published version 1)."""
    values = {"pk": model.pk, "version": 1, "fmt": "md"}
    found = []
    for namespace, patterns in (("compliance", urls.urlpatterns), ("api:compliance-api", api_urls.urlpatterns)):
        for name, kwargs in named_routes(patterns):
            found.append(reverse(f"{namespace}:{name}", kwargs={k: values.get(k, 1) for k in kwargs}))
    return sorted(set(found))


def test_every_compliance_page_and_api_answer_is_no_store(
    officer_client: Client, officer_user, gpai_model: GpaiModel, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        summary.publish(gpai_model, user=officer_user)
    found = route_urls(gpai_model)
    assert "/compliance/" in found and "/api/v1/compliance/packs/" in found and "/compliance/audit.csv" in found
    statuses = {}
    for url in found:
        response = officer_client.get(url)
        statuses[url] = response.status_code
        assert response["Cache-Control"] == "no-store", url
    # Most answer 200 (the rest: 404 for an id no object has, 405 for a POST-only route): the
    # header is checked on real pages, not only on errors.
    assert sum(code == 200 for code in statuses.values()) >= len(found) // 2, statuses


def test_errors_exports_and_the_admin_section_are_no_store_too(
    officer_client: Client, viewer_client: Client, admin_client: Client, client: Client, gpai_model: GpaiModel
) -> None:
    answers = {
        "bad request": officer_client.post(
            "/api/v1/compliance/packs/", {"period_start": "x"}, content_type="application/json"
        ),
        "not found": officer_client.get("/compliance/models/999999/"),
        "no such route": officer_client.get("/compliance/nothing-here/"),
        "forbidden page": viewer_client.get("/compliance/"),
        "forbidden API": viewer_client.get("/api/v1/compliance/packs/"),
        "signed out": client.get("/compliance/audit/"),
        "audit export": officer_client.get("/compliance/audit.csv"),
        "admin section": admin_client.get("/admin/compliance/auditentry/"),
    }
    assert {k: r.status_code for k, r in answers.items()} == {
        "bad request": 400,
        "not found": 404,
        "no such route": 404,
        "forbidden page": 403,
        "forbidden API": 403,
        "signed out": 302,
        "audit export": 200,
        "admin section": 200,
    }
    for what, response in answers.items():
        assert response["Cache-Control"] == "no-store", what


def test_other_pages_keep_their_own_caching(viewer_client: Client) -> None:
    response = viewer_client.get("/fleet/")
    assert response.status_code == 200 and "no-store" not in response.get("Cache-Control", "")
