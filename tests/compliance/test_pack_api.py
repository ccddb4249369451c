"""The compliance pack through the API and the page: request, follow, download (audited), and
who may do any of it (officers and admins; viewers and operators get 403)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from datetime import date, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from compliance.choices import AuditAction, PackStatus
from compliance.models import AuditEntry, CompliancePack, CompliancePackChunk
from tests.compliance.test_pack_build import END, EXPECTED_FILES, START, make_pack_records

PACKS = "/api/v1/compliance/packs/"
PAGE = "/compliance/packs/"

pytestmark = pytest.mark.django_db


def done_pack() -> CompliancePack:
    content = b"PK\x05\x06" + b"\0" * 18  # an empty zip
    pack = CompliancePack.objects.create(
        period_start=START,
        period_end=END,
        status=PackStatus.DONE,
        progress=100,
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
    )
    CompliancePackChunk.objects.create(pack=pack, seq=0, data=content)
    return pack


def test_an_officer_requests_a_pack_and_downloads_it_once_built(
    officer_client: Client, django_capture_on_commit_callbacks
) -> None:
    make_pack_records()
    with django_capture_on_commit_callbacks(execute=True):
        response = officer_client.post(
            PACKS, {"period_start": "2026-01-01", "period_end": "2026-01-31"}, content_type="application/json"
        )
    assert response.status_code == 202, response.content
    pk = response.json()["id"]
    # Eager mode (the embedded runtime) built it when the request's transaction committed.
    status = officer_client.get(f"{PACKS}{pk}/").json()
    assert (status["status"], status["progress"]) == ("done", 100)
    assert status["download_url"] == f"{PACKS}{pk}/download/"

    download = officer_client.get(status["download_url"])
    assert download.status_code == 200
    assert download["Content-Type"] == "application/zip"
    assert download["Content-Disposition"] == f'attachment; filename="{CompliancePack.objects.get().filename}"'
    content = b"".join(download.streaming_content)  # streamed from the stored chunks
    assert len(content) == int(download["Content-Length"]) == status["size"]
    assert hashlib.sha256(content).hexdigest() == status["sha256"]
    assert zipfile.ZipFile(io.BytesIO(content)).namelist() == EXPECTED_FILES


def test_every_download_is_audited(officer_client: Client, officer_user) -> None:
    pack = done_pack()
    for _ in range(2):
        assert officer_client.get(f"{PACKS}{pack.pk}/download/").status_code == 200
    entries = AuditEntry.objects.filter(action=AuditAction.EXPORT, model="compliancepack", object_id=str(pack.pk))
    assert entries.count() == 2
    entry = entries.first()
    assert (entry.actor, entry.actor_id) == ("cora", officer_user.pk)
    assert pack.sha256 in entry.message


@pytest.mark.parametrize("status", [PackStatus.QUEUED, PackStatus.RUNNING, PackStatus.FAILED])
def test_a_pack_not_done_cannot_be_downloaded(officer_client: Client, status: str) -> None:
    pack = CompliancePack.objects.create(period_start=START, period_end=END, status=status)
    response = officer_client.get(f"{PACKS}{pack.pk}/download/")
    assert response.status_code == 409
    assert not AuditEntry.objects.filter(action=AuditAction.EXPORT).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"period_start": "2026-02-01", "period_end": "2026-01-31"}, "period_end"),
        ({"period_start": "2025-01-01", "period_end": "2026-01-31"}, "period_end"),
        ({"period_start": "2026-01-01"}, "period_end"),
        ({"period_start": "1 January", "period_end": "2026-01-31"}, "period_start"),
    ],
)
def test_a_bad_period_is_a_400_naming_the_field_and_nothing_is_queued(
    officer_client: Client, body: dict, field: str
) -> None:
    response = officer_client.post(PACKS, body, content_type="application/json")
    assert response.status_code == 400
    assert field in response.json()
    assert not CompliancePack.objects.exists()


def test_a_period_of_exactly_366_days_is_accepted(officer_client: Client) -> None:
    start = date(2025, 1, 1)
    body = {"period_start": start.isoformat(), "period_end": (start + timedelta(days=365)).isoformat()}
    assert officer_client.post(PACKS, body, content_type="application/json").status_code == 202


def test_the_page_form_requests_a_pack_and_lists_it_with_its_progress(
    officer_client: Client, django_capture_on_commit_callbacks
) -> None:
    page = officer_client.get(PAGE)
    assert page.status_code == 200
    today = timezone.localdate()
    assert page.context["form"].initial == {"period_start": today - timedelta(days=89), "period_end": today}
    with django_capture_on_commit_callbacks(execute=True):
        response = officer_client.post(PAGE, {"period_start": "2026-01-01", "period_end": "2026-01-31"})
    assert response.status_code == 302
    pack = CompliancePack.objects.get()
    html = officer_client.get(PAGE).content.decode()
    assert f'data-pack="{pack.pk}"' in html and 'data-status="done"' in html
    assert '<progress max="100" value="100"' in html
    assert f"{PACKS}{pack.pk}/download/" in html
    assert "js/compliance_pack.js" in html and "<script>" not in html


def test_a_bad_period_on_the_page_shows_the_error_on_the_field(officer_client: Client) -> None:
    response = officer_client.post(PAGE, {"period_start": "2026-02-01", "period_end": "2026-01-01"})
    assert response.status_code == 400
    assert "period_end" in response.context["form"].errors
    assert 'data-error-for="period_end"' in response.content.decode()
    assert not CompliancePack.objects.exists()


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_get_403_everywhere(persona: str, request: pytest.FixtureRequest) -> None:
    client: Client = request.getfixturevalue(persona)
    pack = done_pack()
    body = {"period_start": "2026-01-01", "period_end": "2026-01-31"}
    assert client.get(PAGE).status_code == 403
    assert client.post(PAGE, body).status_code == 403
    assert client.post(PACKS, body, content_type="application/json").status_code == 403
    assert client.get(PACKS).status_code == 403
    assert client.get(f"{PACKS}{pack.pk}/").status_code == 403
    assert client.get(f"{PACKS}{pack.pk}/download/").status_code == 403
    assert CompliancePack.objects.count() == 1
    assert not AuditEntry.objects.filter(action=AuditAction.EXPORT).exists()


def test_an_admin_may_download(admin_client: Client) -> None:
    pack = done_pack()
    assert admin_client.get(f"{PACKS}{pack.pk}/download/").status_code == 200
