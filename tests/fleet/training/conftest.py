"""Shared helpers for the training tests: register a job, post its events."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from fleet.models import Job, Site

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def at(seconds: float, base: datetime = T0) -> str:
    return (base + timedelta(seconds=seconds)).isoformat()


def register_job(client: Client, token: str | None = None, **fields: Any) -> Any:
    body = {
        "name": "llama-70b-pretrain",
        "team": "foundation",
        "framework": "pytorch",
        "gang_size": 16,
        "scheduler": "kueue",
        "scheduler_id": "default/llama-70b",
        "checkpoint_interval_s": 1800,
        **fields,
    }
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post("/api/v1/training/jobs/", json.dumps(body), content_type="application/json", **headers)


def post_events(client: Client, job_id: int, events: list[dict[str, Any]], token: str | None = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(
        f"/api/v1/training/jobs/{job_id}/events",
        json.dumps({"events": events}),
        content_type="application/json",
        **headers,
    )


@pytest.fixture
def job(site_a: Site) -> Job:
    return Job.objects.create(
        site=site_a, name="llama-70b", team="foundation", gang_size=16, scheduler="kueue", scheduler_id="j1"
    )
