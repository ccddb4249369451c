"""The production path with real parts: HTTP POST -> Redis -> a Celery worker process -> PostgreSQL
-> channels-redis -> a websocket client receives the delta."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from fleet.models import Gpu, GpuSample, GpuState
from goodput.asgi import application
from tests.conftest import make_sample, post_batch, redis_url
from tests.stack import Stack

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url(), tmp_path)
    stack.flush_redis()
    stack.start_worker()
    yield stack
    stack.stop()


def test_the_suite_runs_this_test_in_production_mode() -> None:
    assert settings.EAGER_TASKS is False
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"


def test_a_batch_is_stored_by_the_worker_and_pushed_to_a_websocket(worker: Stack, viewer_user, token_a) -> None:
    client = Client()
    client.force_login(viewer_user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    samples = [make_sample(hostname="gpu-a-077", gpu_index=i, power_w=500.0 + i) for i in range(8)]

    async def scenario() -> dict:
        ws = WebsocketCommunicator(
            application, "/ws/live/", headers=[(b"origin", b"http://127.0.0.1"), (b"cookie", cookie)]
        )
        connected, _ = await ws.connect()
        assert connected
        await ws.send_json_to({"action": "subscribe", "topics": ["fleet"]})
        assert (await ws.receive_json_from(timeout=5))["type"] == "subscribed"
        response = await sync_to_async(post_batch)(Client(), token_a, {"samples": samples})
        assert response.status_code == 202, response.content
        message = await ws.receive_json_from(timeout=30)
        await ws.disconnect()
        return message

    message = async_to_sync(scenario)()
    assert message["type"] == "fleet.delta"
    # No table rows on the fleet topic (a table page's rows go to its own view topic): the
    # aggregates, and the worst GPUs, a bounded list that here holds all 8.
    assert "gpus" not in message
    assert {g["uuid"] for g in message["worst"]} == {s["gpu_uuid"] for s in samples}
    assert message["totals"]["power_kw"] == pytest.approx(sum(500.0 + i for i in range(8)) / 1000, abs=0.01)
    # Written by the worker process, read here: the real database, not the test's transaction.
    assert GpuSample.objects.count() == 8
    assert GpuState.objects.count() == 8
    assert Gpu.objects.filter(node__hostname="gpu-a-077").count() == 8
    assert "fleet.tasks.drain_gpu_ingest" in (worker.log_dir / "worker.log").read_text()
