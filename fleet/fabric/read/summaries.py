"""The fabric page's read model: figures kept current by the port rollups, so the page for a
window ending now reads a few thousand rows instead of every port's minutes.

* ``fleet_portstatus``: one row a port, its latest state and rate (and when), the last minute it
  reported, and the highest rate it reported lately (``rate_max``, last seen at ``rate_max_at``;
  a higher rate, or one reported 24 h after the kept one, replaces it). Upserted by the port
  rollups' statement from the minutes it recomputed.
* ``fleet_fabricrollup_1m``: received plus transmitted bytes per site, fabric and minute, day
  partitions, with the port rollup rows they sum (``rows``: a minute none is left in, after a
  port moved fabric, is no point of that fabric's series). The rollups add what their recomputed
  minutes changed (the new increase less the old one of each port rollup row it rewrote), so a
  late sample or a recomputed minute moves the sum by its difference and a redelivery (refused
  by its batch key) moves nothing. A port whose fabric an Operator changes has its bytes moved
  to the new fabric's minutes (``move_fabric``).
* A partial index on ``fleet_portrollup_1m`` holds only the rows whose error or flap counters rose
  (migration 0015): which ports had errors in a window, and how many, is a sparse read.

``rebuild`` recomputes both tables from the port rollups over a span: for rollups written
without the writer (the demo's history, the migration over existing data, the bench's seed).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from fleet.inventory import directory
from fleet.telemetry import partitions

BYTES = ("receive_bytes", "transmit_bytes")
# Quantities the partial index keeps (where their increase is above zero): the page's errors
# and flaps, and the link-degrading detector's link error recoveries.
SPARSE = (
    "symbol_errors",
    "receive_errors",
    "transmit_errors",
    "transmit_discards",
    "link_downed",
    "carrier_changes",
    "link_error_recovery",
)
RATE_MAX_KEPT = timedelta(hours=24)

_STATUS_COLUMNS = "interface_id, seen_at, state, state_at, rate, rate_at, rate_max, rate_max_at"

# Per port from a set of its rollup rows (``{source}``: the rows the writer returned, or the port
# rollups over a span): the latest minute, the latest state and rate, the highest rate.
_STATUS_SELECT = """
SELECT interface_id, max(bucket),
       (array_agg(last ORDER BY bucket DESC) FILTER (WHERE quantity = 'state'))[1],
       max(bucket) FILTER (WHERE quantity = 'state'),
       (array_agg(last ORDER BY bucket DESC) FILTER (WHERE quantity = 'rate'))[1],
       max(bucket) FILTER (WHERE quantity = 'rate'),
       max(max) FILTER (WHERE quantity = 'rate'),
       (array_agg(bucket ORDER BY max DESC, bucket DESC) FILTER (WHERE quantity = 'rate'))[1]
FROM {source}
GROUP BY interface_id
ORDER BY interface_id  -- in key order, as the fabric minutes: concurrent writers never deadlock
"""

_STATUS_MERGE = f"""
INSERT INTO fleet_portstatus ({_STATUS_COLUMNS})
{{select}}
ON CONFLICT (interface_id) DO UPDATE SET
    seen_at = greatest(fleet_portstatus.seen_at, EXCLUDED.seen_at),
    state = CASE WHEN EXCLUDED.state_at >= coalesce(fleet_portstatus.state_at, EXCLUDED.state_at)
                 THEN EXCLUDED.state ELSE fleet_portstatus.state END,
    state_at = greatest(fleet_portstatus.state_at, EXCLUDED.state_at),
    rate = CASE WHEN EXCLUDED.rate_at >= coalesce(fleet_portstatus.rate_at, EXCLUDED.rate_at)
                THEN EXCLUDED.rate ELSE fleet_portstatus.rate END,
    rate_at = greatest(fleet_portstatus.rate_at, EXCLUDED.rate_at),
    rate_max = CASE WHEN EXCLUDED.rate_max IS NULL THEN fleet_portstatus.rate_max
                    WHEN fleet_portstatus.rate_max IS NULL OR EXCLUDED.rate_max >= fleet_portstatus.rate_max
                         OR fleet_portstatus.rate_max_at < EXCLUDED.rate_at - interval '24 hours'
                    THEN EXCLUDED.rate_max ELSE fleet_portstatus.rate_max END,
    rate_max_at = CASE WHEN EXCLUDED.rate_max IS NULL THEN fleet_portstatus.rate_max_at
                       WHEN fleet_portstatus.rate_max IS NULL OR EXCLUDED.rate_max > fleet_portstatus.rate_max
                            OR fleet_portstatus.rate_max_at < EXCLUDED.rate_at - interval '24 hours'
                       THEN EXCLUDED.rate_max_at
                       WHEN EXCLUDED.rate_max = fleet_portstatus.rate_max
                       THEN greatest(fleet_portstatus.rate_max_at, EXCLUDED.rate_max_at)
                       ELSE fleet_portstatus.rate_max_at END
"""


def port_rollup_sql(rollup_sql: str, scope: str) -> str:
    """The port rollups' statement: the series writer's rollup upsert (``rollup_sql``, over the
    ports ``scope`` selects), with the per-fabric minutes moved by what it changed and the ports'
    status merged, in one statement (its parts see the rollup rows as they were before it)."""
    quantities = ", ".join(f"'{q}'" for q in BYTES)
    return f"""
WITH old AS (
    SELECT interface_id, quantity, bucket, increase FROM fleet_portrollup_1m
    WHERE {scope} AND quantity IN ({quantities})
      AND bucket >= %(first)s AND bucket < %(last)s + interval '2 minutes'
), new AS (
{rollup_sql.strip()}
RETURNING interface_id, quantity, bucket, increase, max, last
), moved AS (
    SELECT n.site_id, i.fabric, new.bucket,
           sum(coalesce(new.increase, 0) - coalesce(old.increase, 0)) AS bytes,
           count(*) FILTER (WHERE old.bucket IS NULL) AS rows
    FROM new
    LEFT JOIN old USING (interface_id, quantity, bucket)
    JOIN fleet_nodeinterface i ON i.id = new.interface_id
    JOIN fleet_node n ON n.id = i.node_id
    WHERE new.quantity IN ({quantities})
    GROUP BY n.site_id, i.fabric, new.bucket
), fabric AS (
    -- In key order, so two writers adding to the same minutes never wait on each other in a cycle.
    INSERT INTO fleet_fabricrollup_1m (site_id, fabric, bucket, bytes, rows)
    SELECT site_id, fabric, bucket, bytes, rows FROM moved ORDER BY site_id, fabric, bucket
    ON CONFLICT (site_id, fabric, bucket) DO UPDATE
    SET bytes = fleet_fabricrollup_1m.bytes + EXCLUDED.bytes, rows = fleet_fabricrollup_1m.rows + EXCLUDED.rows
)
{_STATUS_MERGE.format(select=_STATUS_SELECT.format(source="new"))}
"""


REBUILD_FABRIC_SQL = f"""
INSERT INTO fleet_fabricrollup_1m (site_id, fabric, bucket, bytes, rows)
SELECT n.site_id, i.fabric, r.bucket, sum(coalesce(r.increase, 0)), count(*)
FROM fleet_portrollup_1m r
JOIN fleet_nodeinterface i ON i.id = r.interface_id
JOIN fleet_node n ON n.id = i.node_id
WHERE r.quantity IN ({", ".join(f"'{q}'" for q in BYTES)}) AND r.bucket >= %(start)s AND r.bucket < %(end)s
GROUP BY n.site_id, i.fabric, r.bucket
ON CONFLICT (site_id, fabric, bucket) DO UPDATE SET bytes = EXCLUDED.bytes, rows = EXCLUDED.rows
"""

REBUILD_STATUS_SQL = _STATUS_MERGE.format(
    select=_STATUS_SELECT.format(
        source="(SELECT interface_id, quantity, bucket, max, last FROM fleet_portrollup_1m "
        "WHERE bucket >= %(start)s AND bucket < %(end)s AND interface_id IN (SELECT id FROM fleet_nodeinterface)) r"
    )
)


def rebuild(start: datetime, end: datetime) -> None:
    """Recompute the per-fabric minutes in [start, end) from the port rollups, and merge the
    ports' status from them (for rollups written without the port writer)."""
    if start >= end:
        return
    partitions.ensure_partitions(partitions.FABRIC_ROLLUP_1M, start, end)
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM fleet_fabricrollup_1m WHERE bucket >= %(start)s AND bucket < %(end)s",
            {"start": start, "end": end},
        )
        cursor.execute(REBUILD_FABRIC_SQL, {"start": start, "end": end})
        cursor.execute(REBUILD_STATUS_SQL, {"start": start, "end": end})


MOVE_FABRIC_SQL = f"""
WITH port AS (
    SELECT n.site_id, r.bucket, sum(coalesce(r.increase, 0)) AS bytes, count(*) AS rows
    FROM fleet_portrollup_1m r
    JOIN fleet_nodeinterface i ON i.id = r.interface_id
    JOIN fleet_node n ON n.id = i.node_id
    WHERE r.interface_id = %(interface)s AND r.quantity IN ({", ".join(f"'{q}'" for q in BYTES)})
    GROUP BY n.site_id, r.bucket
), taken AS (
    UPDATE fleet_fabricrollup_1m f SET bytes = f.bytes - port.bytes, rows = f.rows - port.rows
    FROM port WHERE f.site_id = port.site_id AND f.fabric = %(before)s AND f.bucket = port.bucket
)
INSERT INTO fleet_fabricrollup_1m (site_id, fabric, bucket, bytes, rows)
SELECT site_id, %(after)s, bucket, bytes, rows FROM port ORDER BY site_id, bucket
ON CONFLICT (site_id, fabric, bucket) DO UPDATE
SET bytes = fleet_fabricrollup_1m.bytes + EXCLUDED.bytes, rows = fleet_fabricrollup_1m.rows + EXCLUDED.rows
"""


def move_fabric(interface_id: int, before: str, after: str) -> None:
    """Move a port's bytes, every minute of its rollups, from one fabric's minutes to another's
    (an Operator corrected the port's fabric: the page shows it as if it had always been so)."""
    days = [start for start, _ in partitions.existing_partitions(partitions.PORT_ROLLUP_1M).values()]
    partitions.ensure_partitions_for(partitions.FABRIC_ROLLUP_1M, days)
    with connection.cursor() as cursor:
        cursor.execute(MOVE_FABRIC_SQL, {"interface": interface_id, "before": before, "after": after})


def forget_port(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A deleted port's status row goes with it (``post_delete`` of NodeInterface: the table has
    no foreign key, which Django's flush could not truncate past). Its rollups and samples stay
    for retention, as a GPU's do; its bytes stay in the fabric minutes they were measured in."""
    directory.forget_node_parts("interface", [instance.node_id])  # this process's cache; others' expire
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM fleet_portstatus WHERE interface_id = %s", [instance.pk])
