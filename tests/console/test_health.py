"""/healthz and /readyz: open, and /readyz says which dependency is down."""

from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_healthz_and_readyz_answer_without_a_session(anon_client) -> None:
    assert anon_client.get("/healthz").json() == {"status": "ok"}
    body = anon_client.get("/readyz").json()
    assert body["status"] == "ok" and body["checks"]["database"] == "ok"


@pytest.mark.django_db
def test_readyz_reports_an_unreachable_broker(anon_client, settings) -> None:
    settings.EAGER_TASKS = False
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = anon_client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("error: ")
