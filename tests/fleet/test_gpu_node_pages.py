"""A GPU's and a node's pages: series snapshots by range, live topics, one unit per chart, incidents."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from console import live, sockets
from fleet.ingest.batches import GpuSampleIn
from fleet.models import Gpu, Node, Site
from fleet.telemetry.read import figures
from fleet.telemetry.rollups import update_rollups
from fleet.telemetry.store import store_gpu_samples
from goodput.asgi import application
from incidents.services.engine import raise_finding
from tests.conftest import make_sample

HOST = "gpu-a-042"
G0, G1 = "GPU-42424242-0000", "GPU-42424242-0001"
MIG = "MIG-42424242-0000-gi1"


def store(site: Site, key: str, *, ages_s: list[float], uuid: str = G0, index: int = 0, **values: object) -> None:
    now = datetime.now(UTC)
    samples = []
    for age in ages_s:
        raw = make_sample(gpu_uuid=uuid, hostname=HOST, gpu_index=index, **values)
        raw["ts"] = now - timedelta(seconds=age)
        samples.append(msgspec.convert(raw, GpuSampleIn, from_attributes=False, strict=False))
    store_gpu_samples(site_id=site.id, batch_key=key, samples=samples)


def series(client: Client, path: str, range_key: str) -> dict:
    response = client.get(path, {"range": range_key})
    assert response.status_code == 200, response.content
    return response.json()


def test_the_gpu_series_for_15_minutes_reads_raw_samples_and_leaves_gaps_as_gaps(site_a, viewer_client) -> None:
    # Two stretches of samples with four minutes of silence between them.
    store(site_a, "b1", ages_s=[600, 590, 580], gpu_util=40.0, power_w=300.0, gpu_temp_c=50.0)
    store(site_a, "b2", ages_s=[340, 330, 320], gpu_util=80.0, power_w=600.0, gpu_temp_c=70.0)
    body = series(viewer_client, f"/api/v1/fleet/gpus/{G0}/series/", "15m")
    assert (body["resolution"], body["bucket_seconds"], body["range"]) == ("raw", 10, "15m")
    assert body["keys"] == ["util", "temp", "power_w", "mem_used_pct"]
    s = body["series"]
    assert s["util"] == [40.0, 40.0, 40.0, None, 80.0, 80.0, 80.0], "the silence should be one None point"
    assert s["power_w"][-1] == 600.0 and s["temp"][-1] == 70.0
    assert s["mem_used_pct"][0] == pytest.approx(87.4, abs=0.1)
    assert len(s["ts"]) == len(s["util"])


def test_the_gpu_series_beyond_15_minutes_reads_the_rollups(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[200, 140, 80], gpu_util=50.0, power_w=400.0)
    update_rollups()
    for range_key in ("1h", "6h", "24h"):
        body = series(viewer_client, f"/api/v1/fleet/gpus/{G0}/series/", range_key)
        assert (body["resolution"], body["bucket_seconds"]) == ("1m", 60)
        assert body["series"]["power_w"] and set(body["series"]["power_w"]) == {400.0}
        assert set(body["series"]["mem_used_pct"]) == {None}  # the rollups keep no memory
    update_rollups(now=datetime.now(UTC) + timedelta(hours=2))  # settle the hour
    week = series(viewer_client, f"/api/v1/fleet/gpus/{G0}/series/", "7d")
    assert (week["resolution"], week["bucket_seconds"]) == ("1h", 3600)
    assert week["series"]["util"] and set(week["series"]["util"]) == {50.0}
    points = {k: figures.RANGES[k] // figures.BUCKET_SECONDS.get(figures.RESOLUTION[k], 10) for k in figures.RANGES}
    assert max(points.values()) <= 1440


def test_a_mig_instance_charts_only_its_own_fields(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[60, 50])
    raw = make_sample(gpu_uuid=MIG, hostname=HOST, gpu_index=0, parent_uuid=G0, mig_profile="1g.10gb")
    raw["ts"] = datetime.now(UTC) - timedelta(seconds=55)
    store_gpu_samples(site_id=site_a.id, batch_key="mig", samples=[msgspec.convert(raw, GpuSampleIn, strict=False)])
    body = series(viewer_client, f"/api/v1/fleet/gpus/{MIG}/series/", "15m")
    assert body["keys"] == ["util", "mem_used_pct"]
    assert set(body["series"]) == {"ts", "util", "mem_used_pct"}
    page = viewer_client.get(f"/fleet/gpus/{MIG}/").content.decode()
    assert 'id="chart-util"' in page and 'id="chart-power"' not in page and 'id="chart-temp"' not in page


def test_the_node_series_has_one_series_per_physical_gpu(site_a, viewer_client) -> None:
    store(site_a, "b0", ages_s=[60, 50], uuid=G0, index=0, gpu_util=10.0)
    store(site_a, "b1", ages_s=[60, 50], uuid=G1, index=1, gpu_util=90.0)
    raw = make_sample(gpu_uuid=MIG, hostname=HOST, gpu_index=0, parent_uuid=G0, mig_profile="1g.10gb")
    store_gpu_samples(site_id=site_a.id, batch_key="mig", samples=[msgspec.convert(raw, GpuSampleIn, strict=False)])
    body = series(viewer_client, f"/api/v1/fleet/nodes/{HOST}/series/", "15m")
    assert body["keys"] == ["util", "temp", "power_w"]
    assert [(g["uuid"], g["label"]) for g in body["gpus"]] == [(G0, "gpu0"), (G1, "gpu1")]
    assert [set(g["series"]["util"]) for g in body["gpus"]] == [{10.0}, {90.0}]
    assert "mem_used_pct" not in body["gpus"][0]["series"]


def test_an_unknown_range_is_refused_by_name(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[60])
    for path in (f"/api/v1/fleet/gpus/{G0}/series/", f"/api/v1/fleet/nodes/{HOST}/series/"):
        response = viewer_client.get(path, {"range": "3y"})
        assert response.status_code == 400 and "15m" in response.json()["range"]
    assert viewer_client.get("/api/v1/fleet/gpus/GPU-nope/series/").status_code == 404


def test_the_pages_follow_their_own_topics_with_no_inline_script(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[60])
    gpu = Gpu.objects.get(uuid=G0)
    gpu_page = viewer_client.get(gpu.get_absolute_url()).content.decode()
    node_page = viewer_client.get(gpu.node.get_absolute_url()).content.decode()
    for page, topic, js in ((gpu_page, f"gpu.{gpu.pk}", "gpu.js"), (node_page, f"node.{gpu.node_id}", "node.js")):
        assert f'"topic": "{topic}"' in page and f"/static/js/{js}" in page and "/static/js/live.js" in page
        assert 'id="range"' in page and '<option value="7d"' in page
        assert "onclick" not in page and "<script>" not in page  # the CSP allows no inline script
    for unit in ("(%)", "(°C)", "(W)"):  # one unit per chart
        assert unit in gpu_page and unit in node_page
    assert live.is_valid_topic(f"gpu.{gpu.pk}") and live.is_valid_topic(f"node.{gpu.node_id}")
    assert not live.is_valid_topic("gpu.abc")


def test_a_gpu_topic_is_pushed_only_while_watched_and_sends_the_newest_sample(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[30])
    gpu = Gpu.objects.get(uuid=G0)
    topics = [f"gpu.{gpu.pk}", f"node.{gpu.node_id}"]
    assert figures.watched_topics([gpu.pk]) == []  # nobody on the pages: ingest asks for nothing
    series(viewer_client, f"/api/v1/fleet/gpus/{G0}/series/", "15m")
    series(viewer_client, f"/api/v1/fleet/nodes/{HOST}/series/", "15m")
    assert figures.watched_topics([gpu.pk]) == sorted(topics)

    payload, watermark = figures.build_gpu_delta(topics[0], None)
    assert payload is not None and payload["type"] == "gpu.delta"
    [point] = payload["points"]
    assert (point["id"], point["util"], point["power_w"], point["temp"]) == (gpu.pk, 97.0, 612.3, 61.0)
    store(site_a, "b2", ages_s=[0], gpu_util=12.0)
    payload, _ = figures.build_node_delta(topics[1], watermark)
    assert [p["util"] for p in payload["points"]] == [12.0]


def test_a_topic_nobody_watches_any_more_stops_being_pushed_while_samples_keep_arriving(
    site_a, viewer_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "WATCH_SECONDS", 1)
    store(site_a, "b0", ages_s=[30])
    store(site_a, "c0", ages_s=[30], uuid=G1, index=1)
    gpu, other = Gpu.objects.get(uuid=G0), Gpu.objects.get(uuid=G1)
    series(viewer_client, f"/api/v1/fleet/gpus/{G0}/series/", "15m")  # the page opens, then closes
    assert figures.watched_topics([gpu.pk]) == [f"gpu.{gpu.pk}"]
    deadline = time.monotonic() + 2.5
    for n in range(100):  # the GPU keeps reporting, and every push goes out, for well past the TTL
        store(site_a, f"b{n + 1}", ages_s=[0], gpu_util=float(n))
        assert live.push_topic(f"gpu.{gpu.pk}") is not None
        live.watch_topic(f"gpu.{other.pk}")  # while someone else stays on another GPU's page
        if time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert figures.watched_topics([gpu.pk, other.pk]) == [f"gpu.{other.pk}"], "a push renewed its own watch"


def test_the_watch_outlasts_the_socket_renewal_period() -> None:
    assert sockets.SESSION_RECHECK_SECONDS < live.WATCH_SECONDS <= 2 * sockets.SESSION_RECHECK_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_subscribed_socket_keeps_its_gpu_and_node_topics_watched(
    site_a, viewer_user, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "WATCH_SECONDS", 1)
    monkeypatch.setattr(sockets, "SESSION_RECHECK_SECONDS", 0.3)
    store(site_a, "b0", ages_s=[30])
    gpu = Gpu.objects.get(uuid=G0)
    topics = [f"gpu.{gpu.pk}", f"node.{gpu.node_id}"]
    client = Client()
    client.force_login(viewer_user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie.encode())]

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        watched = sync_to_async(figures.watched_topics)
        ws = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        assert (await ws.connect())[0]
        await ws.send_json_to({"action": "subscribe", "topics": [*topics, "fleet"]})
        assert (await ws.receive_json_from())["type"] == "subscribed"
        on_subscribe = await watched([gpu.pk])  # no snapshot fetched: subscribing alone watches
        await asyncio.sleep(2.5)  # more than twice the TTL, with the socket renewing
        while_open = await watched([gpu.pk])
        await ws.disconnect()
        await asyncio.sleep(1.5)
        return on_subscribe, while_open, await watched([gpu.pk])

    on_subscribe, while_open, after_close = async_to_sync(scenario)()
    assert on_subscribe == sorted(topics)
    assert while_open == sorted(topics)
    assert after_close == []


def test_the_node_page_lists_the_incidents_that_name_it(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[30])
    Node.objects.create(site=site_a, hostname="gpu-a-999")
    raise_finding("fp-here", {"hostname": HOST, "gpu": G0}, "SEV2", "XID 79 on gpu-a-042 GPU 0", source="test")
    raise_finding("fp-there", {"hostname": "gpu-a-999"}, "SEV3", "Thermal throttling on gpu-a-999", source="test")
    page = viewer_client.get(f"/fleet/nodes/{HOST}/").content.decode()
    assert "XID 79 on gpu-a-042 GPU 0" in page
    assert "Thermal throttling on gpu-a-999" not in page
    other = viewer_client.get("/fleet/nodes/gpu-a-999/").content.decode()
    assert "Thermal throttling on gpu-a-999" in other and "No incidents name this node" not in other


def test_the_series_answer_the_json_format_suffix(site_a, viewer_client) -> None:
    store(site_a, "b1", ages_s=[60])
    assert viewer_client.get(f"/api/v1/fleet/gpus/{G0}/series.json/").status_code == 200
    assert viewer_client.get(f"/api/v1/fleet/nodes/{HOST}/series.json/").status_code == 200


def test_a_gpu_in_mig_mode_takes_its_memory_used_from_its_instances(site_a, viewer_client) -> None:
    """In MIG mode DCGM gives framebuffer per instance: the physical GPU's own is null. The fleet
    table, the GPU page, its chart and its live point all show the instances' memory."""
    store(site_a, "p", ages_s=[60, 50, 0], fb_used_mib=None, fb_free_mib=None)
    for n, (used, free) in enumerate([(8000.0, 2000.0), (1000.0, 9000.0)], start=1):
        raw = [
            make_sample(
                gpu_uuid=f"MIG-42424242-0000-gi{n}",
                hostname=HOST,
                gpu_index=0,
                parent_uuid=G0,
                mig_profile="1g.10gb",
                mig_instance_id=n,
                fb_used_mib=used,
                fb_free_mib=free,
            )
            for _ in (60, 50, 0)
        ]
        for sample, age in zip(raw, (60, 50, 0), strict=True):
            sample["ts"] = datetime.now(UTC) - timedelta(seconds=age)
        store_gpu_samples(
            site_id=site_a.id, batch_key=f"mig{n}", samples=[msgspec.convert(r, GpuSampleIn, strict=False) for r in raw]
        )
    # (8,000 + 1,000) MiB used of (10,000 + 10,000): 45 %.
    rows = {g["uuid"]: g for g in viewer_client.get("/api/v1/fleet/overview/").json()["gpus"]}
    assert rows[G0]["mem_used_pct"] == 45.0
    page = viewer_client.get(f"/fleet/gpus/{G0}/").content.decode()
    assert "9,000 MiB (its 2 MIG instances)" in page and "11,000 MiB (its 2 MIG instances)" in page
    body = series(viewer_client, f"/api/v1/fleet/gpus/{G0}/series/", "15m")
    # The samples 60 and 50 s old, and the newest too when the read's 10-s bucket is already the
    # next one (a slow moment between the writes and the read): each point is 45 %.
    points = [v for v in body["series"]["mem_used_pct"] if v is not None]
    assert points in ([45.0, 45.0], [45.0, 45.0, 45.0])
    gpu = Gpu.objects.get(uuid=G0)
    payload, _ = figures.build_gpu_delta(f"gpu.{gpu.pk}", None)
    assert [p["mem_used_pct"] for p in payload["points"]] == [45.0]
