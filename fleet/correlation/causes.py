"""One cause, one incident, every job it hit: the join between rooms that never import each other.

Fabric (a link flap) and training (a hung job) are siblings: neither may import the other, so
the join lives here, in a room above both (``fleet.ingest`` and this room are the only rooms that
see both). It works through the incident engine's generic cause link (incidents.services.engine):

* a training hang, or a failure whose reason is a fabric class (failures.classify in
  FABRIC_CLASSES: an NCCL timeout), on a job whose nodes' compute-fabric ports flapped between
  the job's fault start minus the fabric window and now, names the flap's finding as its cause
  (``impact["caused_by"]``: the fabric finding's fingerprint, which fabric.detectors.fingerprint
  computes from site, node and port, so it can be named before the fabric detector has run) and
  says so (``impact["effect"]``: "Fabric fault → job hang", the job's name, the flap);
* the engine then puts it in the flap's incident, whichever was raised first, and adds the job's
  GPU-hours lost (the hang's or the failure's own figure) to that incident's.

The same mechanism joins storage: a data-stall finding on a job whose nodes mount a datasets
file system that starves now (storage.detectors' own test on its ``fs_window``: a local disk
saturated, an NFS mount's READs slowed to 50 ms, or its reads halved) names that file system's
starvation finding as its cause (``storage_causes``), with the headline "Storage stall → data
stall"; the starvation finding, raised once the stall fires, joins the same incident, whose
GPU-hours are the stalled jobs' own.

Also here: which nodes hold a running gang job, for the flap detector's severity
(fabric.detectors.register_gang_lookup), read from training's candidate jobs.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from fleet.choices import JobState, MountPurpose
from fleet.fabric import detectors as fabric
from fleet.storage import detectors as storage
from fleet.training import detectors as training
from fleet.training.failures import FABRIC_CLASSES
from fleet.training.models import Job
from incidents.detectors import FindingSpec

FABRIC_EFFECT = "Fabric fault → job hang"
STORAGE_EFFECT = "Storage stall → data stall"


def gang_hosts(now: datetime, hostnames: set[str]) -> set[str]:
    """Those of these hosts running a training job that spans more than one node."""
    if not hostnames:
        return set()
    jobs = training.candidate_jobs(now, hostnames=hostnames)
    return {
        host for job in jobs if job.state == JobState.RUNNING and len(job.hostnames) > 1 for host in job.hostnames
    } & hostnames


def job_hosts(job_ids: set[int]) -> dict[int, set[str]]:
    """Each job's hosts: its nodes, and the nodes of the GPUs it names."""
    out: dict[int, set[str]] = {}
    jobs = Job.objects.filter(pk__in=job_ids)
    for pk, host in list(jobs.values_list("pk", "nodes__hostname")) + list(
        jobs.values_list("pk", "gpus__node__hostname")
    ):
        if host:
            out.setdefault(pk, set()).add(host)
    return out


def _fabric_effect(spec: FindingSpec) -> bool:
    if spec.final or not spec.labels.get("job"):
        return False
    if spec.fingerprint.startswith("training-hang:"):
        return True
    return spec.fingerprint.startswith("training-job-failed:") and spec.impact.get("failure_class") in FABRIC_CLASSES


def fabric_causes(now: datetime, specs: list[FindingSpec]) -> list[FindingSpec]:
    """Hang and NCCL-failure findings on jobs whose nodes' compute links flapped in the window,
    naming the flap as their cause."""
    effects = [s for s in specs if _fabric_effect(s)]
    if not effects:
        return specs
    hosts = job_hosts({int(s.labels["job"]) for s in effects})
    out = []
    for spec in specs:
        on = hosts.get(int(spec.labels["job"]), set()) if spec in effects else set()
        flaps = fabric.flapped_ports(now, on, (spec.started_at or now) - fabric.WINDOW) if on else []
        if not flaps:
            out.append(spec)
            continue
        host, interface, cause, _ = flaps[0]
        detail = f"link flap on {host} {interface}"
        name = spec.labels.get("job_name", spec.labels["job"])
        out.append(
            dataclasses.replace(
                spec,
                summary=f"{FABRIC_EFFECT}: {name} ({detail}); {spec.summary}",
                description=f"{spec.description} Its nodes' compute link flapped first: {detail}.".strip(),
                impact={
                    **spec.impact,
                    "caused_by": cause,
                    "effect": {"headline": FABRIC_EFFECT, "name": name, "detail": detail},
                    "flapped": [f"{h} {i}" for h, i, _, _ in flaps],
                },
            )
        )
    return out


def _caused(spec: FindingSpec, headline: str, cause: str, detail: str, **extra: object) -> FindingSpec:
    name = spec.labels.get("job_name", spec.labels["job"])
    return dataclasses.replace(
        spec,
        summary=f"{headline}: {name} ({detail}); {spec.summary}",
        description=f"{spec.description} Underneath: {detail}.".strip(),
        impact={
            **spec.impact,
            "caused_by": cause,
            "effect": {"headline": headline, "name": name, "detail": detail},
            **extra,
        },
    )


def storage_causes(now: datetime, specs: list[FindingSpec]) -> list[FindingSpec]:
    """Data-stall findings on jobs whose nodes mount a datasets file system that starves now,
    naming that file system's starvation finding as their cause."""
    effects = [
        s for s in specs if s.fingerprint.startswith("training-data-stall:") and not s.final and s.labels.get("job")
    ]
    if not effects:
        return specs
    hosts = job_hosts({int(s.labels["job"]) for s in effects})
    systems = [fs for fs in storage.file_systems(MountPurpose.DATASETS) if fs.hosts]
    starving: dict[str, str] = {}  # fingerprint -> why, each file system judged once
    out = []
    for spec in specs:
        on = hosts.get(int(spec.labels["job"]), set()) if spec in effects else set()
        cause = None
        for fs in systems:
            if not on & set(fs.hosts):
                continue
            fingerprint = fs.fingerprint("storage-starvation")
            if fingerprint not in starving:
                starving[fingerprint] = storage.starving(storage.fs_window(now, fs))
            if starving[fingerprint]:
                cause = (fingerprint, f"{fs.name()}: {starving[fingerprint]}")
                break
        out.append(spec if cause is None else _caused(spec, STORAGE_EFFECT, cause[0], cause[1]))
    return out
