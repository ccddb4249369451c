"""What an incident costs in GPU-hours: one definition for its page, the list, the API, the live
rows, the postmortem draft and /incidents/metrics/ (all through ``Incident.current_gpu_hours``).

GPU-hours lost = the sum of its findings' own figures + its GPUs out of service x its length:

* a finding that reports a figure of its own (``impact["gpu_hours"]``) adds it. The training
  detectors report one per kind: a hang (gang x time without progress), a straggler (the
  slowdown's share of the gang's compute), a data stall (stall time x gang), a failure (what it
  cost: progress lost + waiting to restart + re-initialisation + restore). A finding that fires
  again later adds its new episode's figure to the incident it joins; the engine keeps the sum
  (``Incident.gpu_hours_lost``) as findings report, so a finding that moves on never takes its
  earlier cost away from an incident;
* a finding that takes GPUs out of service and belongs to no job (a GPU fault, a silent node, an
  Alertmanager alert naming ``gpus``) charges those GPUs for the incident's length, each GPU once
  however many findings name it (``Incident.gpus_out_of_service``, as ``count_affected_gpus``
  counts). A GPU fault on a job's GPUs is the job's to price (its failure, or its work at risk);
* nothing else adds: work at risk (``gpu_hours_at_risk``: a checkpoint overdue, a GPU fault under a
  running job) is shown as at risk, never as lost; the gang a training finding names counts in
  the incident's GPUs affected, not in GPU-hours.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def reported_gpu_hours(impact: dict[str, Any] | None) -> float:
    """The GPU-hours lost a finding reports as its own (0 when it reports none)."""
    value = (impact or {}).get("gpu_hours")
    try:
        return max(float(value), 0.0) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def takes_gpus_out(impact: dict[str, Any] | None) -> bool:
    """Whether a finding charges GPUs out of service x time: it names GPUs (``gpu_uuids`` or
    ``gpus``), reports no figure of its own, and is not a job's (``unit`` job:..., or a GPU fault
    linked to a job, ``job_gpus``)."""
    impact = impact or {}
    if "gpu_hours" in impact or "job_gpus" in impact or str(impact.get("unit", "")).startswith("job:"):
        return False
    return bool(impact.get("gpu_uuids")) or bool(impact.get("gpus"))


def faulty_gpu_uuids(impact: dict[str, Any] | None) -> list[str]:
    """The GPUs a finding says are unfit to run work (capacity's "healthy" leaves them out): those
    a GPU, node or alert finding names, a GPU fault under a job included. A job's own finding (a
    straggler, a hang, a data stall: ``unit`` job:...) names the gang it slows, which is not broken."""
    impact = impact or {}
    if str(impact.get("unit", "")).startswith("job:"):
        return []
    return [str(u) for u in impact.get("gpu_uuids") or []]


def count_affected_gpus(impacts: Iterable[tuple[str, dict[str, Any] | None]]) -> int:
    """GPUs out of service, from (fingerprint, impact) pairs, counting each GPU once.

    A finding's impact names the physical GPUs it takes out (``gpu_uuids``: one GPU, or every GPU
    of a node that must drain), so the count is their union however node and GPU findings mix.
    A finding that names none (Alertmanager's, or one raised before findings named their GPUs)
    counts as before: ``gpus`` per ``unit`` (``node:<host>``, ``gpu:<uuid>``), each unit once,
    and nothing where a finding naming its GPUs already covers that unit.
    """
    named: set[str] = set()
    covered: set[str] = set()
    units: dict[str, int] = {}
    for fingerprint, impact in impacts:
        impact = impact or {}
        if "gpu_uuids" in impact:
            named.update(impact["gpu_uuids"])
            covered.add(impact.get("unit") or fingerprint)
        elif gpus := int(impact.get("gpus", 0)):
            unit = impact.get("unit") or fingerprint
            units[unit] = max(units.get(unit, 0), gpus)
    covered.update(f"gpu:{uuid}" for uuid in named)
    return len(named) + sum(gpus for unit, gpus in units.items() if unit not in covered)


def out_of_service(impacts: Iterable[tuple[str, dict[str, Any] | None]]) -> int:
    """GPUs out of service among (fingerprint, impact) pairs, each GPU once (count_affected_gpus
    over the findings that take GPUs out, takes_gpus_out)."""
    return count_affected_gpus((fp, impact) for fp, impact in impacts if takes_gpus_out(impact))


def at_risk_gpu_hours(findings: Iterable[Any]) -> float:
    """GPU-hours at risk in an incident: per job, the latest figure of its firing findings (a
    checkpoint overdue and a GPU fault under the same job report the same work at risk)."""
    per_job: dict[str, tuple[Any, float]] = {}
    for finding in findings:
        if finding.status != "firing":
            continue
        value = (finding.impact or {}).get("gpu_hours_at_risk")
        if value is None:
            continue
        key = str((finding.labels or {}).get("job") or finding.fingerprint)
        if key not in per_job or finding.last_seen > per_job[key][0]:
            per_job[key] = (finding.last_seen, float(value))
    return sum(value for _, value in per_job.values())


def finding_cost(finding: Any) -> dict[str, Any]:
    """A finding's own part of its incident's cost: the GPU-hours lost it reports (None where it
    reports none), the GPU-hours it says are at risk (None where none), and whether it charges
    GPUs out of service for the incident's length (how many)."""
    impact = finding.impact or {}
    gpus = out_of_service([(finding.fingerprint, impact)])
    return {
        "gpu_hours_lost": round(reported_gpu_hours(impact), 3) if "gpu_hours" in impact else None,
        "gpu_hours_at_risk": impact.get("gpu_hours_at_risk"),
        "gpus_out_of_service": gpus,
    }
