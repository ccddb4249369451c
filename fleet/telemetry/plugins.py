"""What telemetry plugs in: the GPU-health and silent-source detectors, the fleet, site, saved-view,
GPU and node live topics, and the fleet tile on the overview."""

from console import live, overview
from fleet.exporters import register_mappings
from fleet.telemetry import dashboard, detectors, fleet_page, mappings, silent_sources
from incidents.detectors import register_detectors

register_detectors(detectors)
register_mappings(*mappings.MAPPINGS)
register_detectors(silent_sources)
live.register_topic_builder("fleet", fleet_page.build_fleet_delta)
live.register_topic_builder(fleet_page.SITE_PREFIX, fleet_page.build_site_delta)
live.register_topic_watcher(fleet_page.SITE_PREFIX, live.watch_topic)
live.register_topic_builder(fleet_page.VIEW_PREFIX, fleet_page.build_view_delta)
live.register_topic_watcher(fleet_page.VIEW_PREFIX, fleet_page.renew_view)
live.register_topic_builder("gpu", dashboard.build_gpu_delta)
live.register_topic_builder("node", dashboard.build_node_delta)
live.register_topic_watcher("gpu", live.watch_topic)
live.register_topic_watcher("node", live.watch_topic)
overview.register_section(
    overview.Section(
        name="fleet",
        template="fleet/_overview.html",
        context=lambda request: {"totals": dashboard.fleet_totals(), "sites": dashboard.site_summaries()},
        order=10,
    )
)
