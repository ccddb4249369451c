"""node_exporter's mountstats (NFS) series through the Prometheus door: the fixture's NFS mount
mapped against an independent reading of its lines, counters rolled up as Prometheus increase()
with a reset in the middle, the storage API's throughput of a network mount from them, an export
no mount of its node has (not written, counted), and bad lines refused naming the line."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from console import counters
from fleet.models import IngestBatch, MountRollup1m, MountSample, NodeMount
from tests.fleet.fabric.node_exporter import FIXTURE, HOST, fixture_samples, push

pytestmark = pytest.mark.django_db

# What the console keeps of mountstats, written out here (not read from the console's table):
# metric -> (quantity, the operation it is kept for, or None for a per-export series).
KEPT = {
    "node_mountstats_nfs_total_read_bytes_total": ("nfs_read_bytes", None),
    "node_mountstats_nfs_total_write_bytes_total": ("nfs_write_bytes", None),
    "node_mountstats_nfs_operations_requests_total": ("nfs_read_ops", "READ"),
    "node_mountstats_nfs_operations_response_time_seconds_total": ("nfs_read_response_seconds", "READ"),
}
EXPORT = "vast01:/datasets"
MOUNT = f'device="{EXPORT}",device_error="",fstype="nfs4",mountpoint="/mnt/datasets"'
LABELS = f'export="{EXPORT}",mountaddr="10.0.4.21",protocol="tcp"'
TYPES = (
    "# TYPE node_filesystem_size_bytes gauge\n"
    "# TYPE node_mountstats_nfs_total_read_bytes_total counter\n"
    "# TYPE node_mountstats_nfs_operations_requests_total counter\n"
    "# TYPE node_mountstats_nfs_operations_response_time_seconds_total counter\n"
)


def _start(minutes: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _scrape(ts: datetime, read_bytes: float, reads: float, response: float, *, size: bool = True) -> str:
    """One scrape of the NFS mount: its size (the filesystem collector) and its mountstats."""
    ms = _ms(ts)
    lines = [f"node_filesystem_size_bytes{{{MOUNT}}} 1e15 {ms}"] if size else []
    lines += [
        f"node_mountstats_nfs_total_read_bytes_total{{{LABELS}}} {read_bytes} {ms}",
        f'node_mountstats_nfs_operations_requests_total{{{LABELS},operation="READ"}} {reads} {ms}',
        f'node_mountstats_nfs_operations_response_time_seconds_total{{{LABELS},operation="READ"}} {response} {ms}',
    ]
    return TYPES + "\n".join(lines) + "\n"


def test_the_fixture_maps_the_nfs_mounts_mountstats_to_its_mount(client, token_a) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    # Independently: the export names the mount whose filesystem ``device`` it is.
    mountpoint_of = {labels["device"]: labels["mountpoint"] for _, labels, _ in fixture_samples("node_filesystem_")}
    expected = {}
    for name, labels, value in fixture_samples("node_mountstats_"):
        if name in KEPT and KEPT[name][1] in (None, labels.get("operation")):
            expected[(mountpoint_of[labels["export"]], KEPT[name][0])] = value
    stored = {
        (s.mount.mountpoint, s.quantity): s.value
        for s in MountSample.objects.select_related("mount").filter(mount__node__hostname=HOST)
        if s.quantity.startswith("nfs_")
    }
    assert stored == expected and len(stored) == 4
    assert stored[("/mnt/datasets", "nfs_read_bytes")] == 1.3087694372864e13
    # 1 MiB READs answered in 4 ms on average since the mount.
    assert stored[("/mnt/datasets", "nfs_read_response_seconds")] / stored[("/mnt/datasets", "nfs_read_ops")] == (
        pytest.approx(0.004)
    )


def test_mountstats_roll_up_as_increase_with_a_reset_in_the_middle_and_give_the_mount_its_throughput(
    client, token_a, viewer_client
) -> None:
    start = _start(4)
    # The client remounted (its counters from zero) before the third scrape.
    read_bytes = [5_000, 9_000, 1_000, 4_000]
    reads = [100, 200, 50, 150]
    response = [1.0, 2.0, 0.5, 1.5]
    for offset, b, n, r in zip((10, 40, 70, 100), read_bytes, reads, response, strict=True):
        body = _scrape(start + timedelta(seconds=offset), b, n, r)
        assert push(client, token_a, body).status_code == 202
    rows = {
        (r.quantity, r.bucket): r.increase
        for r in MountRollup1m.objects.filter(mount__mountpoint="/mnt/datasets", quantity__startswith="nfs_")
    }
    after = start + timedelta(minutes=1)
    assert rows[("nfs_read_bytes", start)] == 4_000 and rows[("nfs_read_bytes", after)] == 1_000 + 3_000

    def increase(values: list[float]) -> float:  # Prometheus increase(): a fall counts from zero
        return sum(b - a if b >= a else b for a, b in itertools.pairwise(values))

    assert sum(v for (q, _), v in rows.items() if q == "nfs_read_bytes") == increase(read_bytes) == 8_000
    assert sum(v for (q, _), v in rows.items() if q == "nfs_read_ops") == increase(reads) == 250
    assert sum(v for (q, _), v in rows.items() if q == "nfs_read_response_seconds") == increase(response) == 2.5
    [mount] = [m for m in viewer_client.get("/api/v1/storage/").json()["mounts"] if m["mountpoint"] == "/mnt/datasets"]
    assert mount["disk"] is None and mount["io_busy_pct"] is None  # no block device on the node
    assert mount["read_bytes_per_second"] == pytest.approx(8_000 / 3600)  # the default hour
    assert mount["written_bytes_per_second"] == 0
    assert mount["read_seconds_per_op"] == pytest.approx(2.5 / 250)


def test_one_export_over_two_transports_is_summed_into_its_mount(client, token_a) -> None:
    ms = _ms(_start(1))
    series = f'node_mountstats_nfs_total_read_bytes_total{{export="{EXPORT}",mountaddr="10.0.4.21"'
    body = (
        TYPES
        + f"node_filesystem_size_bytes{{{MOUNT}}} 1e15 {ms}\n"
        + f'{series},protocol="tcp"}} 700 {ms}\n'
        + f'{series},protocol="rdma"}} 300 {ms}\n'
    )
    assert push(client, token_a, body).status_code == 202
    assert list(MountSample.objects.filter(quantity="nfs_read_bytes").values_list("value", flat=True)) == [1000]


def test_an_export_no_mount_of_its_node_has_is_not_written_and_is_counted(client, token_a) -> None:
    ts = _start(2)
    # mountstats name no mount point: they register no mount, and wait for the filesystem series.
    response = push(client, token_a, _scrape(ts, 1e9, 10, 0.05, size=False))
    assert response.status_code == 202 and response.json()["node_samples"] == 3
    assert not NodeMount.objects.exists() and not MountSample.objects.exists()
    assert counters.snapshot()['goodput_ingest_ignored_total{door="node_mountstats"}'] == 3
    # Once the filesystem collector reported the mount, its export's figures are kept.
    assert push(client, token_a, _scrape(ts + timedelta(minutes=1), 2e9, 20, 0.1)).status_code == 202
    mount = NodeMount.objects.get()
    assert (mount.mountpoint, mount.device, mount.fstype) == ("/mnt/datasets", EXPORT, "nfs4")
    assert MountSample.objects.filter(mount=mount, quantity__startswith="nfs_").count() == 3
    assert counters.snapshot()['goodput_ingest_ignored_total{door="node_mountstats"}'] == 3


def test_another_nfs_operation_is_ignored_and_counted(client, token_a) -> None:
    body = (
        "# TYPE node_mountstats_nfs_operations_requests_total counter\n"
        f'node_mountstats_nfs_operations_requests_total{{{LABELS},operation="WRITE"}} 9\n'
        f'node_mountstats_nfs_operations_requests_total{{{LABELS},operation="READ"}} 5\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 202
    assert (response.json()["node_samples"], response.json()["ignored"]) == (1, 1)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('node_mountstats_nfs_total_read_bytes_total{mountaddr="10.0.4.21",protocol="tcp"} 1', "export"),
        (f"node_mountstats_nfs_operations_requests_total{{{LABELS}}} 1", "operation"),
    ],
)
def test_a_mountstats_series_without_its_labels_is_refused_naming_the_line(client, token_a, line, field) -> None:
    name = line.split("{")[0]
    response = push(client, token_a, f"# HELP {name} x\n# TYPE {name} counter\n{line}\n")
    assert response.status_code == 400
    assert response.json()["error"].startswith("line 3:") and response.json()["field"] == field


def test_a_malformed_mountstats_line_is_refused_naming_it_and_nothing_is_written(client, token_a) -> None:
    lines = FIXTURE.splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("node_mountstats_nfs_total_read_bytes_total{"))
    lines[target] = lines[target].replace("} ", " ", 1)  # the label set left open
    response = push(client, token_a, "\n".join(lines) + "\n")
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"line {target + 1}:")
    assert not MountSample.objects.exists() and not NodeMount.objects.exists() and not IngestBatch.objects.exists()
