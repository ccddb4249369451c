"""The console's role makes and drops telemetry partitions through the owner's functions (issue 37).

Until now the console's role owned the partitioned tables and held CREATE on the schema, since
PostgreSQL lets only a table's owner add or drop its partitions. CREATE on the schema let it plant
a function that the owner's SECURITY DEFINER functions would resolve to, and so act as the owner.
Now the owner keeps every table and the schema to itself (console.dbroles takes them back), and
the console calls two SECURITY DEFINER functions that do one bounded thing each:

- ``goodput_create_partition(parent, interval, start)``: the day or month partition of a ``fleet_``
  partitioned table that starts at ``start`` (named ``<parent>_p<YYYYMMDD|YYYYMM>``), if missing.
- ``goodput_drop_partition(partition)``: drops one partition of such a table, and returns its row
  count and size for the PartitionDrop record (which partitions are due is the caller's rule,
  fleet.telemetry.partitions: the console's role may delete those rows anyway).

Both follow PostgreSQL's own rules for SECURITY DEFINER: ``search_path = pg_catalog, pg_temp`` and
every other name schema-qualified, so nothing the caller can create is looked up.
"""

import re

from django.db import migrations

SQL = """
-- Called inside the two below (as the owner): the parent must be one of the owner's partitioned
-- fleet_ tables in this schema.
CREATE FUNCTION {s}.goodput_partition_parent(p_parent text) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parent oid;
BEGIN
    SELECT c.oid INTO parent FROM pg_catalog.pg_class c
     WHERE c.relnamespace = '{s}'::regnamespace AND c.relname = p_parent AND c.relkind = 'p'
       AND c.relowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user);
    IF parent IS NULL OR p_parent !~ '^fleet_[a-z0-9_]+$' THEN
        RAISE EXCEPTION 'not a telemetry table: %', p_parent USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN parent;
END
$$;

CREATE FUNCTION {s}.goodput_create_partition(p_parent text, p_interval text, p_start timestamptz)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    start_utc timestamp := p_start AT TIME ZONE 'UTC';
    stop timestamptz;
    name text;
BEGIN
    PERFORM {s}.goodput_partition_parent(p_parent);
    IF p_interval NOT IN ('day', 'month') OR start_utc <> date_trunc(p_interval, start_utc) THEN
        RAISE EXCEPTION 'a partition starts at the start of a UTC day or month: % %', p_interval, p_start
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    stop := (start_utc + ('1 ' || p_interval)::interval) AT TIME ZONE 'UTC';
    name := p_parent || '_p' || to_char(start_utc, CASE p_interval WHEN 'day' THEN 'YYYYMMDD' ELSE 'YYYYMM' END);
    IF to_regclass(format('%I.%I', '{s}', name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- IF NOT EXISTS: two workers may race to make the same day.
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
                   '{s}', name, '{s}', p_parent, p_start, stop);
    RETURN true;
END
$$;

CREATE FUNCTION {s}.goodput_drop_partition(p_partition text, OUT dropped_rows bigint, OUT dropped_bytes bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    part oid;
    parent_name text;
BEGIN
    SELECT c.oid, p.relname INTO part, parent_name
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
      JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
     WHERE c.relnamespace = '{s}'::regnamespace AND c.relname = p_partition AND c.relispartition;
    IF part IS NULL THEN
        RAISE EXCEPTION 'not a partition: %', p_partition USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM {s}.goodput_partition_parent(parent_name);
    -- An exact count once a day per partition is cheap next to what it tells an auditor.
    EXECUTE format('SELECT count(*) FROM %I.%I', '{s}', p_partition) INTO dropped_rows;
    dropped_bytes := pg_total_relation_size(part);
    EXECUTE format('DROP TABLE %I.%I', '{s}', p_partition);
END
$$;

REVOKE EXECUTE ON FUNCTION {s}.goodput_partition_parent(text),
    {s}.goodput_create_partition(text, text, timestamptz), {s}.goodput_drop_partition(text) FROM PUBLIC;
"""

REVERSE = """
DROP FUNCTION {s}.goodput_drop_partition(text);
DROP FUNCTION {s}.goodput_create_partition(text, text, timestamptz);
DROP FUNCTION {s}.goodput_partition_parent(text);
"""


def _schema(schema_editor) -> str:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        schema = cursor.fetchone()[0]
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        raise ValueError(f"schema {schema!r}: the console's functions expect a plain schema name")
    return schema


def forwards(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(SQL.replace("{s}", _schema(schema_editor)))


def backwards(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(REVERSE.replace("{s}", _schema(schema_editor)))


class Migration(migrations.Migration):
    dependencies = [("fleet", "0023_scheduler_queue_kind")]

    operations = [migrations.RunPython(forwards, backwards)]
