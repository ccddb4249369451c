"""A published summary's PDF is rendered once per version, in the worker, and served as stored
(issue 22, item 12): a summary over a large crawl runs to hundreds of pages, too slow to render
per download on the web process."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.test import Client

from compliance.choices import AuditAction
from compliance.models import AuditEntry, GpaiModel, SummaryPdf, SummaryVersion
from compliance.services import summary
from compliance.summary.tasks import render_summary_pdf
from tests.conftest import redis_url
from tests.stack import Stack

API = "/api/v1/compliance/models/{pk}/summary/"


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The versions rendered in this process, in order."""
    seen: list[int] = []
    real = summary.render_summary_pdf

    def counting(version: SummaryVersion) -> bytes:
        seen.append(version.pk)
        return real(version)

    monkeypatch.setattr(summary, "render_summary_pdf", counting)
    return seen


def pdf_url(model: GpaiModel, version: int = 1) -> str:
    return API.format(pk=model.pk) + f"versions/{version}/export.pdf"


@pytest.mark.django_db
def test_publishing_renders_the_pdf_once_and_every_download_serves_the_stored_file(
    officer_client: Client,
    officer_user: User,
    gpai_model: GpaiModel,
    renders: list[int],
    django_capture_on_commit_callbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        version = summary.publish(gpai_model, user=officer_user)
    assert renders == [version.pk]  # the task queued on commit rendered it (eagerly here)
    stored = SummaryPdf.objects.get(summary=version)
    content = bytes(stored.content)
    assert content.startswith(b"%PDF")
    assert (stored.size, stored.sha256) == (len(content), hashlib.sha256(content).hexdigest())

    for _ in range(3):
        response = officer_client.get(pdf_url(gpai_model))
        assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
        assert response.content == content
    assert renders == [version.pk]  # no download rendered anything
    assert AuditEntry.objects.filter(action=AuditAction.EXPORT, message="Downloaded summary v1 as pdf").count() == 3
    # Rendering again (a redelivered message) keeps the stored file.
    assert render_summary_pdf(version.pk) == "stored"
    assert renders == [version.pk]


@pytest.mark.django_db
def test_a_download_before_the_worker_rendered_it_is_a_409_to_retry_and_is_not_audited(
    officer_client: Client, officer_user: User, gpai_model: GpaiModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued: list[int] = []
    monkeypatch.setattr(summary, "queue_pdf", queued.append)  # the worker has not got to it yet
    version = summary.publish(gpai_model, user=officer_user)

    response = officer_client.get(pdf_url(gpai_model))
    assert response.status_code == 409
    assert response["Retry-After"] == "5"
    assert response.json()["detail"] == "The PDF of summary v1 is being rendered; try again in a few seconds."
    assert queued == [version.pk]  # a version without its PDF gets it queued again
    assert not AuditEntry.objects.filter(action=AuditAction.EXPORT).exists()

    summary.store_pdf(version.pk)  # the worker's turn
    response = officer_client.get(pdf_url(gpai_model))
    assert response.status_code == 200 and response.content == bytes(SummaryPdf.objects.get().content)


@pytest.mark.django_db
def test_the_stored_pdf_is_frozen_like_its_version(officer_user: User, gpai_model: GpaiModel) -> None:
    version = summary.publish(gpai_model, user=officer_user)
    rendered = bytes(summary.store_pdf(version.pk).content)
    for change in (
        lambda: SummaryPdf.objects.filter(pk=version.pk).update(content=b"%PDF forged"),
        lambda: SummaryPdf.objects.filter(pk=version.pk).delete(),
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            change()
    assert bytes(SummaryPdf.objects.get().content) == rendered


@pytest.mark.django_db
def test_while_one_render_of_a_version_runs_another_does_nothing(
    officer_user: User, gpai_model: GpaiModel, renders: list[int]
) -> None:
    version = summary.publish(gpai_model, user=officer_user)
    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"], host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"], password=s["PASSWORD"] or None
    ) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [(summary.PDF_LOCK_CLASS << 32) | version.pk])
        assert render_summary_pdf(version.pk) == "busy"
    assert renders == [] and not SummaryPdf.objects.exists()
    assert render_summary_pdf(version.pk) == "stored"
    assert renders == [version.pk]


# --- the production path: the worker renders, the web process never does -----------------------


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url(), tmp_path)
    stack.flush_redis()
    stack.start_worker()
    yield stack
    stack.stop()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_renders_the_published_pdf_and_the_web_process_never_does(
    worker: Stack, officer_client: Client, gpai_model: GpaiModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def web_render(version: SummaryVersion) -> bytes:
        raise AssertionError("the web process rendered a PDF")

    monkeypatch.setattr(summary, "render_summary_pdf", web_render)
    response = officer_client.post(API.format(pk=gpai_model.pk) + "publish/")
    assert response.status_code == 201, response.content
    deadline = time.monotonic() + 60
    while not SummaryPdf.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    stored = SummaryPdf.objects.get()
    assert stored.summary.version == 1
    download = officer_client.get(pdf_url(gpai_model))
    assert download.status_code == 200 and download.content == bytes(stored.content)
    assert "compliance.tasks_summary.render_summary_pdf" in (worker.log_dir / "worker.log").read_text()
