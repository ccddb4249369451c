"""The production path: a pack requested through the API is built by a real Celery worker process
on Redis, and the status the page polls moves to done."""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from tests.compliance.test_pack_build import EXPECTED_FILES, make_pack_records
from tests.conftest import redis_url
from tests.stack import Stack

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url(), tmp_path)
    stack.flush_redis()
    stack.start_worker()
    yield stack
    stack.stop()


def test_a_worker_builds_the_pack_and_its_progress_reaches_100(worker: Stack, officer_client: Client) -> None:
    assert settings.EAGER_TASKS is False
    make_pack_records()
    body = {"period_start": "2026-01-01", "period_end": "2026-01-31"}
    response = officer_client.post("/api/v1/compliance/packs/", body, content_type="application/json")
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "queued"  # the worker, not this request, builds it
    url = f"/api/v1/compliance/packs/{response.json()['id']}/"
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = officer_client.get(url).json()
        seen.append(status["progress"])
        if status["status"] in ("done", "failed"):
            break
        time.sleep(0.1)
    assert (status["status"], status["progress"], status["step"]) == ("done", 100, "Done"), status
    assert seen == sorted(seen)
    download = officer_client.get(status["download_url"])
    assert zipfile.ZipFile(io.BytesIO(download.content)).namelist() == EXPECTED_FILES
    assert "compliance.tasks_pack.build_compliance_pack" in (worker.log_dir / "worker.log").read_text()
