"""Read models for the incident pages, the overview and the live `incidents` topic."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max
from django.utils import timezone

from incidents.choices import Severity
from incidents.models import Incident

OVERLAP = timedelta(seconds=2)


def incident_row(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.pk,
        "title": incident.title,
        "severity": incident.severity,
        "state": incident.state,
        "category": incident.category,
        "site": incident.labels.get("site", ""),
        "labels": incident.labels,
        "started_at": incident.started_at.isoformat(),
        "detected_at": incident.detected_at.isoformat(),
        "resolved_at": incident.resolved_at.isoformat() if incident.resolved_at else None,
        "gpu_hours": round(incident.current_gpu_hours(), 2),
        "commander": incident.commander.get_username() if incident.commander_id else None,
        "url": incident.get_absolute_url(),
        "updated_at": incident.updated_at.isoformat(),
    }


def open_counts() -> dict[str, int]:
    counts = dict(Incident.objects.open().values_list("severity").annotate(n=Count("pk")).values_list("severity", "n"))
    return {sev.value: counts.get(sev.value, 0) for sev in Severity}


def build_incidents_delta(topic: str, watermark: str | None) -> tuple[dict[str, Any], str | None]:
    since = datetime.fromisoformat(watermark) - OVERLAP if watermark else timezone.now() - timedelta(minutes=5)
    newest = Incident.objects.aggregate(m=Max("updated_at"))["m"]
    changed = Incident.objects.filter(updated_at__gt=since).select_related("commander").order_by("-detected_at")[:200]
    payload = {
        "type": "incidents.delta",
        "topic": topic,
        "ts": timezone.now().isoformat(),
        "open": open_counts(),
        "incidents": [incident_row(i) for i in changed],
    }
    return payload, newest.isoformat() if newest else watermark


def overview_context() -> dict[str, Any]:
    open_incidents = Incident.objects.open().select_related("commander").order_by("severity", "-detected_at")[:8]
    return {"open_counts": open_counts(), "open_incidents": open_incidents}


def mttx_by_severity_and_month(since: datetime) -> list[dict[str, Any]]:
    """MTTD (fault start to detection), MTTA (detection to acknowledgement) and MTTR (detection to
    resolution) in minutes, by severity and month of detection.

    Here and below, an incident merged into another is not counted: its fault lives on in the
    target (whose start it took), and its closing time is the merge, not a recovery."""
    rows: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: {"mttd": [], "mtta": [], "mttr": []})
    for incident in Incident.objects.filter(detected_at__gte=since, merged_into__isnull=True).only(
        "severity", "started_at", "detected_at", "acknowledged_at", "resolved_at"
    ):
        key = (incident.detected_at.strftime("%Y-%m"), incident.severity)
        rows[key]["mttd"].append((incident.detected_at - incident.started_at).total_seconds() / 60)
        if incident.acknowledged_at:
            rows[key]["mtta"].append((incident.acknowledged_at - incident.detected_at).total_seconds() / 60)
        if incident.resolved_at:
            rows[key]["mttr"].append((incident.resolved_at - incident.detected_at).total_seconds() / 60)
    out = []
    for (month, severity), values in sorted(rows.items()):
        out.append(
            {
                "month": month,
                "severity": severity,
                "count": len(values["mttd"]),
                **{k: round(sum(v) / len(v), 1) if v else None for k, v in values.items()},
            }
        )
    return out


def by_category(since: datetime) -> list[dict[str, Any]]:
    return list(
        Incident.objects.filter(detected_at__gte=since, merged_into__isnull=True)
        .values("category")
        .annotate(count=Count("pk"))
        .order_by("-count", "category")
    )


def gpu_hours_by_month(since: datetime) -> list[dict[str, Any]]:
    totals: dict[str, float] = defaultdict(float)
    for incident in Incident.objects.filter(detected_at__gte=since, merged_into__isnull=True):
        totals[incident.detected_at.strftime("%Y-%m")] += incident.current_gpu_hours()
    return [{"month": m, "gpu_hours": round(v, 2)} for m, v in sorted(totals.items())]
