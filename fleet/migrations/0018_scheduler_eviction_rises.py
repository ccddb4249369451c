"""A partial index on the scheduler rollups holding only the minutes in which a queue's evictions or
preemptions rose: the eviction-storm detector (fleet.scheduler.detectors) reads the last ten
minutes of them every cycle, which otherwise scans the day's partition (about 2 million rows for
50 ClusterQueues by evening)."""

from django.db import migrations

# Made on the parent: every partition, present and future, gets its own.
INDEX_SQL = """
CREATE INDEX fleet_schedulerrollup_1m_evictions ON fleet_schedulerrollup_1m (bucket) INCLUDE (queue_id, quantity, increase)
WHERE increase > 0 AND quantity IN ('evicted_workloads', 'preempted_workloads');
"""
REVERSE_SQL = "DROP INDEX fleet_schedulerrollup_1m_evictions;"


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0017_scheduler_queue_team"),
    ]

    operations = [migrations.RunSQL(INDEX_SQL, REVERSE_SQL)]
