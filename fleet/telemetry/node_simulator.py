"""A simulated node_exporter on each node of the simulated fleet: its InfiniBand ports, its network
interface, its disks and its file systems, printed as node_exporter prints them and pushed to the
console's Prometheus door (``POST /api/v1/ingest/prometheus``, one body per site with a
``hostname`` label on every line, as a federating Prometheus relabels them) every ``interval``.

Each node's figures follow what its GPUs do (``activity``: the training simulator's job phases,
the inference load of the day), within what the hardware can carry:

* a training node has eight compute InfiniBand ports (NDR 400 Gb/s, 50 GB/s, on H100/H200; HDR
  200 Gb/s on A100) carrying its job's collectives (a fifth to a third of the link while it
  computes, almost nothing while it is hung or idle), a 25 GbE management interface, an OS disk
  and a local NVMe RAID holding its datasets (``/data``, ``md0``: a couple of GB/s while its job
  trains and a shard prefetch now and then at 11-14 GB/s; UNDERPROVISIONED sites' RAIDs top out
  at about 7 GB/s, below what a training server needs), and its site's shared checkpoint file
  system (NFS, ``/mnt/checkpoints``);
* an inference node has its management interface, its OS disk and a local model cache
  (``/models``).

Scripted faults, set by whoever runs it (fleet.management.commands.simulate couples them to the
training simulator's scenarios, fleet.management.backfill to the history's):

* ``flap(hostname, interface, at)``: the port's link goes down once (``link_downed`` +1, its state
  Down for ``FLAP_DOWN``) and recovers;
* ``slow(hostnames, start, end)``: the nodes' datasets RAID saturates (busy ~99 % of the time)
  while its reads fall to a third.

``minute`` gives a node's figures over one minute (the history's rollups, written by COPY);
``exposition`` prints its counters at an instant. The clock is always an argument.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fleet.telemetry.simulator import SimGpu

IB_ACTIVE, IB_DOWN = 4, 1  # node_exporter's state_id: 1 down, 2 init, 3 armed, 4 active
IB_LINKUP, IB_POLLING = 5, 2  # physical_state_id
IB_RATE = {"A100": 25e9}  # bytes/s; HDR 200 Gb/s on A100 systems, NDR 400 Gb/s (50e9) otherwise
NDR_RATE = 50e9
MGMT_RATE = 3.125e9  # 25 GbE
IB_PORTS = 8
FLAP_DOWN = timedelta(seconds=20)
# The port that flaps under a scripted hang (on the hung job's first node), this long before it.
SCRIPTED_FLAP_PORT = "mlx5_3/1"
FLAP_LEAD = timedelta(seconds=20)
# Share of the link a working job's collectives use per port (uniform per job node), and what an
# idle or hung port still carries (subnet management, NCCL's keep-alives): bytes/s.
COLLECTIVE_SHARE = (0.2, 0.34)
QUIET_BYTES = 4e4
# The datasets RAID: a working node reads BASE_READ (uniform, bytes/s) and, one minute in
# PREFETCH_EVERY, prefetches the next shard at PREFETCH_READ; an under-provisioned site's RAID
# tops out at SLOW_RAID_READ. Saturated (``slow``), it is busy SATURATED_BUSY of the time and
# reads STARVED_SHARE of its usual rate.
BASE_READ = (1.2e9, 2.4e9)
PREFETCH_EVERY = 7
PREFETCH_READ = (11e9, 14e9)
RAID_MAX_READ = 25e9  # eight NVMe drives
SLOW_RAID_READ = 7e9
UNDERPROVISIONED = frozenset({"iad-2"})
SATURATED_BUSY = 0.99
STARVED_SHARE = 0.33
CHECKPOINT_FS = 2.0e15  # bytes: the site's checkpoint file system (2 PB)
OS_DISK = 1.92e12
DATA_RAID = 30.7e12  # 8 x 3.84 TB
MODEL_CACHE = 7.68e12
NFS_SERVER = "10.20.0.5"  # the checkpoint file system's server (mountstats' mountaddr)
NFS_WRITE = 1.5e8  # bytes/s of checkpoints a working node writes, on average
NFS_READ = 2e6
NFS_READ_S = 0.002  # seconds per 1 MiB READ
SCRAPE_S = 15.0  # what a minute's rollup counts as samples

Activity = Callable[[str, datetime], dict[str, float]]  # hostname -> {work, hung, idle: share}


@dataclass
class SimPort:
    device: str
    port: str  # "" for a network interface
    rate: float  # bytes/s
    share: float  # of the rate a working job's traffic uses
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}" if self.port else self.device


@dataclass
class SimDisk:
    device: str
    max_read: float
    counters: dict[str, float] = field(default_factory=dict)


@dataclass
class SimMount:
    mountpoint: str
    fstype: str
    device: str
    size: float
    free_share: float
    counters: dict[str, float] = field(default_factory=dict)  # an NFS mount's mountstats

    @property
    def nfs(self) -> bool:
        return self.fstype.startswith("nfs")


@dataclass
class SimNode:
    hostname: str
    site: str
    workload: str
    utc_offset_h: int
    ports: list[SimPort]
    disks: list[SimDisk]
    mounts: list[SimMount]
    base_read: float = 0.0
    prefetch_read: float = 0.0
    prefetch_phase: int = 0

    @property
    def ib(self) -> list[SimPort]:
        return [p for p in self.ports if p.port]


@dataclass(frozen=True)
class Figures:
    """A node's rates over a stretch (bytes/s, ops/s, busy seconds per second) and its gauges."""

    port_rates: dict[str, dict[str, float]]  # port name -> counter -> per second
    port_state: dict[str, float]  # port name -> lowest state in the stretch
    disk_rates: dict[str, dict[str, float]]
    nfs_rates: dict[str, dict[str, float]]  # mountpoint -> mountstats quantity -> per second
    free: dict[str, float]  # mountpoint -> available bytes


class NodeExporterSimulator:
    """node_exporter's view of every node of the simulated fleet (see the module's docstring)."""

    def __init__(
        self,
        fleet: dict[str, list[SimGpu]],
        *,
        seed: int,
        interval: float = SCRAPE_S,
        activity: Activity | None = None,
        stamped: bool = False,
    ) -> None:
        self.stamped = stamped  # print each scrape's time (a simulated clock); else the door stamps it
        self.rng = random.Random(seed + 23)
        self.interval = timedelta(seconds=interval)
        self.activity = activity or (lambda hostname, at: {"idle": 1.0})
        self.nodes: dict[str, SimNode] = {}
        for site, gpus in fleet.items():
            by_host: dict[str, SimGpu] = {}
            for gpu in gpus:
                by_host.setdefault(gpu.hostname, gpu)
            for hostname in sorted(by_host):
                self.nodes[hostname] = self._node(site, by_host[hostname])
        self.flaps: list[tuple[str, str, datetime]] = []  # (hostname, port name, when)
        self.slowed: list[tuple[frozenset[str], datetime, datetime]] = []
        self.posted_at: datetime | None = None
        self.rejected: list[str] = []

    def _node(self, site: str, gpu: SimGpu) -> SimNode:
        rng = self.rng
        mgmt = SimPort("eno1", "", MGMT_RATE, 0.002)
        disks = [SimDisk("nvme0n1", 6.5e9)]
        mounts = [SimMount("/", "ext4", "/dev/nvme0n1p2", OS_DISK, rng.uniform(0.55, 0.75))]
        node = SimNode(gpu.hostname, site, gpu.workload, gpu.utc_offset_h, [mgmt], disks, mounts)
        if gpu.workload == "training":
            rate = next((r for name, r in IB_RATE.items() if name in gpu.model.name), NDR_RATE)
            share = rng.uniform(*COLLECTIVE_SHARE)
            node.ports += [SimPort(f"mlx5_{i}", "1", rate, share * rng.uniform(0.97, 1.03)) for i in range(IB_PORTS)]
            raid = SLOW_RAID_READ if site in UNDERPROVISIONED else RAID_MAX_READ
            disks.append(SimDisk("md0", raid))
            mounts.append(SimMount("/data", "xfs", "/dev/md0", DATA_RAID, rng.uniform(0.3, 0.45)))
            export = f"ckpt.{site}.internal:/checkpoints"
            mounts.append(SimMount("/mnt/checkpoints", "nfs4", export, CHECKPOINT_FS, 0.41))
            node.base_read = rng.uniform(*BASE_READ)
            node.prefetch_read = min(raid * 0.95, rng.uniform(*PREFETCH_READ))
            node.prefetch_phase = rng.randrange(PREFETCH_EVERY)
        else:
            disks.append(SimDisk("nvme1n1", 6.5e9))
            mounts.append(SimMount("/models", "ext4", "/dev/nvme1n1", MODEL_CACHE, rng.uniform(0.35, 0.5)))
        for port in node.ports:
            port.counters = {
                "receive_bytes": rng.uniform(1e13, 9e14) if port.port else rng.uniform(1e11, 5e12),
                "transmit_bytes": rng.uniform(1e13, 9e14) if port.port else rng.uniform(1e11, 5e12),
                "link_downed": float(rng.choice((0, 0, 0, 1, 2))),
                "link_error_recovery": float(rng.choice((0, 0, 1))),
                "symbol_errors": float(rng.choice((0, 0, 0, 3, 12))),
                "transmit_wait": rng.uniform(1e6, 1e9),
                "carrier_changes": float(rng.choice((1, 2, 2, 4))),
            }
        for disk in disks:
            disk.counters = {
                "read_bytes": rng.uniform(1e12, 4e14),
                "written_bytes": rng.uniform(1e12, 1e14),
                "reads": rng.uniform(1e7, 1e9),
                "writes": rng.uniform(1e7, 1e9),
                "io_time_seconds": rng.uniform(1e4, 1e6),
            }
        return node

    # --- scripted faults ---------------------------------------------------------------------------

    def flap(self, hostname: str, port: str, at: datetime) -> None:
        """``hostname``'s port (``mlx5_3/1``) goes down once at ``at`` and comes back."""
        if hostname in self.nodes:
            self.flaps.append((hostname, port, at))

    def slow(self, hostnames: Iterable[str], start: datetime, end: datetime) -> None:
        """The nodes' datasets RAID saturates from ``start`` to ``end``."""
        self.slowed.append((frozenset(hostnames), start, end))

    def _slowed_share(self, hostname: str, start: datetime, end: datetime) -> float:
        seconds = (end - start).total_seconds()
        overlap = sum(
            max(0.0, (min(end, until) - max(start, since)).total_seconds())
            for hosts, since, until in self.slowed
            if hostname in hosts
        )
        return min(1.0, overlap / seconds) if seconds > 0 else 0.0

    # --- figures -------------------------------------------------------------------------------------

    def figures(self, node: SimNode, start: datetime, end: datetime) -> Figures:
        """The node's rates over [start, end) and its gauges at the end."""
        shares = self.activity(node.hostname, start)
        work = shares.get("work", 0.0)
        slowed = self._slowed_share(node.hostname, start, end)
        load = 0.5 + 0.45 * math.sin(2 * math.pi * ((start.hour + start.minute / 60 + node.utc_offset_h) % 24 - 9) / 24)
        port_rates, port_state = {}, {}
        for port in node.ports:
            if port.port:
                traffic = QUIET_BYTES + work * port.share * port.rate * self.rng.uniform(0.9, 1.1)
                # Transmit wait ticks/s: some while collectives run, far under the congestion limit.
                wait = 2e3 + work * 2e4 * self.rng.uniform(0.5, 1.5)
            else:
                busy = load if node.workload == "inference" else 0.3 + 0.7 * work
                traffic = 2e6 + busy * 1.5e7 * self.rng.uniform(0.8, 1.2)
                wait = 0.0
            port_rates[port.name] = {"receive_bytes": traffic, "transmit_bytes": traffic * 0.98, "transmit_wait": wait}
            port_state[port.name] = IB_ACTIVE
        for hostname, name, at in self.flaps:
            if hostname == node.hostname and start - FLAP_DOWN < at < end:
                port_state[name] = IB_DOWN
        disk_rates = {}
        for disk in node.disks:
            if disk.device == "md0":
                minute = int(start.timestamp() // 60)
                read = node.base_read
                if (minute + node.prefetch_phase) % PREFETCH_EVERY == 0:
                    read = node.prefetch_read
                read *= work
                busy = min(0.95, read / disk.max_read * 1.1) + 0.01
                read = read * (1 - slowed) + read * STARVED_SHARE * slowed
                busy = busy * (1 - slowed) + SATURATED_BUSY * slowed
                written = 2e6 * work
            elif disk.device == "nvme1n1":
                read, written, busy = 5e7 * load, 1e6, 0.02 + 0.05 * load
            else:
                read, written, busy = 2e6, 6e6, 0.01
            jitter = self.rng.uniform(0.9, 1.1)
            disk_rates[disk.device] = {
                "read_bytes": min(read * jitter, disk.max_read),
                "written_bytes": written * jitter,
                "reads": read * jitter / 1.3e5,  # about 128 KiB per read
                "writes": written * jitter / 6.5e4,
                "io_time_seconds": min(1.0, busy),
            }
        nfs_rates = {}
        for mount in node.mounts:
            if mount.nfs:  # checkpoint saves written, a restore read now and then; 1 MiB READs at ~2 ms
                read = NFS_READ * (0.5 + work) * self.rng.uniform(0.8, 1.2)
                nfs_rates[mount.mountpoint] = {
                    "nfs_write_bytes": NFS_WRITE * work * self.rng.uniform(0.8, 1.2),
                    "nfs_read_bytes": read,
                    "nfs_read_ops": read / 2**20,
                    "nfs_read_response_seconds": read / 2**20 * NFS_READ_S,
                }
        free = {}
        for mount in node.mounts:
            share = mount.free_share
            if mount.fstype == "nfs4":  # checkpoints written and pruned over the day: +-1 %
                share += 0.01 * math.sin(2 * math.pi * (end.timestamp() % 86400) / 86400)
            free[mount.mountpoint] = mount.size * share
        return Figures(port_rates, port_state, disk_rates, nfs_rates, free)

    def advance(self, node: SimNode, figures: Figures, start: datetime, end: datetime) -> None:
        """Count the stretch into the node's counters (and its flaps)."""
        seconds = (end - start).total_seconds()
        for port in node.ports:
            for quantity, rate in figures.port_rates[port.name].items():
                port.counters[quantity] += rate * seconds
        for hostname, name, at in self.flaps:
            if hostname == node.hostname and start <= at < end:
                port = next(p for p in node.ports if p.name == name)
                port.counters["link_downed"] += 1
        for disk in node.disks:
            for quantity, rate in figures.disk_rates[disk.device].items():
                disk.counters[quantity] += rate * seconds
        for mount in node.mounts:
            for quantity, rate in figures.nfs_rates.get(mount.mountpoint, {}).items():
                mount.counters[quantity] = mount.counters.get(quantity, 0.0) + rate * seconds

    # --- node_exporter's text ------------------------------------------------------------------------

    def exposition(self, nodes: Iterable[SimNode], figures: dict[str, Figures], at: datetime | None = None) -> str:
        """node_exporter's lines for these nodes, each with its ``hostname`` label; with ``at``, each
        stamped with it (node_exporter prints none: the console stamps a scrape when it arrives)."""
        lines: dict[str, list[str]] = {name: [] for name, _ in EXPOSITION}
        for node in nodes:
            f = figures[node.hostname]
            host = f'hostname="{node.hostname}"'
            for port in node.ports:
                if port.port:
                    labels = f'{{device="{port.device}",{host},port="{port.port}"}}'
                    c = port.counters
                    state = f.port_state[port.name]
                    values = {
                        "node_infiniband_link_downed_total": c["link_downed"],
                        "node_infiniband_link_error_recovery_total": c["link_error_recovery"],
                        "node_infiniband_symbol_error_total": c["symbol_errors"],
                        "node_infiniband_port_data_received_bytes_total": c["receive_bytes"],
                        "node_infiniband_port_data_transmitted_bytes_total": c["transmit_bytes"],
                        "node_infiniband_port_transmit_wait_total": c["transmit_wait"],
                        "node_infiniband_state_id": state,
                        "node_infiniband_physical_state_id": IB_LINKUP if state == IB_ACTIVE else IB_POLLING,
                        "node_infiniband_rate_bytes_per_second": port.rate,
                    }
                else:
                    labels = f'{{device="{port.device}",{host}}}'
                    values = {
                        "node_network_receive_bytes_total": port.counters["receive_bytes"],
                        "node_network_transmit_bytes_total": port.counters["transmit_bytes"],
                        "node_network_carrier_changes_total": port.counters["carrier_changes"],
                        "node_network_speed_bytes": port.rate,
                    }
                for name, value in values.items():
                    lines[name].append(f"{name}{labels} {value:.17g}")
            for disk in node.disks:
                labels = f'{{device="{disk.device}",{host}}}'
                for name, quantity in DISK_METRICS.items():
                    lines[name].append(f"{name}{labels} {disk.counters[quantity]:.17g}")
            for mount in node.mounts:
                labels = f'{{device="{mount.device}",fstype="{mount.fstype}",{host},mountpoint="{mount.mountpoint}"}}'
                lines["node_filesystem_avail_bytes"].append(
                    f"node_filesystem_avail_bytes{labels} {f.free[mount.mountpoint]:.17g}"
                )
                lines["node_filesystem_size_bytes"].append(f"node_filesystem_size_bytes{labels} {mount.size:.17g}")
                if mount.nfs and mount.counters:
                    server = f'export="{mount.device}",{host},mountaddr="{NFS_SERVER}"'
                    for name, quantity in NFS_METRICS.items():
                        op = ',operation="READ"' if "operations" in name else ""
                        value = mount.counters[quantity]
                        lines[name].append(f'{name}{{{server}{op},protocol="tcp"}} {value:.17g}')
        stamp = f" {round(at.timestamp() * 1000)}" if at is not None else ""
        out = []
        for name, kind in EXPOSITION:
            if lines[name]:
                out += [f"# TYPE {name} {kind}", *(line + stamp for line in lines[name])]
        return "\n".join(out) + "\n"

    # --- the live run --------------------------------------------------------------------------------

    def tick(self, now: datetime, sender: Any) -> int:
        """Every ``interval``: advance every node to ``now`` and push each site's scrape; returns
        the sites pushed. ``sender`` is fleet.telemetry.simulator.Poster (``send_text``). The first
        tick also pushes the scrape one interval before, stamped: a counter's increase needs two
        samples, and without it the run's first minute would show no traffic at all."""
        if self.posted_at is not None and now - self.posted_at < self.interval:
            return 0
        if self.posted_at is None:
            self._scrape(now - self.interval, now - 2 * self.interval, sender, stamped=True)
        pushed = self._scrape(now, self.posted_at or now - self.interval, sender, stamped=self.stamped)
        return pushed

    def _scrape(self, now: datetime, start: datetime, sender: Any, *, stamped: bool) -> int:
        self.posted_at = now
        by_site: dict[str, list[SimNode]] = {}
        figures = {}
        for node in self.nodes.values():
            figures[node.hostname] = f = self.figures(node, start, now)
            self.advance(node, f, start, now)
            by_site.setdefault(node.site, []).append(node)
        pushed = 0
        for site, nodes in by_site.items():
            text = self.exposition(nodes, figures, now if stamped else None)
            response = sender.send_text(site, "/api/v1/ingest/prometheus", text)
            if response is not None and response.status_code < 300:
                pushed += 1
            else:
                status = response.status_code if response is not None else "no answer"
                self.rejected.append(f"{site}: node_exporter scrape {status}: {getattr(response, 'text', '')[:200]}")
        return pushed

    # --- a history -----------------------------------------------------------------------------------

    def minute_rows(self, start: datetime, minutes: int) -> Iterable[tuple[str, str, str, datetime, dict[str, Any]]]:
        """Each node's minutes from ``start``, as the 1-minute rollups would hold them: (hostname,
        "port"/"disk"/"mount", name, bucket, {quantity: (samples, increase, min, max, last)}), the
        counters advancing as they go (the live run continues from where the history ends)."""
        samples = round(60 / SCRAPE_S)
        for k in range(minutes):
            bucket = start + timedelta(minutes=k)
            end = bucket + timedelta(minutes=1)
            for node in self.nodes.values():
                f = self.figures(node, bucket, end)
                before = {p.name: dict(p.counters) for p in node.ports}
                disks_before = {d.device: dict(d.counters) for d in node.disks}
                mounts_before = {m.mountpoint: dict(m.counters) for m in node.mounts}
                self.advance(node, f, bucket, end)
                for port in node.ports:
                    rows: dict[str, tuple] = {}
                    old = before[port.name]
                    for quantity in IB_COUNTERS if port.port else ETH_COUNTERS:
                        value, increase = port.counters[quantity], port.counters[quantity] - old[quantity]
                        if increase or quantity in TRAFFIC:  # an error counter's quiet minutes stay out
                            rows[quantity] = (samples, increase, old[quantity], value, value)
                    if port.port:
                        state = f.port_state[port.name]
                        rows["state"] = (samples, None, state, IB_ACTIVE, IB_ACTIVE)
                    rows["rate"] = (samples, None, port.rate, port.rate, port.rate)
                    yield node.hostname, "port", port.name, bucket, rows
                for disk in node.disks:
                    old = disks_before[disk.device]
                    rows = {q: (samples, v - old[q], old[q], v, v) for q, v in disk.counters.items()}
                    yield node.hostname, "disk", disk.device, bucket, rows
                for mount in node.mounts:
                    free = f.free[mount.mountpoint]
                    rows = {
                        "avail_bytes": (samples, None, free, free, free),
                        "size_bytes": (samples, None, mount.size, mount.size, mount.size),
                    }
                    for quantity, value in mount.counters.items():
                        old = mounts_before[mount.mountpoint].get(quantity, 0.0)
                        rows[quantity] = (samples, value - old, old, value, value)
                    yield node.hostname, "mount", mount.mountpoint, bucket, rows


# The counters a history's minutes hold: every minute of the traffic, the other counters' minutes
# only where they rose (a quiet error counter's rollup says nothing the pages read; transmit wait
# is the congestion detector's, which judges the live minutes).
TRAFFIC = frozenset({"receive_bytes", "transmit_bytes"})
IB_COUNTERS = ("receive_bytes", "transmit_bytes", "link_downed", "link_error_recovery", "symbol_errors")
ETH_COUNTERS = ("receive_bytes", "transmit_bytes", "carrier_changes")
DISK_METRICS = {
    "node_disk_read_bytes_total": "read_bytes",
    "node_disk_written_bytes_total": "written_bytes",
    "node_disk_reads_completed_total": "reads",
    "node_disk_writes_completed_total": "writes",
    "node_disk_io_time_seconds_total": "io_time_seconds",
}
NFS_METRICS = {
    "node_mountstats_nfs_total_read_bytes_total": "nfs_read_bytes",
    "node_mountstats_nfs_total_write_bytes_total": "nfs_write_bytes",
    "node_mountstats_nfs_operations_requests_total": "nfs_read_ops",
    "node_mountstats_nfs_operations_response_time_seconds_total": "nfs_read_response_seconds",
}
EXPOSITION = (
    ("node_infiniband_link_downed_total", "counter"),
    ("node_infiniband_link_error_recovery_total", "counter"),
    ("node_infiniband_symbol_error_total", "counter"),
    ("node_infiniband_port_data_received_bytes_total", "counter"),
    ("node_infiniband_port_data_transmitted_bytes_total", "counter"),
    ("node_infiniband_port_transmit_wait_total", "counter"),
    ("node_infiniband_state_id", "gauge"),
    ("node_infiniband_physical_state_id", "gauge"),
    ("node_infiniband_rate_bytes_per_second", "gauge"),
    ("node_network_receive_bytes_total", "counter"),
    ("node_network_transmit_bytes_total", "counter"),
    ("node_network_carrier_changes_total", "counter"),
    ("node_network_speed_bytes", "gauge"),
    *((name, "counter") for name in DISK_METRICS),
    ("node_filesystem_avail_bytes", "gauge"),
    ("node_filesystem_size_bytes", "gauge"),
    *((name, "counter") for name in NFS_METRICS),
)
