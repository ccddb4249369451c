"""Field formats met in the wild: MIG instance ids, profiling and violation counters, a model
version per endpoint, and a primary key on serving samples (a series once per time)."""

from django.db import migrations, models

# The sample table is made by SQL (0002) with real, not double, columns for floats: the writer's
# binary COPY sends float4. ADD COLUMN on the partitioned parent reaches every partition.
GPU_SAMPLE_SQL = """
ALTER TABLE fleet_gpusample
    ADD COLUMN gr_engine_active real,
    ADD COLUMN dram_active real,
    ADD COLUMN thermal_violation_us bigint,
    ADD COLUMN power_violation_us bigint;
"""
GPU_SAMPLE_REVERSE_SQL = """
ALTER TABLE fleet_gpusample
    DROP COLUMN gr_engine_active, DROP COLUMN dram_active,
    DROP COLUMN thermal_violation_us, DROP COLUMN power_violation_us;
"""

# Serving samples had no key in the database, so a series replayed under another batch key was
# stored twice. Keep one row of each (endpoint, ts, metric, series), then make that the key.
# The series becomes text: a bounded column silently cut long label strings into collisions.
SERVING_KEY_SQL = """
DELETE FROM fleet_servingsample s
USING (
    SELECT tableoid, ctid,
           row_number() OVER (PARTITION BY endpoint_id, ts, metric, series ORDER BY ctid) AS n
    FROM fleet_servingsample
) d
WHERE s.tableoid = d.tableoid AND s.ctid = d.ctid AND d.n > 1;
ALTER TABLE fleet_servingsample ALTER COLUMN series TYPE text;
ALTER TABLE fleet_servingsample ADD PRIMARY KEY (endpoint_id, metric, series, ts);
"""
SERVING_KEY_REVERSE_SQL = """
ALTER TABLE fleet_servingsample DROP CONSTRAINT fleet_servingsample_pkey;
ALTER TABLE fleet_servingsample ALTER COLUMN series TYPE varchar(500);
"""


def _metric(kind: type, help_text: str) -> models.Field:
    return kind(blank=True, help_text=help_text, null=True)


NEW_METRICS = [
    ("gr_engine_active", models.FloatField, "Graphics engine activity (ratio)"),
    ("dram_active", models.FloatField, "Memory interface activity (ratio)"),
    ("thermal_violation_us", models.BigIntegerField, "Time throttled by thermal limits (cumulative) (µs)"),
    ("power_violation_us", models.BigIntegerField, "Time throttled by power limits (cumulative) (µs)"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0003_latest_state_hot_updates"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="gpu",
            options={
                "ordering": ["node__hostname", "index", "mig_instance_id"],
                "verbose_name": "GPU",
                "verbose_name_plural": "GPUs",
            },
        ),
        migrations.AddField(
            model_name="endpoint",
            name="version",
            field=models.CharField(
                blank=True, help_text="The model version last reported (Triton's version label)", max_length=64
            ),
        ),
        migrations.AddField(
            model_name="gpu",
            name="mig_instance_id",
            field=models.PositiveSmallIntegerField(
                blank=True, help_text="MIG GPU instance id (dcgm-exporter's GPU_I_ID)", null=True
            ),
        ),
        *[
            migrations.AddField(model_name="gpustate", name=name, field=_metric(kind, help_text))
            for name, kind, help_text in NEW_METRICS
        ],
        # MIG instances registered before the id had a column: it is in their UUID (...-gi<id>).
        migrations.RunSQL(
            "UPDATE fleet_gpu SET mig_instance_id = substring(uuid from '-gi([0-9]{1,4})$')::int "
            "WHERE parent_id IS NOT NULL AND mig_instance_id IS NULL AND uuid ~ '-gi[0-9]{1,4}$'",
            migrations.RunSQL.noop,
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(model_name="gpusample", name=name, field=_metric(kind, help_text))
                for name, kind, help_text in NEW_METRICS
            ],
            database_operations=[migrations.RunSQL(GPU_SAMPLE_SQL, GPU_SAMPLE_REVERSE_SQL)],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="servingsample",
                    name="series",
                    field=models.TextField(help_text='Canonical labels, e.g. finished_reason="stop",le="0.5"'),
                ),
            ],
            database_operations=[migrations.RunSQL(SERVING_KEY_SQL, SERVING_KEY_REVERSE_SQL)],
        ),
    ]
