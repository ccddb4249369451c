"""The exporter mapping table: which metric families the Prometheus door reads, how a sample of
each maps, and which room's store function keeps it. One table, whatever the exporter.

Each room contributes its own entries from its ``mappings.py`` (DCGM fields: fleet.telemetry;
vLLM, Triton and TGI: fleet.serving; node_exporter's ports: fleet.fabric, its file systems and
disks: fleet.storage; Kueue, kube-state-metrics and Slurm: fleet.scheduler; Velero:
compliance), registered from its ``plugins.py``. The door (fleet.ingest.prometheus) looks each
exposed name up here once a push and hands the sample to the reader the entry names; a name no
entry matches is ignored and counted. Adding an exporter: docs/adding-an-exporter.md.

This module sits at the top of ``fleet`` beside ``choices``: every room may import it, and it
imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# How a sample maps: the door's reader for each shape of series (fleet.ingest.prometheus).
GPU_FIELD = "gpu-field"  # a DCGM field of one GPU (spec: the GpuSample field's name)
SERVING = "serving"  # an inference server's series of one endpoint (spec: serving.mappings.ServingSeries)
NODE = "node"  # a node_exporter series of one host (spec: telemetry.series.NodeSeries)
QUEUE = "queue"  # a scheduler's series of one queue (spec: scheduler.mappings.QueueSeries)
# Read from the push's text after the parse, which counts its samples as ignored (Velero: a few
# series a backup schedule, mapped together). Its store is called as
# store(text, *, site_id, received, openmetrics) -> its figures in the door's answer.
PUSH = "push"
READS = (GPU_FIELD, SERVING, NODE, QUEUE, PUSH)


@dataclass(frozen=True)
class ExporterMapping:
    """One exporter's families: ``families`` names each exposed series (its spec says how a
    sample maps), or ``prefix`` takes every name starting with it (each with ``spec``)."""

    exporter: str  # who exposes them ("dcgm-exporter", "vllm", ...): the key of a PUSH entry's figures
    reads: str  # one of READS
    store: Callable[..., Any]  # the room's function the mapped samples end in
    families: Mapping[str, Any] = field(default_factory=dict)
    prefix: str = ""
    spec: Any = None  # for a prefix: what every name under it maps as
    kinds: tuple[str, ...] = ("auto",)  # the door's ?kind= values that read these families


Hit = tuple[ExporterMapping, Any]  # the entry and the spec of one exposed name

_exact: dict[str, Hit] = {}
_prefixed: list[ExporterMapping] = []


def register_mappings(*mappings: ExporterMapping) -> None:
    """Add entries to the table (from a room's plugins.py). An exposed name belongs to one entry:
    a second claim on it is a mistake in the table, refused at start-up."""
    for mapping in mappings:
        if mapping.reads not in READS:
            raise ValueError(f"{mapping.exporter}: reads {mapping.reads!r}, not one of {READS}")
        for name, spec in mapping.families.items():
            if _exact.get(name, (mapping, None))[0] is not mapping:
                raise ValueError(f"{name} is mapped twice ({_exact[name][0].exporter}, {mapping.exporter})")
            _exact[name] = (mapping, spec)
        if mapping.prefix and mapping not in _prefixed:
            _prefixed.append(mapping)


def lookup(name: str) -> Hit | None:
    """The entry that maps the exposed ``name``, or None. The door caches this per name for a push,
    so the prefixes are tried once per distinct name, not once per sample."""
    hit = _exact.get(name)
    if hit is not None:
        return hit
    for mapping in _prefixed:
        if name.startswith(mapping.prefix):
            return mapping, mapping.spec
    return None


def families(reads: str) -> dict[str, Any]:
    """Every exposed name read as ``reads`` and its spec (the node or queue series the door maps)."""
    return {name: spec for name, (mapping, spec) in _exact.items() if mapping.reads == reads}


def map_pushes(
    text: str, ignored_names: Iterable[str], *, site_id: int, received: datetime, openmetrics: bool
) -> dict[str, dict[str, Any]]:
    """Run each PUSH entry whose prefix one of the parse's ignored names has: {exporter: figures}.
    A push without them (every dcgm-exporter or vLLM scrape) costs one look at the few names the
    parse ignored. An entry runs in the door's request, before the push is queued: what it maps is
    small and written idempotently, so a retried push maps nothing twice; it may raise
    fleet.validation.IngestError to refuse the push with a 4xx naming the line."""
    names = list(ignored_names)
    figures = {}
    for mapping in _prefixed:
        if mapping.reads == PUSH and any(name.startswith(mapping.prefix) for name in names):
            figures[mapping.exporter] = mapping.store(text, site_id=site_id, received=received, openmetrics=openmetrics)
    return figures
