"""The fabric page's read model (fleet.fabric.read.summaries): the snapshot it gives for a window ending
now equals the one read from every port's rollups for the same pushed data; the per-site,
per-fabric minutes follow a recomputed minute by its difference, ignore a redelivery and count a
counter reset as Prometheus ``increase()`` does; the status keeps each port's latest state and rate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from fleet.choices import Fabric
from fleet.fabric.read import health as fabric
from fleet.fabric.read import summaries
from fleet.fabric.store import store_port_points
from fleet.inventory.models import NodeInterface
from fleet.models import Node, Rack
from fleet.telemetry.series import NodePoint
from tests.fleet.fabric.node_exporter import roll
from tests.fleet.fabric.test_pages import pushed  # noqa: F401  (the page tests' pushed scrapes)

HOSTNAME = "gpu-rm-01"


def _minute(minutes_ago: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)


def _without_ts(snap: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in snap.items() if k != "ts"}


def _both_agree() -> None:
    """The read model's snapshot equals the rollups' over one window (two calls to the default
    window could straddle a second and read two windows)."""
    win = fabric.default_window()
    assert _without_ts(fabric.snapshot(win)) == _without_ts(fabric.snapshot(win, read_model=False))


def _fabric_minutes() -> dict[tuple[str, datetime], float]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT fabric, bucket, bytes FROM fleet_fabricrollup_1m")
        return {(fabric_, bucket): value for fabric_, bucket, value in cursor.fetchall()}


def _rollup_minutes() -> dict[tuple[str, datetime], float]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.fabric, r.bucket, sum(r.increase) FROM fleet_portrollup_1m r "
            "JOIN fleet_nodeinterface i ON i.id = r.interface_id "
            "WHERE r.quantity IN ('receive_bytes', 'transmit_bytes') GROUP BY 1, 2"
        )
        return {(fabric_, bucket): value for fabric_, bucket, value in cursor.fetchall()}


@pytest.mark.parametrize("range_", ["1h", "6h", "24h"])
def test_the_read_model_gives_the_rollups_answer(pushed, range_: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    win = fabric.window({"range": range_})
    fast, slow = fabric.snapshot(win), fabric.snapshot(win, read_model=False)
    assert fast["totals"] == {"ports": 3, "up": 3, "flapping": 1, "degraded": 1}
    assert fast["throughput"]["ts"] and fast["flaps"] and fast["worst_ports"]
    assert _without_ts(fast) == _without_ts(slow)


def test_a_window_that_ends_before_the_pushes_reads_nothing_from_the_status(pushed) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    start, end = pushed["t0"] - timedelta(hours=2), pushed["t0"] - timedelta(minutes=1)
    win = fabric.window({"from": start.isoformat(), "to": end.isoformat()})
    snap = fabric.snapshot(win)
    assert snap["totals"] == {"ports": 3, "up": 0, "flapping": 0, "degraded": 0}
    assert _without_ts(snap) == _without_ts(fabric.snapshot(win, read_model=False))


def _points(values: list[tuple[datetime, float]], *, state: float = 4.0, rate: float = 5e10) -> list[NodePoint]:
    out = []
    for ts, value in values:
        for quantity, v in (("receive_bytes", value), ("transmit_bytes", value / 2), ("state", state), ("rate", rate)):
            out.append(NodePoint(HOSTNAME, "infiniband", quantity, ts, v, device="mlx5_0", port="1"))
    return out


@pytest.fixture
def node(site_a) -> Node:  # type: ignore[no-untyped-def]
    return Node.objects.create(site=site_a, rack=Rack.objects.create(site=site_a, name="r1"), hostname=HOSTNAME)


def test_a_recomputed_minute_moves_the_fabric_minute_by_its_difference_and_a_redelivery_by_nothing(
    site_a,  # type: ignore[no-untyped-def]
    node: Node,
) -> None:
    m = _minute(6)
    first = _points([(m - timedelta(seconds=15), 1000.0), (m + timedelta(seconds=5), 1600.0)])
    first += _points([(m + timedelta(seconds=35), 2200.0)])
    assert store_port_points(site_id=site_a.pk, batch_key="b1", points=first)
    roll()
    # received 1,200 and transmitted 600 in minute m
    assert _fabric_minutes()[("compute", m)] == pytest.approx(1800.0)
    assert store_port_points(site_id=site_a.pk, batch_key="b1", points=first) == 0  # redelivered
    roll()
    assert _fabric_minutes()[("compute", m)] == pytest.approx(1800.0)
    # A late sample inside minute m and the next minute's: both minutes recomputed from raw.
    late = _points([(m + timedelta(seconds=20), 1900.0), (m + timedelta(seconds=65), 2800.0)])
    assert store_port_points(site_id=site_a.pk, batch_key="b2", points=late)
    roll()
    minutes = _fabric_minutes()
    assert minutes[("compute", m)] == pytest.approx(1800.0)  # the same increase, split differently
    assert minutes[("compute", m + timedelta(minutes=1))] == pytest.approx(900.0)
    assert minutes == pytest.approx(_rollup_minutes())


def test_a_counter_reset_counts_from_zero_in_the_fabric_minute(site_a, node: Node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(4)
    points = _points([(m + timedelta(seconds=5), 5000.0), (m + timedelta(seconds=20), 5600.0)])
    points += _points([(m + timedelta(seconds=35), 300.0)])  # the HCA was reset: counts from zero
    assert store_port_points(site_id=site_a.pk, batch_key="r1", points=points)
    roll()
    assert _fabric_minutes()[("compute", m)] == pytest.approx((600 + 300) * 1.5)
    assert _fabric_minutes() == pytest.approx(_rollup_minutes())


def test_the_status_keeps_the_latest_state_and_the_highest_rate(site_a, node: Node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(8)
    assert store_port_points(site_id=site_a.pk, batch_key="s1", points=_points([(m, 1.0)], rate=5e10))
    roll()
    later = m + timedelta(minutes=3)
    assert store_port_points(site_id=site_a.pk, batch_key="s2", points=_points([(later, 2.0)], state=1, rate=2.5e10))
    roll()
    # A sample that arrives late for an earlier minute does not replace the latest values.
    assert store_port_points(site_id=site_a.pk, batch_key="s3", points=_points([(m + timedelta(minutes=1), 1.5)]))
    roll()
    with connection.cursor() as cursor:
        cursor.execute("SELECT seen_at, state, rate, rate_max, rate_max_at FROM fleet_portstatus")
        assert cursor.fetchall() == [(later, 1.0, 2.5e10, 5e10, m + timedelta(minutes=1))]
    [port] = fabric.snapshot()["worst_ports"]
    assert (port["up"], port["below_rate"], port["rated_bytes_per_second"]) == (False, True, 5e10)
    _both_agree()


def test_rebuild_reads_rollups_written_without_the_writer(site_a, node: Node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(5)
    assert store_port_points(
        site_id=site_a.pk, batch_key="w1", points=_points([(m, 10.0), (m + timedelta(seconds=30), 70.0)])
    )
    roll()
    expected = _fabric_minutes()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM fleet_fabricrollup_1m; DELETE FROM fleet_portstatus")
    summaries.rebuild(m - timedelta(hours=1), m + timedelta(minutes=2))
    assert _fabric_minutes() == expected
    _both_agree()


def test_a_port_slower_than_its_peer_and_an_ethernet_port_without_state_agree(site_a, node: Node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(3)
    points = [
        NodePoint(HOSTNAME, "infiniband", "rate", m, 5e10, device="mlx5_0", port="1"),
        NodePoint(HOSTNAME, "infiniband", "state", m, 4.0, device="mlx5_0", port="1"),
        NodePoint(HOSTNAME, "infiniband", "rate", m, 2.5e10, device="mlx5_1", port="1"),  # never faster
        NodePoint(HOSTNAME, "infiniband", "state", m, 4.0, device="mlx5_1", port="1"),
        NodePoint(HOSTNAME, "netdev", "receive_bytes", m, 10.0, device="eth0"),
        NodePoint(HOSTNAME, "netdev", "receive_bytes", m + timedelta(seconds=30), 70.0, device="eth0"),
    ]
    assert store_port_points(site_id=site_a.pk, batch_key="p1", points=points)
    roll()
    snap = fabric.snapshot()
    assert snap["totals"] == {"ports": 3, "up": 3, "flapping": 0, "degraded": 1}
    [slow] = snap["worst_ports"]
    assert (slow["name"], slow["rated_bytes_per_second"], slow["below_rate"]) == ("mlx5_1/1", 5e10, True)
    _both_agree()


def test_a_port_moved_to_another_fabric_takes_its_bytes_along(site_a, node: Node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(4)
    assert store_port_points(
        site_id=site_a.pk, batch_key="f1", points=_points([(m, 0.0), (m + timedelta(seconds=30), 900.0)])
    )
    roll()
    port = NodeInterface.objects.get(node=node)
    port.fabric = Fabric.STORAGE
    port.save()
    minutes = _fabric_minutes()
    assert minutes[("storage", m)] == pytest.approx(1350.0) and minutes[("compute", m)] == pytest.approx(0.0)
    _both_agree()


def test_a_deleted_port_leaves_no_status_row(site_a, node: Node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(3)
    assert store_port_points(site_id=site_a.pk, batch_key="d1", points=_points([(m, 1.0)]))
    roll()
    other = NodeInterface.objects.create(node=node, name="mlx5_1/1", kind="ib")
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fleet_portstatus (interface_id, seen_at) VALUES (%s, %s)", [other.pk, m])
    NodeInterface.objects.filter(name="mlx5_0/1").delete()  # a queryset's delete, as the admin's
    with connection.cursor() as cursor:
        cursor.execute("SELECT interface_id FROM fleet_portstatus")
        assert cursor.fetchall() == [(other.pk,)]
    assert fabric.snapshot()["totals"]["ports"] == 1
