"""Hostile input gets a 400 naming the field (or a 409 naming what depends), never a 500: checked
once for every DRF write (console.parsers), every query string and form (console.middleware),
every list (console.api's pagination), and the silence form's dates."""

from __future__ import annotations

import json

import pytest

from fleet.models import Node, Site
from incidents.models import Silence

API_WRITE = "/api/v1/fleet/sites/"


def post_json(client, url: str, body: str):  # type: ignore[no-untyped-def]
    return client.post(url, data=body, content_type="application/json")


@pytest.mark.parametrize("depth", [900, 1_000, 100_000])
def test_json_nested_deep_is_a_400(admin_client, depth: int) -> None:
    body = '{"name": ' + "[" * depth + "]" * depth + "}"
    response = post_json(admin_client, API_WRITE, body)
    assert response.status_code == 400 and "nested" in response.json()["detail"]
    assert not Site.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"name": "ams-9", "region": "eu\\u0000west"}', "region"),
        ('{"name": "ams-9", "region": "\\ud800"}', "region"),
        ('{"name": "ams-9", "region\\u0000": "eu"}', "['region\\x00']"),
    ],
)
def test_nul_and_lone_surrogates_in_json_are_a_400_naming_the_field(admin_client, body, field) -> None:
    response = post_json(admin_client, API_WRITE, body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not Site.objects.exists()


def test_a_nul_in_an_incident_api_note_is_a_400(operator_client) -> None:
    response = post_json(operator_client, "/api/v1/silences/", json.dumps({"comment": "x\x00y", "matchers": []}))
    assert response.status_code == 400 and response.json()["field"] == "comment"


@pytest.mark.parametrize("query", ["?limit=1e20", "?limit=100000000000000000000", "?offset=-1", "?limit=0"])
def test_list_bounds_are_a_400_naming_the_parameter(viewer_client, site_a, query) -> None:
    response = viewer_client.get(f"/api/v1/fleet/sites/{query}")
    assert response.status_code == 400, response.content
    assert set(response.json()) & {"limit", "offset"} and set(response.json()) <= {"limit", "offset"}


def test_a_nul_in_a_query_string_is_a_400(viewer_client) -> None:
    response = viewer_client.get("/incidents/?q=%00")
    assert response.status_code == 400 and b"'q'" in response.content


def test_a_nul_in_a_page_form_is_a_400(operator_client) -> None:
    response = operator_client.post(
        "/incidents/silences/", {"matchers": 'hostname="a"', "comment": "x\x00", "hours": 1}
    )
    assert response.status_code == 400 and b"comment" in response.content
    assert not Silence.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("starts_at", "2026-02-30T10:00Z"), ("starts_at", "9999-12-31T23:59:59+14:00"), ("starts_at", "abc")],
)
def test_the_silence_form_refuses_impossible_dates_with_a_message(operator_client, field, value) -> None:
    form = {"matchers": 'hostname="gpu-a-001"', "comment": "maintenance", "hours": "2", field: value}
    response = operator_client.post("/incidents/silences/", form)
    assert response.status_code == 200 and b"Start must be" in response.content
    assert not Silence.objects.exists()


def test_expiring_a_silence_by_a_non_number_is_a_400(operator_client) -> None:
    response = operator_client.post("/incidents/silences/", {"expire": "abc"})
    assert response.status_code == 400


def test_deleting_a_site_that_still_has_nodes_is_a_409_naming_them(admin_client, site_a) -> None:
    Node.objects.create(site=site_a, hostname="gpu-a-001")
    response = admin_client.delete(f"/api/v1/fleet/sites/{site_a.pk}/")
    assert response.status_code == 409, response.content
    assert "gpu-a-001" in response.json()["error"] and "node" in response.json()["error"]
    assert Site.objects.filter(pk=site_a.pk).exists()


def test_a_nul_in_a_session_cookie_is_a_400_not_a_500(anon_client) -> None:
    anon_client.cookies["sessionid"] = "aaaaaaaa\x00"
    response = anon_client.get("/accounts/login/")
    assert response.status_code == 400 and b"sessionid" in response.content


@pytest.mark.parametrize("url", ["/fleet/gpus/%00/", "/fleet/nodes/%00/", "/api/v1/fleet/nodes/%00/"])
def test_a_nul_in_the_path_is_a_400(viewer_client, url) -> None:
    assert viewer_client.get(url).status_code == 400


def test_the_api_speaks_json_only(admin_client) -> None:
    response = admin_client.post(API_WRITE, {"name": "ams%00"})  # a form body
    assert response.status_code == 415
    assert not Site.objects.exists()


def test_nan_is_not_json(admin_client) -> None:
    response = post_json(admin_client, API_WRITE, '{"name": "ams-9", "contracted_power_kw": NaN}')
    assert response.status_code == 400 and not Site.objects.exists()


def test_a_silence_regex_is_checked_as_it_will_be_matched(operator_client) -> None:
    """'(?i)gpu' compiles alone but not inside ^(?:...)$: accepted, it broke every finding."""
    body = {"comment": "x", "matchers": [{"name": "hostname", "op": "=~", "value": "(?i)gpu"}]}
    response = post_json(operator_client, "/api/v1/silences/", json.dumps(body))
    assert response.status_code == 400, response.content
    assert not Silence.objects.exists()


def test_no_template_has_inline_script_the_content_security_policy_would_block() -> None:
    import re
    from pathlib import Path

    templates = Path(__file__).resolve().parents[2] / "templates"
    inline = re.compile(r"""<[^>]*\son[a-z]+\s*=|javascript:|<script(?![^>]*\b(src|type="application/json")\b)""", re.I)
    offenders = [
        f"{path.relative_to(templates)}: {match.group(0)[:80]}"
        for path in templates.rglob("*.html")
        for match in inline.finditer(path.read_text())
    ]
    assert not offenders, offenders
