"""Fabric detectors: functions from the ports' 1-minute rollups (fleet.fabric.store: counters as
Prometheus increase(), a reset counted from zero) to the findings present now, registered with the
incident engine like the GPU-health detectors.

* fabric-link-flap: a port's link went down (``link_downed`` or, on Ethernet, ``carrier_changes``
  rose in the window) or its state left Active (node_exporter's infiniband ``state_id`` 4). The
  severity follows the fabric: compute SEV2 on a node holding a running gang job (a training job
  on more than one node: one port down stalls every rank), compute SEV3 otherwise, storage SEV3,
  management SEV4;
* fabric-link-degrading: symbol errors or link error recoveries rising faster than a limit per
  hour (settings FABRIC_SYMBOL_ERRORS_PER_HOUR, FABRIC_LINK_RECOVERIES_PER_HOUR), or a port running
  below its rated speed (the highest rate it reported over the last day);
* fabric-rdma-congestion: transmit wait ticks or transmit discards rising more than a limit over
  the window (FABRIC_TRANSMIT_WAIT_PER_WINDOW, FABRIC_TRANSMIT_DISCARDS_PER_WINDOW).

Each finding carries the labels site, node, interface (``mlx5_0/1``, ``eth0``) and fabric, and its
figures in its text; a port finding clears only while the port reports (missing data is not health).

Which nodes hold a running gang job is training's to say, a sibling room this one never imports:
the room above both registers a lookup (``register_gang_lookup``); without one, compute flaps are
SEV3. ``flapped_ports`` is what that room reads to tie a hung job to the flap under it
(fleet.correlation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connection

from fleet.choices import Fabric
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector

WINDOW = timedelta(minutes=10)
RATED_LOOKBACK = timedelta(hours=24)
STATE_ACTIVE = 4.0  # node_exporter's infiniband state_id: 1 down, 2 init, 3 armed, 4 active
FLAP_COUNTERS = ("link_downed", "carrier_changes")
QUANTITIES = (
    "link_downed",
    "carrier_changes",
    "state",
    "symbol_errors",
    "link_error_recovery",
    "transmit_wait",
    "transmit_discards",
    "rate",
)

# (now, hostnames) -> those of them holding a running training job that spans more than one node.
GangLookup = Callable[[datetime, set[str]], set[str]]
_gang_lookups: list[GangLookup] = []


def register_gang_lookup(lookup: GangLookup) -> None:
    """Tell the flap detector which nodes hold a running gang job (called once, at import, by the
    room above this one and training)."""
    if lookup not in _gang_lookups:
        _gang_lookups.append(lookup)


def _gang_hosts(now: datetime, hostnames: set[str]) -> set[str]:
    found: set[str] = set()
    for lookup in _gang_lookups:
        found |= lookup(now, hostnames)
    return found


@dataclass
class Port:
    """One port over the window: per quantity its increase (counters), min / max / last (all),
    and the first minute its condition showed."""

    interface_id: int
    site: str
    hostname: str
    name: str
    fabric: str
    increase: dict[str, float] = field(default_factory=dict)
    low: dict[str, float] = field(default_factory=dict)
    high: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    first_rise: dict[str, datetime] = field(default_factory=dict)
    first_inactive: datetime | None = None
    rated: float | None = None  # the highest rate the port reported over RATED_LOOKBACK

    @property
    def labels(self) -> dict[str, str]:
        return {"site": self.site, "node": self.hostname, "interface": self.name, "fabric": self.fabric}

    def fingerprint(self, kind: str) -> str:
        return fingerprint(kind, self.site, self.hostname, self.name)

    @property
    def flapped(self) -> bool:
        return any(self.increase.get(q, 0) > 0 for q in FLAP_COUNTERS) or self.first_inactive is not None

    @property
    def flap_started(self) -> datetime | None:
        stamps = [self.first_rise[q] for q in FLAP_COUNTERS if q in self.first_rise]
        if self.first_inactive is not None:
            stamps.append(self.first_inactive)
        return min(stamps) if stamps else None


def fingerprint(kind: str, site: str, hostname: str, interface: str) -> str:
    return f"fabric-{kind}:{site}:{hostname}:{interface}"


@lru_cache(maxsize=2)
def port_window(now: datetime) -> dict[int, Port]:
    """Every port that reported in the window (one scan of the rollups' window, one of the rate's
    last day), shared by the three detectors for one ``now``."""
    return _ports(now, None)


def _ports(now: datetime, hostnames: list[str] | None, since: datetime | None = None) -> dict[int, Port]:
    start = since if since is not None else now - WINDOW
    on_hosts = "AND n.hostname = ANY(%(hosts)s)" if hostnames is not None else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT i.id, s.name, n.hostname, i.name, i.fabric, r.quantity,
                   sum(r.increase), min(r.min), max(r.max),
                   (array_agg(r.last ORDER BY r.bucket DESC))[1],
                   min(r.bucket) FILTER (WHERE r.increase > 0),
                   min(r.bucket) FILTER (WHERE r.quantity = 'state' AND (r.min <> %(active)s OR r.max <> %(active)s))
            FROM fleet_portrollup_1m r
            JOIN fleet_nodeinterface i ON i.id = r.interface_id
            JOIN fleet_node n ON n.id = i.node_id
            JOIN fleet_site s ON s.id = n.site_id
            WHERE r.bucket > %(start)s AND r.bucket <= %(now)s AND r.quantity = ANY(%(quantities)s) {on_hosts}
            GROUP BY i.id, s.name, n.hostname, i.name, i.fabric, r.quantity
            """,
            {
                "start": start,
                "now": now,
                "active": STATE_ACTIVE,
                "quantities": list(QUANTITIES),
                "hosts": hostnames or [],
            },
        )
        ports: dict[int, Port] = {}
        for pk, site, host, name, fabric, quantity, increase, low, high, last, first_rise, inactive in cursor:
            port = ports.setdefault(pk, Port(pk, site, host, name, fabric))
            if increase is not None:
                port.increase[quantity] = increase
            port.low[quantity], port.high[quantity], port.last[quantity] = low, high, last
            if first_rise is not None:
                port.first_rise[quantity] = first_rise
            if inactive is not None:
                port.first_inactive = inactive
        if hostnames is None and ports:
            cursor.execute(
                """
                SELECT interface_id, max(max) FROM fleet_portrollup_1m
                WHERE quantity = 'rate' AND bucket > %s AND bucket <= %s AND interface_id = ANY(%s)
                GROUP BY interface_id
                """,
                [now - RATED_LOOKBACK, now, list(ports)],
            )
            for pk, rated in cursor:
                ports[pk].rated = rated
    return ports


def _judged(now: datetime, labels: dict[str, Any]) -> bool:
    """A port finding clears only while its port reports."""
    return any(
        p.site == labels.get("site") and p.hostname == labels.get("node") and p.name == labels.get("interface")
        for p in port_window(now).values()
    )


def flap_severity(fabric: str, on_gang_node: bool) -> str:
    if fabric == Fabric.COMPUTE:
        return Severity.SEV2 if on_gang_node else Severity.SEV3
    if fabric == Fabric.STORAGE:
        return Severity.SEV3
    return Severity.SEV4


def _n(value: float) -> str:
    return f"{value:,.0f}"


@detector("fabric-link-flap", judged=_judged)
def fabric_link_flap(now: datetime) -> list[FindingSpec]:
    """A port whose link went down in the window, or whose state is not Active."""
    flapped = [p for p in port_window(now).values() if p.flapped]
    gang = _gang_hosts(now, {p.hostname for p in flapped if p.fabric == Fabric.COMPUTE}) if flapped else set()
    specs = []
    for port in flapped:
        figures = [f"{q.replace('_', ' ')} +{_n(port.increase[q])}" for q in FLAP_COUNTERS if port.increase.get(q)]
        if port.first_inactive is not None:
            figures.append(f"state {port.last.get('state', 0):.0f} (4 is Active)")
        on_gang = port.hostname in gang
        summary = f"Link flap on {port.hostname} {port.name} ({port.fabric} fabric): {', '.join(figures)} in 10 min"
        if on_gang:
            summary += "; the node runs a multi-node training job"
        specs.append(
            FindingSpec(
                fingerprint=port.fingerprint("link-flap"),
                labels=port.labels,
                severity=flap_severity(port.fabric, on_gang),
                summary=summary,
                description=(
                    "The port's link went down (link downed / carrier changes rose) or its state left Active. "
                    "On the compute fabric a flap stalls every collective (NCCL) through the port."
                ),
                impact={
                    **{q: port.increase[q] for q in FLAP_COUNTERS if q in port.increase},
                    **({"state": port.last["state"]} if "state" in port.last else {}),
                    "gang_node": on_gang,
                },
                category="fabric",
                started_at=port.flap_started,
            )
        )
    return specs


def degrading_limits() -> dict[str, float]:
    """Errors per hour past which a link is degrading (settings)."""
    return {
        "symbol_errors": settings.FABRIC_SYMBOL_ERRORS_PER_HOUR,
        "link_error_recovery": settings.FABRIC_LINK_RECOVERIES_PER_HOUR,
    }


def errors_over_limits(increase: dict[str, float], span: timedelta) -> dict[str, float]:
    """The error counters whose increase over ``span`` is more per hour than its limit, with
    their rates per hour: the degrading test, for the detector's window and the page's."""
    per_hour = 3600 / span.total_seconds()
    rates = {q: increase.get(q, 0) * per_hour for q in degrading_limits()}
    return {q: rate for q, rate in rates.items() if rate > degrading_limits()[q]}


@detector("fabric-link-degrading", judged=_judged)
def fabric_link_degrading(now: datetime) -> list[FindingSpec]:
    """Symbol errors or link error recoveries rising faster than their limit per hour, or a port
    running below its rated speed."""
    limits = degrading_limits()
    specs = []
    for port in port_window(now).values():
        figures, impact, started = [], {}, []
        for quantity, rate in errors_over_limits(port.increase, WINDOW).items():
            figures.append(f"{quantity.replace('_', ' ')} {rate:,.0f}/h (limit {limits[quantity]:,.0f}/h)")
            impact[f"{quantity}_per_hour"] = round(rate, 1)
            started.append(port.first_rise.get(quantity))
        current = port.last.get("rate")
        if current is not None and port.rated and current < port.rated:
            figures.append(f"running at {current / 1e9:,.1f} GB/s of its rated {port.rated / 1e9:,.1f} GB/s")
            impact |= {"rate_bytes_per_second": current, "rated_bytes_per_second": port.rated}
        if not figures:
            continue
        specs.append(
            FindingSpec(
                fingerprint=port.fingerprint("link-degrading"),
                labels=port.labels,
                severity=Severity.SEV4 if port.fabric == Fabric.MANAGEMENT else Severity.SEV3,
                summary=f"Link degrading on {port.hostname} {port.name} ({port.fabric} fabric): {'; '.join(figures)}",
                description=(
                    "Rising symbol errors or link error recoveries mean a marginal cable or transceiver; a port "
                    "below its rated speed renegotiated down. Both precede flaps: reseat or replace the part."
                ),
                impact=impact,
                category="fabric",
                started_at=min((s for s in started if s is not None), default=None),
            )
        )
    return specs


@detector("fabric-rdma-congestion", judged=_judged)
def fabric_rdma_congestion(now: datetime) -> list[FindingSpec]:
    """Transmit wait ticks or transmit discards rising more than their limit over the window."""
    limits = {
        "transmit_wait": settings.FABRIC_TRANSMIT_WAIT_PER_WINDOW,
        "transmit_discards": settings.FABRIC_TRANSMIT_DISCARDS_PER_WINDOW,
    }
    specs = []
    for port in port_window(now).values():
        over = {q: port.increase.get(q, 0) for q, limit in limits.items() if port.increase.get(q, 0) > limit}
        if not over:
            continue
        figures = [f"{q.replace('_', ' ')} +{_n(v)} (limit {_n(limits[q])})" for q, v in over.items()]
        specs.append(
            FindingSpec(
                fingerprint=port.fingerprint("rdma-congestion"),
                labels=port.labels,
                severity=Severity.SEV3 if port.fabric == Fabric.COMPUTE else Severity.SEV4,
                summary=f"RDMA congestion on {port.hostname} {port.name} ({port.fabric} fabric): "
                f"{', '.join(figures)} in 10 min",
                description=(
                    "The port had data to send and could not (transmit wait) or dropped it (discards): "
                    "congestion in the fabric or a slow receiver. Collectives through it slow down."
                ),
                impact={q: v for q, v in over.items()},
                category="fabric",
                started_at=min((port.first_rise[q] for q in over if q in port.first_rise), default=None),
            )
        )
    return specs


def flapped_ports(now: datetime, hostnames: Iterable[str], since: datetime) -> list[tuple[str, str, str, datetime]]:
    """Compute-fabric ports of these hosts that flapped between ``since`` and ``now``: (hostname,
    interface, the flap finding's fingerprint, when it flapped), earliest first."""
    hosts = sorted(set(hostnames) - {""})
    if not hosts:
        return []
    ports = _ports(now, hosts, since=min(since, now - WINDOW))
    found = [
        (p.hostname, p.name, p.fingerprint("link-flap"), p.flap_started)
        for p in ports.values()
        if p.fabric == Fabric.COMPUTE and p.flapped and p.flap_started is not None
    ]
    return sorted(found, key=lambda f: (f[3], f[0], f[1]))
