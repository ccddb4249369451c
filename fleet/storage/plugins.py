"""What storage plugs in: its detectors, the mounts on the node page, the ``storage`` live topic and
the overview tile."""

from django.db.models.signals import post_delete

from console import live, overview
from fleet.exporters import register_mappings
from fleet.inventory.models import NodeMount
from fleet.storage import detectors, mappings
from fleet.storage import read as storage
from fleet.telemetry.views import register_node_section
from incidents.detectors import register_detectors

register_detectors(detectors)
register_mappings(*mappings.MAPPINGS)
post_delete.connect(storage.forget_mount, sender=NodeMount, dispatch_uid="storage-forget-mount")
register_node_section("storage/_node.html", storage.node_section, order=20)
live.register_topic_builder("storage", storage.build_storage_delta)
live.register_topic_watcher("storage", live.watch_topic)
overview.register_section(
    overview.Section(name="storage", template="storage/_overview.html", context=storage.overview_tile, order=36)
)
