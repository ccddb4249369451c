"""The compliance home page, the nav entry and the overview tile: there for officers and admins,
absent (not merely refused) for the other roles."""

from __future__ import annotations

from datetime import date

from django.test import Client

from compliance.models import SubjectRequest


def test_an_officer_sees_the_compliance_tile_nav_entry_and_home(officer_client: Client, gpai_model) -> None:
    SubjectRequest.objects.create(kind="erasure", subject_reference="DSR-9", received_on=date(2026, 1, 5))
    home = officer_client.get("/").content.decode()
    assert 'id="compliance-tile"' in home and 'href="/compliance/"' in home
    page = officer_client.get("/compliance/")
    assert page.status_code == 200
    status = page.context["status"]
    assert (status["models"], status["open_requests"], status["overdue_requests"]) == (1, 1, 1)
    for area in ("/compliance/models/", "/compliance/processing/", "/compliance/audit/", "/compliance/packs/"):
        assert f'href="{area}"' in page.content.decode(), area


def test_a_viewer_and_an_operator_see_no_compliance_tile_or_nav_entry(
    viewer_client: Client, operator_client: Client
) -> None:
    for client in (viewer_client, operator_client):
        home = client.get("/").content.decode()
        assert 'id="compliance-tile"' not in home and 'href="/compliance/"' not in home
        assert client.get("/compliance/").status_code == 403
