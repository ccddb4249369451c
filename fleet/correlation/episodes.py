"""A job's hangs and stalls with what its nodes' fabric and storage did meanwhile: the job page's
"Hangs and stalls" section and the ``episodes`` of its snapshot API.

Training may not import fabric or storage (siblings), so the join lives here, above all three, and
reaches the training page through the hooks training offers (fleet.training.views.
register_job_section, fleet.training.api.register_job_snapshot_part), wired in
fleet/correlation/plugins.py.

An episode is one of the job's findings that the cause link reads (fleet.correlation.causes): a
``training-hang``, a ``training-data-stall``, or a ``training-job-failed`` whose failure class is a
fabric one (an NCCL timeout). Its window runs from the finding's start minus the fabric detector's
window (fabric.detectors.WINDOW, 10 minutes: a flap that far before a hang is what names it as
the cause) to its clear, or now while it fires. Over that window, per node of the job:

* its compute-fabric ports that flapped (fabric.detectors.flapped_ports: the link-flap detector's
  own test, link downed or carrier changes rising or the state leaving Active, with when) or
  degraded (fabric.read.health.ports: errors over the link-degrading detector's limits, or a rate
  below the port's rated one), or are down at the window's end;
* its datasets and checkpoints mounts (storage.read.mounts: read throughput, I/O busy and free
  space over the window), each datasets file system judged by the starvation detector's own test
  (storage.detectors.starving over fs_window at the window's end; for data stalls only, the
  episodes storage can cause), a disk busy at or over the detector's line
  (storage.detectors.IO_SATURATED) marked saturated.

The cause, when the finding names one (``impact["caused_by"]``), links to its incident: the cause
finding's, else the episode's own (the engine puts both in one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone

from console.ranges import MINUTE, Window
from fleet.choices import Fabric, MountPurpose
from fleet.correlation.causes import job_hosts
from fleet.fabric import detectors as fabric_detectors
from fleet.fabric.read import health as fabric_health
from fleet.inventory.models import Node
from fleet.storage import detectors as storage_detectors
from fleet.storage import read as storage_read
from fleet.training.failures import FABRIC_CLASSES
from fleet.training.models import Job
from incidents.detectors import source_of
from incidents.models import Finding

LEAD = fabric_detectors.WINDOW  # the window opens this long before the hang or stall started
MOST = 20  # the job's latest episodes shown
KINDS = {
    "training-hang": "Hang",
    "training-data-stall": "Data stall",
    "training-job-failed": "Failure",
}
PURPOSES = (MountPurpose.DATASETS, MountPurpose.CHECKPOINTS)


def _kind(finding: Finding) -> str | None:
    """The episode's name, or None for a finding that is not one (a failure of another class)."""
    name = finding.source.removeprefix("detector:")
    if name == "training-job-failed" and (finding.impact or {}).get("failure_class") not in FABRIC_CLASSES:
        return None
    return KINDS.get(name)


def _findings(job: Job) -> list[Finding]:
    rows = (
        Finding.objects.filter(source__in=[source_of(n) for n in KINDS], labels__job=str(job.pk))
        .select_related("incident")
        .order_by("-started_at", "-pk")
    )
    return [f for f in rows[: MOST * 2] if _kind(f) is not None][:MOST]


def _incident_link(incident_id: int | None, title: str = "") -> dict[str, Any] | None:
    if incident_id is None:
        return None
    return {"id": incident_id, "title": title, "url": reverse("incidents:detail", args=[incident_id])}


def _cause(finding: Finding) -> dict[str, Any] | None:
    """The finding's cause (``impact["caused_by"]``) with the incident it sits in."""
    impact = finding.impact or {}
    fingerprint = str(impact.get("caused_by") or "")
    if not fingerprint:
        return None
    effect = impact.get("effect") or {}
    cause = Finding.objects.filter(fingerprint=fingerprint).select_related("incident").first()
    incident = cause.incident if cause is not None and cause.incident is not None else finding.incident
    return {
        "fingerprint": fingerprint,
        "headline": effect.get("headline", ""),
        "detail": effect.get("detail", ""),
        "summary": cause.summary if cause is not None else "",
        "incident": _incident_link(incident.pk, incident.title) if incident is not None else None,
    }


def _ports(win: Window, node_ids: list[int], hosts: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Per host, its compute ports that flapped, degraded or are down over the window."""
    flapped = {(host, name): when for host, name, _, when in fabric_detectors.flapped_ports(win.end, hosts, win.start)}
    out: dict[str, list[dict[str, Any]]] = {}
    for port in fabric_health.ports(win, node_ids=node_ids):
        if port["fabric"] != Fabric.COMPUTE:
            continue
        when = flapped.get((port["hostname"], port["name"]))
        down = port["reported"] and not port["up"]
        if when is None and not port["flapping"] and not port["degraded"] and not down:
            continue
        out.setdefault(port["hostname"], []).append(
            {
                **{k: port[k] for k in ("name", "kind", "flaps", "symbol_errors", "below_rate", "degraded", "state")},
                "flapped": when is not None or port["flapping"],
                "flapped_at": when,
                "down": down,
                "rate_bytes_per_second": port["rate_bytes_per_second"],
                "rated_bytes_per_second": port["rated_bytes_per_second"],
            }
        )
    return out


def _starving(end: datetime, systems: list[storage_detectors.FileSystem]) -> dict[int, str]:
    """Mount id -> why its datasets file system starves its readers at ``end`` ('' when not)."""
    out: dict[int, str] = {}
    for fs in systems:
        why = storage_detectors.starving(storage_detectors.fs_window(end, fs))
        for mount_id, _, _ in fs.mounts:
            out[mount_id] = why
    return out


def _mounts(
    win: Window, node_ids: list[int], systems: list[storage_detectors.FileSystem]
) -> dict[str, list[dict[str, Any]]]:
    """Per host, its datasets and checkpoints mounts over the window; the starvation verdict for
    the datasets file systems in ``systems`` (a disk read each, as the detector reads them)."""
    starving = _starving(win.end, systems)
    saturated = 100 * storage_detectors.IO_SATURATED
    out: dict[str, list[dict[str, Any]]] = {}
    for mount in storage_read.mounts(win, node_ids=node_ids, purposes=PURPOSES):
        busy = mount["io_busy_pct"]
        out.setdefault(mount["hostname"], []).append(
            {
                **{
                    k: mount[k]
                    for k in ("mountpoint", "fstype", "purpose", "read_bytes_per_second", "io_busy_pct", "free_pct")
                },
                "saturated": busy is not None and busy >= saturated,
                "low_free": mount["free_pct"] is not None and mount["free_pct"] < storage_read.LOW_FREE_PCT,
                "starving": starving.get(mount["id"], ""),
            }
        )
    return out


def _window(start: datetime, end: datetime) -> Window:
    """[start - LEAD, end): the whole minutes' rollup buckets before ``end`` (the minute under way
    is not over: its figures per second would read low)."""
    return Window(start=start - LEAD, end=end.replace(second=0, microsecond=0), preset=None, resolution=MINUTE)


def job_episodes(job: Job, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """The job's hangs, data stalls and NCCL failures, newest first (MOST at most), each with its
    window, incident, cause and its nodes' compute ports and datasets / checkpoints mounts over the
    window (see the module's docstring)."""
    now = now or timezone.now()
    findings = _findings(job)
    if not findings:
        return []
    hosts = job_hosts({job.pk}).get(job.pk, set())
    nodes = dict(Node.objects.filter(hostname__in=hosts).values_list("pk", "hostname"))
    node_ids = sorted(nodes)
    # The datasets file systems on its nodes (one query for every episode).
    systems = [fs for fs in storage_detectors.file_systems(MountPurpose.DATASETS) if hosts & set(fs.hosts)]
    episodes = []
    for finding in findings:
        end = finding.cleared_at or now
        win = _window(finding.started_at, end)
        ports = _ports(win, node_ids, hosts) if node_ids else {}
        # Starvation is what a data stall is judged against (causes.storage_causes): only its
        # episodes read the verdict, which costs a disk read per file system.
        judged = systems if finding.source == source_of("training-data-stall") else []
        mounts = _mounts(win, node_ids, judged) if node_ids else {}
        per_node = [
            {"hostname": host, "ports": ports.get(host, []), "mounts": mounts.get(host, [])} for host in sorted(hosts)
        ]
        incident = finding.incident
        episodes.append(
            {
                "finding_id": finding.pk,
                "kind": _kind(finding),
                "failure_class": (finding.impact or {}).get("failure_class"),
                "summary": finding.summary,
                "status": finding.status,
                "ongoing": finding.cleared_at is None,
                "started_at": finding.started_at,
                "cleared_at": finding.cleared_at,
                "window": {"from": win.start, "to": end},
                "gpu_hours": (finding.impact or {}).get("gpu_hours"),
                "incident": _incident_link(incident.pk, incident.title) if incident is not None else None,
                "cause": _cause(finding),
                "nodes": per_node,
                "troubled_ports": sum(len(n["ports"]) for n in per_node),
                "flapped_ports": sum(p["flapped"] for n in per_node for p in n["ports"]),
                "has_mounts": any(n["mounts"] for n in per_node),
                "starving_mounts": sum(bool(m["starving"]) or m["saturated"] for n in per_node for m in n["mounts"]),
            }
        )
    return episodes


def job_section(job: Job) -> dict[str, Any]:
    """The job page's section context."""
    return {"episodes": job_episodes(job), "lead_minutes": int(LEAD.total_seconds() // 60)}
