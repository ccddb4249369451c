"""The events door: a batch is stored whole or refused whole with a 400 naming the event and
field; a retried event is stored once; agent tokens write their own site's jobs only."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Job, JobEvent, Node
from tests.fleet.training.conftest import post_events, register_job

pytestmark = pytest.mark.django_db


def _now(seconds: float = 0) -> str:
    return (timezone.now() - timedelta(hours=1) + timedelta(seconds=seconds)).isoformat()


def _start(job_id: int, client: Client, token: str) -> None:
    response = post_events(
        client,
        job_id,
        [{"id": "a1", "ts": _now(0), "kind": "allocated"}, {"id": "s1", "ts": _now(30), "kind": "started"}],
        token,
    )
    assert response.status_code == 200, response.content


def _step(n: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"id": f"step-{n}", "ts": _now(seconds), "kind": "step", "step": n, "step_time_s": 2.0, **extra}


def test_an_agent_registers_a_job_of_its_site_and_reregistering_updates_it(token_a: str, site_a: Any) -> None:
    Node.objects.create(site=site_a, hostname="gpu-a-001")
    Node.objects.create(site=site_a, hostname="gpu-a-002")
    client = Client()
    first = register_job(client, token_a, nodes=["gpu-a-001", "gpu-a-002", "trainer-pod-7f9c"])
    assert first.status_code == 201, first.content
    assert first.json()["site"] == site_a.name
    # Known nodes are linked; a pod's name is named back, not added to the fleet's inventory.
    assert first.json()["nodes"] == ["gpu-a-001", "gpu-a-002"]
    assert first.json()["unknown_nodes"] == ["trainer-pod-7f9c"]
    assert not Node.objects.filter(hostname="trainer-pod-7f9c").exists()
    again = register_job(client, token_a, gang_size=32)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.get().gang_size == 32


def test_it_stores_a_batch_and_moves_the_job_along(token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    response = post_events(
        client,
        job_id,
        [
            _step(1, 60, tokens=1000, data_wait_s=0.5),
            _step(2, 62),
            {"id": "c1", "ts": _now(70), "kind": "checkpoint_saved", "step": 2, "duration_s": 5.0, "bytes": 10},
        ],
        token_a,
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"written": 3, "repeated": 0, "state": "running"}
    job = Job.objects.get(pk=job_id)
    assert (job.last_step, job.last_checkpoint_step, job.last_step_time_s) == (2, 2, 2.0)
    assert JobEvent.objects.filter(job=job).count() == 5


def test_a_repeated_event_is_written_once(token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    batch = [_step(1, 60), _step(2, 62)]
    assert post_events(client, job_id, batch, token_a).json()["written"] == 2
    again = post_events(client, job_id, [*batch, _step(3, 64)], token_a)
    assert again.json() == {"written": 1, "repeated": 2, "state": "running"}
    assert JobEvent.objects.filter(kind="step").count() == 3


@pytest.mark.parametrize(
    ("event", "field", "words"),
    [
        (
            {"id": "x", "ts": "2026-01-01T00:00:00Z", "kind": "checkpoint_saved", "step": 1, "duration_s": -1},
            "duration_s",
            ">= 0",
        ),
        ({"id": "x", "ts": "NOW", "kind": "step", "step": 5}, "step_time_s", "needs step_time_s"),
        ({"id": "x", "ts": "NOW", "kind": "failed", "tokens": 5}, "tokens", "takes no tokens"),
        ({"id": "x", "ts": "NOW", "kind": "teleported"}, "kind", ""),
        (
            {"id": "x", "ts": "NOW", "kind": "step", "step": 1, "step_time_s": 1, "data_wait_s": 3},
            "data_wait_s",
            "longer",
        ),
    ],
)
def test_a_bad_event_is_a_400_naming_it_and_nothing_is_written(
    token_a: str, event: dict[str, Any], field: str, words: str
) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    if event["ts"] == "NOW":
        event["ts"] = _now(100)
    response = post_events(client, job_id, [_step(1, 60), event], token_a)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["item"] == 1 and body["field"] == field
    assert "events[1] (id 'x')" in body["error"] and words in body["error"]
    assert not JobEvent.objects.filter(kind="step").exists()


def test_out_of_order_events_are_refused_whole(token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    response = post_events(client, job_id, [_step(1, 60), _step(2, 50)], token_a)
    assert response.status_code == 400
    assert response.json()["field"] == "ts" and "time order" in response.json()["error"]
    assert not JobEvent.objects.filter(kind="step").exists()


def test_a_step_going_back_needs_a_restore(token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    checkpoint = {"id": "c3", "ts": _now(55), "kind": "checkpoint_saved", "step": 3, "duration_s": 1}
    assert post_events(client, job_id, [_step(3, 50), checkpoint, _step(10, 60)], token_a).status_code == 200
    back = post_events(client, job_id, [{**_step(4, 70), "id": "late-4"}], token_a)
    assert back.status_code == 400 and back.json()["field"] == "step"
    restored = post_events(
        client,
        job_id,
        [
            {"id": "r1", "ts": _now(80), "kind": "restored", "step": 3, "duration_s": 4},
            {**_step(4, 90), "id": "late-4"},
        ],
        token_a,
    )
    assert restored.status_code == 200, restored.content


def test_steps_before_an_allocation_are_refused(token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    response = post_events(client, job_id, [_step(1, 60)], token_a)
    assert response.status_code == 400 and "send allocated" in response.json()["error"]


def test_an_unknown_job_is_a_404_naming_it(token_a: str) -> None:
    response = post_events(Client(), 999_999, [_step(1, 60)], token_a)
    assert response.status_code == 404


def test_another_sites_agent_cannot_write_the_job(token_a: str, token_b: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    response = post_events(client, job_id, [{"id": "a1", "ts": _now(0), "kind": "allocated"}], token_b)
    assert response.status_code == 403
    assert not JobEvent.objects.exists()


def test_people_write_with_the_operator_role_and_read_with_any(
    operator_client: Client, viewer_client: Client, site_a: Any
) -> None:
    assert register_job(viewer_client, site=site_a.name).status_code == 403
    created = register_job(operator_client, site=site_a.name)
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    assert post_events(viewer_client, job_id, [{"id": "a1", "ts": _now(0), "kind": "allocated"}]).status_code == 403
    assert post_events(operator_client, job_id, [{"id": "a1", "ts": _now(0), "kind": "allocated"}]).status_code == 200
    listed = viewer_client.get("/api/v1/training/jobs/?state=allocated")
    assert listed.status_code == 200 and listed.json()["count"] == 1


def test_a_checkpoint_ahead_of_the_steps_and_a_restore_of_no_checkpoint_are_refused(token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    ahead = {"id": "c1", "ts": _now(70), "kind": "checkpoint_saved", "step": 999_999, "duration_s": 1}
    response = post_events(client, job_id, [_step(1, 60), ahead], token_a)
    assert response.status_code == 400 and response.json()["field"] == "step"
    assert "reached step 1" in response.json()["error"]
    never_saved = {"id": "r1", "ts": _now(80), "kind": "restored", "step": 5000}
    response = post_events(client, job_id, [_step(1, 60), never_saved], token_a)
    assert response.status_code == 400 and "no checkpoint of step 5000" in response.json()["error"]
    fresh_start = {"id": "r0", "ts": _now(80), "kind": "restored", "step": 0}
    assert post_events(client, job_id, [_step(1, 60), fresh_start], token_a).status_code == 200


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"reason": "NCCL\u0000timeout"}, "reason"), ({"tokens": 2**41}, "tokens"), ({"step": 2**60}, "step")],
)
def test_values_the_database_or_the_sums_could_not_hold_are_400s(
    token_a: str, extra: dict[str, Any], field: str
) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    kind = "failed" if field == "reason" else "step"
    event = {"id": "x", "ts": _now(60), "kind": kind, **({"step": 1, "step_time_s": 1.0} if kind == "step" else {})}
    body = json.dumps({"events": [{**event, **extra}]})  # a NUL goes as the JSON escape \\u0000
    response = client.post(
        f"/api/v1/training/jobs/{job_id}/events",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token_a}",
    )
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert JobEvent.objects.filter(job_id=job_id).count() == 2


def test_editing_a_job_keeps_what_its_events_wrote(operator_client: Client, token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    _start(job_id, client, token_a)
    assert post_events(client, job_id, [_step(1, 60)], token_a).status_code == 200
    patched = operator_client.patch(
        f"/api/v1/training/jobs/{job_id}/", json.dumps({"checkpoint_interval_s": 600}), content_type="application/json"
    )
    assert patched.status_code == 200, patched.content
    job = Job.objects.get(pk=job_id)
    assert (job.checkpoint_interval_s, job.state, job.last_step, job.events_seen) == (600, "running", 1, 3)
    assert patched.json()["state"] == "running"


def test_a_jobs_identity_and_its_past_gang_size_cannot_be_changed(operator_client: Client, token_a: str) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    other = register_job(client, token_a, scheduler_id="default/other").json()["id"]
    assert other != job_id
    url = f"/api/v1/training/jobs/{job_id}/"
    clash = operator_client.patch(url, json.dumps({"scheduler_id": "default/other"}), content_type="application/json")
    assert clash.status_code == 400 and "scheduler_id" in clash.json()
    _start(job_id, client, token_a)
    regang = register_job(client, token_a, gang_size=64)
    assert regang.status_code == 400 and "gang_size" in regang.json()
    assert Job.objects.get(pk=job_id).gang_size == 16
