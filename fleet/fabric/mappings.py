"""node_exporter's port series (collector/infiniband_linux.go, netclass_linux.go and
netdev_common.go): fabric's entry in the exporter mapping table (fleet.exporters), registered from
fleet/fabric/plugins.py. Each is a node series of a host's port (fleet.telemetry.series.NodeSeries:
collector, quantity stored, is a counter), kept by fabric's part of the node-series writer."""

from __future__ import annotations

from fleet.exporters import NODE, ExporterMapping
from fleet.fabric.store import port_part
from fleet.telemetry.series import NodeSeries

PORT_SERIES: dict[str, NodeSeries] = {
    "node_infiniband_link_downed_total": NodeSeries("infiniband", "link_downed", True),
    "node_infiniband_link_error_recovery_total": NodeSeries("infiniband", "link_error_recovery", True),
    "node_infiniband_symbol_error_total": NodeSeries("infiniband", "symbol_errors", True),
    "node_infiniband_port_errors_received_total": NodeSeries("infiniband", "receive_errors", True),
    "node_infiniband_port_discards_transmitted_total": NodeSeries("infiniband", "transmit_discards", True),
    "node_infiniband_port_transmit_wait_total": NodeSeries("infiniband", "transmit_wait", True),
    "node_infiniband_port_data_received_bytes_total": NodeSeries("infiniband", "receive_bytes", True),
    "node_infiniband_port_data_transmitted_bytes_total": NodeSeries("infiniband", "transmit_bytes", True),
    "node_infiniband_state_id": NodeSeries("infiniband", "state", False),
    "node_infiniband_physical_state_id": NodeSeries("infiniband", "physical_state", False),
    "node_infiniband_rate_bytes_per_second": NodeSeries("infiniband", "rate", False),
    "node_network_carrier_changes_total": NodeSeries("netdev", "carrier_changes", True),
    "node_network_receive_errs_total": NodeSeries("netdev", "receive_errors", True),
    "node_network_transmit_errs_total": NodeSeries("netdev", "transmit_errors", True),
    "node_network_receive_drop_total": NodeSeries("netdev", "receive_drops", True),
    "node_network_transmit_drop_total": NodeSeries("netdev", "transmit_drops", True),
    "node_network_receive_bytes_total": NodeSeries("netdev", "receive_bytes", True),
    "node_network_transmit_bytes_total": NodeSeries("netdev", "transmit_bytes", True),
    "node_network_speed_bytes": NodeSeries("netdev", "rate", False),
}

MAPPINGS = (ExporterMapping("node_exporter (ports)", NODE, port_part, families=PORT_SERIES, kinds=("auto", "node")),)
