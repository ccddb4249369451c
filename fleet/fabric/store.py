"""Writing port series: node_exporter's infiniband collector (per ``device`` and ``port``) and its
netdev/netclass collectors (per ``device``). An interface is registered on first sighting under its
node (fleet.inventory.models.NodeInterface); its rated speed follows what the exporter reports."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from console import live
from fleet.choices import InterfaceKind
from fleet.fabric import readmodel
from fleet.inventory.models import DEFAULT_FABRIC, NodeInterface
from fleet.telemetry import partitions
from fleet.telemetry.series import NodePoint, SeriesTable, site_nodes, store_series

PORT_COUNTERS = frozenset(
    {
        "link_downed",
        "link_error_recovery",
        "symbol_errors",
        "receive_errors",
        "transmit_errors",
        "transmit_discards",
        "transmit_wait",
        "receive_drops",
        "transmit_drops",
        "receive_bytes",
        "transmit_bytes",
        "carrier_changes",
    }
)
PORT_GAUGES = frozenset({"state", "physical_state", "rate"})
# The port writer also keeps the fabric page's read model (fleet.fabric.readmodel) in its statement.
PORTS = SeriesTable(
    partitions.PORT_SAMPLES,
    partitions.PORT_ROLLUP_1M,
    ("interface_id",),
    ("int8",),
    PORT_COUNTERS,
    wrap_rollup=readmodel.port_rollup_sql,
    also_partitions=(partitions.FABRIC_ROLLUP_1M,),
)
SOURCES = {"infiniband": InterfaceKind.IB, "netdev": InterfaceKind.ETHERNET}


def interface_name(point: NodePoint) -> str:
    """``mlx5_0/1`` for an InfiniBand port (device and port), the device for a network interface."""
    return f"{point.device}/{point.port}" if point.source == "infiniband" else point.device


def store_port_points(*, site_id: int, batch_key: str, points: Sequence[NodePoint]) -> int:
    """Store port values under a batch key; return the rows written (0: a redelivery)."""

    def rows() -> list[tuple]:
        ids = _resolve_interfaces(site_id, points)
        return [
            (ids[key], p.ts, p.quantity, p.value) for p in points if (key := (p.hostname, interface_name(p))) in ids
        ]

    stored = store_series(PORTS, site_id=site_id, batch_key=batch_key, stamps=[p.ts for p in points], rows=rows)
    if stored:  # the fabric page follows the ports while someone watches it
        transaction.on_commit(lambda: live.request_push(*live.watched(["fabric"])))
    return stored


def _resolve_interfaces(site_id: int, points: Sequence[NodePoint]) -> dict[tuple[str, str], int]:
    """(hostname, interface name) -> interface id, registering the new ones; a rate that changed
    is updated (a port renegotiated to another speed)."""
    nodes = site_nodes(site_id, (p.hostname for p in points))
    wanted: dict[tuple[str, str], str] = {}
    rates: dict[tuple[str, str], float] = {}
    for p in points:
        if p.hostname in nodes:
            key = (p.hostname, interface_name(p))
            wanted.setdefault(key, SOURCES[p.source])
            if p.quantity == "rate":
                rates[key] = p.value
    if not wanted:
        return {}
    node_ids = {nodes[h] for h, _ in wanted}
    hostnames = {node_id: h for h, node_id in nodes.items()}

    def existing() -> dict[tuple[str, str], NodeInterface]:
        found = NodeInterface.objects.filter(node_id__in=node_ids).only(
            "id", "node_id", "name", "rate_bytes_per_second"
        )
        return {(hostnames[i.node_id], i.name): i for i in found}

    known = existing()
    new = [
        NodeInterface(
            node_id=nodes[h],
            name=name,
            kind=kind,
            rate_bytes_per_second=rates.get((h, name)),
            fabric=DEFAULT_FABRIC[kind],
        )
        for (h, name), kind in sorted(wanted.items())
        if (h, name) not in known
    ]
    if new:
        NodeInterface.objects.bulk_create(new, ignore_conflicts=True)
        known = existing()
    for key, rate in rates.items():
        interface = known.get(key)
        if interface is not None and interface.rate_bytes_per_second != rate:
            NodeInterface.objects.filter(pk=interface.pk).update(rate_bytes_per_second=rate)
    return {key: known[key].pk for key in wanted if key in known}
