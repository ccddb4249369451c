"""Silence detectors: who stopped reporting, judged against when the console last heard from
the level above (the console itself, a site, a node), so that the console's own outage, a
site's network or a node's agent is one finding about that, not one per GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import redis
from django.conf import settings
from django.core.cache import cache
from django.db.models import F, Max, Min

from fleet.choices import ScrapeHealth
from fleet.telemetry.detectors import SILENT_HORIZON, gpu_finding, gpu_rows, node_impact
from fleet.telemetry.models import GpuState, IngestBatch, ScrapeTarget
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector

# Where ingest-silent remembers its previous run, and since when the runs have been steady.
DETECTOR_LOOP_KEY = "fleet:ingest-silent:loop"


# How long the oldest batch the console accepted has waited for a writer, in seconds (None when
# nothing waits): the ingest room registers its queue's probe (fleet.ingest.stream) at start-up.
BacklogProbe = Callable[[], float | None]
_backlog_probes: list[BacklogProbe] = []


def register_backlog_probe(probe: BacklogProbe) -> None:
    """Let silence judge the console's own ingest backlog (see ``_ingest_behind``)."""
    if probe not in _backlog_probes:
        _backlog_probes.append(probe)


@dataclass(frozen=True)
class _Silence:
    """Who went quiet, each judged against when the console last heard from the level above."""

    settled: bool  # the console has been receiving steadily for the last gap: silence can be judged
    findings: list[FindingSpec]
    sites: frozenset[str]  # sites silent as a whole
    nodes: frozenset[str]  # nodes silent as a whole


def _ingest_settled(now: datetime, gap: timedelta) -> bool:
    """Whether the console has been receiving without a hole longer than ``gap`` since ``now -
    gap``. After an outage of the console (or of its ingest), agents flush their backlogs one by
    one: until they have had the time to, a node not yet heard from is late, not silent."""
    received = IngestBatch.objects.order_by()
    before = received.filter(received_at__lte=now - gap).aggregate(t=Max("received_at"))["t"]
    after = received.filter(received_at__gt=now - gap, received_at__lte=now).aggregate(t=Min("received_at"))["t"]
    return before is not None and after is not None and after - before <= gap and not _ingest_behind(gap)


def _ingest_behind(gap: timedelta) -> bool:
    """Whether GPU batches the console accepted have waited for a writer for more than a third
    of the gap: its own backlog (a writer killed mid-batch holds its batches until they are
    reclaimed, a minute), during which a site whose batches wait in the queue is not silent. The
    queue's age is on Redis's own clock, whatever ``now`` the run judges."""
    if settings.EAGER_TASKS:  # embedded mode writes at once: nothing waits
        return False
    try:
        waits = [probe() for probe in _backlog_probes]
    except redis.RedisError:  # the queue cannot be read: neither can who was heard be judged
        return True
    return any(waited is not None and waited > gap.total_seconds() / 3 for waited in waits)


@lru_cache(maxsize=2)
def _silence(now: datetime) -> _Silence:
    """Silence, judged level by level against the level above, never against our own clock
    alone: an outage of the console is not an outage of every GPU.

    1. A site is silent when the console heard from other sites but not from it for the gap.
    2. A node is silent when its site's agents were heard but not about this node: one finding
       for the node, not one per GPU.
    3. A GPU is silent when its node's other GPUs report samples newer than its last by the gap.

    "Heard" is when the console stored something (the state's updated_at: the writer's
    transaction time, the same clock as IngestBatch.received_at); a GPU against its own node
    compares sample times, from the one agent's clock.
    """
    gap = timedelta(seconds=3 * settings.FLEET_SAMPLE_INTERVAL_SECONDS)
    # GPU telemetry as a whole must be arriving: serving points claim batch keys too, and a fleet
    # whose every GPU went quiet is ingest-silent's finding, judged by GPU telemetry alone.
    gpu_heard = _gpu_heard(now)
    if not _ingest_settled(now, gap) or gpu_heard is None or now - gpu_heard > gap:
        return _Silence(False, [], frozenset(), frozenset())
    states = list(
        GpuState.objects.filter(updated_at__gte=now - SILENT_HORIZON, updated_at__lte=now, gpu__parent__isnull=True)
        .values("gpu_id", "ts", "updated_at", hostname=F("gpu__node__hostname"), site=F("gpu__node__site__name"))
        .order_by("gpu_id")
    )
    if not states:
        return _Silence(True, [], frozenset(), frozenset())
    heard = max(s["updated_at"] for s in states)
    site_heard: dict[str, datetime] = {}
    node_heard: dict[str, datetime] = {}
    node_newest: dict[str, datetime] = {}
    for s in states:
        site_heard[s["site"]] = max(site_heard.get(s["site"], s["updated_at"]), s["updated_at"])
        node_heard[s["hostname"]] = max(node_heard.get(s["hostname"], s["updated_at"]), s["updated_at"])
        node_newest[s["hostname"]] = max(node_newest.get(s["hostname"], s["ts"]), s["ts"])
    silent_sites = {site for site, t in site_heard.items() if heard - t > gap}
    silent_nodes = {
        s["hostname"]
        for s in states
        if s["site"] not in silent_sites and site_heard[s["site"]] - node_heard[s["hostname"]] > gap
    }
    # A node scraped through a target that is down: the target's finding says so (scrape-target-down).
    covered = silent_nodes & set(_down_targets(now).values_list("hostname", flat=True))
    silent_gpus = [
        s
        for s in states
        if s["site"] not in silent_sites
        and s["hostname"] not in silent_nodes
        and node_newest[s["hostname"]] - s["ts"] > gap
    ]
    one_per_node = {s["hostname"]: s["gpu_id"] for s in states if s["hostname"] in silent_nodes - covered}
    gpus = gpu_rows([*(s["gpu_id"] for s in silent_gpus), *one_per_node.values()])
    findings = []
    for site in sorted(silent_sites):
        count = sum(1 for s in states if s["site"] == site)
        findings.append(
            FindingSpec(
                fingerprint=f"silent-site:{site}",
                labels={"site": site},
                severity=Severity.SEV2,
                summary=f"Site {site} silent: nothing received from it since {site_heard[site]:%H:%M:%S} UTC",
                description="The console hears from other sites: the site's agents or its network are down.",
                impact={"gpus": count, "unit": f"site:{site}"},
                category="gpu-health",
                started_at=site_heard[site],
            )
        )
    for hostname in sorted(one_per_node):
        gpu = gpus[one_per_node[hostname]]
        findings.append(
            FindingSpec(
                fingerprint=f"silent-node:{hostname}",
                labels={
                    "site": gpu["site"],
                    "hostname": hostname,
                    **({"rack": gpu["rack"]} if gpu["rack"] else {}),
                },
                severity=Severity.SEV3,
                summary=f"{hostname} silent: no sample from its {gpu['node_gpu_count']} GPUs since "
                f"{node_newest[hostname]:%H:%M:%S} UTC",
                description="Its site's other nodes report: the node, its agent or its network is down.",
                impact=node_impact(gpu),
                category="gpu-health",
                started_at=node_newest[hostname],
            )
        )
    for s in silent_gpus:
        g = gpus[s["gpu_id"]]
        findings.append(
            gpu_finding(
                g,
                "silent",
                severity=Severity.SEV3,
                summary=f"{g['hostname']} GPU {g['index']} silent since {s['ts']:%H:%M:%S} UTC",
                started_at=s["ts"],
            )
        )
    return _Silence(True, findings, frozenset(silent_sites), frozenset(silent_nodes))


def _silence_judged(now: datetime, labels: dict[str, Any]) -> bool:
    """A silence finding clears when its sender is heard again, not while the console cannot
    judge (its own ingest unsettled) nor while a wider silence covers it."""
    silence = _silence(now)
    if not silence.settled or labels.get("site") in silence.sites:
        return False
    return not (labels.get("gpu") and labels.get("hostname") in silence.nodes)


@detector("gpu-silent", judged=_silence_judged)
def gpu_silent(now: datetime) -> list[FindingSpec]:
    """Sites, nodes and GPUs that stopped reporting while the rest of the fleet did not (see
    _silence), heard from within a day (not decommissioned).

    Physical GPUs only: a MIG instance that stops reporting while its GPU reports was destroyed
    or reconfigured, not lost; and when the GPU itself goes quiet, its own finding says so.
    """
    return _silence(now).findings


def _down_targets(now: datetime) -> Any:
    return ScrapeTarget.objects.filter(
        enabled=True, health=ScrapeHealth.DOWN, last_scrape_at__gte=now - SILENT_HORIZON
    ).select_related("site")


@detector("scrape-target-down")
def scrape_target_down(now: datetime) -> list[FindingSpec]:
    """A scrape target whose last scrape failed: one finding for the target, not one per GPU
    behind it (their silence is this). Labelled with its host where it has one, so it joins that
    node's incident."""
    specs = []
    for target in _down_targets(now):
        labels = {"site": target.site.name, "target": target.name}
        if target.hostname:
            labels["hostname"] = target.hostname
        specs.append(
            FindingSpec(
                fingerprint=f"scrape-down:{target.site.name}/{target.name}",
                labels=labels,
                severity=Severity.SEV4,
                summary=f"Scrape target {target.name} ({target.url}) down: {target.last_error}"[:500],
                category="scrape",
            )
        )
    return specs


def _gpu_heard(now: datetime) -> datetime | None:
    """When the console last stored GPU telemetry (any GPU's state), up to ``now``. Not any
    IngestBatch: serving points claim batch keys too, and must not hide a silence of every GPU."""
    return GpuState.objects.filter(updated_at__lte=now).aggregate(t=Max("updated_at"))["t"]


def _ingest_heard(now: datetime, labels: dict[str, Any]) -> bool:
    """The console's own silence clears only when it stores GPU telemetry again (not when a day
    has passed)."""
    gap = timedelta(seconds=3 * settings.FLEET_SAMPLE_INTERVAL_SECONDS)
    return GpuState.objects.filter(updated_at__gt=now - gap, updated_at__lte=now).exists()


def _detector_loop_steady(now: datetime, gap: timedelta) -> bool:
    """Whether this detector has run steadily (no two runs more than ``gap`` apart) for at least
    ``gap`` up to ``now``; records this run. After a restart of the console (or of its beat) the
    agents have not yet had the time to post: until they have, no telemetry is late, not lost,
    and a restart must not page."""
    last, since = cache.get(DETECTOR_LOOP_KEY) or (None, None)
    if last is None or not timedelta(0) <= now - last <= gap:
        since = now  # the first run, or the first after the loop stopped: the console was down
    cache.set(DETECTOR_LOOP_KEY, (now, since), timeout=int(SILENT_HORIZON.total_seconds()))
    return now - since >= gap


@detector("ingest-silent", judged=_ingest_heard)
def ingest_silent(now: datetime) -> list[FindingSpec]:
    """The console stored no GPU telemetry for three reporting intervals, while GPUs reported
    within the day and the detector loop has been running for as long: an outage or backlog of
    the console's ingest, or every GPU source down; one finding about that, not one per GPU."""
    gap = timedelta(seconds=3 * settings.FLEET_SAMPLE_INTERVAL_SECONDS)
    if not _detector_loop_steady(now, gap):
        return []
    last = _gpu_heard(now)
    if last is None or now - last <= gap or now - last > SILENT_HORIZON:
        return []
    return [
        FindingSpec(
            fingerprint="ingest-silent:console",
            labels={"component": "ingest"},
            severity=Severity.SEV2,
            summary=f"The console has stored no GPU telemetry since {last:%H:%M:%S} UTC",
            description=(
                "No GPU sample from any agent, push or scrape: the console's ingest (web, broker or workers) is "
                "down or backlogged, or every GPU source is. GPUs are not judged silent while it is."
            ),
            category="console",
            started_at=last,
        )
    ]
