"""Back-pressure and outages: 429 when the queue is over its bound, 503 when the broker or the
database is down, always with Retry-After, never a 500."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from console import queues
from fleet.ingest import stream as ingest_stream
from fleet.ingest.batches import decode_rows
from fleet.models import GpuSample, IngestBatch
from tests.conftest import make_sample, post_batch, redis_url
from tests.stack import Stack


def test_a_queue_over_its_bound_answers_429_with_retry_after(client, token_a, broker_mode, settings) -> None:
    settings.INGEST_QUEUE_BOUND = 3
    sample = make_sample()
    response = post_batch(client, token_a, {"samples": [sample]})
    assert response.status_code == 202
    # Queued for a writer, not stored here: the batch waits in the stream and a drain is scheduled.
    [(_, fields)] = broker_mode.xrange(ingest_stream.STREAM)
    assert fields[b"k"].decode() == response.json()["batch"]
    [row] = decode_rows(fields[b"d"])
    assert row.gpu_uuid == sample["gpu_uuid"] and row.power_w == sample["power_w"]
    assert broker_mode.llen("celery") == 1
    assert GpuSample.objects.count() == 0
    broker_mode.rpush("celery", "x")  # other work waiting: 3 in all
    queues.reset()  # the depth is read at most four times a second; this test cannot wait that long
    response = post_batch(client, token_a, {"samples": [make_sample()]})
    assert response.status_code == 429
    assert response["Retry-After"] == "2" and "bound 3" in response.json()["error"]
    assert broker_mode.xlen(ingest_stream.STREAM) == 1  # the refused batch was not queued


def test_a_broker_that_is_down_answers_503_with_retry_after(client, token_a, broker_mode, settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    queues.reset()
    response = post_batch(client, token_a, {"samples": [make_sample()]})
    assert response.status_code == 503
    assert response["Retry-After"] == "5" and "unavailable" in response.json()["error"]
    assert GpuSample.objects.count() == 0 and IngestBatch.objects.count() == 0


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_database_that_is_down_answers_503_not_500(tmp_path: Path, token_a) -> None:
    """A real server whose database does not answer (a closed port), in production mode."""
    stack = Stack(
        redis_url(), tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:1/goodput", DATABASE_CONNECT_TIMEOUT="1"
    )
    stack.start_server()
    try:
        ingest = requests.post(
            stack.base_url + "/api/v1/ingest/gpu-samples",
            json={"samples": [make_sample()]},
            headers={"Authorization": f"Bearer {token_a}"},
            timeout=30,
        )
        assert ingest.status_code == 503 and ingest.headers["Retry-After"] == "5"
        ready = requests.get(stack.base_url + "/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["checks"]["database"].startswith("error")
        page = requests.get(
            stack.base_url + "/fleet/", cookies={"sessionid": "a" * 32}, timeout=30, allow_redirects=False
        )
        assert page.status_code == 503
        assert requests.get(stack.base_url + "/healthz", timeout=30).status_code == 200  # the process is alive
    finally:
        stack.stop()


def test_a_drain_that_cannot_be_scheduled_answers_503_and_frees_the_slot(
    client, token_a, broker_mode, monkeypatch
) -> None:
    """The batch is already in the stream when publishing its drain fails: the agent hears 503
    and retries (its batch key makes that safe), the slot is free for the next batch, and the
    beat's drain writes what is queued."""
    from kombu.exceptions import OperationalError as BrokerError

    from fleet.tasks import drain_gpu_ingest

    def broker_down(*args, **kwargs):
        raise BrokerError("Error 111 connecting to the broker")

    monkeypatch.setattr(drain_gpu_ingest, "apply_async", broker_down)
    response = post_batch(client, token_a, {"samples": [make_sample()]}, **{"Idempotency-Key": "retry-me"})
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert broker_mode.xlen(ingest_stream.STREAM) == 1
    assert not any(broker_mode.exists(k) for k in ingest_stream.slot_keys())
    monkeypatch.undo()
    retry = post_batch(client, token_a, {"samples": [make_sample()]}, **{"Idempotency-Key": "retry-me"})
    assert retry.status_code == 202
    broker_mode.delete("celery", *ingest_stream.slot_keys())  # the drain it scheduled has been and gone
    assert ingest_stream.drain(None, None) == 1  # two copies queued, one written
    assert GpuSample.objects.count() == 1
