"""node_exporter's InfiniBand and network series through the Prometheus door: the fixture mapped
against an independent reading, counters rolled up as Prometheus increase() with a reset in the
middle, unknown series counted, bad lines refused naming the line."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from fleet import exporters
from fleet.ingest.prometheus import parse_exposition
from fleet.models import IngestBatch, NodeInterface, PortRollup1m, PortSample
from tests.fleet.fabric.node_exporter import FIXTURE, HOST, exposition, fixture_samples, push

NODE_SERIES = exporters.families(exporters.NODE)  # fabric's and storage's entries in the table


def _minute_ago(minutes: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_the_fixture_maps_every_port_value_to_its_interface_and_quantity(client, site_a, token_a) -> None:
    response = push(client, token_a, FIXTURE)
    assert response.status_code == 202, response.content
    expected = {}
    for name, labels, value in fixture_samples("node_infiniband_") + fixture_samples("node_network_"):
        if name not in NODE_SERIES or labels.get("device") == "lo":
            continue
        interface = f"{labels['device']}/{labels['port']}" if "port" in labels else labels["device"]
        expected[(interface, NODE_SERIES[name][1])] = value
    stored = {
        (s.interface.name, s.quantity): s.value
        for s in PortSample.objects.select_related("interface__node").filter(interface__node__hostname=HOST)
    }
    assert stored == expected
    assert len(stored) == 11 * 2 + 8  # 11 quantities on each IB port, 8 on eth0
    assert stored[("mlx5_1/1", "link_downed")] == 3 and stored[("mlx5_0/1", "transmit_wait")] == 4294967295
    assert stored[("eth0", "carrier_changes")] == 2


def test_ports_become_interfaces_of_the_node_with_kind_rate_and_default_fabric(client, site_a, token_a) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    interfaces = {i.name: i for i in NodeInterface.objects.filter(node__hostname=HOST, node__site=site_a)}
    assert set(interfaces) == {"mlx5_0/1", "mlx5_1/1", "eth0"}  # lo is no fabric
    assert interfaces["mlx5_0/1"].kind == "ib" and interfaces["mlx5_0/1"].fabric == "compute"
    assert interfaces["mlx5_0/1"].rate_bytes_per_second == 5e10
    assert interfaces["eth0"].kind == "ethernet" and interfaces["eth0"].fabric == "management"
    assert interfaces["eth0"].rate_bytes_per_second == 1.25e9


def test_the_unknown_series_are_counted_as_ignored(client, token_a) -> None:
    body = push(client, token_a, FIXTURE).json()
    # Mapped: a known name, not the loopback, and of mountstats' per-operation series only READ's.
    mapped = [
        (n, labels)
        for n, labels, _ in fixture_samples("node_")
        if n in NODE_SERIES and labels.get("device") != "lo" and labels.get("operation", "READ") == "READ"
    ]
    total = len(fixture_samples("node_"))
    assert body["node_samples"] == len(mapped) == 46 + 4  # 4: the NFS mount's mountstats
    assert body["ignored"] == total - len(mapped) == 12 + 8
    assert body["ignored_metrics"]["node_cpu_seconds_total"] == 2
    assert body["ignored_metrics"]["node_infiniband_info"] == 2
    assert body["ignored_metrics"]["node_load1"] == 1
    assert body["ignored_metrics"]["node_network_receive_bytes_total"] == 1  # lo
    assert body["ignored_metrics"]["node_mountstats_nfs_operations_requests_total"] == 2  # GETATTR, WRITE
    assert body["ignored_metrics"]["node_mountstats_nfs_read_bytes_total"] == 1  # read() calls, cache hits too


def test_counters_roll_up_as_increase_with_a_reset_in_the_middle(client, token_a) -> None:
    start = _minute_ago(4)
    # link_downed 100 -> 160 -> (reboot) 40 -> 90: the minute holds 60, the next 40 + 50.
    for offset, value in ((5, 100), (35, 160), (65, 40), (95, 90)):
        line = f'node_infiniband_link_downed_total{{device="mlx5_0",port="1"}} {value}'
        assert push(client, token_a, exposition([line], _ms(start + timedelta(seconds=offset)))).status_code == 202
    rows = {
        r.bucket: r
        for r in PortRollup1m.objects.filter(interface__name="mlx5_0/1", quantity="link_downed").order_by("bucket")
    }
    # Independently: increase() sums the rises between consecutive samples, a fall counting from 0.
    values = [100, 160, 40, 90]
    total = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
    assert total == 150
    assert rows[start].increase == 60 and rows[start].samples == 2
    assert rows[start + timedelta(minutes=1)].increase == 90
    assert sum(r.increase for r in rows.values()) == total
    assert rows[start + timedelta(minutes=1)].last == 90 and rows[start + timedelta(minutes=1)].min == 40


def test_a_late_sample_is_folded_in_by_recomputing_its_minute_and_the_next(client, token_a) -> None:
    start = _minute_ago(4)
    series = 'node_network_carrier_changes_total{device="eth0"}'
    for offset, value in ((5, 2), (95, 9)):  # the middle scrape arrives last
        assert (
            push(client, token_a, exposition([f"{series} {value}"], _ms(start + timedelta(seconds=offset)))).status_code
            == 202
        )
    assert push(client, token_a, exposition([f"{series} 4"], _ms(start + timedelta(seconds=50)))).status_code == 202
    rows = {r.bucket: r.increase for r in PortRollup1m.objects.filter(quantity="carrier_changes")}
    assert rows == {start: 2, start + timedelta(minutes=1): 5}


def test_gauges_keep_min_max_and_last_and_no_increase(client, token_a) -> None:
    start = _minute_ago(3)
    for offset, state in ((5, 4), (20, 1), (40, 4)):  # Active, Down, Active: a flap inside a minute
        line = f'node_infiniband_state_id{{device="mlx5_1",port="1"}} {state}'
        assert push(client, token_a, exposition([line], _ms(start + timedelta(seconds=offset)))).status_code == 202
    row = PortRollup1m.objects.get(quantity="state", bucket=start)
    assert (row.min, row.max, row.last, row.samples, row.increase) == (1, 4, 4, 3, None)


def test_a_bad_line_is_refused_naming_it_and_nothing_is_written(client, token_a) -> None:
    lines = FIXTURE.splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("node_infiniband_state_id{"))
    lines[target] = 'node_infiniband_state_id{device="mlx5_0",port="1" 4'
    response = push(client, token_a, "\n".join(lines) + "\n")
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"line {target + 1}:")
    assert not PortSample.objects.exists() and not NodeInterface.objects.exists()
    assert not IngestBatch.objects.exists()


def test_a_port_without_its_port_label_is_refused_naming_the_line(client, token_a) -> None:
    body = '# TYPE node_infiniband_link_downed_total counter\nnode_infiniband_link_downed_total{device="mlx5_0"} 1\n'
    response = push(client, token_a, body)
    assert response.status_code == 400
    assert response.json()["error"].startswith("line 2:") and response.json()["field"] == "port"


def test_node_series_need_a_node(client, token_a) -> None:
    response = push(client, token_a, FIXTURE, query="")
    assert response.status_code == 400 and response.json()["field"] == "hostname"
    labelled = 'node_network_carrier_changes_total{device="eth0",hostname="gpu-b-002"} 3\n'
    assert push(client, token_a, labelled, query="").status_code == 202
    assert NodeInterface.objects.get().node.hostname == "gpu-b-002"


def test_values_no_read_can_use_are_ignored_and_counted(client, token_a) -> None:
    body = (
        "# TYPE node_network_receive_errs_total counter\n"
        'node_network_receive_errs_total{device="eth0"} NaN\n'
        'node_network_receive_errs_total{device="eth1"} -3\n'
        'node_network_receive_errs_total{device="eth2"} 7\n'
    )
    response = push(client, token_a, body)
    assert response.status_code == 202
    assert (response.json()["node_samples"], response.json()["ignored"]) == (1, 2)
    assert list(PortSample.objects.values_list("interface__name", "value")) == [("eth2", 7)]


def test_kind_node_keeps_only_node_exporter_series(client, token_a) -> None:
    dcgm = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="gpu-a-017"} 60\n'
    response = push(client, token_a, dcgm + FIXTURE, query=f"?hostname={HOST}&kind=node")
    assert response.status_code == 202
    assert response.json()["gpu_samples"] == 0 and response.json()["ignored_metrics"]["DCGM_FI_DEV_GPU_TEMP"] == 1


def test_a_retried_push_stores_nothing_twice(client, token_a) -> None:
    for _ in range(2):
        assert push(client, token_a, FIXTURE, **{"Idempotency-Key": "node-0001"}).status_code == 202
    assert PortSample.objects.count() == 30


def test_parse_exposition_reads_the_port_labels_into_points() -> None:
    exposition_ = parse_exposition(FIXTURE, hostname=HOST)
    point = next(p for p in exposition_.node if p.quantity == "symbol_errors" and p.device == "mlx5_1")
    assert (point.source, point.port, point.value, point.hostname) == ("infiniband", "1", 41, HOST)


@pytest.mark.parametrize("name", sorted(NODE_SERIES))
def test_every_mapped_name_is_one_node_exporter_prints(name: str) -> None:
    assert f"# TYPE {name} " in FIXTURE and f"# HELP {name} " in FIXTURE


def test_a_minute_after_a_gap_counts_from_the_last_value_before_it_within_the_lookback(client, token_a) -> None:
    """A minute's first increase starts from the series' last value before it, read from that
    minute's rollup: three minutes back it counts; past the lookback (10 minutes) it starts at 0,
    as a series seen for the first time does."""
    start = _minute_ago(20)
    series = 'node_infiniband_symbol_error_total{device="mlx5_0",port="1"}'
    # 10 at +0:05, 16 at +3:05 (a slow scrape), then a pause of 12 minutes, 30 at +15:05.
    for offset, value in ((5, 10), (185, 16), (905, 30)):
        response = push(client, token_a, exposition([f"{series} {value}"], _ms(start + timedelta(seconds=offset))))
        assert response.status_code == 202
    rows = {r.bucket: r.increase for r in PortRollup1m.objects.filter(quantity="symbol_errors")}
    assert rows == {start: 0, start + timedelta(minutes=3): 6, start + timedelta(minutes=15): 0}
    # The value before a late sample's minute is read again: 12 at +2:05 splits the 6.
    line = f"{series} 12"
    assert push(client, token_a, exposition([line], _ms(start + timedelta(seconds=125)))).status_code == 202
    rows = {r.bucket: r.increase for r in PortRollup1m.objects.filter(quantity="symbol_errors")}
    assert rows[start + timedelta(minutes=2)] == 2 and rows[start + timedelta(minutes=3)] == 4
