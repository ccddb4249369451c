"""The fabric page's read model (fleet.fabric.read.summaries): the ports' latest status, throughput per
site, fabric and minute (day partitions, like the port rollups), and a partial index on the port
rollups holding only the minutes whose error or flap counters rose. Existing port rollups are read
once into the new tables."""

from django.db import migrations

READ_MODEL_SQL = """
-- No foreign key, as the rollups have none: Django's flush truncates only the tables it knows
-- (the tests' transactional databases), and a status row of a deleted port is never read (the
-- page starts from the ports).
CREATE TABLE fleet_portstatus (
    interface_id bigint PRIMARY KEY,
    seen_at timestamptz NOT NULL,
    state double precision,
    state_at timestamptz,
    rate double precision,
    rate_at timestamptz,
    rate_max double precision,
    rate_max_at timestamptz
);
CREATE TABLE fleet_fabricrollup_1m (
    site_id bigint NOT NULL,
    fabric varchar(16) NOT NULL,
    bucket timestamptz NOT NULL,
    bytes double precision NOT NULL,
    rows integer NOT NULL,
    PRIMARY KEY (site_id, fabric, bucket)
) PARTITION BY RANGE (bucket);
CREATE INDEX fleet_fabricrollup_1m_bucket ON fleet_fabricrollup_1m (bucket);
-- Made on the parent: every partition, present and future, gets its own.
CREATE INDEX fleet_portrollup_1m_errors ON fleet_portrollup_1m (bucket) INCLUDE (interface_id, quantity, increase)
WHERE increase > 0 AND quantity IN ('symbol_errors', 'receive_errors', 'transmit_errors', 'transmit_discards',
                                    'link_downed', 'carrier_changes', 'link_error_recovery');
"""
REVERSE_SQL = "DROP INDEX fleet_portrollup_1m_errors; DROP TABLE fleet_fabricrollup_1m; DROP TABLE fleet_portstatus;"


def read_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    from fleet.fabric.read import summaries
    from fleet.telemetry import partitions

    spans = partitions.existing_partitions(partitions.PORT_ROLLUP_1M).values()
    if not spans:
        return
    starts = sorted(start for start, _ in spans)
    partitions.ensure_partitions_for(partitions.FABRIC_ROLLUP_1M, starts)
    summaries.rebuild(starts[0], max(end for _, end in spans))


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0015_scheduler_queues"),
    ]

    operations = [
        migrations.RunSQL(READ_MODEL_SQL, REVERSE_SQL),
        migrations.RunPython(read_existing, migrations.RunPython.noop),
    ]
