"""The demo's node_exporter (fleet.telemetry.node_simulator): its scrapes pass the real Prometheus
door with nothing ignored, its figures stay within what the hardware carries, and coupled to the
training simulator's scenarios as the simulate command couples them, the scripted hang and data
stall each land in one incident with the fabric or storage fault under them."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from console.models import AgentToken
from fleet import exporters
from fleet.correlation.causes import FABRIC_EFFECT, STORAGE_EFFECT
from fleet.ingest.batches import parse_gpu_batch
from fleet.management.commands.simulate import Command as SimulateCommand
from fleet.models import NodeInterface, NodeMount, PortRollup1m, Site
from fleet.telemetry.node_simulator import (
    IB_ACTIVE,
    IB_DOWN,
    SCRIPTED_FLAP_PORT,
    NodeExporterSimulator,
)
from fleet.telemetry.simulator import DEFAULT_SITES, FleetSimulator, build_fleet
from fleet.telemetry.store import store_gpu_samples
from fleet.training.simulator import TrainingSimulator
from incidents.detectors import run_detectors
from incidents.models import Incident

from .node_exporter import fixture_samples, roll

DETECTORS = [
    "training-hang",
    "training-data-stall",
    "training-job-failed",
    "fabric-link-flap",
    "fabric-link-degrading",
    "fabric-rdma-congestion",
    "storage-starvation",
    "storage-checkpoint-full",
]


class Sender:
    """Posts as fleet.telemetry.simulator.Poster does (JSON and Prometheus text, with the site's
    agent token), through Django's test client."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.client, self.tokens = Client(), tokens
        self.answers: list[tuple[int, Any]] = []

    def _auth(self, site: str) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.tokens[site]}"}

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any:
        return self.client.post(url, json.dumps(body), content_type="application/json", **self._auth(site))

    def send_text(self, site: str, url: str, text: str) -> Any:
        response = self.client.post(url, text, content_type="text/plain; version=0.0.4", **self._auth(site))
        self.answers.append((response.status_code, response.json() if response.content else None))
        roll()  # the node rollups' beat task
        return response


def _fleet() -> dict[str, list[Any]]:
    return build_fleet(DEFAULT_SITES, gpu_limit=None, seed=5)


def _sites() -> tuple[dict[str, int], Sender]:
    ids, tokens = {}, {}
    for spec in DEFAULT_SITES:
        site = Site.objects.create(name=spec.name, region=spec.region, contracted_power_kw=spec.contracted_power_kw)
        ids[spec.name] = site.pk
        tokens[spec.name] = AgentToken.issue(site=site, name="simulator")[1]
    return ids, Sender(tokens)


def _start() -> datetime:
    # Whole minutes, far enough back that the simulated run ends before now.
    return timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=40)


def _counters(text: str) -> dict[tuple[str, str, str], float]:
    """(metric, hostname, device/port or mountpoint) -> value, read from the text by a plain split."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, rest = line.split("{", 1)
        labels = dict(pair.split("=", 1) for pair in rest.split("}")[0].split(","))
        labels = {k: v.strip('"') for k, v in labels.items()}
        if "export" in labels:  # mountstats: per export
            where = labels["export"]
        else:
            where = labels.get("mountpoint") or (labels["device"] + ("/" + labels["port"] if "port" in labels else ""))
        out[(name, labels["hostname"], where)] = float(rest.split("} ")[1].split()[0])
    return out


def _scrape(sim: NodeExporterSimulator, start: datetime, seconds: float, hosts: list[str]) -> str:
    end = start + timedelta(seconds=seconds)
    nodes = [sim.nodes[h] for h in hosts]
    figures = {n.hostname: sim.figures(n, start, end) for n in nodes}
    for n in nodes:
        sim.advance(n, figures[n.hostname], start, end)
    return sim.exposition(nodes, figures, end)


def test_every_series_it_prints_is_one_the_console_maps_and_names_node_exporter_prints() -> None:
    sim = NodeExporterSimulator(_fleet(), seed=5)
    text = _scrape(sim, _start(), 15, sorted(sim.nodes)[:2])
    printed = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    node_series = set(exporters.families(exporters.NODE))  # fabric's and storage's entries in the table
    assert printed <= node_series, printed - node_series
    # The names and labels are node_exporter's own (the fixture is written from its collectors).
    documented = {name for name, _, _ in fixture_samples("node_")}
    assert printed <= documented, printed - documented


@pytest.mark.django_db
def test_a_sites_scrape_through_the_door_registers_every_port_and_mount_and_ignores_nothing() -> None:
    _, sender = _sites()
    fleet = _fleet()
    sim = NodeExporterSimulator(fleet, seed=5, stamped=True, activity=lambda host, at: {"work": 1.0})
    start = _start()  # once: a minute boundary crossed between two reads would look up the wrong bucket
    assert sim.tick(start, sender) == len([s for s in DEFAULT_SITES if fleet.get(s.name)])
    assert {status for status, _ in sender.answers} == {202}
    assert all(body["ignored"] == 0 for _, body in sender.answers), sender.answers
    hosts = {n.hostname: n for n in sim.nodes.values()}
    assert NodeInterface.objects.count() == sum(len(n.ports) for n in hosts.values())
    assert NodeMount.objects.count() == sum(len(n.mounts) for n in hosts.values())
    # Each InfiniBand port at its link's rate, on the compute fabric; the datasets RAID and the
    # checkpoint file system with their purposes guessed from their paths.
    ib = NodeInterface.objects.filter(kind="ib")
    assert ib.count() == 8 * sum(1 for n in hosts.values() if n.workload == "training")
    assert set(ib.values_list("fabric", flat=True)) == {"compute"}
    assert set(ib.values_list("rate_bytes_per_second", flat=True)) == {50e9, 25e9} - (
        set() if any("A100" in n.hostname and n.workload == "training" for n in hosts.values()) else {25e9}
    )
    purposes = dict(NodeMount.objects.values_list("mountpoint", "purpose").distinct())
    assert purposes["/data"] == "datasets" and purposes["/mnt/checkpoints"] == "checkpoints"
    # The first tick also pushed the scrape an interval before: the run's first minute already
    # carries traffic (an increase needs two samples), at a working job's share of the link.
    first = PortRollup1m.objects.filter(quantity="receive_bytes", bucket=start, interface__kind="ib").select_related(
        "interface"
    )
    assert first.count() == ib.count()
    assert all(0.15 * 50e9 * 15 <= r.increase <= 50e9 * 15 for r in first if r.interface.rate_bytes_per_second == 50e9)


def test_figures_stay_within_what_the_hardware_carries() -> None:
    sim = NodeExporterSimulator(_fleet(), seed=5, activity=lambda host, at: {"work": 1.0})
    start = _start()
    for k in range(30):  # half an hour of minutes, prefetches included
        t = start + timedelta(minutes=k)
        for node in sim.nodes.values():
            f = sim.figures(node, t, t + timedelta(minutes=1))
            for port in node.ports:
                rates = f.port_rates[port.name]
                assert rates["receive_bytes"] <= port.rate and rates["transmit_bytes"] <= port.rate
            for disk in node.disks:
                rates = f.disk_rates[disk.device]
                assert rates["read_bytes"] <= disk.max_read and 0 <= rates["io_time_seconds"] <= 1
            for mount in node.mounts:
                assert 0 < f.free[mount.mountpoint] < mount.size


def test_a_datasets_raid_peaks_above_a_training_servers_need_except_on_the_underprovisioned_site() -> None:
    from fleet.storage.read import NEED_BYTES_PER_SECOND

    sim = NodeExporterSimulator(_fleet(), seed=5, activity=lambda host, at: {"work": 1.0})
    start = _start()
    peaks: dict[str, list[float]] = defaultdict(list)
    for node in sim.nodes.values():
        if node.workload == "training":
            reads = [
                sim.figures(node, t, t + timedelta(minutes=1)).disk_rates["md0"]["read_bytes"]
                for t in (start + timedelta(minutes=k) for k in range(60))
            ]
            peaks[node.site].append(max(reads))
    assert min(peaks["ams-1"]) >= NEED_BYTES_PER_SECOND[0]
    assert max(peaks["iad-2"]) < NEED_BYTES_PER_SECOND[0]


def test_a_flap_takes_the_port_down_once_and_a_slow_raid_saturates() -> None:
    sim = NodeExporterSimulator(_fleet(), seed=5, activity=lambda host, at: {"work": 1.0})
    host = next(n.hostname for n in sim.nodes.values() if n.workload == "training")
    start = _start()
    before = _counters(_scrape(sim, start, 15, [host]))
    sim.flap(host, SCRIPTED_FLAP_PORT, start + timedelta(seconds=20))
    sim.slow([host], start + timedelta(seconds=30), start + timedelta(minutes=5))
    during = _counters(_scrape(sim, start + timedelta(seconds=15), 15, [host]))
    key = ("node_infiniband_link_downed_total", host, SCRIPTED_FLAP_PORT)
    assert during[key] == before[key] + 1
    assert during[("node_infiniband_state_id", host, SCRIPTED_FLAP_PORT)] == IB_DOWN
    other = ("node_infiniband_state_id", host, "mlx5_0/1")
    assert during[other] == IB_ACTIVE
    later = _counters(_scrape(sim, start + timedelta(minutes=2), 60, [host]))
    assert later[key] == during[key] and later[("node_infiniband_state_id", host, SCRIPTED_FLAP_PORT)] == IB_ACTIVE
    # Saturated: busy 99 % of the time, reading a third of what it did.
    busy = ("node_disk_io_time_seconds_total", host, "md0")
    assert (later[busy] - during[busy]) / 60 > 0.9
    # The checkpoint file system's mountstats: checkpoints written, 1 MiB READs at about 2 ms.
    export = next(m.device for m in sim.nodes[host].mounts if m.nfs)
    written = ("node_mountstats_nfs_total_write_bytes_total", host, export)
    assert 5e7 < (later[written] - during[written]) / 60 < 5e8
    ops, spent = (
        later[(f"node_mountstats_nfs_operations_{q}_total", host, export)]
        for q in ("requests", "response_time_seconds")
    )
    assert spent / ops == pytest.approx(0.002)


def test_a_hung_or_idle_node_carries_no_collective_traffic() -> None:
    phase = {"work": 1.0}
    sim = NodeExporterSimulator(_fleet(), seed=5, activity=lambda host, at: phase)
    node = next(n for n in sim.nodes.values() if n.workload == "training")
    start = _start()
    working = sim.figures(node, start, start + timedelta(minutes=1)).port_rates["mlx5_0/1"]["receive_bytes"]
    phase.clear()
    phase["hung"] = 1.0
    hung = sim.figures(node, start, start + timedelta(minutes=1))
    assert working > 5e9 and hung.port_rates["mlx5_0/1"]["receive_bytes"] < 1e5
    assert hung.disk_rates["md0"]["read_bytes"] == 0


@pytest.mark.django_db
def test_the_scripted_hang_and_stall_each_land_in_one_incident_with_the_fault_under_them() -> None:
    """The simulate command's coupling, on a simulated clock: the hang job's compute port flaps
    just before it hangs; the stall job's datasets RAID saturates just before its loader starves."""
    ids, sender = _sites()
    fleet = _fleet()
    fleet_sim = FleetSimulator(fleet, fault_rate_per_gpu_hour=0, interval=60, seed=5)
    training = TrainingSimulator(fleet_sim, sender, jobs=8, seed=5, failure_rate_per_gpu_hour=0.0)
    nodes = NodeExporterSimulator(fleet, seed=5, interval=60, stamped=True, activity=training.node_activity)
    start = _start()
    for m in range(16):
        now = start + timedelta(minutes=m)
        for site, samples in fleet_sim.batches(now).items():
            if samples:
                batch = parse_gpu_batch(json.dumps({"samples": samples}).encode(), now=now)
                store_gpu_samples(site_id=ids[site], batch_key=f"{site}:{now}", samples=batch.samples)
        training.tick(now)
        if m == 0:
            SimulateCommand()._script_node_faults(nodes, training)
        nodes.tick(now, sender)
        run_detectors(now=now, only=DETECTORS)
    assert {status for status, _ in sender.answers} == {202}
    hang = next(j for j in training.jobs if j.scenario in ("hang", "hang-done"))
    stall = next(j for j in training.jobs if j.scenario == "stall")
    fabric = Incident.objects.get(findings__source="detector:training-hang")
    sources = set(fabric.findings.values_list("source", flat=True))
    assert {"detector:fabric-link-flap", "detector:training-hang"} <= sources
    assert fabric.title.startswith(f"{FABRIC_EFFECT}: {hang.name}")
    assert f"{hang.nodes[0]} {SCRIPTED_FLAP_PORT}" in fabric.title
    storage = Incident.objects.get(findings__source="detector:training-data-stall")
    assert {"detector:storage-starvation", "detector:training-data-stall"} <= set(
        storage.findings.values_list("source", flat=True)
    )
    assert storage.title.startswith(f"{STORAGE_EFFECT}: {stall.name}")
    # No fault the script did not make: no congestion, no degrading link, no other flap.
    assert not Incident.objects.filter(findings__source__in=["detector:fabric-rdma-congestion"]).exists()
    assert not Incident.objects.filter(findings__source="detector:fabric-link-degrading").exists()
    assert Incident.objects.filter(findings__source="detector:fabric-link-flap").count() == 1
