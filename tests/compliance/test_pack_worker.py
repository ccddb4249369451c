"""The production path: a pack requested through the API is built by a real Celery worker process
on Redis, and the status the page polls moves to done; two packs requested at once, with two
workers free, are built one after the other."""

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
from tests.compliance.test_pack_streaming import add_audit_entries
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
    assert zipfile.ZipFile(io.BytesIO(b"".join(download.streaming_content))).namelist() == EXPECTED_FILES
    assert "compliance.tasks_pack.build_compliance_pack" in (worker.log_dir / "worker.log").read_text()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url(), tmp_path)
    stack.flush_redis()
    stack.start_worker(name="w1")
    stack.start_worker(name="w2")
    yield stack
    stack.stop()


def test_two_packs_requested_at_once_are_built_one_after_the_other(two_workers: Stack, officer_client: Client) -> None:
    make_pack_records()
    # 2,000 entries in the period: each build renders a 1,000-row audit table, long enough that two
    # workers building at once would overlap. Inserted 500 a statement (each entry is sealed into the
    # audit chain when its statement commits).
    for _ in range(4):
        add_audit_entries(500)
    body = {"period_start": "2026-01-01", "period_end": "2026-01-31"}
    ids = [
        officer_client.post("/api/v1/compliance/packs/", body, content_type="application/json").json()["id"]
        for _ in range(2)
    ]
    seen_running_together, steps = False, set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        states = [officer_client.get(f"/api/v1/compliance/packs/{pk}/").json() for pk in ids]
        seen_running_together |= all(s["status"] == "running" for s in states)
        steps |= {s["step"] for s in states if s["status"] == "queued"}
        if all(s["status"] in ("done", "failed") for s in states):
            break
        time.sleep(0.05)
    assert [s["status"] for s in states] == ["done", "done"], states
    assert not seen_running_together
    assert any("(packs are built one at a time)" in step for step in steps), steps
    logs = (two_workers.log_dir / "w1.log").read_text() + (two_workers.log_dir / "w2.log").read_text()
    # Three messages: the two requests', and the one the first build sent for the pack that waited.
    assert logs.count("Task compliance.tasks_pack.build_compliance_pack[") == 3, logs
