"""What the fleet app as a whole plugs in; each room declares its own in ``fleet/<room>/plugins.py``
(console.extension_points lists the points, discover_plugins imports these modules)."""

from console import metrics
from fleet import metrics as fleet_metrics

metrics.register_collector(fleet_metrics.collect)
