"""GPUs out of service per incident (incidents.services.cost): the GPU-hours an incident charges
for GPUs taken out outside any job, apart from the figures its findings report. Existing incidents
get theirs from their findings."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def _takes_gpus_out(impact: dict[str, Any]) -> bool:
    # As incidents.services.cost.takes_gpus_out at the time of this migration.
    if "gpu_hours" in impact or "job_gpus" in impact or str(impact.get("unit", "")).startswith("job:"):
        return False
    return bool(impact.get("gpu_uuids")) or bool(impact.get("gpus"))


def _count(impacts: list[tuple[str, dict[str, Any]]]) -> int:
    # As incidents.services.engine.count_affected_gpus at the time of this migration.
    named: set[str] = set()
    covered: set[str] = set()
    units: dict[str, int] = {}
    for fingerprint, impact in impacts:
        if "gpu_uuids" in impact:
            named.update(impact["gpu_uuids"])
            covered.add(impact.get("unit") or fingerprint)
        elif gpus := int(impact.get("gpus", 0)):
            unit = impact.get("unit") or fingerprint
            units[unit] = max(units.get(unit, 0), gpus)
    covered.update(f"gpu:{uuid}" for uuid in named)
    return len(named) + sum(gpus for unit, gpus in units.items() if unit not in covered)


def fill(apps: Any, schema_editor: Any) -> None:
    Incident = apps.get_model("incidents", "Incident")
    Finding = apps.get_model("incidents", "Finding")
    impacts: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for incident_id, fingerprint, impact in Finding.objects.filter(incident__isnull=False).values_list(
        "incident_id", "fingerprint", "impact"
    ):
        if isinstance(impact, dict) and _takes_gpus_out(impact):
            impacts.setdefault(incident_id, []).append((fingerprint, impact))
    for incident_id, found in impacts.items():
        Incident.objects.filter(pk=incident_id).update(gpus_out_of_service=_count(found))


class Migration(migrations.Migration):
    dependencies = [("incidents", "0006_outbound_url_validator")]

    operations = [
        migrations.AddField(
            model_name="incident",
            name="gpus_out_of_service",
            field=models.PositiveIntegerField(
                default=0, help_text="GPUs its findings take out of service outside any job, each once"
            ),
        ),
        migrations.AlterField(
            model_name="incident",
            name="gpu_hours_lost",
            field=models.FloatField(
                default=0, help_text="The GPU-hours lost its findings reported, summed (incidents.services.cost)"
            ),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
