"""What cost plugs in: the money on the job, capacity and incident pages (cost prices the rooms
below it), the ``cost`` live topic and the overview tile."""

from console import live, overview
from fleet.capacity.read.tables import register_pool_section
from fleet.cost import figures
from fleet.cost import read as cost
from fleet.training.views import register_job_section
from incidents.views import register_gpu_hours_cost

live.register_topic_builder("cost", cost.build_cost_delta)
live.register_topic_watcher("cost", live.watch_topic)
overview.register_section(
    overview.Section(name="cost", template="cost/_overview.html", context=cost.overview_tile, order=38)
)
register_job_section("cost/_job.html", cost.job_section, order=20)
register_pool_section("cost/_capacity.html", cost.capacity_section, order=20)
register_gpu_hours_cost(figures.incident_cost)
