"""The storage page and its API: node_exporter text pushed through the Prometheus door, each
mount's free space, its disk's throughput and I/O time and the running jobs on its node, and per
GPU server its read throughput (disks plus storage-fabric receive) against the 10 GB/s a training
server needs, checked against figures worked out here from the pushed values; ranges, auth
refusals, the empty state, the live push, the overview tile and the node page's mounts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from console.models import PersonalToken
from fleet.choices import Fabric, JobState
from fleet.models import Gpu, Job, Node, NodeInterface, NodeMount
from fleet.storage import read as storage
from tests.fleet.fabric.node_exporter import push

SLOW, FAST = "gpu-a-017", "gpu-a-018"
TYPES = {
    "node_disk_read_bytes_total": "counter",
    "node_disk_written_bytes_total": "counter",
    "node_disk_io_time_seconds_total": "counter",
    "node_filesystem_avail_bytes": "gauge",
    "node_filesystem_size_bytes": "gauge",
    "node_network_receive_bytes_total": "counter",
}
ROOT = 'device="/dev/nvme0n1p2",device_error="",fstype="ext4",mountpoint="/"'
CKPT = 'device="10.0.5.10@o2ib:/ckpt",device_error="",fstype="lustre",mountpoint="/mnt/checkpoints"'
NVME = 'device="nvme0n1"'
ETH1 = 'device="eth1"'


def _values(read_bytes: float) -> dict[tuple[str, str], tuple[float, float]]:
    """(metric, labels) -> (value at t0, value at t1) for a node that reads read_bytes in a minute."""
    return {
        ("node_disk_read_bytes_total", NVME): (1e9, 1e9 + read_bytes),
        ("node_disk_written_bytes_total", NVME): (0, 7.2e9),
        ("node_disk_io_time_seconds_total", NVME): (100, 100 + 1800),
        ("node_filesystem_avail_bytes", ROOT): (2e11, 1e11),
        ("node_filesystem_size_bytes", ROOT): (1e12, 1e12),
        ("node_filesystem_avail_bytes", CKPT): (5e12, 5e12),
        ("node_filesystem_size_bytes", CKPT): (1e14, 1e14),
        ("node_network_receive_bytes_total", ETH1): (0, 0),
    }


SLOW_VALUES = _values(3e11)  # 5 GB/s in its busiest minute: below need
FAST_VALUES = _values(9e11)  # 15 GB/s


def _minute(minutes_ago: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)


T0, T1 = 10, 5


def _body(values: dict, which: int, ts: datetime) -> str:  # type: ignore[type-arg]
    ms = int(ts.timestamp() * 1000)
    out = []
    for name, kind in TYPES.items():
        lines = [f"{name}{{{labels}}} {v[which]} {ms}" for (n, labels), v in values.items() if n == name]
        out += [f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


def _push_all(client: Client, token: str, slow: dict | None = None) -> None:  # type: ignore[type-arg]
    t0, t1 = _minute(T0) + timedelta(seconds=5), _minute(T1) + timedelta(seconds=5)
    for host, values in ((SLOW, slow or SLOW_VALUES), (FAST, FAST_VALUES)):
        for which, ts in ((0, t0), (1, t1)):
            response = push(client, token, _body(values, which, ts), query=f"?hostname={host}")
            assert response.status_code == 202, response.content


@pytest.fixture
def pushed(client: Client, site_a, token_a) -> dict[str, Job]:  # type: ignore[no-untyped-def]
    nodes = {h: Node.objects.create(site=site_a, hostname=h) for h in (SLOW, FAST)}
    for n, node in enumerate(nodes.values()):
        Gpu.objects.create(node=node, index=0, uuid=f"GPU-{n}")
    running = Job.objects.create(
        site=site_a, name="llama-70b", team="lm", gang_size=8, scheduler_id="w-1", state=JobState.RUNNING
    )
    running.nodes.add(nodes[SLOW])
    pending = Job.objects.create(site=site_a, name="queued", team="lm", gang_size=8, scheduler_id="w-2")
    pending.nodes.add(nodes[SLOW])
    _push_all(client, token_a)
    return {"running": running}


def _mount(body: dict, host: str, mountpoint: str) -> dict:  # type: ignore[type-arg]
    return next(m for m in body["mounts"] if (m["hostname"], m["mountpoint"]) == (host, mountpoint))


def test_a_local_mount_carries_free_space_its_disk_throughput_and_io_time(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    body = viewer_client.get("/api/v1/storage/").json()
    root = _mount(body, SLOW, "/")
    avail, size = (
        SLOW_VALUES[("node_filesystem_avail_bytes", ROOT)][1],
        SLOW_VALUES[("node_filesystem_size_bytes", ROOT)][1],
    )
    assert root["free_pct"] == 100 * avail / size == 10.0  # the latest value, not the earlier 20 %
    assert root["disk"] == "nvme0n1"
    hour = 3600
    assert root["read_bytes_per_second"] == pytest.approx(3e11 / hour)
    assert root["written_bytes_per_second"] == pytest.approx(7.2e9 / hour)
    assert root["io_busy_pct"] == 100 * 1800 / hour == 50.0
    assert root["jobs"] == [{"id": pushed["running"].pk, "name": "llama-70b", "team": "lm"}]  # not the pending one
    assert _mount(body, FAST, "/")["jobs"] == []


def test_a_network_mount_has_no_block_device_and_low_free_space_counts(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    body = viewer_client.get("/api/v1/storage/").json()
    ckpt = _mount(body, SLOW, "/mnt/checkpoints")
    assert ckpt["fstype"] == "lustre" and ckpt["disk"] is None
    assert ckpt["read_bytes_per_second"] is None and ckpt["io_busy_pct"] is None
    assert ckpt["free_pct"] == 5.0
    assert body["totals"] == {"mounts": 4, "low_free": 2, "servers": 2, "training_servers": 1, "servers_below_need": 1}


def test_each_gpu_server_reads_against_what_training_needs(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    body = viewer_client.get("/api/v1/storage/").json()
    servers = {s["hostname"]: s for s in body["servers"]}
    assert servers[SLOW]["peak_read_bytes_per_second"] == pytest.approx(3e11 / 60) == 5e9
    assert servers[SLOW]["below_need"] is True
    assert servers[FAST]["peak_read_bytes_per_second"] == pytest.approx(9e11 / 60)
    assert servers[FAST]["below_need"] is False
    assert servers[SLOW]["average_read_bytes_per_second"] == pytest.approx(3e11 / 3600)
    assert servers[SLOW]["jobs"][0]["name"] == "llama-70b"
    assert body["need_bytes_per_second"] == [10e9, 20e9]


def test_storage_fabric_receive_counts_as_a_servers_reads(
    client: Client, viewer_client: Client, site_a, token_a
) -> None:  # type: ignore[no-untyped-def]
    node = Node.objects.create(site=site_a, hostname=SLOW)
    Gpu.objects.create(node=node, index=0, uuid="GPU-s")
    t0 = _minute(T0) + timedelta(seconds=5)
    series = f"node_network_receive_bytes_total{{{ETH1}}}"
    line = f"# TYPE node_network_receive_bytes_total counter\n{series} 0 {int(t0.timestamp() * 1000)}\n"
    assert push(client, token_a, line, query=f"?hostname={SLOW}").status_code == 202
    NodeInterface.objects.filter(node=node, name="eth1").update(fabric=Fabric.STORAGE)  # an Operator's setting
    t1 = _minute(T1) + timedelta(seconds=5)
    line = line.replace(" 0 ", " 6.6e11 ").replace(str(int(t0.timestamp() * 1000)), str(int(t1.timestamp() * 1000)))
    assert push(client, token_a, line, query=f"?hostname={SLOW}").status_code == 202
    [server] = viewer_client.get("/api/v1/storage/").json()["servers"]
    assert server["peak_read_bytes_per_second"] == pytest.approx(6.6e11 / 60) == 1.1e10
    assert server["below_need"] is False


def test_a_custom_window_reads_only_its_minutes(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    start, end = _minute(T0 + 1), _minute(T0 - 1)
    body = viewer_client.get(f"/api/v1/storage/?from={start:%Y-%m-%dT%H:%M:%SZ}&to={end:%Y-%m-%dT%H:%M:%SZ}").json()
    assert body["window"]["range"] == "custom"
    root = _mount(body, SLOW, "/")
    assert root["free_pct"] == 20.0  # the earlier scrape's figure
    assert root["read_bytes_per_second"] == 0
    assert body["totals"]["servers_below_need"] == 0  # no reads in the window: idle, not under-provisioned


@pytest.mark.parametrize(("query", "field"), [("range=9d", "range"), ("to=2024-05-01T02:00:00Z", "from")])
def test_a_bad_window_is_a_400_naming_the_field(viewer_client: Client, query: str, field: str) -> None:
    response = viewer_client.get(f"/api/v1/storage/?{query}")
    assert response.status_code == 400 and field in response.json()


def test_reads_need_a_session_or_a_token_and_a_role(anon_client: Client, norole_client: Client, viewer_user) -> None:  # type: ignore[no-untyped-def]
    assert anon_client.get("/api/v1/storage/").status_code in (401, 403)
    assert anon_client.get("/storage/").status_code == 302
    assert norole_client.get("/api/v1/storage/").status_code == 403
    assert norole_client.get("/storage/").status_code == 403
    _, plain = PersonalToken.issue(user=viewer_user, name="read")
    assert Client().get("/api/v1/storage/", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 200


def test_the_empty_state(viewer_client: Client, db) -> None:  # type: ignore[no-untyped-def]
    page = viewer_client.get("/storage/")
    assert page.status_code == 200 and b"No mounts yet" in page.content
    body = viewer_client.get("/api/v1/storage/").json()
    assert body["mounts"] == [] and body["servers"] == []
    assert body["totals"] == {"mounts": 0, "low_free": 0, "servers": 0, "training_servers": 0, "servers_below_need": 0}
    assert b"No mounts reported yet" in viewer_client.get("/").content


def test_the_live_push_carries_changes_only(pushed) -> None:  # type: ignore[no-untyped-def]
    payload, watermark = storage.build_storage_delta("storage", None)
    assert payload is not None and payload["type"] == "storage.delta" and payload["totals"]["servers_below_need"] == 1
    assert storage.build_storage_delta("storage", watermark)[0] is None


def test_the_overview_tile_and_the_node_page_show_the_mounts(viewer_client: Client, pushed) -> None:  # type: ignore[no-untyped-def]
    home = viewer_client.get("/").content.decode()
    assert 'id="storage-tile"' in home and f"{SLOW}:/mnt/checkpoints" in home
    node = viewer_client.get(f"/fleet/nodes/{SLOW}/").content.decode()
    assert 'id="node-mounts"' in node and "/mnt/checkpoints" in node and "50.0 %" in node and "10.0 %" in node


def test_disk_of_maps_a_partition_to_its_disk() -> None:
    disks = {"nvme0n1", "nvme1n1", "sda", "sdab"}
    assert storage.disk_of("/dev/nvme0n1p2", disks) == "nvme0n1"
    assert storage.disk_of("/dev/sda1", disks) == "sda"
    assert storage.disk_of("/dev/sdab", disks) == "sdab"
    assert storage.disk_of("10.0.4.20:/datasets", disks) is None
    assert storage.disk_of("/dev/md0", disks) is None


def test_only_a_training_server_is_judged_against_a_training_servers_need(
    client: Client, viewer_client: Client, site_a, token_a
) -> None:  # type: ignore[no-untyped-def]
    """An inference server reading its model cache at 5 GB/s is not under-provisioned; the same
    server mounting a datasets file system is a training server, and below need."""
    node = Node.objects.create(site=site_a, hostname=SLOW)
    Gpu.objects.create(node=node, index=0, uuid="GPU-i")
    t0, t1 = _minute(T0) + timedelta(seconds=5), _minute(T1) + timedelta(seconds=5)
    for which, ts in ((0, t0), (1, t1)):
        assert push(client, token_a, _body(SLOW_VALUES, which, ts), query=f"?hostname={SLOW}").status_code == 202
    body = viewer_client.get("/api/v1/storage/").json()
    [server] = body["servers"]
    assert server["peak_read_bytes_per_second"] == pytest.approx(5e9)
    assert server["training"] is False and server["below_need"] is False
    assert body["totals"]["training_servers"] == 0 and body["totals"]["servers_below_need"] == 0
    NodeMount.objects.create(node=node, mountpoint="/data", fstype="xfs", device="/dev/md0", purpose="datasets")
    [server] = viewer_client.get("/api/v1/storage/").json()["servers"]
    assert server["training"] is True and server["below_need"] is True
