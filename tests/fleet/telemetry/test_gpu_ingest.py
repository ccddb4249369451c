"""POST /api/v1/ingest/gpu-samples: validation at the edge, site scope, idempotency, storage."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from console.models import AgentToken
from fleet.models import Gpu, GpuSample, GpuState, IngestBatch, Node, Site
from tests.conftest import make_sample, post_batch


def counts() -> tuple[int, int, int, int]:
    return GpuSample.objects.count(), GpuState.objects.count(), Gpu.objects.count(), IngestBatch.objects.count()


def test_a_valid_batch_is_stored_and_updates_latest_state(client, site_a: Site, token_a: str) -> None:
    samples = [make_sample(hostname="gpu-a-001", gpu_index=i) for i in range(4)]
    response = post_batch(client, token_a, {"samples": samples})
    assert response.status_code == 202, response.content
    assert response.json()["accepted"] == 4
    assert GpuSample.objects.count() == 4
    gpu = Gpu.objects.select_related("node__site", "state").get(uuid=samples[2]["gpu_uuid"])
    assert gpu.node.site == site_a and gpu.node.hostname == "gpu-a-001"
    assert gpu.index == 2 and gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.hbm_gib == round((71234 + 10245) / 1024)
    assert gpu.state.power_w == pytest.approx(612.3)
    assert gpu.state.gpu_util == pytest.approx(97.0)


def test_latest_state_never_moves_back_in_time(client, token_a: str) -> None:
    now = datetime.now(UTC)
    newer = make_sample(ts=now.isoformat(), gpu_util=10.0)
    older = dict(newer, ts=(now - timedelta(seconds=30)).isoformat(), gpu_util=90.0)
    assert post_batch(client, token_a, {"samples": [newer]}).status_code == 202
    assert post_batch(client, token_a, {"samples": [older]}).status_code == 202
    assert GpuSample.objects.count() == 2  # the late sample is history, kept
    assert GpuState.objects.get().gpu_util == pytest.approx(10.0)  # but not the latest state


def test_unsupported_fields_are_stored_as_null(client, token_a: str) -> None:
    sample = make_sample(memory_temp_c=None)
    sample.pop("tensor_active")
    assert post_batch(client, token_a, {"samples": [sample]}).status_code == 202
    stored = GpuSample.objects.get()
    assert stored.memory_temp_c is None and stored.tensor_active is None and stored.gpu_temp_c == 61.0


def test_a_redelivered_batch_writes_nothing_twice(client, token_a: str) -> None:
    body = json.dumps({"samples": [make_sample(), make_sample()]})
    for _ in range(3):
        assert post_batch(client, token_a, body).status_code == 202
    assert GpuSample.objects.count() == 2
    assert IngestBatch.objects.count() == 1


def test_the_idempotency_key_header_wins_over_the_body_hash(client, token_a: str) -> None:
    assert post_batch(client, token_a, {"samples": [make_sample()]}, **{"Idempotency-Key": "k-1"}).status_code == 202
    # The agent retried the same logical batch after re-stamping it: same key, different bytes.
    assert post_batch(client, token_a, {"samples": [make_sample()]}, **{"Idempotency-Key": "k-1"}).status_code == 202
    assert GpuSample.objects.count() == 1


def _too_many() -> dict:
    sample = make_sample()
    return {"samples": [sample] * 10_001}


BAD_BATCHES = [
    # (name, body, status, item, field, words in the message)
    ("malformed JSON", b'{"samples": [', 400, None, None, "Malformed JSON"),
    ("not an object", b"[1, 2]", 400, None, None, "Expected `object`"),
    ("empty body", b"", 400, None, None, "Empty body"),
    ("no samples", {"samples": []}, 400, None, "samples", "no samples"),
    ("wrong type", {"samples": [make_sample(), make_sample(gpu_util="98")]}, 400, 1, "gpu_util", "Expected"),
    (
        "NaN literal",
        b'{"samples": [{"gpu_uuid": "GPU-1234567", "hostname": "h", "ts": "2026-01-01T00:00:00Z", "power_w": NaN}]}',
        400,
        None,
        None,
        "Malformed JSON",
    ),
    (
        "infinity",
        json.dumps({"samples": [make_sample()]}).replace('"power_w": 612.3', '"power_w": 1e999'),
        400,
        0,
        "power_w",
        "out of range",
    ),
    ("negative power", {"samples": [make_sample(), make_sample(), make_sample(power_w=-5)]}, 400, 2, "power_w", ">= 0"),
    ("utilisation over 100", {"samples": [make_sample(gpu_util=100.5)]}, 400, 0, "gpu_util", "<= 100"),
    (
        "future timestamp",
        {"samples": [make_sample(), make_sample(ts=(datetime.now(UTC) + timedelta(hours=2)).isoformat())]},
        400,
        1,
        "ts",
        "in the future",
    ),
    ("naive timestamp", {"samples": [make_sample(ts="2026-11-29T10:00:00")]}, 400, 0, "ts", "timezone"),
    (
        "unknown field",
        {"samples": [make_sample(), make_sample(gpu_utilization=50)]},
        400,
        1,
        "gpu_utilization",
        "unknown field",
    ),
    ("unknown top-level field", {"samples": [make_sample()], "extra": 1}, 400, None, "extra", "unknown field"),
    (
        "missing uuid",
        {"samples": [{k: v for k, v in make_sample().items() if k != "gpu_uuid"}]},
        400,
        0,
        "gpu_uuid",
        "missing required field",
    ),
    ("bad uuid", {"samples": [make_sample(gpu_uuid="not-a-uuid")]}, 400, 0, "gpu_uuid", "matching regex"),
    (
        "bad hostname in a later sample",
        {"samples": [make_sample(), make_sample(), make_sample(hostname="-bad host")]},
        400,
        2,
        "hostname",
        "matching regex",
    ),
    (
        "bad parent uuid",
        {"samples": [make_sample(), make_sample(parent_uuid="GPU-x y", mig_profile="1g.10gb")]},
        400,
        1,
        "parent_uuid",
        "matching regex",
    ),
    ("too many items", _too_many(), 413, None, None, "at most 10000"),
]


@pytest.mark.parametrize(
    ("name", "body", "status", "item", "field", "words"), BAD_BATCHES, ids=[b[0] for b in BAD_BATCHES]
)
def test_bad_input_is_refused_whole_with_a_clear_message(
    client, token_a, name, body, status, item, field, words
) -> None:
    before = counts()
    response = post_batch(client, token_a, body)
    assert response.status_code == status, response.content
    payload = response.json()
    assert words.lower() in payload["error"].lower(), payload
    assert payload.get("item") == item
    assert payload.get("field") == field
    assert counts() == before  # nothing written: no samples, states, GPUs or batch keys


def test_a_body_over_5_mb_is_refused_with_413(client, token_a: str) -> None:
    padding = " " * (5 * 1024 * 1024)
    body = '{"samples": [' + json.dumps(make_sample()) + "]" + padding + "}"
    response = post_batch(client, token_a, body)
    assert response.status_code == 413
    assert "limit is 5242880 bytes" in response.json()["error"]
    assert GpuSample.objects.count() == 0


def test_a_wrong_token_gets_401(client, token_a: str) -> None:
    for token in ("gp_deadbeefdeadbeef_nope", token_a[:-2] + "xx", "garbage"):
        response = post_batch(client, token, {"samples": [make_sample()]})
        assert response.status_code == 401, token
        assert response["WWW-Authenticate"].startswith("Bearer")
    assert post_batch(client, None, {"samples": [make_sample()]}).status_code == 401
    assert GpuSample.objects.count() == 0


def test_a_revoked_token_gets_401(client, site_a: Site, token_a: str) -> None:
    AgentToken.objects.update(revoked_at=datetime.now(UTC))
    assert post_batch(client, token_a, {"samples": [make_sample()]}).status_code == 401


def test_a_browser_session_cannot_push_telemetry(viewer_client, admin_client) -> None:
    for client in (viewer_client, admin_client):
        response = post_batch(client, None, {"samples": [make_sample()]})
        assert response.status_code in (401, 403)
    assert GpuSample.objects.count() == 0


def test_a_site_a_token_sending_a_site_b_gpu_is_held_back_and_the_rest_written(
    client, token_a: str, site_b: Site
) -> None:
    """A claim, not a refusal of the batch (fleet.inventory.claims; tests/fleet/inventory/test_claims.py)."""
    node_b = Node.objects.create(site=site_b, hostname="gpu-b-001")
    gpu_b = Gpu.objects.create(node=node_b, index=0, uuid="GPU-bbbbbbbb-0000-0000-0000-000000000001")
    batch = {"samples": [make_sample(), make_sample(gpu_uuid=gpu_b.uuid, hostname="gpu-a-009")]}
    response = post_batch(client, token_a, batch)
    assert response.status_code == 409
    assert response.json()["item"] == 1 and response.json()["field"] == "gpu_uuid"
    assert response.json()["accepted"] == 1 and response.json()["held_back"][0]["value"] == gpu_b.uuid
    assert GpuSample.objects.count() == 1 and not GpuSample.objects.filter(gpu=gpu_b).exists()


def test_a_site_a_token_sending_a_site_b_node_is_held_back(client, token_a: str, site_b: Site) -> None:
    Node.objects.create(site=site_b, hostname="gpu-b-001")
    response = post_batch(client, token_a, {"samples": [make_sample(hostname="gpu-b-001")]})
    assert response.status_code == 409
    assert response.json()["field"] == "hostname" and response.json()["accepted"] == 0
    assert Gpu.objects.count() == 0


def test_samples_are_written_with_copy_into_the_sample_table(client, token_a: str) -> None:
    """The writer is one service; this pins that COPY (not row INSERTs) carries the samples."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert post_batch(client, token_a, {"samples": [make_sample() for _ in range(50)]}).status_code == 202
    inserts = [q["sql"] for q in queries.captured_queries if 'INSERT INTO "fleet_gpusample"' in q["sql"]]
    assert inserts == []
    assert GpuSample.objects.count() == 50
