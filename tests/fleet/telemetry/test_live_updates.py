"""The websocket hub: permission on connect, topic subscriptions, deltas after ingest, coalescing."""

from __future__ import annotations

import asyncio
import itertools
import math
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.core.cache import cache
from django.test import Client

from console import live
from goodput.asgi import application
from tests.conftest import make_sample, post_batch

pytestmark = pytest.mark.django_db(transaction=True)


def _cookie(user) -> bytes:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _communicator(cookie: bytes | None = None, origin: bytes = b"http://127.0.0.1") -> WebsocketCommunicator:
    headers = [(b"origin", origin)]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


def test_a_viewer_subscribes_and_receives_a_delta_after_ingest(viewer_user, site_a, token_a) -> None:
    cookie = _cookie(viewer_user)
    sample = make_sample(hostname="gpu-a-042", gpu_util=55.5)

    async def scenario() -> dict:
        ws = _communicator(cookie)
        connected, _ = await ws.connect()
        assert connected
        await ws.send_json_to({"action": "subscribe", "topics": ["fleet"]})
        assert (await ws.receive_json_from()) == {"type": "subscribed", "topics": ["fleet"]}
        response = await sync_to_async(post_batch)(Client(), token_a, {"samples": [sample]})
        assert response.status_code == 202
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    message = async_to_sync(scenario)()
    assert message["type"] == "fleet.delta"
    assert "gpus" not in message  # table rows go to the page's view topic (tests/fleet/telemetry/test_fleet_page.py)
    assert [g["uuid"] for g in message["worst"]] == [sample["gpu_uuid"]]
    assert message["worst"][0]["util"] == 55.5
    assert message["totals"]["gpus"] == 1 and message["totals"]["reporting"] == 1
    assert message["sites"][0]["name"] == site_a.name


@pytest.mark.parametrize(("persona", "code"), [("norole_user", 4403)])
def test_a_user_without_a_role_is_refused(request, persona: str, code: int) -> None:
    cookie = _cookie(request.getfixturevalue(persona))

    async def scenario() -> tuple[bool, int]:
        ws = _communicator(cookie)
        connected, close_code = await ws.connect()
        return connected, close_code

    assert async_to_sync(scenario)() == (False, code)


def test_a_foreign_origin_is_refused(viewer_user) -> None:
    cookie = _cookie(viewer_user)

    async def scenario() -> bool:
        connected, _ = await _communicator(cookie, origin=b"https://evil.example").connect()
        return connected

    assert async_to_sync(scenario)() is False


def test_unknown_topics_are_refused_with_an_error(viewer_user) -> None:
    cookie = _cookie(viewer_user)

    async def scenario() -> list[dict]:
        ws = _communicator(cookie)
        await ws.connect()
        replies = []
        for message in (
            {"action": "subscribe", "topics": ["fleet", "site.abc"]},
            {"action": "subscribe", "topics": "fleet"},
            {"action": "dance"},
        ):
            await ws.send_json_to(message)
            replies.append(await ws.receive_json_from())
        await ws.disconnect()
        return replies

    replies = async_to_sync(scenario)()
    assert all(r["type"] == "error" for r in replies)
    assert "site.abc" in replies[0]["error"]


def test_pushes_are_coalesced_to_one_per_interval(settings, monkeypatch, site_a, token_a) -> None:
    """With a server loop bound (as under uvicorn), a burst of requests yields one push per interval."""
    settings.LIVE_MIN_INTERVAL_MS = 1000
    post_batch(Client(), token_a, {"samples": [make_sample()]})  # data for the builder
    cache.delete("live:last:fleet")  # that write pushed at once: the burst's first push must too
    layer_messages: list[float] = []
    sent_at: list[float] = []  # when each push was built, measured at the sender: delivery can lag
    real_push = live.push_topic

    def recording_push(topic: str):
        sent_at.append(time.monotonic())
        return real_push(topic)

    monkeypatch.setattr(live, "push_topic", recording_push)
    burst: list[float] = []

    async def scenario() -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(live.group_name("fleet"), channel)
        live.bind_event_loop(asyncio.get_running_loop())
        try:
            started = time.monotonic()
            for _ in range(10):  # a burst of commits, as from many batches
                await sync_to_async(live.request_push)("fleet")
                await asyncio.sleep(0.05)
            burst.append(time.monotonic() - started)
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                try:
                    await asyncio.wait_for(layer.receive(channel), timeout=deadline - time.monotonic())
                    layer_messages.append(time.monotonic() - started)
                except TimeoutError:
                    break
        finally:
            live.bind_event_loop(None)  # type: ignore[arg-type]

    async_to_sync(scenario)()
    # 10 requests over about 0.5 s with a 1 s interval: the first goes at once, the rest fold into
    # one. A loaded machine can stretch the burst past an interval, and then one more push is due
    # for each interval it spans; never one per request.
    allowed = 1 + math.ceil(burst[0] / 1.0)
    assert 2 <= len(layer_messages) <= allowed, (layer_messages, burst)
    assert len(sent_at) >= len(layer_messages)
    # Coalescing is checked where the pushes are made: consecutive sends are an interval apart
    # (less a little for the timer's own slack), where unfolded sends would be milliseconds apart.
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert all(gap >= 0.9 for gap in gaps), gaps
