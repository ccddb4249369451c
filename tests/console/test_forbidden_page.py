"""A page a role may not open answers 403 in the console's own layout, naming the role it needs."""

from __future__ import annotations

import pytest
from django.templatetags.static import static
from django.test import Client

from tests.conftest import _make_user

COMPLIANCE_PAGES = [
    "/compliance/",
    "/compliance/models/",
    "/compliance/datasets/",
    "/compliance/processing/",
    "/compliance/retention/",
    "/compliance/audit/",
    "/compliance/packs/",
]


@pytest.mark.parametrize("path", COMPLIANCE_PAGES)
def test_a_viewer_on_a_compliance_page_gets_the_consoles_403_naming_the_role(viewer_client: Client, path: str) -> None:
    response = viewer_client.get(path)
    assert response.status_code == 403
    html = response.content.decode()
    assert static("css/goodput.css") in html and 'class="topbar"' in html  # the site's layout, styled
    assert "<title>Not for your role · Goodput</title>" in html
    assert "Compliance records need the Compliance officer or Admin role." in html
    assert "with the role Viewer" in html and 'href="/">Back to the overview' in html
    # The API gives the same reason.
    api = viewer_client.get("/api/v1/compliance/models/")
    assert api.status_code == 403 and api.json()["detail"] in html


def test_an_operator_gets_the_same_page(operator_client: Client) -> None:
    html = operator_client.get("/compliance/").content.decode()
    assert "Compliance officer or Admin role" in html and "with the role Operator" in html


def test_a_user_without_a_role_is_told_a_role_is_needed(norole_client: Client) -> None:
    response = norole_client.get("/fleet/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "need a role: Viewer, Operator, Compliance officer or Admin" in html and "with no role" in html


def test_an_action_refused_to_a_viewer_says_which_role_it_needs(viewer_client: Client) -> None:
    response = viewer_client.post("/fleet/targets/", {"name": "x"})
    assert response.status_code == 403
    assert "Adding scrape targets needs the Operator role." in response.content.decode()


def test_a_user_with_two_roles_sees_both(db: None) -> None:
    from django.contrib.auth.models import Group

    user = _make_user("two-hats", "Viewer")
    user.groups.add(Group.objects.get(name="Operator"))
    client = Client()
    client.force_login(user)
    assert "with the roles " in client.get("/compliance/").content.decode()
