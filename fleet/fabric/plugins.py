"""What fabric plugs in: its detectors, the read model following a node's interfaces, the ports on
the node page, the ``fabric`` live topic and the overview tile."""

from django.db.models.signals import post_delete

from console import live, overview
from fleet.exporters import register_mappings
from fleet.fabric import detectors, mappings
from fleet.fabric.read import health as fabric
from fleet.fabric.read import summaries
from fleet.inventory.models import NodeInterface, on_fabric_change
from fleet.telemetry.views import register_node_section
from incidents.detectors import register_detectors

register_detectors(detectors)
register_mappings(*mappings.MAPPINGS)
on_fabric_change(summaries.move_fabric)
post_delete.connect(summaries.forget_port, sender=NodeInterface, dispatch_uid="fabric-forget-port")
register_node_section("fabric/_node.html", fabric.node_section, order=10)
live.register_topic_builder("fabric", fabric.build_fabric_delta)
live.register_topic_watcher("fabric", live.watch_topic)
overview.register_section(
    overview.Section(name="fabric", template="fabric/_overview.html", context=fabric.overview_tile, order=35)
)
