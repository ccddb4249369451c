"""Serving series (vLLM, Triton, TGI): the writer every serving door ends in, as
``fleet.telemetry.store`` is for GPU samples. Batch keys are claimed first, values are written by
COPY, endpoints are registered on first sight, and the minutes they touch are marked for the
rollups (fleet.serving.rollups). The reads live in fleet.serving.slo."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from console import counters
from fleet.serving import rollups as serving_rollups
from fleet.serving.models import Endpoint
from fleet.telemetry import partitions
from fleet.telemetry.store import claim_batch_keys


@dataclass(slots=True)
class ServingPoint:
    endpoint: str
    framework: str
    model_name: str
    ts: datetime
    metric: str
    series: str
    value: float
    version: str = ""


def store_serving_points(*, site_id: int, batch_key: str, points: list[ServingPoint]) -> int:
    """Store serving series values under a batch key; return the rows written.

    The rows go by binary COPY into a temporary table, then one INSERT ... ON CONFLICT DO NOTHING
    on the table's key (endpoint, metric, series, ts): the same series at the same time, replayed
    under another batch key, is stored once.
    """
    first, last = min(p.ts for p in points), max(p.ts for p in points)

    def write() -> int:
        with transaction.atomic():
            if not claim_batch_keys([(batch_key, site_id, len(points), None)]):
                return 0
            endpoint_ids = _resolve_endpoints(site_id, points)
            with connection.cursor() as cursor:
                raw = cursor.cursor
                raw.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS goodput_serving_in "
                    "(endpoint_id int8, ts timestamptz, metric text, series text, value float8)"
                )
                raw.execute("TRUNCATE goodput_serving_in")
                with raw.copy(
                    "COPY goodput_serving_in (endpoint_id, ts, metric, series, value) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(["int8", "timestamptz", "text", "text", "float8"])
                    for p in points:
                        copy.write_row((endpoint_ids[p.endpoint], p.ts, p.metric, p.series, p.value))
                raw.execute(
                    "INSERT INTO fleet_servingsample (endpoint_id, ts, metric, series, value) "
                    "SELECT endpoint_id, ts, metric, series, value FROM goodput_serving_in "
                    "ON CONFLICT (endpoint_id, metric, series, ts) DO NOTHING"
                )
                stored = raw.rowcount
            if stored:
                serving_rollups.mark_dirty(
                    {(endpoint_ids[p.endpoint], p.ts.replace(second=0, microsecond=0)) for p in points}
                )
            return stored

    stored = partitions.write_with_partitions(partitions.SERVING_SAMPLES, first, last, write)
    if stored:
        counters.increment("goodput_ingest_samples_stored_total", stored)
    return stored


def _resolve_endpoints(site_id: int, points: list[ServingPoint]) -> dict[str, int]:
    """Endpoint ids by name, registering new endpoints; a Triton model's version is kept on its
    endpoint (the highest loaded version when several are)."""
    wanted: dict[str, ServingPoint] = {}
    versions: dict[str, str] = {}
    for p in points:
        wanted.setdefault(p.endpoint, p)
        if p.version and _version_order(p.version) > _version_order(versions.get(p.endpoint, "")):
            versions[p.endpoint] = p.version
    Endpoint.objects.bulk_create(
        [
            Endpoint(
                site_id=site_id,
                name=n,
                framework=p.framework,
                model_name=p.model_name,
                version=versions.get(n, ""),
            )
            for n, p in sorted(wanted.items())
        ],
        ignore_conflicts=True,
    )
    endpoints = {e.name: e for e in Endpoint.objects.filter(site_id=site_id, name__in=wanted)}
    for name, version in sorted(versions.items()):
        if endpoints[name].version != version:
            Endpoint.objects.filter(pk=endpoints[name].pk).update(version=version)
    return {name: e.pk for name, e in endpoints.items()}


def _version_order(version: str) -> tuple[int, int, str]:
    """Triton versions are integers; compare them as numbers, anything else as text after them.
    (isascii: "²".isdigit() is True, and int("²") fails.)"""
    return (1, int(version), "") if version.isascii() and version.isdigit() else (0, 0, version)
