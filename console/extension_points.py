"""Every extension point of the project, in one list: where a room plugs into another room's page,
answer, detector run or door, without the lower room importing the higher one.

A room declares what it plugs in in its own ``plugins.py`` (``fleet/<room>/plugins.py``,
``incidents/plugins.py``, ``compliance/plugins.py``); ``discover_plugins`` imports them all once,
from ConsoleConfig.ready, as the admin finds ``admin.py``. So a reader of a page that shows a panel
it does not import (capacity's Kueue queues) finds here which register function fed it, and greps
``plugins.py`` for who calls it. Registry paths are dotted strings because console sits below the apps
(imports run console <- incidents <- fleet <- compliance); tests/test_extension_points.py resolves
each one, and fails on a ``register_*`` in the code this list does not name, or called outside a
``plugins.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.apps import apps
from django.utils.module_loading import autodiscover_modules


@dataclass(frozen=True)
class ExtensionPoint:
    registry: str  # the register function's dotted path
    plugs_in: str  # what plugs into it
    used_by: str  # who calls what was plugged in


EXTENSION_POINTS: tuple[ExtensionPoint, ...] = (
    # console: the shell every app shares
    ExtensionPoint("console.live.register_topic_builder", "a live topic's delta builder", "console.live's broadcast"),
    ExtensionPoint(
        "console.live.register_topic_watcher",
        "a topic pushed only while a page follows it",
        "console.consumers (a socket renews its watches)",
    ),
    ExtensionPoint("console.overview.register_section", "a tile on the overview page", "console's overview view"),
    ExtensionPoint("console.metrics.register_collector", "series on the console's /metrics", "console.metrics"),
    ExtensionPoint(
        "console.queues.register_stream",
        "a Redis stream of queued work (an ingest lane)",
        "queue_depth: the ingest doors' 429 bound and /metrics",
    ),
    # incidents: findings in, incidents out
    ExtensionPoint("incidents.detectors.register_detectors", "a module's @detector functions", "run_detectors"),
    ExtensionPoint(
        "incidents.views.register_gpu_hours_cost", "the money on an incident's GPU-hours (cost)", "incident page"
    ),
    # fleet: each room's hooks for the rooms above it
    ExtensionPoint(
        "fleet.inventory.models.on_fabric_change", "what follows a node's interfaces (fabric)", "inventory's saves"
    ),
    ExtensionPoint(
        "fleet.telemetry.views.register_node_section", "a section on the node page (fabric, storage)", "node page"
    ),
    ExtensionPoint(
        "fleet.telemetry.detectors.register_gpu_fault_hook",
        "what a GPU fault finding also names (training: the job and its cost)",
        "telemetry's GPU-health detectors",
    ),
    ExtensionPoint(
        "fleet.telemetry.placement.register_job_locator",
        "the jobs on a host (training)",
        "fabric and storage findings and pages",
    ),
    ExtensionPoint(
        "fleet.telemetry.silent_sources.register_backlog_probe",
        "the ingest queue's oldest wait (ingest)",
        "the ingest-silent detector",
    ),
    ExtensionPoint(
        "fleet.training.views.register_job_section", "a section on the job page (correlation, cost)", "job page"
    ),
    ExtensionPoint(
        "fleet.training.api.register_job_snapshot_part",
        "a part of the job snapshot API answer (correlation's episodes)",
        "the job snapshot API",
    ),
    ExtensionPoint(
        "fleet.training.detectors.register_job_finding_hook",
        "a cause named on a job finding (correlation: fabric, storage)",
        "training's detectors",
    ),
    ExtensionPoint(
        "fleet.capacity.read.tables.register_pool_section",
        "a section under each pool on the capacity page (scheduler's Kueue queues, cost)",
        "capacity page",
    ),
    ExtensionPoint(
        "fleet.capacity.read.tables.register_team_section",
        "a section on a team's capacity page (scheduler's quota waits)",
        "capacity team page",
    ),
    ExtensionPoint(
        "fleet.capacity.api.register_capacity_part",
        "a part of the capacity API answer (scheduler's queues and quota waits)",
        "the capacity API",
    ),
    ExtensionPoint(
        "fleet.fabric.detectors.register_gang_lookup",
        "a job's gang hosts (correlation)",
        "fabric's detectors",
    ),
    ExtensionPoint(
        "fleet.storage.read.register_fabric_reads",
        "storage-fabric bytes per node (fabric, wired by correlation)",
        "storage page",
    ),
    ExtensionPoint("fleet.ingest.stream.register_lane", "a kind of ingest drained from Redis", "ingest's drain tasks"),
    ExtensionPoint(
        "fleet.exporters.register_mappings",
        "an exporter's metric families: how each maps and the room's store function (each room's mappings.py)",
        "the Prometheus door (fleet.ingest.prometheus)",
    ),
)


def plugin_modules() -> list[str]:
    """The plugins modules' names relative to their app: ``plugins``, then ``<room>.plugins`` for each
    package inside an app that has one, in name order (nothing relies on it: sections carry theirs)."""
    rooms = {
        f"{room.name}.plugins"
        for config in apps.get_app_configs()
        for path in getattr(config.module, "__path__", [])
        for room in Path(path).iterdir()
        if (room / "plugins.py").is_file()
    }
    return ["plugins", *sorted(rooms)]


def discover_plugins() -> None:
    """Import every app's and room's plugins.py (called once, from ConsoleConfig.ready)."""
    autodiscover_modules(*plugin_modules())
