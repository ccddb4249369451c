"""What telemetry plugs in: the GPU-health and silent-source detectors, the fleet, site, saved-view,
GPU and node live topics, and the fleet tile on the overview."""

from console import live, overview
from fleet.exporters import register_mappings
from fleet.telemetry import detectors, mappings, silent_sources
from fleet.telemetry.read import figures, fleet_summary
from incidents.detectors import register_detectors

register_detectors(detectors)
register_mappings(*mappings.MAPPINGS)
register_detectors(silent_sources)
live.register_topic_builder("fleet", fleet_summary.build_fleet_delta)
live.register_topic_builder(fleet_summary.SITE_PREFIX, fleet_summary.build_site_delta)
live.register_topic_watcher(fleet_summary.SITE_PREFIX, live.watch_topic)
live.register_topic_builder(fleet_summary.VIEW_PREFIX, fleet_summary.build_view_delta)
live.register_topic_watcher(fleet_summary.VIEW_PREFIX, fleet_summary.renew_view)
live.register_topic_builder("gpu", figures.build_gpu_delta)
live.register_topic_builder("node", figures.build_node_delta)
live.register_topic_watcher("gpu", live.watch_topic)
live.register_topic_watcher("node", live.watch_topic)
overview.register_section(
    overview.Section(
        name="fleet",
        template="fleet/_overview.html",
        context=lambda request: {"totals": figures.fleet_totals(), "sites": figures.site_summaries()},
        order=10,
    )
)
