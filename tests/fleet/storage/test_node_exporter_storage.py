"""node_exporter's file system and disk series through the Prometheus door: the fixture mapped
against an independent reading, disk counters rolled up as Prometheus increase() with a reset in
the middle, free space kept as a gauge."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from fleet.models import DiskRollup1m, DiskSample, MountRollup1m, MountSample, NodeMount
from fleet.storage.mappings import STORAGE_SERIES
from tests.fleet.fabric.node_exporter import FIXTURE, HOST, exposition, fixture_samples, push


def _start(minutes: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_the_fixture_maps_every_file_system_value_to_its_mount(client, token_a) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    expected = {
        (labels["mountpoint"], STORAGE_SERIES[name][1]): value
        for name, labels, value in fixture_samples("node_filesystem_")
    }
    stored = {
        (s.mount.mountpoint, s.quantity): s.value
        for s in MountSample.objects.select_related("mount").filter(quantity__in=("avail_bytes", "size_bytes"))
    }
    assert stored == expected and len(stored) == 6
    assert stored[("/mnt/checkpoints", "avail_bytes")] == 8.796093022208e12


def test_the_fixture_maps_every_disk_counter_to_its_device(client, token_a) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    expected = {
        (labels["device"], STORAGE_SERIES[name][1]): value for name, labels, value in fixture_samples("node_disk_")
    }
    stored = {(s.device, s.quantity): s.value for s in DiskSample.objects.filter(node__hostname=HOST)}
    assert stored == expected and len(stored) == 10
    assert stored[("nvme0n1", "io_time_seconds")] == 11325.968


def test_disk_counters_roll_up_as_increase_with_a_reset_in_the_middle(client, token_a) -> None:
    start = _start(4)
    values = [5_000, 9_000, 1_000, 4_000]  # read bytes; the node rebooted before the third scrape
    for offset, value in zip((10, 40, 70, 100), values, strict=True):
        line = f'node_disk_read_bytes_total{{device="nvme0n1"}} {value}'
        assert push(client, token_a, exposition([line], _ms(start + timedelta(seconds=offset)))).status_code == 202
    rows = {r.bucket: r.increase for r in DiskRollup1m.objects.filter(device="nvme0n1", quantity="read_bytes")}
    expected_total = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
    assert rows == {start: 4_000, start + timedelta(minutes=1): 1_000 + 3_000}
    assert sum(rows.values()) == expected_total == 8_000


def test_free_space_is_a_gauge_min_and_last_per_minute(client, token_a) -> None:
    start = _start(3)
    series = 'node_filesystem_avail_bytes{device="10.0.5.10@o2ib:/ckpt",fstype="lustre",mountpoint="/mnt/checkpoints"}'
    for offset, value in ((5, 900), (25, 300), (45, 500)):
        assert (
            push(client, token_a, exposition([f"{series} {value}"], _ms(start + timedelta(seconds=offset)))).status_code
            == 202
        )
    row = MountRollup1m.objects.get(bucket=start, quantity="avail_bytes")
    assert (row.min, row.max, row.last, row.increase) == (300, 900, 500, None)
    assert NodeMount.objects.get().fstype == "lustre"


def test_a_file_system_series_without_its_mountpoint_is_refused_naming_the_line(client, token_a) -> None:
    body = (
        '# TYPE node_filesystem_size_bytes gauge\n\nnode_filesystem_size_bytes{device="/dev/sda1",fstype="ext4"} 1e9\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 400
    assert response.json()["error"].startswith("line 3:") and response.json()["field"] == "mountpoint"
    assert not NodeMount.objects.exists()


def test_disks_of_another_sites_node_are_not_written(client, site_a, token_a, token_b) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    before = DiskSample.objects.count()
    later = exposition(['node_disk_read_bytes_total{device="nvme0n1"} 6e11'], _ms(datetime.now(UTC)))
    refused = push(client, token_b, later)  # gpu-a-017 is site A's: all of the push is held back
    assert refused.status_code == 409 and refused.json()["held_back"][0]["value"] == "gpu-a-017"
    assert DiskSample.objects.count() == before
