"""The fleet page at fleet scale: the GPU table paged and filtered on the server (one FilterSet for
the HTML view and the API), site rows with health, a bounded worst-GPUs list, and live topics that
carry only the rows a page shows (fleetview.<digest>) or a site's figures (site.<id>)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from console import live
from fleet.telemetry.read import fleet_summary, gpu_list
from fleet.telemetry.store import store_gpu_samples
from goodput.asgi import application
from tests.conftest import make_sample, post_batch
from tests.fleet.telemetry.test_rollups_and_retention import sample

TABLE = "/api/v1/fleet/gpu-table/"


def _fleet(client: Client, token: str, *, hosts: int, site: str = "a", **overrides: object) -> list[str]:
    """``hosts`` nodes of 8 GPUs reporting now; their UUIDs in host, index order."""
    samples = [
        make_sample(
            gpu_uuid=f"GPU-{site}{h:04d}000-{i:04d}",
            hostname=f"gpu-{site}-{h:03d}",
            gpu_index=i,
            gpu_temp_c=50.0 + h + i,
            **overrides,
        )
        for h in range(hosts)
        for i in range(8)
    ]
    assert post_batch(client, token, {"samples": samples}).status_code == 202
    return [s["gpu_uuid"] for s in samples]


def test_the_table_is_paged_on_the_server(viewer_client, client, token_a) -> None:
    uuids = _fleet(client, token_a, hosts=4)
    first = viewer_client.get(TABLE, {"size": 10}).json()
    assert (first["count"], first["page"], first["pages"], first["size"]) == (32, 1, 4, 10)
    assert [g["uuid"] for g in first["gpus"]] == uuids[:10]
    last = viewer_client.get(TABLE, {"size": 10, "page": 4}).json()
    assert [g["uuid"] for g in last["gpus"]] == uuids[30:]
    assert first["topic"].startswith("fleetview.") and live.is_valid_topic(first["topic"])


def test_the_table_sorts_and_filters_on_the_server(viewer_client, client, token_a) -> None:
    _fleet(client, token_a, hosts=3)
    hottest = viewer_client.get(TABLE, {"sort": "-temp", "size": 3}).json()["gpus"]
    assert [g["temp"] for g in hottest] == [59.0, 58.0, 58.0]  # 50 + host + index
    one_host = viewer_client.get(TABLE, {"q": "gpu-a-001"}).json()
    assert one_host["count"] == 8 and {g["hostname"] for g in one_host["gpus"]} == {"gpu-a-001"}
    assert viewer_client.get(TABLE, {"site": "ams-1"}).json()["count"] == 24
    assert viewer_client.get(TABLE, {"site": "iad-2"}).json()["count"] == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"size": "0"}, "size"),
        ({"size": "5000"}, "size"),
        ({"page": "-1"}, "page"),
        ({"sort": "colour"}, "sort"),
        ({"state": "on-fire"}, "state"),
        ({"site_id": "ams"}, "site_id"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_table_parameter_is_a_400_naming_it_in_the_api_and_the_page(viewer_client, params, field) -> None:
    response = viewer_client.get(TABLE, params)
    assert response.status_code == 400 and field in response.json()
    page = viewer_client.get("/fleet/", params)
    assert page.status_code == 400 and f"<b>{field}</b>" in page.content.decode()


def test_the_html_view_and_the_api_show_the_same_page(viewer_client, client, token_a) -> None:
    _fleet(client, token_a, hosts=2)
    params = {"q": "gpu-a-001", "sort": "-temp", "size": "5"}
    api = viewer_client.get(TABLE, params).json()
    html = viewer_client.get("/fleet/", params).content.decode()
    assert "8 of 16" in html
    positions = [html.index(f"/fleet/gpus/{g['uuid']}/") for g in api["gpus"]]
    assert positions == sorted(positions) and len(positions) == 5


def test_health_counts_add_up_per_site_and_agree_with_the_totals(viewer_client, client, token_a, token_b) -> None:
    _fleet(client, token_a, hosts=1)  # 8 healthy
    _fleet(client, token_b, hosts=1, site="b", throttle_reasons=0x40)  # 8 degraded: thermal slowdown
    old = (timezone.now() - timedelta(hours=1)).isoformat()
    post_batch(client, token_a, {"samples": [make_sample(hostname="gpu-a-900", ts=old)]})  # 1 stale: degraded
    snap = viewer_client.get("/api/v1/fleet/overview/").json()
    sites = {s["name"]: s for s in snap["sites"]}
    assert {n: (s["healthy"], s["degraded"], s["failed"]) for n, s in sites.items()} == {
        "ams-1": (8, 1, 0),
        "iad-2": (0, 8, 0),
    }
    totals = snap["totals"]
    assert (totals["healthy"], totals["degraded"], totals["failed"]) == (8, 9, 0)
    assert totals["healthy"] + totals["degraded"] + totals["failed"] == totals["gpus"] == 17
    degraded = viewer_client.get(TABLE, {"state": "degraded", "size": 100}).json()
    assert degraded["count"] == 9 and {g["health"] for g in degraded["gpus"]} == {"degraded"}
    assert snap["sites"][0]["mean_temp"] is not None


def test_the_worst_gpus_are_bounded_and_put_the_hottest_troubled_first(client, token_a, token_b, db) -> None:
    _fleet(client, token_a, hosts=8)  # 64 GPUs, none in trouble
    hot = make_sample(hostname="gpu-b-001", gpu_index=0, gpu_temp_c=88.0)  # degraded: thermally hot
    post_batch(client, token_b, {"samples": [hot]})
    worst = gpu_list.worst_gpus()
    assert len(worst) == gpu_list.WORST == 50
    assert worst[0]["uuid"] == hot["gpu_uuid"] and worst[0]["health"] == "degraded"
    assert [g["temp"] for g in worst[1:4]] == [64.0, 63.0, 63.0]  # then the hottest healthy ones


def test_a_view_push_carries_only_its_page_and_only_when_the_page_changed(site_a) -> None:
    now = timezone.now()
    samples = [
        sample(gpu_uuid=f"GPU-view0000-{i:04d}", hostname=f"gpu-a-{i // 8:03d}", gpu_index=i % 8, ts=now)
        for i in range(16)
    ]
    store_gpu_samples(site_id=site_a.id, batch_key="first", samples=samples)
    query = gpu_list.parse_query({"size": "4"})
    topic = fleet_summary.watch_view(query)
    first, mark = fleet_summary.build_view_delta(topic, None)
    assert first is not None and first["type"] == "fleet.rows" and first["count"] == 16
    assert [g["uuid"] for g in first["gpus"]] == [s.gpu_uuid for s in samples[:4]]
    assert fleet_summary.build_view_delta(topic, mark)[0] is None  # nothing on the page changed

    off_page = sample(gpu_uuid=samples[9].gpu_uuid, hostname="gpu-a-001", gpu_index=1, ts=now, gpu_util=1.0)
    store_gpu_samples(site_id=site_a.id, batch_key="second", samples=[off_page])
    assert fleet_summary.build_view_delta(topic, mark)[0] is None  # a row on another page is not news here

    on_page = sample(gpu_uuid=samples[2].gpu_uuid, hostname="gpu-a-000", gpu_index=2, ts=now, gpu_util=12.5)
    store_gpu_samples(site_id=site_a.id, batch_key="third", samples=[on_page])
    changed, mark = fleet_summary.build_view_delta(topic, mark)
    assert changed is not None and len(changed["gpus"]) == 4 and changed["gpus"][2]["util"] == 12.5


def test_the_same_view_is_one_topic_and_another_view_another(site_a) -> None:
    a = fleet_summary.view_topic(gpu_list.parse_query({"state": "failed", "q": "x", "size": "10"}))
    b = fleet_summary.view_topic(gpu_list.parse_query({"size": "10", "q": "x", "state": "failed"}))
    c = fleet_summary.view_topic(gpu_list.parse_query({"size": "10", "q": "x", "state": "failed", "page": "2"}))
    assert a == b != c
    assert fleet_summary.build_view_delta("fleetview.0123456789abcdef", None) == (None, None)  # never registered


def test_a_site_push_carries_its_row_totals_and_worst_gpus(client, token_a, token_b, site_b) -> None:
    _fleet(client, token_a, hosts=1)
    b = _fleet(client, token_b, hosts=1, site="b")
    payload, _ = fleet_summary.build_site_delta(f"site.{site_b.id}", None)
    assert payload["site"]["name"] == "iad-2" and payload["totals"]["gpus"] == 8
    assert {g["uuid"] for g in payload["worst"]} == set(b)
    assert fleet_summary.build_site_delta("site.999999", None) == (None, None)


pytestmark_ws = pytest.mark.django_db(transaction=True)


@pytestmark_ws
def test_a_socket_on_a_table_view_gets_that_pages_rows_after_ingest(viewer_user, token_a) -> None:
    web = Client()
    web.force_login(viewer_user)
    cookie = f"sessionid={web.cookies['sessionid'].value}".encode()
    _fleet(Client(), token_a, hosts=2)
    snapshot = web.get("/api/v1/fleet/overview/", {"size": "8", "q": "gpu-a-001"}).json()
    view = snapshot["table"]["topic"]
    assert [g["hostname"] for g in snapshot["gpus"]] == ["gpu-a-001"] * 8

    async def scenario() -> list[dict]:
        ws = WebsocketCommunicator(
            application, "/ws/live/", headers=[(b"origin", b"http://127.0.0.1"), (b"cookie", cookie)]
        )
        connected, _ = await ws.connect()
        assert connected
        await ws.send_json_to({"action": "subscribe", "topics": ["fleet", view]})
        assert (await ws.receive_json_from())["topics"] == sorted(["fleet", view])
        newer = make_sample(gpu_uuid="GPU-a0001000-0003", hostname="gpu-a-001", gpu_index=3, gpu_util=3.5)
        other = make_sample(gpu_uuid="GPU-a0000000-0003", hostname="gpu-a-000", gpu_index=3, gpu_util=4.5)
        response = await sync_to_async(post_batch)(Client(), token_a, {"samples": [newer, other]})
        assert response.status_code == 202
        messages = [await ws.receive_json_from(timeout=5), await ws.receive_json_from(timeout=5)]
        await ws.disconnect()
        return messages

    messages = {m["type"]: m for m in async_to_sync(scenario)()}
    assert set(messages) == {"fleet.delta", "fleet.rows"}
    rows = messages["fleet.rows"]
    assert rows["topic"] == view and {g["hostname"] for g in rows["gpus"]} == {"gpu-a-001"}
    assert [g["util"] for g in rows["gpus"] if g["uuid"] == "GPU-a0001000-0003"] == [3.5]
    assert "gpus" not in messages["fleet.delta"] and messages["fleet.delta"]["totals"]["gpus"] == 16


@pytestmark_ws
def test_a_socket_cannot_name_a_view_topic_the_server_did_not_make(viewer_user) -> None:
    web = Client()
    web.force_login(viewer_user)
    cookie = f"sessionid={web.cookies['sessionid'].value}".encode()

    async def scenario() -> dict:
        ws = WebsocketCommunicator(
            application, "/ws/live/", headers=[(b"origin", b"http://127.0.0.1"), (b"cookie", cookie)]
        )
        connected, _ = await ws.connect()
        assert connected
        await ws.send_json_to({"action": "subscribe", "topics": ["fleetview.site=1;drop"]})
        reply = await ws.receive_json_from()
        await ws.disconnect()
        return reply

    assert async_to_sync(scenario)()["type"] == "error"
