"""What serving plugs in: its detectors, the serving and endpoint live topics, and the overview tile."""

from django.conf import settings

from console import live, overview
from fleet.exporters import register_mappings
from fleet.serving import detectors, mappings, read
from incidents.detectors import register_detectors

register_detectors(detectors)
register_mappings(*mappings.MAPPINGS)
# A serving push reads every endpoint's SLOs and minutes (at 125 endpoints, a push twice a
# second was a sixth of the workers' CPU): it moves the overview as often as its snapshot
# is recomputed (current_overview). One endpoint's own topic keeps the usual interval.
live.register_topic_builder(
    "serving", read.build_serving_delta, min_interval=lambda: float(settings.SERVING_SUMMARY_SECONDS)
)
live.register_topic_builder("endpoint", read.build_endpoint_delta)
# Pushed only while a page follows them.
live.register_topic_watcher("serving", live.watch_topic)
live.register_topic_watcher("endpoint", live.watch_topic)
overview.register_section(
    overview.Section(name="serving", template="serving/_overview.html", context=read.overview_tile, order=25)
)
