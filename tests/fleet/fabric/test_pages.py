"""The fabric page and its API: node_exporter text pushed through the Prometheus door, port health
per site and rack, the worst ports, the flap timeline and throughput per fabric checked against
figures worked out here from the pushed values; ranges, auth refusals, the empty state, the live
push, the overview tile and the node page's ports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from console.models import PersonalToken
from fleet.fabric.read import health as fabric
from fleet.models import Node, Rack
from tests.fleet.fabric.node_exporter import HOST, push

TYPES = {
    "node_infiniband_link_downed_total": "counter",
    "node_infiniband_symbol_error_total": "counter",
    "node_infiniband_port_errors_received_total": "counter",
    "node_infiniband_port_data_received_bytes_total": "counter",
    "node_infiniband_port_data_transmitted_bytes_total": "counter",
    "node_infiniband_state_id": "gauge",
    "node_infiniband_rate_bytes_per_second": "gauge",
    "node_network_carrier_changes_total": "counter",
    "node_network_receive_bytes_total": "counter",
    "node_network_speed_bytes": "gauge",
}
IB0 = 'device="mlx5_0",port="1"'
IB1 = 'device="mlx5_1",port="1"'
ETH = 'device="eth0"'
# (metric, labels) -> (value at t0, value at t1)
VALUES = {
    ("node_infiniband_link_downed_total", IB0): (0, 0),
    ("node_infiniband_symbol_error_total", IB0): (0, 0),
    ("node_infiniband_state_id", IB0): (4, 4),
    ("node_infiniband_rate_bytes_per_second", IB0): (5e10, 5e10),
    ("node_infiniband_port_data_received_bytes_total", IB0): (1e12, 1e12 + 6e10),
    ("node_infiniband_port_data_transmitted_bytes_total", IB0): (0, 3e10),
    ("node_infiniband_link_downed_total", IB1): (3, 5),  # flapping: two link downs
    ("node_infiniband_symbol_error_total", IB1): (41, 50),  # degraded: nine symbol errors
    ("node_infiniband_port_errors_received_total", IB1): (7, 8),
    ("node_infiniband_state_id", IB1): (4, 4),
    ("node_infiniband_rate_bytes_per_second", IB1): (5e10, 2.5e10),  # renegotiated to half speed
    ("node_network_carrier_changes_total", ETH): (2, 2),
    ("node_network_receive_bytes_total", ETH): (0, 1.2e9),
    ("node_network_speed_bytes", ETH): (1.25e9, 1.25e9),
}


def _minute(minutes_ago: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)


T0 = 10  # minutes ago
T1 = 5


def _body(which: int, ts: datetime) -> str:
    ms = int(ts.timestamp() * 1000)
    out = []
    for name, kind in TYPES.items():
        lines = [f"{name}{{{labels}}} {values[which]} {ms}" for (n, labels), values in VALUES.items() if n == name]
        if lines:
            out += [f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


@pytest.fixture
def pushed(client: Client, site_a, token_a) -> dict[str, datetime]:  # type: ignore[no-untyped-def]
    rack = Rack.objects.create(site=site_a, name="r12")
    Node.objects.create(site=site_a, rack=rack, hostname=HOST)
    t0, t1 = _minute(T0) + timedelta(seconds=5), _minute(T1) + timedelta(seconds=5)
    for which, ts in ((0, t0), (1, t1)):
        response = push(client, token_a, _body(which, ts))
        assert response.status_code == 202, response.content
    return {"t0": t0, "t1": t1}


def _increase(name: str, labels: str) -> float:
    a, b = VALUES[(name, labels)]
    return b - a if b >= a else b


def test_the_api_counts_ports_up_flapping_and_degraded_per_site_and_rack(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    body = viewer_client.get("/api/v1/fabric/").json()
    assert body["window"]["range"] == "1h"
    assert body["totals"] == {"ports": 3, "up": 3, "flapping": 1, "degraded": 1}
    [site] = body["sites"]
    assert site["name"] == "ams-1"
    assert [(r["name"], r["ports"], r["flapping"], r["degraded"]) for r in site["racks"]] == [("r12", 3, 1, 1)]


def test_the_worst_port_carries_its_error_rate_and_its_rate_against_rated(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    body = viewer_client.get("/api/v1/fabric/?range=1h").json()
    worst = body["worst_ports"][0]
    assert (worst["hostname"], worst["name"]) == (HOST, "mlx5_1/1")
    errors = (
        _increase("node_infiniband_symbol_error_total", IB1)
        + _increase("node_infiniband_port_errors_received_total", IB1)
        + _increase("node_infiniband_link_downed_total", IB1)
    )
    assert errors == 12
    assert worst["errors"] == errors
    assert worst["errors_per_hour"] == errors / 1  # a one-hour window
    assert worst["flaps"] == 2 and worst["symbol_errors"] == 9
    assert worst["rate_bytes_per_second"] == 2.5e10 and worst["rated_bytes_per_second"] == 5e10
    assert worst["below_rate"] and worst["degraded"] and worst["flapping"]
    assert [p["name"] for p in body["worst_ports"]] == ["mlx5_1/1"]  # the healthy ports are not listed


def test_the_flap_timeline_and_throughput_per_fabric(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    body = viewer_client.get("/api/v1/fabric/").json()
    bucket = _minute(T1)
    assert body["flaps"] == [{"ts": bucket.isoformat(), "hostname": HOST, "interface": "mlx5_1/1", "flaps": 2}]
    series = body["throughput"]
    at = series["ts"].index(bucket.isoformat())
    compute = (
        _increase("node_infiniband_port_data_received_bytes_total", IB0)
        + _increase("node_infiniband_port_data_transmitted_bytes_total", IB0)
    ) / 60
    assert compute == 1.5e9
    assert series["bytes_per_second"]["compute"][at] == pytest.approx(compute)
    assert series["bytes_per_second"]["management"][at] == pytest.approx(1.2e9 / 60)
    assert series["bytes_per_second"]["storage"][at] is None  # no storage-fabric port


def test_a_custom_window_reads_only_its_minutes(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    start, end = _minute(T0 + 1), _minute(T0 - 1)  # the first scrape only: no increase yet
    query = f"from={start:%Y-%m-%dT%H:%M:%SZ}&to={end:%Y-%m-%dT%H:%M:%SZ}"
    body = viewer_client.get(f"/api/v1/fabric/?{query}").json()
    assert body["window"]["range"] == "custom"
    assert body["totals"] == {"ports": 3, "up": 3, "flapping": 0, "degraded": 0}
    assert body["flaps"] == [] and body["worst_ports"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [("range=2y", "range"), ("from=2024-05-01T02:00:00Z", "to"), ("from=nope&to=2024-05-01T02:00:00Z", "from")],
)
def test_a_bad_window_is_a_400_naming_the_field(viewer_client: Client, query: str, field: str) -> None:
    response = viewer_client.get(f"/api/v1/fabric/?{query}")
    assert response.status_code == 400
    assert field in response.json()


def test_reads_need_a_session_or_a_token_and_a_role(anon_client: Client, norole_client: Client, viewer_user) -> None:  # type: ignore[no-untyped-def]
    assert anon_client.get("/api/v1/fabric/").status_code in (401, 403)
    page = anon_client.get("/fabric/")
    assert page.status_code == 302 and "/accounts/login/" in page["Location"]
    assert norole_client.get("/api/v1/fabric/").status_code == 403
    assert norole_client.get("/fabric/").status_code == 403
    _, plain = PersonalToken.issue(user=viewer_user, name="read")
    assert Client().get("/api/v1/fabric/", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 200
    assert Client().get("/api/v1/fabric/", HTTP_AUTHORIZATION="Bearer nope").status_code in (401, 403)


def test_the_empty_state(viewer_client: Client, db) -> None:  # type: ignore[no-untyped-def]
    page = viewer_client.get("/fabric/")
    assert page.status_code == 200
    assert b"No ports yet" in page.content and b'id="range"' in page.content
    body = viewer_client.get("/api/v1/fabric/").json()
    assert body["totals"] == {"ports": 0, "up": 0, "flapping": 0, "degraded": 0}
    assert body["sites"] == [] and body["flaps"] == [] and body["throughput"]["ts"] == []
    assert b"No ports reported yet" in viewer_client.get("/").content


def test_the_live_push_carries_changes_only(pushed) -> None:  # type: ignore[no-untyped-def]
    payload, watermark = fabric.build_fabric_delta("fabric", None)
    assert payload is not None and payload["type"] == "fabric.delta"
    assert payload["totals"]["flapping"] == 1 and payload["worst_ports"][0]["name"] == "mlx5_1/1"
    again, _ = fabric.build_fabric_delta("fabric", watermark)
    assert again is None


def test_the_overview_tile_and_the_node_page_show_the_ports(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    home = viewer_client.get("/").content.decode()
    assert 'id="fabric-tile"' in home and "mlx5_1/1" in home
    node = viewer_client.get(f"/fleet/nodes/{HOST}/").content.decode()
    assert 'id="node-ports"' in node
    assert "mlx5_0/1" in node and "mlx5_1/1" in node and "eth0" in node and "flapping" in node


@pytest.mark.parametrize(("symbol_errors", "degraded"), [(59, False), (61, True)])
def test_a_port_is_degraded_on_the_page_by_the_detectors_own_limit(
    client: Client, viewer_client: Client, site_a, token_a, symbol_errors: int, degraded: bool
) -> None:  # type: ignore[no-untyped-def]
    """Symbol errors in the page's hour against the link-degrading detector's limit per hour (60):
    a stray error or two is not a degraded link, on the page as for the detector."""
    Node.objects.create(site=site_a, hostname=HOST)
    t0, t1 = _minute(T0) + timedelta(seconds=5), _minute(T1) + timedelta(seconds=5)
    for value, ts in ((0, t0), (symbol_errors, t1)):
        ms = int(ts.timestamp() * 1000)
        body = (
            "# TYPE node_infiniband_symbol_error_total counter\n"
            f"node_infiniband_symbol_error_total{{{IB0}}} {value} {ms}\n"
            "# TYPE node_infiniband_state_id gauge\n"
            f"node_infiniband_state_id{{{IB0}}} 4 {ms}\n"
        )
        assert push(client, token_a, body).status_code == 202
    [port] = viewer_client.get("/api/v1/fabric/?range=1h").json()["worst_ports"] or [None]
    totals = viewer_client.get("/api/v1/fabric/?range=1h").json()["totals"]
    assert totals["degraded"] == int(degraded)
    assert port is not None and port["symbol_errors"] == symbol_errors and port["degraded"] is degraded
