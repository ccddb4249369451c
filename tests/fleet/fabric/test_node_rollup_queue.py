"""The node series' queued rollups (fleet.telemetry.series): the writer COPYs ports, mounts and
disks in one transaction and queues the minutes it wrote; update_node_rollups folds each queued
minute once, for every series in it, counting resets as Prometheus ``increase()`` does; a late
sample queues its minute again; the writer's cache of a node's ports and mounts follows a
deletion and a new rate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from fleet.fabric.store import port_part, store_port_points
from fleet.inventory import directory
from fleet.inventory.models import NodeInterface, NodeMount
from fleet.models import Node, Rack
from fleet.storage.store import storage_parts
from fleet.telemetry import series
from fleet.telemetry.series import NodePoint, store_parts
from fleet.telemetry.store import claim_batch_keys
from tests.fleet.fabric.node_exporter import roll

HOSTNAME = "gpu-rq-01"

pytestmark = pytest.mark.django_db


def _minute(minutes_ago: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)


@pytest.fixture
def node(site_a) -> Node:  # type: ignore[no-untyped-def]
    return Node.objects.create(site=site_a, rack=Rack.objects.create(site=site_a, name="r1"), hostname=HOSTNAME)


def _port(ts: datetime, value: float, *, quantity: str = "link_downed", rate: float | None = None) -> list[NodePoint]:
    points = [NodePoint(HOSTNAME, "infiniband", quantity, ts, value, device="mlx5_0", port="1")]
    if rate is not None:
        points.append(NodePoint(HOSTNAME, "infiniband", "rate", ts, rate, device="mlx5_0", port="1"))
    return points


def _storage(ts: datetime, avail: float, read: float) -> list[NodePoint]:
    return [
        NodePoint(HOSTNAME, "filesystem", "avail_bytes", ts, avail, "10.0.4.20:/ds", "", "/mnt/datasets", "nfs4"),
        NodePoint(HOSTNAME, "disk", "read_bytes", ts, read, device="nvme0n1"),
    ]


def _queued() -> set[tuple[str, datetime]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT series, bucket FROM fleet_noderollupdirty")
        return set(cursor.fetchall())


def _increase(table: str, quantity: str) -> dict[datetime, float]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT bucket, increase FROM {table} WHERE quantity = %s ORDER BY bucket", [quantity])
        return dict(cursor.fetchall())


def test_a_push_queues_its_minutes_and_the_fold_rolls_them_once_with_a_reset(site_a, node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(5)
    points = [*_port(m + timedelta(seconds=5), 3), *_port(m + timedelta(seconds=20), 0)]  # the HCA reset
    points += [*_port(m + timedelta(seconds=40), 2), *_port(m + timedelta(seconds=70), 3)]
    assert store_port_points(site_id=site_a.pk, batch_key="q1", points=points) == 4
    assert _queued() == {("port", m), ("port", m + timedelta(minutes=1))}
    assert _increase("fleet_portrollup_1m", "link_downed") == {}  # not rolled in the write
    assert roll() == {"port": 2, "mount": 0, "disk": 0}
    # 3 -> 0 is a reset (counts 0), 0 -> 2 is +2; the next minute's 2 -> 3 is +1.
    assert _increase("fleet_portrollup_1m", "link_downed") == {m: 2.0, m + timedelta(minutes=1): 1.0}
    assert _queued() == set()
    assert roll() == {"port": 0, "mount": 0, "disk": 0}


def test_a_late_sample_queues_its_minute_again_and_the_minute_after_starts_from_it(site_a, node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(8)
    store_port_points(site_id=site_a.pk, batch_key="a", points=[*_port(m, 10), *_port(m + timedelta(seconds=90), 14)])
    roll()
    assert _increase("fleet_portrollup_1m", "link_downed") == {m: 0.0, m + timedelta(minutes=1): 4.0}
    store_port_points(site_id=site_a.pk, batch_key="b", points=_port(m + timedelta(seconds=45), 12))
    assert _queued() == {("port", m)}
    roll()
    assert _increase("fleet_portrollup_1m", "link_downed") == {m: 2.0, m + timedelta(minutes=1): 2.0}


def test_minutes_apart_fold_as_two_runs_and_leave_the_minutes_between_alone() -> None:
    a, b = _minute(30), _minute(3)
    assert series._runs([a, a + timedelta(minutes=1), b]) == [(a, a + timedelta(minutes=1)), (b, b)]
    assert series._runs([]) == []


def test_a_queued_minute_outside_retention_is_dropped_not_rolled(site_a, node) -> None:  # type: ignore[no-untyped-def]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fleet_noderollupdirty (series, bucket, dirtied_at) VALUES ('disk', %s, now())",
            [_minute(0) - timedelta(days=400)],
        )
    assert roll()["disk"] == 0 and _queued() == set()


def test_ports_mounts_and_disks_of_a_push_commit_together_or_not_at_all(site_a, node, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    m = _minute(4)
    parts = [port_part(site_id=site_a.pk, batch_key="t:port", points=_port(m, 1))]
    parts += storage_parts(site_id=site_a.pk, batch_key="t:storage", points=_storage(m, 5e12, 1e9))
    broken = parts[-1]
    monkeypatch.setattr(broken, "rows", lambda: [(node.pk, "nvme0n1", m, "read_bytes", "not a number")])
    with pytest.raises(Exception):  # noqa: B017 (the COPY's own error: a text where a float goes)
        store_parts(site_id=site_a.pk, parts=parts)
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM fleet_portsample) + (SELECT count(*) FROM fleet_mountsample)")
        assert cursor.fetchone()[0] == 0
    assert _queued() == set()
    # Nothing claimed: the retry writes everything.
    monkeypatch.undo()
    parts = [port_part(site_id=site_a.pk, batch_key="t:port", points=_port(m, 1))]
    parts += storage_parts(site_id=site_a.pk, batch_key="t:storage", points=_storage(m, 5e12, 1e9))
    assert store_parts(site_id=site_a.pk, parts=parts) == 3
    assert _queued() == {("port", m), ("mount", m), ("disk", m)}


def test_a_redelivered_part_is_skipped_and_the_others_written(site_a, node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(4)
    assert claim_batch_keys([("r:port", site_a.pk, 1, None)])  # the ports were stored before
    parts = [port_part(site_id=site_a.pk, batch_key="r:port", points=_port(m, 1))]
    parts += storage_parts(site_id=site_a.pk, batch_key="r:storage", points=_storage(m, 5e12, 1e9))
    assert store_parts(site_id=site_a.pk, parts=parts) == 2
    assert _queued() == {("mount", m), ("disk", m)}


def test_a_deleted_port_is_registered_again_on_its_next_push(site_a, node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(6)
    store_port_points(site_id=site_a.pk, batch_key="d1", points=_port(m, 1))
    first = NodeInterface.objects.get(node=node)
    first.delete()  # the cache of this process forgets the node's ports
    store_port_points(site_id=site_a.pk, batch_key="d2", points=_port(m + timedelta(seconds=30), 1))
    again = NodeInterface.objects.get(node=node)
    assert again.pk != first.pk
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT interface_id FROM fleet_portsample WHERE ts > %s", [m])
        assert cursor.fetchall() == [(again.pk,)]


def test_a_cached_port_reporting_a_new_rate_has_it_updated(site_a, node, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    m = _minute(6)
    with django_capture_on_commit_callbacks(execute=True):  # as if committed: the cache is kept
        store_port_points(site_id=site_a.pk, batch_key="c1", points=_port(m, 1, rate=5e10))
    (ports,) = directory.node_parts("interface", [node.pk])[0].values()
    assert ports == {"mlx5_0/1": (NodeInterface.objects.get(node=node).pk, 5e10)}
    with django_capture_on_commit_callbacks(execute=True):
        store_port_points(site_id=site_a.pk, batch_key="c2", points=_port(m + timedelta(seconds=15), 1, rate=5e10))
        store_port_points(site_id=site_a.pk, batch_key="c3", points=_port(m + timedelta(seconds=30), 1, rate=2.5e10))
    assert NodeInterface.objects.get(node=node).rate_bytes_per_second == 2.5e10
    assert directory.node_parts("interface", [node.pk])[0][node.pk]["mlx5_0/1"][1] == 2.5e10


def test_a_cached_node_is_answered_without_a_query(site_a, node, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    from django.test.utils import CaptureQueriesContext

    m = _minute(6)
    with django_capture_on_commit_callbacks(execute=True):
        store_port_points(site_id=site_a.pk, batch_key="n1", points=_port(m, 1))
    with CaptureQueriesContext(connection) as queries:
        store_port_points(site_id=site_a.pk, batch_key="n2", points=_port(m + timedelta(seconds=15), 1))
    assert not [q for q in queries.captured_queries if "fleet_nodeinterface" in q["sql"]]


def test_a_deleted_mount_is_registered_again_on_its_next_push(site_a, node) -> None:  # type: ignore[no-untyped-def]
    m = _minute(6)
    store_parts(site_id=site_a.pk, parts=storage_parts(site_id=site_a.pk, batch_key="m1", points=_storage(m, 5e12, 1)))
    NodeMount.objects.get(node=node).delete()
    later = m + timedelta(seconds=30)
    store_parts(
        site_id=site_a.pk, parts=storage_parts(site_id=site_a.pk, batch_key="m2", points=_storage(later, 5e12, 2))
    )
    mount = NodeMount.objects.get(node=node)
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT mount_id FROM fleet_mountsample WHERE ts > %s", [m])
        assert cursor.fetchall() == [(mount.pk,)]
