"""Publishing the training-content summary: a frozen version with its hash, refused changes by
every path (API, admin, ORM against the real database), a new version with a diff after a register
change, no duplicate versions, the exports and their audit, and who may do any of it."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, transaction
from django.test import Client
from django.utils import timezone
from pypdf import PdfReader

from compliance.choices import AuditAction
from compliance.models import AuditEntry, Dataset, GpaiModel, SummaryVersion
from compliance.services import summary

API = "/api/v1/compliance/models/{pk}/summary/"


def _publish(client: Client, model: GpaiModel) -> dict:
    response = client.post(API.format(pk=model.pk) + "publish/")
    assert response.status_code == 201, response.content
    return response.json()


def test_publishing_freezes_the_draft_as_version_1_with_its_hash_and_an_audit_entry(
    officer_client: Client, officer_user: User, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    draft = officer_client.get(API.format(pk=gpai_model.pk) + "draft/").json()
    assert "- **Version of the Summary:** draft, not published" in draft["markdown"]

    body = _publish(officer_client, gpai_model)

    version = SummaryVersion.objects.get(model=gpai_model)
    assert (body["version"], version.version) == (1, 1)
    assert version.last_update == timezone.localdate()
    assert version.document == draft["document"]
    assert version.text.startswith(
        "# Public Summary of Training Content for Goodput-LM 1.0\n\n- **Version of the Summary:** 1\n"
    )
    assert version.sha256 == hashlib.sha256(version.text.encode()).hexdigest() == body["sha256"]
    assert body["verified"] is True
    entry = AuditEntry.objects.get(action=AuditAction.ACTION, model="summaryversion")
    assert (entry.object_id, entry.message, entry.actor_id) == (
        str(version.pk),
        "Published summary v1",
        officer_user.pk,
    )


def test_a_version_cannot_be_changed_through_the_api(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    url = API.format(pk=gpai_model.pk) + "versions/1/"
    for method in ("put", "patch", "delete"):
        response = getattr(officer_client, method)(url, {"text": "edited"}, content_type="application/json")
        assert response.status_code == 405, (method, response.status_code)
    assert officer_client.get(url).json()["verified"] is True
    assert SummaryVersion.objects.get().text.startswith("# Public Summary")


def test_a_version_cannot_be_changed_or_deleted_in_the_admin(
    admin_client: Client, officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    version = SummaryVersion.objects.get()
    change = f"/admin/compliance/summaryversion/{version.pk}/change/"
    page = admin_client.get(change)
    assert page.status_code == 200  # shown read-only
    assert b'name="_save"' not in page.content
    assert admin_client.post(change, {"text": "edited", "sha256": "0" * 64}).status_code == 403
    assert (
        admin_client.post(f"/admin/compliance/summaryversion/{version.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    assert admin_client.get("/admin/compliance/summaryversion/add/").status_code == 403
    version.refresh_from_db()
    assert version.verify()


def test_the_database_refuses_an_orm_update_or_delete_of_a_version(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    version = SummaryVersion.objects.get()
    # Each attempt in a savepoint: the failed statement breaks only the savepoint, not the test's transaction.
    # The trigger refuses; as the console's own role (the embedded suite), the missing privilege first.
    denied = "|permission denied for table compliance_summaryversion"
    with pytest.raises(DatabaseError, match="append-only: UPDATE refused" + denied), transaction.atomic():
        SummaryVersion.objects.filter(pk=version.pk).update(text="tampered")
    with pytest.raises(DatabaseError, match="append-only: UPDATE refused" + denied), transaction.atomic():
        version.text = "tampered"
        version.save()
    with pytest.raises(DatabaseError, match="append-only: DELETE refused" + denied), transaction.atomic():
        SummaryVersion.objects.filter(pk=version.pk).delete()
    fresh = SummaryVersion.objects.get(pk=version.pk)
    assert fresh.text.startswith("# Public Summary") and fresh.verify()


def test_the_hash_verifies_and_a_tampered_copy_would_not(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    version = SummaryVersion.objects.get()
    assert version.verify()
    # A copy in memory (the database keeps the original): one word changed, the sum no longer holds.
    copy = SummaryVersion(text=version.text.replace("Goodput Labs B.V.", "Goodput Labs Ltd"), sha256=version.sha256)
    assert not copy.verify()
    assert hashlib.sha256(copy.text.encode()).hexdigest() != version.sha256


def test_a_register_change_publishes_version_2_with_a_diff_of_the_changed_line(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    gpai_model.authorised_representative = "Goodput EU Representative GmbH, Berlin"
    gpai_model.save()
    body = _publish(officer_client, gpai_model)
    assert body["version"] == 2
    assert "- **Version of the Summary:** 2" in body["text"]

    diff = officer_client.get(API.format(pk=gpai_model.pk) + "versions/2/diff/").json()
    assert (diff["from_version"], diff["to_version"]) == (1, 2)
    lines = diff["diff"].splitlines()
    today = timezone.localdate().isoformat()
    assert lines[:2] == [f"--- v1 ({today})", f"+++ v2 ({today})"]
    changed = [line for line in lines[2:] if line[:1] in "+-"]
    assert changed == [
        "-- **Version of the Summary:** 1",
        "+- **Version of the Summary:** 2",
        "-- **Authorised representative name and contact details:** to be provided",
        "+- **Authorised representative name and contact details:** Goodput EU Representative GmbH, Berlin",
    ]
    # The page shows it, styled line by line.
    page = officer_client.get(f"/compliance/models/{gpai_model.pk}/summary/").content.decode()
    assert (
        '<span class="diff-add">+- **Authorised representative name and contact details:** '
        "Goodput EU Representative GmbH, Berlin</span>" in page
    )
    assert (
        '<span class="diff-del">-- **Authorised representative name and contact details:** to be provided</span>'
        in page
    )


def test_publishing_with_nothing_changed_is_refused(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    response = officer_client.post(API.format(pk=gpai_model.pk) + "publish/")
    assert response.status_code == 409
    assert response.json() == {"detail": "Nothing changed in the register since version 1: no new version published."}
    page = officer_client.post(f"/compliance/models/{gpai_model.pk}/summary/")
    assert page.status_code == 409
    assert b"Nothing changed in the register since version 1" in page.content
    with pytest.raises(summary.SummaryUnchanged):
        summary.publish(gpai_model, user=None)
    assert SummaryVersion.objects.count() == 1
    assert AuditEntry.objects.filter(message__startswith="Published").count() == 1


def test_the_page_publishes_and_shows_the_version(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    url = f"/compliance/models/{gpai_model.pk}/summary/"
    page = officer_client.get(url).content.decode()
    assert '<span class="tbp">to be provided</span>' in page
    assert "Publish version 1" in page and "Nothing published yet" in page
    response = officer_client.post(url)
    assert response.status_code == 302
    assert response["Location"] == f"/compliance/models/{gpai_model.pk}/summary/v1/"
    version = SummaryVersion.objects.get()
    shown = officer_client.get(response["Location"]).content.decode()
    assert version.sha256 in shown and "hash verified" in shown
    assert f"/api/v1/compliance/models/{gpai_model.pk}/summary/versions/1/export.pdf" in shown


def test_the_markdown_export_is_the_hashed_text_and_is_audited(
    officer_client: Client, officer_user: User, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    version = SummaryVersion.objects.get()
    response = officer_client.get(API.format(pk=gpai_model.pk) + "versions/1/export.md")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="summary-Goodput-LM-1.0-v1.md"'
    assert response.content == version.text.encode()
    assert hashlib.sha256(response.content).hexdigest() == version.sha256
    entry = AuditEntry.objects.get(action=AuditAction.EXPORT)
    assert (entry.object_id, entry.message, entry.actor_id) == (
        str(version.pk),
        "Downloaded summary v1 as md",
        officer_user.pk,
    )


def test_the_json_export_holds_document_version_hash_and_date(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    version = SummaryVersion.objects.get()
    response = officer_client.get(API.format(pk=gpai_model.pk) + "versions/1/export.json")
    assert response.status_code == 200
    body = json.loads(response.content)
    assert body == {
        "model": "Goodput-LM 1.0",
        "version": 1,
        "last_update": timezone.localdate().isoformat(),
        "sha256": version.sha256,
        "document": version.document,
    }
    assert body["document"]["general"]["latest_collection"] == "12/2025"
    assert AuditEntry.objects.filter(action=AuditAction.EXPORT, message="Downloaded summary v1 as json").count() == 1


def test_the_pdf_export_holds_the_headings_the_model_and_the_hash(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    version = SummaryVersion.objects.get()
    response = officer_client.get(API.format(pk=gpai_model.pk) + "versions/1/export.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert response.content.startswith(b"%PDF")
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(response.content)).pages)
    flat = " ".join(text.split())
    for heading in summary.HEADINGS.values():
        assert heading in flat, heading
    assert "Goodput-LM 1.0" in flat
    assert f"SHA-256 {version.sha256}" in flat
    assert AuditEntry.objects.filter(action=AuditAction.EXPORT, message="Downloaded summary v1 as pdf").count() == 1


def test_an_unknown_export_format_or_version_is_a_404_and_not_audited(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    base = API.format(pk=gpai_model.pk)
    assert officer_client.get(base + "versions/1/export.docx").status_code == 404
    assert officer_client.get(base + "versions/2/export.md").status_code == 404
    assert officer_client.get(base + "versions/2/").status_code == 404
    assert not AuditEntry.objects.filter(action=AuditAction.EXPORT).exists()


def test_viewers_and_operators_get_403_on_the_summary_its_exports_and_publishing(
    officer_client: Client,
    viewer_client: Client,
    operator_client: Client,
    gpai_model: GpaiModel,
    crawled_dataset: Dataset,
) -> None:
    _publish(officer_client, gpai_model)
    base = API.format(pk=gpai_model.pk)
    reads = [
        f"/compliance/models/{gpai_model.pk}/summary/",
        f"/compliance/models/{gpai_model.pk}/summary/v1/",
        base + "draft/",
        base + "versions/",
        base + "versions/1/",
        base + "versions/1/diff/",
        *(base + f"versions/1/export.{fmt}" for fmt in ("md", "json", "pdf")),
    ]
    for client in (viewer_client, operator_client):
        for url in reads:
            assert client.get(url).status_code == 403, url
        assert client.post(base + "publish/").status_code == 403
        assert client.post(f"/compliance/models/{gpai_model.pk}/summary/").status_code == 403
    assert SummaryVersion.objects.count() == 1
    assert not AuditEntry.objects.filter(action=AuditAction.EXPORT).exists()


def test_the_versions_list_is_newest_first(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    _publish(officer_client, gpai_model)
    gpai_model.other_processing = "Deduplicated at document level."
    gpai_model.save()
    _publish(officer_client, gpai_model)
    body = officer_client.get(API.format(pk=gpai_model.pk) + "versions/").json()
    assert [v["version"] for v in body["results"]] == [2, 1]
    assert all(v["verified"] for v in body["results"])
