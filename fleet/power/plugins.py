"""What power plugs in: its detectors, the ``power`` live topic and the overview tile."""

from console import live, overview
from fleet.power import detectors
from fleet.power import read as power
from incidents.detectors import register_detectors

register_detectors(detectors)
live.register_topic_builder("power", power.build_power_delta)
# Pushed only while a page follows it: each push reads every site's and rack's figures.
live.register_topic_watcher("power", live.watch_topic)
overview.register_section(
    overview.Section(name="power", template="power/_overview.html", context=power.overview_tile, order=30)
)
