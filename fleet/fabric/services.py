"""The fabric page's read model, its API, its live pushes and its overview tile: port health per
site and rack over a window, read from the ports' 1-minute rollups (fleet_portrollup_1m), never
from raw samples.

* Up: a port whose latest state in the window is up (InfiniBand ``state`` 4, active; a network
  interface has no state series, so one that reported in the window counts as up).
* Flapping: ``link_downed`` or ``carrier_changes`` increased in the window.
* Degraded: symbol errors or link error recoveries rising faster per hour over the window than
  the link-degrading detector's limits (the detector's own test), or the port's latest rate is below its
  rated speed: the highest rate it or a port of the same kind on its node reported in the window
  (a port that renegotiated down shows against its peers).
* Error rate: the port's error increase (symbol, receive and transmit errors, transmit
  discards, link downs, carrier changes) per hour of the window.
* Throughput per fabric: received plus transmitted bytes per second, per minute bucket.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from console.ranges import Window, window_from_query
from fleet.choices import Fabric, InterfaceKind
from fleet.fabric.detectors import errors_over_limits
from fleet.inventory.models import NodeInterface

PRESETS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24)}
DEFAULT_RANGE = "1h"
IB_ACTIVE = 4
FLAP_QUANTITIES = ("link_downed", "carrier_changes")
ERROR_QUANTITIES = (
    "symbol_errors",
    "receive_errors",
    "transmit_errors",
    "transmit_discards",
    "link_downed",
    "carrier_changes",
)
DEGRADING = ("symbol_errors", "link_error_recovery")
WORST_PORTS = 10
NO_RACK = "(no rack)"


def window(params: Any, *, now: datetime | None = None) -> Window:
    """The window a request asks for (console.ranges; a RangeError names the parameter)."""
    return window_from_query(params, presets=PRESETS, default=DEFAULT_RANGE, now=now)


def default_window() -> Window:
    return window({})


def _interfaces(node_ids: list[int] | None = None) -> list[dict[str, Any]]:
    rows = NodeInterface.objects.values(
        "id",
        "name",
        "kind",
        "fabric",
        "rate_bytes_per_second",
        "node_id",
        "node__hostname",
        "node__site_id",
        "node__site__name",
        "node__rack_id",
        "node__rack__name",
    ).order_by("node__hostname", "name")
    if node_ids is not None:
        rows = rows.filter(node_id__in=node_ids)
    return list(rows)


# The quantities the page reads (ERROR_QUANTITIES, the bytes; ``state`` and ``rate``): the
# figures query names them, so the rollup's primary key (interface_id, quantity, bucket) seeks
# each port's quantity straight to the window instead of walking every quantity of the day.
PAGE_COUNTERS = tuple(dict.fromkeys((*ERROR_QUANTITIES, "receive_bytes", "transmit_bytes")))
PAGE_GAUGES = ("state", "rate")


def _port_figures(start: datetime, end: datetime, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per interface: each counter's increase over the window, and each gauge's latest value and
    its highest (for the rate). Counters are summed in a hash aggregate; only the two gauges are
    ordered by minute (for their latest value)."""
    if not ids:
        return {}
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT interface_id, quantity, sum(increase), NULL::float8, NULL::float8, max(bucket)
            FROM fleet_portrollup_1m
            WHERE interface_id = ANY(%s) AND quantity = ANY(%s) AND bucket >= %s AND bucket < %s
            GROUP BY interface_id, quantity
            """,
            [ids, list(PAGE_COUNTERS), start, end],
        )
        rows = cursor.fetchall()
        cursor.execute(
            """
            SELECT interface_id, quantity, NULL::float8, max(max),
                   (array_agg(last ORDER BY bucket DESC))[1], max(bucket)
            FROM fleet_portrollup_1m
            WHERE interface_id = ANY(%s) AND quantity = ANY(%s) AND bucket >= %s AND bucket < %s
            GROUP BY interface_id, quantity
            """,
            [ids, list(PAGE_GAUGES), start, end],
        )
        rows += cursor.fetchall()
    for interface_id, quantity, increase, highest, last, latest in rows:
        out[interface_id][quantity] = {"increase": increase or 0.0, "max": highest, "last": last}
        out[interface_id]["_seen"] = max(latest, out[interface_id].get("_seen", latest))
    return out


def _port(row: dict[str, Any], figures: dict[str, Any], peers_rate: float | None, span: timedelta) -> dict[str, Any]:
    def inc(q: str) -> float:
        return figures.get(q, {}).get("increase", 0.0)

    rate = figures.get("rate", {}).get("last", row["rate_bytes_per_second"])
    rated = max(filter(None, [figures.get("rate", {}).get("max"), peers_rate, rate]), default=None)
    state = figures.get("state", {}).get("last")
    reported = "_seen" in figures
    up = reported and (state == IB_ACTIVE if row["kind"] != InterfaceKind.ETHERNET or state is not None else True)
    flaps = sum(inc(q) for q in FLAP_QUANTITIES)
    errors = sum(inc(q) for q in ERROR_QUANTITIES)
    below_rate = rate is not None and rated is not None and rate < rated
    return {
        "id": row["id"],
        "hostname": row["node__hostname"],
        "name": row["name"],
        "kind": row["kind"],
        "fabric": row["fabric"],
        "site": row["node__site__name"],
        "rack": row["node__rack__name"] or NO_RACK,
        "reported": reported,
        "up": bool(up),
        "state": state,
        "flaps": flaps,
        "flapping": flaps > 0,
        "symbol_errors": inc("symbol_errors"),
        "errors": errors,
        "errors_per_hour": round(errors / hours, 3) if (hours := span.total_seconds() / 3600) else None,
        "rate_bytes_per_second": rate,
        "rated_bytes_per_second": rated,
        "below_rate": below_rate,
        # The link-degrading detector's test (errors per hour over their limits) over this window.
        "degraded": bool(errors_over_limits({q: inc(q) for q in DEGRADING}, span)) or below_rate,
        "receive_bytes": inc("receive_bytes"),
        "transmit_bytes": inc("transmit_bytes"),
        "last_seen": figures.get("_seen").isoformat() if reported else None,
    }


def ports(win: Window, *, node_id: int | None = None, node_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Every port (of one node, of these nodes, or all) with its health over the window."""
    rows = _interfaces([node_id] if node_id is not None else node_ids)
    figures = _port_figures(win.start, win.end, [r["id"] for r in rows])
    peers: dict[tuple[int, str], float] = {}
    for r in rows:
        highest = figures.get(r["id"], {}).get("rate", {}).get("max")
        if highest is not None:
            key = (r["node_id"], r["kind"])
            peers[key] = max(peers.get(key, 0.0), highest)
    return [_port(r, figures.get(r["id"], {}), peers.get((r["node_id"], r["kind"])), win.span) for r in rows]


def _count(items: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "ports": len(items),
        "up": sum(p["up"] for p in items),
        "flapping": sum(p["flapping"] for p in items),
        "degraded": sum(p["degraded"] for p in items),
    }


def _flaps(win: Window) -> list[dict[str, Any]]:
    """Every minute a port's link went down or its carrier changed, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT r.bucket, n.hostname, i.name, sum(r.increase)
            FROM fleet_portrollup_1m r
            JOIN fleet_nodeinterface i ON i.id = r.interface_id
            JOIN fleet_node n ON n.id = i.node_id
            WHERE r.quantity = ANY(%s) AND r.bucket >= %s AND r.bucket < %s AND r.increase > 0
            GROUP BY r.bucket, n.hostname, i.name
            ORDER BY r.bucket, n.hostname, i.name
            """,
            [list(FLAP_QUANTITIES), win.start, win.end],
        )
        return [
            {"ts": ts.isoformat(), "hostname": host, "interface": name, "flaps": count}
            for ts, host, name, count in cursor.fetchall()
        ]


def _throughput(win: Window) -> dict[str, Any]:
    """Bytes per second (received plus transmitted) per fabric, a point a minute."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT r.bucket, i.fabric, sum(r.increase) / 60.0
            FROM fleet_portrollup_1m r
            JOIN fleet_nodeinterface i ON i.id = r.interface_id
            WHERE r.quantity IN ('receive_bytes', 'transmit_bytes') AND r.bucket >= %s AND r.bucket < %s
            GROUP BY r.bucket, i.fabric
            ORDER BY r.bucket
            """,
            [win.start, win.end],
        )
        rows = cursor.fetchall()
    stamps = sorted({ts for ts, _, _ in rows})
    index = {ts: n for n, ts in enumerate(stamps)}
    series: dict[str, list[float | None]] = {f.value: [None] * len(stamps) for f in Fabric}
    for ts, fabric, bps in rows:
        if fabric in series:
            series[fabric][index[ts]] = bps
    return {"ts": [ts.isoformat() for ts in stamps], "bytes_per_second": series}


def snapshot(win: Window | None = None) -> dict[str, Any]:
    """Port health per site and rack, the worst ports, the flap timeline and throughput per fabric."""
    win = win or default_window()
    every = ports(win)
    sites: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for p in every:
        sites[p["site"]][p["rack"]].append(p)
    worst = sorted((p for p in every if p["errors"] or p["degraded"]), key=lambda p: (-p["errors"], p["hostname"]))
    return {
        "ts": timezone.now().isoformat(),
        "window": win.as_json(),
        "totals": _count(every),
        "sites": [
            {
                "name": site,
                **_count([p for rack in racks.values() for p in rack]),
                "racks": [{"name": rack, **_count(items)} for rack, items in sorted(racks.items())],
            }
            for site, racks in sorted(sites.items())
        ],
        "worst_ports": worst[:WORST_PORTS],
        "flaps": _flaps(win),
        "throughput": _throughput(win),
    }


def storage_reads(start: datetime, end: datetime) -> dict[int, dict[datetime, float]]:
    """Bytes the storage-fabric ports received per node and minute (for the storage page's
    per-server read throughput, wired by fleet.apps)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.node_id, r.bucket, sum(r.increase)
            FROM fleet_portrollup_1m r
            JOIN fleet_nodeinterface i ON i.id = r.interface_id
            WHERE i.fabric = %s AND r.quantity = 'receive_bytes' AND r.bucket >= %s AND r.bucket < %s
            GROUP BY i.node_id, r.bucket
            """,
            [Fabric.STORAGE, start, end],
        )
        out: dict[int, dict[datetime, float]] = defaultdict(dict)
        for node_id, bucket, received in cursor.fetchall():
            out[node_id][bucket] = received or 0.0
        return out


def build_fabric_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``fabric`` topic's push: the default window's counts per site and rack when they
    changed, and the newest throughput points (the page appends them or re-reads its window)."""
    snap = snapshot()
    figures = {"totals": snap["totals"], "sites": snap["sites"], "flaps": len(snap["flaps"])}
    tail = {"ts": snap["throughput"]["ts"][-2:]}
    tail["bytes_per_second"] = {k: v[-2:] for k, v in snap["throughput"]["bytes_per_second"].items()}
    previous = watermark or {}
    if previous.get("figures") == figures and previous.get("tail") == tail:
        return None, previous
    payload = {
        "type": "fabric.delta",
        "topic": topic,
        "ts": snap["ts"],
        **figures,
        "worst_ports": snap["worst_ports"],
        "flap_events": snap["flaps"][-20:],
        "throughput": tail,
    }
    return payload, {"figures": figures, "tail": tail}


def overview_tile(request: Any) -> dict[str, Any]:
    snap = snapshot()
    return {"has_ports": bool(snap["totals"]["ports"]), **snap["totals"], "worst": snap["worst_ports"][:3]}


def register() -> None:
    """Register the ``fabric`` live topic and the overview tile (called from FleetConfig.ready)."""
    from console import live, overview
    from fleet.telemetry.views import register_node_section

    register_node_section("fabric/_node.html", node_section)
    live.register_topic_builder("fabric", build_fabric_delta)
    live.register_topic_watcher("fabric", live.watch_topic)
    overview.register_section(
        overview.Section(name="fabric", template="fabric/_overview.html", context=overview_tile, order=35)
    )


def node_section(node: Any) -> dict[str, Any]:
    """The node page's ports: each with its latest state and rate, and its figures over the last hour."""
    win = default_window()
    return {"ports": ports(win, node_id=node.pk), "window": win}
