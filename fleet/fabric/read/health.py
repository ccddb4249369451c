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

The page (``snapshot``) reads figures kept ahead of it (fleet.fabric.read.summaries), never every
port's minutes: errors and flaps from the partial index of the minutes whose error counters rose,
throughput from the per-site, per-fabric minutes, and, for a window ending now (a preset), each
port's latest state and rate from its status row. A custom window (``from``/``to``) reads the
gauges from the rollups instead (correct for any window, slower: every port's state and rate
minutes in it). ``ports`` (a node's ports, the correlation's) reads the rollups: a few ports' rows,
by their primary key. ``snapshot(win, read_model=False)`` is the whole answer from the rollups,
the definition the read model is tested against.

Where they can differ: a port's rated speed from its status is the highest rate it reported
lately if that was seen in the window, else its latest rate (the rollups: the highest in the
window).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from console.ranges import Window, window_from_query
from fleet.choices import Fabric, InterfaceKind
from fleet.fabric.detectors import degrading_limits, errors_over_limits
from fleet.fabric.read import summaries

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


_INTERFACE_FIELDS = (
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
)


def _interfaces(node_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """The ports with their node, site and rack (one query; plain SQL: the whole fleet's 8,000
    ports through the ORM's row building cost more than the page's other reads together)."""
    condition = "WHERE i.node_id = ANY(%s)" if node_ids is not None else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT i.id, i.name, i.kind, i.fabric, i.rate_bytes_per_second, i.node_id, n.hostname,
                   n.site_id, s.name, n.rack_id, r.name
            FROM fleet_nodeinterface i
            JOIN fleet_node n ON n.id = i.node_id
            JOIN fleet_site s ON s.id = n.site_id
            LEFT JOIN fleet_rack r ON r.id = n.rack_id
            {condition}
            ORDER BY n.hostname, i.name
            """,
            [node_ids] if node_ids is not None else [],
        )
        return [dict(zip(_INTERFACE_FIELDS, row, strict=True)) for row in cursor.fetchall()]


# The quantities the page reads (ERROR_QUANTITIES, the bytes; ``state`` and ``rate``): the
# figures query names them, so the rollup's primary key (interface_id, quantity, bucket) seeks
# each port's quantity straight to the window instead of walking every quantity of the day.
PAGE_COUNTERS = tuple(dict.fromkeys((*ERROR_QUANTITIES, *DEGRADING, "receive_bytes", "transmit_bytes")))
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


_NOTHING: dict[str, Any] = {}


class _Health(NamedTuple):
    """One port's figures over a window: what the page counts and what it shows of a port."""

    increases: dict[str, float]
    rate: float | None
    rated: float | None
    state: float | None
    reported: bool
    up: bool
    flaps: float
    errors: float
    below_rate: bool
    degraded: bool


def _health(row: dict[str, Any], figures: dict[str, Any], peers_rate: float | None, span: timedelta) -> _Health:
    # Most ports have no counter that rose (the read model gives none): their sums are zeros.
    increases = {q: f["increase"] for q, f in figures.items() if q[0] != "_" and "increase" in f}
    gauge_rate = figures.get("rate")
    rate = gauge_rate["last"] if gauge_rate else row["rate_bytes_per_second"]
    rated = max(filter(None, [gauge_rate and gauge_rate["max"], peers_rate, rate]), default=None)
    state = figures["state"]["last"] if "state" in figures else None
    reported = "_seen" in figures
    up = reported and (state == IB_ACTIVE if row["kind"] != InterfaceKind.ETHERNET or state is not None else True)
    below_rate = rate is not None and rated is not None and rate < rated
    if not increases:
        return _Health(increases, rate, rated, state, reported, bool(up), 0.0, 0.0, below_rate, below_rate)
    flaps = sum(increases.get(q, 0.0) for q in FLAP_QUANTITIES)
    errors = sum(increases.get(q, 0.0) for q in ERROR_QUANTITIES)
    # The link-degrading detector's test (errors per hour over their limits) over this window.
    over = bool(errors_over_limits({q: increases.get(q, 0.0) for q in DEGRADING}, span))
    return _Health(increases, rate, rated, state, reported, bool(up), flaps, errors, below_rate, over or below_rate)


def _port(row: dict[str, Any], figures: dict[str, Any], peers_rate: float | None, span: timedelta) -> dict[str, Any]:
    h = _health(row, figures, peers_rate, span)

    def inc(q: str) -> float:
        return h.increases.get(q, 0.0)

    rate, rated, state, reported, errors, flaps = h.rate, h.rated, h.state, h.reported, h.errors, h.flaps
    return {
        "id": row["id"],
        "hostname": row["node__hostname"],
        "name": row["name"],
        "kind": row["kind"],
        "fabric": row["fabric"],
        "site": row["node__site__name"],
        "rack": row["node__rack__name"] or NO_RACK,
        "reported": reported,
        "up": h.up,
        "state": state,
        "flaps": flaps,
        "flapping": flaps > 0,
        "symbol_errors": inc("symbol_errors"),
        "errors": errors,
        "errors_per_hour": round(errors / hours, 3) if (hours := span.total_seconds() / 3600) else None,
        "rate_bytes_per_second": rate,
        "rated_bytes_per_second": rated,
        "below_rate": h.below_rate,
        "degraded": h.degraded,
        "receive_bytes": inc("receive_bytes"),
        "transmit_bytes": inc("transmit_bytes"),
        "last_seen": figures.get("_seen").isoformat() if reported else None,
    }


@contextmanager
def _serial() -> Iterator[Any]:
    """A cursor for a sparse read: the planner cannot tell from the column statistics how few
    rows the partial index holds, costs the read in millions of rows, and would start parallel
    workers and compile it (JIT), each costing more than the read itself."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true)"
        )
        yield cursor


def _sparse_counters(start: datetime, end: datetime) -> list[tuple[int, str, float]]:
    """(interface, quantity, increase) of every port whose error or flap counters rose in the
    window: the rollup's partial index of such minutes (migration 0015), whose predicate the
    query repeats word for word so the planner can use it. Never narrowed to some ports in SQL:
    the planner would seek every port's primary key instead."""
    quantities = ", ".join(f"'{q}'" for q in summaries.SPARSE)
    with _serial() as cursor:
        cursor.execute(
            f"""
            SELECT interface_id, quantity, sum(increase)
            FROM fleet_portrollup_1m
            WHERE increase > 0 AND quantity IN ({quantities}) AND bucket >= %s AND bucket < %s
            GROUP BY interface_id, quantity
            """,
            [start, end],
        )
        return cursor.fetchall()


def _status_figures(start: datetime, end: datetime, ids: list[int]) -> dict[int, dict[str, Any]]:
    """``_port_figures``'s answer for a window ending now, from the read model: each port's latest
    state and rate from its status row (when they fall in the window), its errors and flaps from
    the sparse index. Bytes are left out (``_port_bytes`` reads them for the ports shown)."""
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    moments: dict[float, datetime] = {}  # most ports were last seen in the same few minutes
    with connection.cursor() as cursor:
        # The comparisons are made here, and the last minute comes as seconds: parsing 8,000
        # timestamps into datetimes would cost more than the query.
        cursor.execute(
            """
            SELECT interface_id, extract(epoch FROM seen_at)::float8,
                   CASE WHEN state_at >= %(start)s THEN state END,
                   CASE WHEN rate_at >= %(start)s THEN rate END,
                   CASE WHEN rate_at >= %(start)s THEN
                        greatest(rate, CASE WHEN rate_max_at >= %(start)s THEN rate_max END) END
            FROM fleet_portstatus WHERE interface_id = ANY(%(ids)s) AND seen_at >= %(start)s AND seen_at < %(end)s
            """,
            {"start": start, "end": end, "ids": ids},
        )
        for interface_id, seen, state, rate, highest in cursor.fetchall():
            if seen not in moments:
                moments[seen] = datetime.fromtimestamp(seen, UTC)
            figures = out[interface_id]
            figures["_seen"] = moments[seen]
            if state is not None:
                figures["state"] = {"last": state}
            if rate is not None:
                figures["rate"] = {"last": rate, "max": highest}
    for interface_id, quantity, increase in _sparse_counters(start, end):  # the fleet's: few
        if interface_id in out:
            out[interface_id][quantity] = {"increase": increase or 0.0}
    return out


def _port_bytes(start: datetime, end: datetime, ports: list[dict[str, Any]]) -> None:
    """Fill in the received and transmitted bytes of these ports (a few: by the primary key)."""
    if not ports:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT interface_id, quantity, sum(increase) FROM fleet_portrollup_1m
            WHERE interface_id = ANY(%s) AND quantity = ANY(%s) AND bucket >= %s AND bucket < %s
            GROUP BY interface_id, quantity
            """,
            [[p["id"] for p in ports], list(summaries.BYTES), start, end],
        )
        found = {(i, q): v or 0.0 for i, q, v in cursor.fetchall()}
    for p in ports:
        for q in summaries.BYTES:
            p[q] = found.get((p["id"], q), 0.0)


def _peers(rows: list[dict[str, Any]], figures: dict[int, dict[str, Any]]) -> dict[tuple[int, str], float]:
    """The highest rate a port of each node and kind reported in the window (a port's rated
    speed is at least its peers')."""
    peers: dict[tuple[int, str], float] = {}
    for r in rows:
        gauge = figures.get(r["id"], _NOTHING).get("rate")
        if gauge is not None and gauge["max"] is not None:
            key = (r["node_id"], r["kind"])
            peers[key] = max(peers.get(key, 0.0), gauge["max"])
    return peers


def _ports(rows: list[dict[str, Any]], figures: dict[int, dict[str, Any]], span: timedelta) -> list[dict[str, Any]]:
    peers = _peers(rows, figures)
    return [_port(r, figures.get(r["id"], _NOTHING), peers.get((r["node_id"], r["kind"])), span) for r in rows]


def ports(win: Window, *, node_id: int | None = None, node_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Every port (of one node, of these nodes, or all) with its health over the window, from the
    rollups."""
    rows = _interfaces([node_id] if node_id is not None else node_ids)
    return _ports(rows, _port_figures(win.start, win.end, [r["id"] for r in rows]), win.span)


def _counts(ports: int = 0, up: int = 0, flapping: int = 0, degraded: int = 0) -> dict[str, int]:
    return {"ports": ports, "up": up, "flapping": flapping, "degraded": degraded}


def _flaps(win: Window) -> list[dict[str, Any]]:
    """Every minute a port's link went down or its carrier changed, oldest first (the partial
    index of the minutes whose error counters rose: its predicate repeated word for word)."""
    with _serial() as cursor:
        cursor.execute(
            f"""
            SELECT r.bucket, n.hostname, i.name, sum(r.increase)
            FROM fleet_portrollup_1m r
            JOIN fleet_nodeinterface i ON i.id = r.interface_id
            JOIN fleet_node n ON n.id = i.node_id
            WHERE r.increase > 0 AND r.quantity IN ({", ".join(f"'{q}'" for q in summaries.SPARSE)})
              AND r.quantity = ANY(%s) AND r.bucket >= %s AND r.bucket < %s
            GROUP BY r.bucket, n.hostname, i.name
            ORDER BY r.bucket, n.hostname, i.name
            """,
            [list(FLAP_QUANTITIES), win.start, win.end],
        )
        return [
            {"ts": ts.isoformat(), "hostname": host, "interface": name, "flaps": count}
            for ts, host, name, count in cursor.fetchall()
        ]


def _throughput(win: Window, *, read_model: bool = True) -> dict[str, Any]:
    """Bytes per second (received plus transmitted) per fabric, a point a minute: from the
    per-site, per-fabric minutes, or (``read_model=False``) from every port's rollups. The minute
    in progress is left out: it holds only the nodes that have pushed so far, and drawn it would
    be a drop at the chart's edge that no link saw."""
    end = min(win.end, timezone.now().replace(second=0, microsecond=0))
    if read_model:
        with connection.cursor() as cursor:
            # The minute comes as its ISO text (datetime.isoformat's, buckets being whole minutes
            # in UTC): a day's 1,440 timestamps parsed and formatted again cost more than the read.
            cursor.execute(
                """
                SELECT to_char(bucket AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"') AS minute, fabric,
                       sum(bytes) / 60.0
                FROM fleet_fabricrollup_1m
                WHERE bucket >= %s AND bucket < %s AND rows > 0
                GROUP BY bucket, fabric
                ORDER BY bucket
                """,
                [win.start, end],
            )
            return _series(cursor.fetchall())
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
            [win.start, end],
        )
        return _series(cursor.fetchall())


def _series(rows: list[tuple[datetime | str, str, float]]) -> dict[str, Any]:
    """Rows ordered by minute (a datetime, or its ISO text) -> the page's series per fabric."""
    stamps = list(dict.fromkeys(ts for ts, _, _ in rows))
    index = {ts: n for n, ts in enumerate(stamps)}
    series: dict[str, list[float | None]] = {f.value: [None] * len(stamps) for f in Fabric}
    for ts, fabric, bps in rows:
        if fabric in series:
            series[fabric][index[ts]] = bps
    return {"ts": [ts if isinstance(ts, str) else ts.isoformat() for ts in stamps], "bytes_per_second": series}


def _rollup_counts(win: Window) -> tuple[dict[str, dict[str, dict[str, int]]], list[dict[str, Any]]]:
    """Counts per site and rack, and the worst ports, from every port's rollups in the window."""
    rows = _interfaces()
    figures = _port_figures(win.start, win.end, [r["id"] for r in rows])
    peers = _peers(rows, figures)
    sites: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    candidates = []
    for r in rows:
        port_figures = figures.get(r["id"], _NOTHING)
        peers_rate = peers.get((r["node_id"], r["kind"]))
        h = _health(r, port_figures, peers_rate, win.span)
        rack = sites[r["node__site__name"]].setdefault(r["node__rack__name"] or NO_RACK, _counts())
        rack["ports"] += 1
        rack["up"] += h.up
        rack["flapping"] += h.flaps > 0
        rack["degraded"] += h.degraded
        if h.errors or h.degraded:
            candidates.append(_port(r, port_figures, peers_rate, win.span))
    return sites, sorted(candidates, key=lambda p: (-p["errors"], p["hostname"]))[:WORST_PORTS]


def _status_counts(win: Window) -> tuple[dict[str, dict[str, dict[str, int]]], list[tuple[int, int]]]:
    """Counts per site and rack, and the worst ports' (interface, node), for a window ending now,
    from the read model in one statement: ``_health``'s test (up, flapping, below its rated
    speed, errors over the degrading limits) in SQL, so the fleet's ports never become Python
    rows. The tests hold it to the rollups' answer."""
    limits = degrading_limits()
    per_hour = 3600 / win.span.total_seconds()
    quantities = ", ".join(f"'{q}'" for q in summaries.SPARSE)
    with _serial() as cursor:
        cursor.execute(
            f"""
            WITH st AS (
                SELECT interface_id, CASE WHEN state_at >= %(start)s THEN state END AS state,
                       CASE WHEN rate_at >= %(start)s THEN rate END AS rate,
                       CASE WHEN rate_at >= %(start)s
                            THEN greatest(rate, CASE WHEN rate_max_at >= %(start)s THEN rate_max END) END AS highest
                FROM fleet_portstatus WHERE seen_at >= %(start)s AND seen_at < %(end)s
            ), sp AS (
                SELECT interface_id,
                       sum(increase) FILTER (WHERE quantity = ANY(%(flap)s)) AS flaps,
                       sum(increase) FILTER (WHERE quantity = ANY(%(errors)s)) AS errors,
                       sum(increase) FILTER (WHERE quantity = 'symbol_errors') AS symbol_errors,
                       sum(increase) FILTER (WHERE quantity = 'link_error_recovery') AS link_error_recovery
                FROM fleet_portrollup_1m
                WHERE increase > 0 AND quantity IN ({quantities}) AND bucket >= %(start)s AND bucket < %(end)s
                GROUP BY interface_id
            ), p AS (
                SELECT i.id, i.node_id, n.hostname, i.name, s.name AS site, coalesce(r.name, %(no_rack)s) AS rack,
                       st.interface_id IS NOT NULL
                       AND CASE WHEN i.kind <> %(ethernet)s OR st.state IS NOT NULL THEN st.state = %(active)s
                                ELSE true END AS up,
                       coalesce(st.rate, i.rate_bytes_per_second) AS rate,
                       greatest(st.highest, max(st.highest) OVER (PARTITION BY i.node_id, i.kind),
                                coalesce(st.rate, i.rate_bytes_per_second)) AS rated,
                       coalesce(sp.flaps, 0) AS flaps, coalesce(sp.errors, 0) AS errors,
                       coalesce(sp.symbol_errors, 0) * %(per_hour)s > %(symbol_limit)s
                       OR coalesce(sp.link_error_recovery, 0) * %(per_hour)s > %(recovery_limit)s AS over
                FROM fleet_nodeinterface i
                JOIN fleet_node n ON n.id = i.node_id
                JOIN fleet_site s ON s.id = n.site_id
                LEFT JOIN fleet_rack r ON r.id = n.rack_id
                LEFT JOIN st ON st.interface_id = i.id
                LEFT JOIN sp ON sp.interface_id = i.id
            ), judged AS (
                SELECT *, coalesce(rate < rated, false) AS below FROM p
            ), shown AS (
                SELECT id, node_id, errors FROM judged WHERE errors > 0 OR over OR below
            ), cut AS (
                -- The worst ports' least errors: every port with as many is a candidate (Python
                -- orders the ties by hostname as the page always has).
                SELECT errors FROM shown ORDER BY errors DESC OFFSET %(last)s LIMIT 1
            )
            SELECT site, rack, count(*), count(*) FILTER (WHERE up), count(*) FILTER (WHERE flaps > 0),
                   count(*) FILTER (WHERE over OR below),
                   (SELECT array_agg(ARRAY[id, node_id]) FROM shown
                    WHERE errors >= coalesce((SELECT errors FROM cut), 0))
            FROM judged
            GROUP BY site, rack
            """,
            {
                "start": win.start,
                "end": win.end,
                "flap": list(FLAP_QUANTITIES),
                "errors": list(ERROR_QUANTITIES),
                "no_rack": NO_RACK,
                "ethernet": InterfaceKind.ETHERNET.value,
                "active": IB_ACTIVE,
                "per_hour": per_hour,
                "symbol_limit": limits["symbol_errors"],
                "recovery_limit": limits["link_error_recovery"],
                "last": WORST_PORTS - 1,
            },
        )
        sites: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
        candidates: list[tuple[int, int]] = []
        for site, rack, ports_, up, flapping, degraded, shown in cursor.fetchall():
            sites[site][rack] = _counts(ports_, up, flapping, degraded)
            candidates = [(interface, node) for interface, node in shown or []]
    return sites, candidates


def snapshot(win: Window | None = None, *, read_model: bool = True) -> dict[str, Any]:
    """Port health per site and rack, the worst ports, the flap timeline and throughput per fabric:
    from the read model (a window ending now) or the rollups (a custom window, or ``read_model``
    False: the same answer read the long way)."""
    win = win or default_window()
    if read_model and not win.custom:
        sites, worst_ids = _status_counts(win)
        rows = _interfaces(sorted({node for _, node in worst_ids}))
        figures = _status_figures(win.start, win.end, [r["id"] for r in rows])
        wanted = {interface for interface, _ in worst_ids}
        peers = _peers(rows, figures)  # the worst ports' nodes' ports: their rated speed
        worst = [
            _port(r, figures.get(r["id"], _NOTHING), peers.get((r["node_id"], r["kind"])), win.span)
            for r in rows
            if r["id"] in wanted
        ]
        worst = sorted(worst, key=lambda p: (-p["errors"], p["hostname"]))[:WORST_PORTS]
        _port_bytes(win.start, win.end, worst)
    else:
        sites, worst = _rollup_counts(win)
    totals = _counts()
    for racks in sites.values():
        for counts in racks.values():
            for k in totals:
                totals[k] += counts[k]
    return {
        "ts": timezone.now().isoformat(),
        "window": win.as_json(),
        "totals": totals,
        "sites": [
            {
                "name": site,
                **_counts(*(sum(c[k] for c in racks.values()) for k in ("ports", "up", "flapping", "degraded"))),
                "racks": [{"name": rack, **counts} for rack, counts in sorted(racks.items())],
            }
            for site, racks in sorted(sites.items())
        ],
        "worst_ports": worst,
        "flaps": _flaps(win),
        "throughput": _throughput(win, read_model=read_model),
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


def node_section(node: Any) -> dict[str, Any]:
    """The node page's ports: each with its latest state and rate, and its figures over the last hour."""
    win = default_window()
    return {"ports": ports(win, node_id=node.pk), "window": win}
