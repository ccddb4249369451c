"""The engine's generic cause link (``impact["caused_by"]``): effects join their cause's incident
whichever is raised first, the incident is titled after the effects, and their GPU-hours add up.
Labels and fingerprints only: nothing here knows a fabric or a mount."""

from __future__ import annotations

import pytest

from incidents.models import Incident
from incidents.services.engine import raise_finding

pytestmark = pytest.mark.django_db

CAUSE = "storage-mount-starving:ams-1:gpu-a-001:/datasets"


def effect(job: str, hours: float) -> dict:
    return {
        "gpu_hours": hours,
        "unit": f"job:{job}",
        "caused_by": CAUSE,
        "effect": {"headline": "Storage stall → data stall", "name": f"job-{job}", "detail": "/datasets starving"},
    }


def test_cause_first_then_two_effects_make_one_incident_with_both_jobs_gpu_hours() -> None:
    raise_finding(CAUSE, {"node": "gpu-a-001", "mount": "/datasets"}, "SEV3", "Mount /datasets starving")
    raise_finding("stall:1", {"job": "1"}, "SEV3", "Data stall on job-1", impact=effect("1", 2.0))
    raise_finding("stall:2", {"job": "2"}, "SEV3", "Data stall on job-2", impact=effect("2", 3.0))
    incident = Incident.objects.get()
    assert incident.findings.count() == 3
    assert incident.title == "Storage stall → data stall: job-1, job-2 (/datasets starving)"
    assert incident.gpu_hours_lost == pytest.approx(5.0) and incident.gpus_out_of_service == 0


def test_an_effect_first_waits_for_its_cause_and_an_unrelated_finding_stays_apart() -> None:
    raise_finding("stall:1", {"job": "1"}, "SEV3", "Data stall on job-1", impact=effect("1", 2.0))
    waiting = Incident.objects.get()
    assert waiting.group_key == f"cause={CAUSE}"
    raise_finding("stall:9", {"job": "9"}, "SEV3", "Data stall on job-9", impact={"gpu_hours": 1.0})
    raise_finding(CAUSE, {"node": "gpu-a-001", "mount": "/datasets"}, "SEV3", "Mount /datasets starving")
    assert Incident.objects.count() == 2
    waiting.refresh_from_db()
    assert waiting.findings.count() == 2 and waiting.gpu_hours_lost == pytest.approx(2.0)
    assert waiting.title.startswith("Storage stall → data stall: job-1")
