"""What the scheduler plugs in: its detectors; the Kueue/Slurm queue panel under each pool and on a
team's page, and the ``queues`` and ``quota_waits`` parts of the capacity API (capacity sits below
and cannot import the scheduler); the ``scheduler`` live topic and the overview tile."""

from console import live, overview
from fleet.capacity.api import register_capacity_part
from fleet.capacity.read.tables import register_pool_section, register_team_section
from fleet.exporters import register_mappings
from fleet.scheduler import detectors, mappings, read, views
from fleet.scheduler.serializers import PoolQueuesSerializer, QuotaWaitSerializer
from incidents.detectors import register_detectors

register_detectors(detectors)
register_mappings(*mappings.MAPPINGS)
# First under each pool: its quota notes set the wait beside each quota that later sections show.
register_pool_section("scheduler/_pool_queues.html", read.pool_section, order=10)
register_team_section("scheduler/_team_queues.html", read.team_section, order=10)
register_capacity_part("queues", read.queues_part, described_by=PoolQueuesSerializer(many=True))
register_capacity_part("quota_waits", read.quota_waits_part, described_by=QuotaWaitSerializer(many=True))
live.register_topic_builder(read.TOPIC, read.build_scheduler_delta)
live.register_topic_watcher(read.TOPIC, live.watch_topic)
overview.register_section(
    overview.Section(name="scheduler", template="scheduler/_overview.html", context=views.overview_tile, order=29)
)
