"""Writing port series: node_exporter's infiniband collector (per ``device`` and ``port``) and its
netdev/netclass collectors (per ``device``). An interface is registered on first sighting under its
node (fleet.inventory.models.NodeInterface); its rated speed follows what the exporter reports."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.choices import InterfaceKind
from fleet.fabric.read import summaries
from fleet.inventory import directory
from fleet.inventory.models import DEFAULT_FABRIC, NodeInterface
from fleet.telemetry import partitions
from fleet.telemetry.series import NodePoint, Part, SeriesTable, queued, site_nodes, store_parts

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
# The port rollups also keep the fabric page's read model (fleet.fabric.read.summaries) in their
# statement; queued minutes, folded by update_node_rollups, which then updates the fabric page.
PORTS = queued(
    SeriesTable(
        partitions.PORT_SAMPLES,
        partitions.PORT_ROLLUP_1M,
        ("interface_id",),
        ("int8",),
        PORT_COUNTERS,
        wrap_rollup=summaries.port_rollup_sql,
        also_partitions=(partitions.FABRIC_ROLLUP_1M,),
        queue="port",
        topic="fabric",
    )
)
SOURCES = {"infiniband": InterfaceKind.IB, "netdev": InterfaceKind.ETHERNET}


def interface_name(point: NodePoint) -> str:
    """``mlx5_0/1`` for an InfiniBand port (device and port), the device for a network interface."""
    return f"{point.device}/{point.port}" if point.source == "infiniband" else point.device


def store_port_points(*, site_id: int, batch_key: str, points: Sequence[NodePoint]) -> int:
    """Store port values under a batch key; return the rows written (0: a redelivery)."""
    return store_parts(site_id=site_id, parts=[port_part(site_id=site_id, batch_key=batch_key, points=points)])


def port_part(*, site_id: int, batch_key: str, points: Sequence[NodePoint]) -> Part:
    """The ports' share of a push, for series.store_parts."""

    def rows() -> list[tuple]:
        ids = _resolve_interfaces(site_id, points)
        return [
            (ids[key], p.ts, p.quantity, p.value) for p in points if (key := (p.hostname, interface_name(p))) in ids
        ]

    return Part(PORTS, batch_key, [p.ts for p in points], rows, hostnames=frozenset(p.hostname for p in points))


def _resolve_interfaces(site_id: int, points: Sequence[NodePoint]) -> dict[tuple[str, str], int]:
    """(hostname, interface name) -> interface id, registering the new ones; a rate that changed
    is updated (a port renegotiated to another speed). A node whose ports are all known at the
    rates they report is answered from the directory's cache, without a query."""
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
    hostnames = {node_id: h for h, node_id in nodes.items()}
    by_node: dict[int, list[str]] = {}
    for h, name in wanted:
        by_node.setdefault(nodes[h], []).append(name)
    cached, misses = directory.node_parts("interface", by_node)
    known: dict[tuple[str, str], tuple[int, float | None]] = {}
    for node_id, ports in cached.items():
        h = hostnames[node_id]
        if all(name in ports and rates.get((h, name), ports[name][1]) == ports[name][1] for name in by_node[node_id]):
            known.update({(h, name): ports[name] for name in by_node[node_id]})
        else:  # a new port or a new rate: read the node afresh
            misses.add(node_id)
    if misses:
        known.update(_interfaces_of(misses, hostnames, wanted, rates))
    return {key: known[key][0] for key in wanted if key in known}


def _interfaces_of(
    node_ids: set[int],
    hostnames: dict[int, str],
    wanted: dict[tuple[str, str], str],
    rates: dict[tuple[str, str], float],
) -> dict[tuple[str, str], tuple[int, float | None]]:
    """Read these nodes' ports, register the wanted ones missing, update changed rates."""

    def existing() -> dict[int, dict[str, tuple[int, float | None]]]:
        found = NodeInterface.objects.filter(node_id__in=node_ids).values_list(
            "id", "node_id", "name", "rate_bytes_per_second"
        )
        by_node: dict[int, dict[str, tuple[int, float | None]]] = {n: {} for n in node_ids}
        for pk, node_id, name, rate in found:
            by_node[node_id][name] = (pk, rate)
        return by_node

    by_node = existing()
    nodes = {h: n for n, h in hostnames.items()}
    new = [
        NodeInterface(
            node_id=nodes[h],
            name=name,
            kind=kind,
            rate_bytes_per_second=rates.get((h, name)),
            fabric=DEFAULT_FABRIC[kind],
        )
        for (h, name), kind in sorted(wanted.items())
        if nodes[h] in node_ids and name not in by_node[nodes[h]]
    ]
    changed = [
        (by_node[nodes[h]][name][0], rate)
        for (h, name), rate in rates.items()
        if nodes[h] in node_ids and name in by_node[nodes[h]] and by_node[nodes[h]][name][1] != rate
    ]
    if new:
        NodeInterface.objects.bulk_create(new, ignore_conflicts=True)
        by_node = existing()
    for pk, rate in changed:
        NodeInterface.objects.filter(pk=pk).update(rate_bytes_per_second=rate)
    current = {
        n: {name: (pk, rates.get((hostnames[n], name), rate)) for name, (pk, rate) in ports.items()}
        for n, ports in by_node.items()
    }
    directory.remember_node_parts("interface", current)  # once this transaction commits
    return {(hostnames[n], name): pk_rate for n, ports in current.items() for name, pk_rate in ports.items()}
