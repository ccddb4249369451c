"""Read models for the fleet dashboard: totals, site cards, the GPU table, time series, live deltas.

The snapshot (HTTP) and the live deltas (websocket) are built from the same functions, so a page
that reconnects and re-fetches the snapshot lands on exactly what the deltas would have shown.
"""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Avg, Count, Max, Q, Sum
from django.utils import timezone

from console import live
from fleet.inventory.models import Gpu, Node, Site
from fleet.telemetry.models import GpuState

RANGES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
DEFAULT_RANGE = "15m"
MAX_POINTS = 180  # raw-sample series (the 15-minute view, a GPU's page)
# Where each range reads from: raw samples only for the short live view; rollups beyond, so no
# series has more than 1,440 points and no query scans raw samples over hours.
RESOLUTION = {"15m": "raw", "1h": "1m", "6h": "1m", "24h": "1m", "7d": "1h"}
BUCKET_SECONDS = {"1m": 60, "1h": 3600}
HOTTEST = 5
# A delta re-sends rows updated slightly before the previous watermark: a transaction that
# committed late with an earlier timestamp is not missed, and a duplicate row is harmless.
WATERMARK_OVERLAP = timedelta(seconds=2)

GPU_ROW_FIELDS = (
    "gpu__uuid",
    "gpu__index",
    "gpu__model",
    "gpu__node__hostname",
    "gpu__node__site_id",
    "gpu__node__site__name",
    "ts",
    "gpu_util",
    "fb_used_mib",
    "fb_free_mib",
    "gpu_temp_c",
    "memory_temp_c",
    "power_w",
    "sm_clock_mhz",
    "xid",
    "ecc_dbe_total",
    "throttle_reasons",
    "tensor_active",
    "updated_at",
)


def _stale_cutoff() -> datetime:
    return timezone.now() - timedelta(seconds=settings.FLEET_STALE_SECONDS)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(float(value), digits)


def fleet_totals(*, site_id: int | None = None) -> dict[str, Any]:
    """Totals over physical GPUs: a MIG instance is part of its GPU, not another GPU (its power,
    temperature and errors are the physical GPU's own)."""
    gpus = Gpu.objects.physical()
    states = GpuState.objects.filter(gpu__parent__isnull=True)
    if site_id is not None:
        gpus = gpus.filter(node__site_id=site_id)
        states = states.filter(gpu__node__site_id=site_id)
    cutoff = _stale_cutoff()
    fresh = Q(ts__gte=cutoff)
    agg = states.aggregate(
        reporting=Count("pk", filter=fresh),
        mean_util=Avg("gpu_util", filter=fresh),
        power_w=Sum("power_w", filter=fresh),
        max_temp=Max("gpu_temp_c", filter=fresh),
        with_errors=Count("pk", filter=Q(xid__gt=0) | Q(ecc_dbe_total__gt=0)),
        throttled=Count("pk", filter=fresh & Q(throttle_reasons__gt=1)),
    )
    hottest = [
        _gpu_row(row)
        for row in states.filter(fresh, gpu_temp_c__isnull=False)
        .order_by("-gpu_temp_c")
        .values(*GPU_ROW_FIELDS)[:HOTTEST]
    ]
    total = gpus.count()
    return {
        "gpus": total,
        "reporting": agg["reporting"],
        "stale": total - agg["reporting"],
        "mean_util": _round(agg["mean_util"]),
        "power_kw": _round((agg["power_w"] or 0) / 1000, 2),
        "max_temp": _round(agg["max_temp"]),
        "with_errors": agg["with_errors"],
        "throttled": agg["throttled"],
        "hottest": hottest,
    }


def site_summaries() -> list[dict[str, Any]]:
    cutoff = _stale_cutoff()
    physical = Q(nodes__gpus__parent__isnull=True)
    fresh = physical & Q(nodes__gpus__state__ts__gte=cutoff)
    sites = Site.objects.annotate(
        gpu_count=Count("nodes__gpus", filter=physical, distinct=True),
        node_count=Count("nodes", distinct=True),
        reporting=Count("nodes__gpus__state", filter=fresh),
        mean_util=Avg("nodes__gpus__state__gpu_util", filter=fresh),
        power_w=Sum("nodes__gpus__state__power_w", filter=fresh),
        max_temp=Max("nodes__gpus__state__gpu_temp_c", filter=fresh),
        with_errors=Count(
            "nodes__gpus__state",
            filter=physical & (Q(nodes__gpus__state__xid__gt=0) | Q(nodes__gpus__state__ecc_dbe_total__gt=0)),
        ),
    ).order_by("name")
    return [
        {
            "id": s.id,
            "name": s.name,
            "region": s.region,
            "contracted_power_kw": _round(s.contracted_power_kw),
            "gpus": s.gpu_count,
            "nodes": s.node_count,
            "reporting": s.reporting,
            "mean_util": _round(s.mean_util),
            "power_kw": _round((s.power_w or 0) / 1000, 2),
            "max_temp": _round(s.max_temp),
            "with_errors": s.with_errors,
        }
        for s in sites
    ]


def _gpu_row(row: dict[str, Any]) -> dict[str, Any]:
    fb_total = None
    if row["fb_used_mib"] is not None and row["fb_free_mib"] is not None:
        fb_total = row["fb_used_mib"] + row["fb_free_mib"]
    return {
        "uuid": row["gpu__uuid"],
        "index": row["gpu__index"],
        "model": row["gpu__model"],
        "hostname": row["gpu__node__hostname"],
        "site_id": row["gpu__node__site_id"],
        "site": row["gpu__node__site__name"],
        "ts": row["ts"].isoformat(),
        "util": _round(row["gpu_util"]),
        "mem_used_pct": _round(100 * row["fb_used_mib"] / fb_total) if fb_total else None,
        "temp": _round(row["gpu_temp_c"]),
        "mem_temp": _round(row["memory_temp_c"]),
        "power_w": _round(row["power_w"]),
        "sm_clock": _round(row["sm_clock_mhz"], 0),
        "xid": row["xid"],
        "ecc_dbe": row["ecc_dbe_total"],
        "throttle": row["throttle_reasons"],
        "tensor": _round(row["tensor_active"], 3),
    }


def gpu_rows(*, site_id: int | None = None, updated_since: datetime | None = None) -> list[dict[str, Any]]:
    """The GPU table's rows: physical GPUs (their MIG instances are listed on the GPU's page)."""
    states = GpuState.objects.filter(gpu__parent__isnull=True)
    if site_id is not None:
        states = states.filter(gpu__node__site_id=site_id)
    if updated_since is not None:
        states = states.filter(updated_at__gt=updated_since)
    return [_gpu_row(r) for r in states.order_by("gpu__node__hostname", "gpu__index").values(*GPU_ROW_FIELDS)]


def _empty_series() -> dict[str, list[Any]]:
    return {"ts": [], "util": [], "power_kw": [], "temp": []}


# A bucket's time as (epoch seconds, ISO text), both made by PostgreSQL: Django loads every
# timestamptz through a Python function, which made fetching a day of minutes cost more than
# running the query.
def _bucket_columns(expression: str) -> str:
    return (
        f"extract(epoch FROM {expression})::int8, "
        f"""to_char({expression} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"')"""
    )


def _collect(rows: Any, bucket: int) -> dict[int, dict[str, list[Any]]]:
    """Rows of (epoch, ISO time, site, util, power kW, temp) into per-site series; gaps become None
    points."""
    series: dict[int, dict[str, list[Any]]] = {}
    last_epoch: dict[int, int] = {}
    gap = 3 * bucket
    for epoch, iso, sid, util, power_kw, temp in rows:
        s = series.setdefault(sid, _empty_series())
        previous = last_epoch.get(sid)
        if previous is not None and epoch - previous > gap:
            # A gap in the data (an outage, a stopped agent) is drawn as a gap, not a straight line.
            s["ts"].append(datetime.fromtimestamp(previous + bucket, UTC).isoformat())
            for key in ("util", "power_kw", "temp"):
                s[key].append(None)
        last_epoch[sid] = epoch
        s["ts"].append(iso)
        s["util"].append(_round(util))
        s["power_kw"].append(_round(power_kw, 2))
        s["temp"].append(_round(temp))
    return series


def site_series_from_raw(*, seconds: int, site_id: int | None = None) -> dict[str, Any]:
    """Per-site series computed from raw samples (the live 15-minute view; the benchmark's baseline).

    The newest, still-filling bucket is left out: a half-reported bucket would draw a false dip.
    """
    bucket = max(10, seconds // MAX_POINTS)
    now = timezone.now()
    site_filter = "AND n.site_id = %(site_id)s" if site_id is not None else ""
    sql = f"""
        WITH per_gpu AS (
            SELECT date_bin(%(bucket)s, s.ts, TIMESTAMPTZ '2000-01-01') AS bucket, n.site_id, s.gpu_id,
                   avg(s.gpu_util) AS util, avg(s.power_w) AS power, max(s.gpu_temp_c) AS temp,
                   max(g.parent_id) AS parent_id
            FROM fleet_gpusample s
            JOIN fleet_gpu g ON g.id = s.gpu_id
            JOIN fleet_node n ON n.id = g.node_id
            WHERE s.ts >= %(since)s AND s.ts < date_bin(%(bucket)s, %(now)s, TIMESTAMPTZ '2000-01-01')
            {site_filter}
            GROUP BY 1, 2, 3
        )
        -- MIG instances are left out after the per-GPU step, not in the join: a filter there
        -- changes the planner's row estimates and costs the raw scan its parallel plan.
        SELECT {_bucket_columns("bucket")}, site_id, avg(util), sum(power) / 1000.0, max(temp)
        FROM per_gpu WHERE parent_id IS NULL GROUP BY bucket, site_id ORDER BY bucket, site_id
    """
    params = {
        "bucket": timedelta(seconds=bucket),
        "since": now - timedelta(seconds=seconds),
        "now": now,
        "site_id": site_id,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        series = _collect(cursor.fetchall(), bucket)
    return {
        "bucket_seconds": bucket,
        "range_seconds": seconds,
        "resolution": "raw",
        "sites": {str(k): v for k, v in series.items()},
    }


def site_series_from_rollups(*, seconds: int, resolution: str, site_id: int | None = None) -> dict[str, Any]:
    """Per-site series from the site rollups: a read of at most a few thousand rows."""
    bucket = BUCKET_SECONDS[resolution]
    site_filter = "AND scope_id = %(site_id)s" if site_id is not None else ""
    sql = f"""
        SELECT {_bucket_columns("bucket")}, scope_id, util_mean, power_sum / 1000.0, temp_max
        FROM fleet_grouprollup_{resolution}
        WHERE scope = 'site' AND bucket >= %(since)s {site_filter}
        ORDER BY bucket, scope_id
    """
    params = {"since": timezone.now() - timedelta(seconds=seconds), "site_id": site_id}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        series = _collect(cursor.fetchall(), bucket)
    return {
        "bucket_seconds": bucket,
        "range_seconds": seconds,
        "resolution": resolution,
        "sites": {str(k): v for k, v in series.items()},
    }


def site_series(*, range_key: str, site_id: int | None = None) -> dict[str, Any]:
    seconds, resolution = RANGES[range_key], RESOLUTION[range_key]
    if resolution == "raw":
        return site_series_from_raw(seconds=seconds, site_id=site_id)
    return site_series_from_rollups(seconds=seconds, resolution=resolution, site_id=site_id)


def overview_snapshot(*, range_key: str = DEFAULT_RANGE, site_id: int | None = None) -> dict[str, Any]:
    """Everything the fleet page draws, for a first load or after a websocket reconnect."""
    return {
        "ts": timezone.now().isoformat(),
        "range": range_key,
        "totals": fleet_totals(site_id=site_id),
        "sites": site_summaries(),
        "gpus": gpu_rows(site_id=site_id),
        "series": site_series(range_key=range_key, site_id=site_id),
    }


def build_fleet_delta(topic: str, watermark: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `fleet` topic's push: totals and site cards now, and the GPU rows changed since the
    previous push.

    The watermark is the newest state time sent and a digest of each GPU row in the previous
    push's window: the overlap reads those rows again, and one whose content has not changed since
    is not sent again (pushes come faster than the overlap: without this each row went out several times)."""
    if isinstance(watermark, str):  # a watermark from before the sent rows were remembered
        watermark = {"t": watermark, "sent": {}}
    since = (
        datetime.fromisoformat(watermark["t"]) - WATERMARK_OVERLAP
        if watermark and watermark.get("t")
        else timezone.now() - timedelta(seconds=settings.FLEET_STALE_SECONDS)
    )
    sent = (watermark or {}).get("sent") or {}
    # Read the watermark before the rows: a state written in between is sent now or next time.
    newest = GpuState.objects.aggregate(m=Max("updated_at"))["m"]
    window = [(row, _row_digest(row)) for row in gpu_rows(updated_since=since)]
    rows = [row for row, digest in window if sent.get(row["uuid"]) != digest]
    payload = {
        "type": "fleet.delta",
        "topic": topic,
        "ts": timezone.now().isoformat(),
        "totals": fleet_totals(),
        "sites": site_summaries(),
        "gpus": rows,
    }
    mark = newest.isoformat() if newest else (watermark or {}).get("t")
    # Every row of the window is in this push or was in the previous one.
    return payload, {"t": mark, "sent": {row["uuid"]: digest for row, digest in window}}


def _row_digest(row: dict[str, Any]) -> int:
    """A row's content as a number, the same in every process (a state rewritten with the same
    sample time but other values, a second source for one GPU, differs)."""
    return zlib.crc32(repr(tuple(row.values())).encode())


# --- One GPU's and one node's pages ----------------------------------------------------------

# What a GPU's charts draw, by the key the page reads. A MIG instance has only utilisation and
# memory of its own (power and temperature are its physical GPU's), and the rollups keep no
# memory, so a MIG instance's memory is drawn from raw samples (the 15-minute view) only.
GPU_SERIES_KEYS = ("util", "temp", "power_w", "mem_used_pct")
MIG_SERIES_KEYS = ("util", "mem_used_pct")
NODE_SERIES_KEYS = ("util", "temp", "power_w")
# The newest sample's fields, as live pushes send them (the same keys as the series).
_STATE_FIELDS = (
    "gpu_id",
    "gpu__uuid",
    "ts",
    "gpu_util",
    "gpu_temp_c",
    "power_w",
    "fb_used_mib",
    "fb_free_mib",
    "updated_at",
)


def _collect_per_gpu(rows: Any, bucket: int, keys: tuple[str, ...]) -> dict[int, dict[str, list[Any]]]:
    """Rows of (epoch, ISO time, gpu id, *values in ``keys`` order) into per-GPU series; a gap of
    more than three buckets gets a None point, so the chart draws a gap, not a straight line."""
    series: dict[int, dict[str, list[Any]]] = {}
    last_epoch: dict[int, int] = {}
    for epoch, iso, gpu_id, *values in rows:
        s = series.setdefault(gpu_id, {"ts": [], **{k: [] for k in keys}})
        previous = last_epoch.get(gpu_id)
        if previous is not None and epoch - previous > 3 * bucket:
            s["ts"].append(datetime.fromtimestamp(previous + bucket, UTC).isoformat())
            for key in keys:
                s[key].append(None)
        last_epoch[gpu_id] = epoch
        s["ts"].append(iso)
        for key, value in zip(keys, values, strict=True):
            s[key].append(_round(value))
    return series


def _gpu_series(gpu_ids: list[int], *, range_key: str) -> tuple[dict[str, Any], dict[int, dict[str, list[Any]]]]:
    """Per-GPU series over a range: raw samples for 15 minutes, the GPU rollups beyond (1-minute
    up to a day, hourly for a week), so no series passes 1,440 points."""
    seconds, resolution = RANGES[range_key], RESOLUTION[range_key]
    now = timezone.now()
    if resolution == "raw":
        bucket = max(10, seconds // MAX_POINTS)
        # The newest, still-filling bucket is left out: the live pushes draw it when it is whole.
        sql = f"""
            SELECT {_bucket_columns("bucket")}, gpu_id, util, temp, power, mem FROM (
                SELECT date_bin(%(bucket)s, ts, TIMESTAMPTZ '2000-01-01') AS bucket, gpu_id,
                       avg(gpu_util) AS util, max(gpu_temp_c) AS temp, avg(power_w) AS power,
                       avg(100.0 * fb_used_mib / nullif(fb_used_mib + fb_free_mib, 0)) AS mem
                FROM fleet_gpusample
                WHERE gpu_id = ANY(%(ids)s) AND ts >= %(since)s
                  AND ts < date_bin(%(bucket)s, %(now)s, TIMESTAMPTZ '2000-01-01')
                GROUP BY 1, 2
            ) b ORDER BY bucket, gpu_id
        """
        params: dict[str, Any] = {"bucket": timedelta(seconds=bucket)}
    else:
        bucket = BUCKET_SECONDS[resolution]
        sql = f"""
            SELECT {_bucket_columns("bucket")}, gpu_id, util_mean, temp_max, power_mean, NULL
            FROM fleet_gpurollup_{resolution}
            WHERE gpu_id = ANY(%(ids)s) AND bucket >= %(since)s
            ORDER BY bucket, gpu_id
        """
        params = {}
    params.update({"ids": gpu_ids, "since": now - timedelta(seconds=seconds), "now": now})
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        series = _collect_per_gpu(cursor.fetchall(), bucket, GPU_SERIES_KEYS)
    meta = {"range": range_key, "resolution": resolution, "bucket_seconds": bucket, "range_seconds": seconds}
    return meta, series


def _empty(keys: tuple[str, ...]) -> dict[str, list[Any]]:
    return {"ts": [], **{k: [] for k in keys}}


def gpu_series(gpu: Gpu, *, range_key: str = DEFAULT_RANGE) -> dict[str, Any]:
    """One GPU's page snapshot: its series over the range and the keys it charts."""
    keys = MIG_SERIES_KEYS if gpu.is_mig_instance else GPU_SERIES_KEYS
    meta, series = _gpu_series([gpu.pk], range_key=range_key)
    s = series.get(gpu.pk, _empty(GPU_SERIES_KEYS))
    return {
        **meta,
        "ts": timezone.now().isoformat(),
        "gpu": {"id": gpu.pk, "uuid": gpu.uuid, "label": gpu.label},
        "keys": list(keys),
        "series": {"ts": s["ts"], **{k: s[k] for k in keys}},
    }


def node_series(node: Node, *, range_key: str = DEFAULT_RANGE) -> dict[str, Any]:
    """A node's page snapshot: one series per physical GPU, side by side on each chart."""
    gpus = list(Gpu.objects.physical().filter(node=node).order_by("index", "uuid").values("id", "uuid", "index"))
    meta, series = _gpu_series([g["id"] for g in gpus], range_key=range_key)
    return {
        **meta,
        "ts": timezone.now().isoformat(),
        "node": {"id": node.pk, "hostname": node.hostname},
        "keys": list(NODE_SERIES_KEYS),
        "gpus": [
            {
                "id": g["id"],
                "uuid": g["uuid"],
                "label": f"gpu{g['index']}",
                "series": {
                    k: v for k, v in series.get(g["id"], _empty(GPU_SERIES_KEYS)).items() if k != "mem_used_pct"
                },
            }
            for g in gpus
        ],
    }


def _point(row: dict[str, Any]) -> dict[str, Any]:
    used, free = row["fb_used_mib"], row["fb_free_mib"]
    return {
        "id": row["gpu_id"],
        "uuid": row["gpu__uuid"],
        "ts": row["ts"].isoformat(),
        "util": _round(row["gpu_util"]),
        "temp": _round(row["gpu_temp_c"]),
        "power_w": _round(row["power_w"]),
        "mem_used_pct": _round(100 * used / (used + free)) if used is not None and free else None,
    }


def watched_topics(gpu_ids: Any) -> list[str]:
    """The ``gpu.<id>`` and ``node.<id>`` topics of these GPUs that a page is watching."""
    if not live.anything_watched():  # the common case, nobody on a GPU or node page: one read
        return []
    rows = Gpu.objects.filter(pk__in=list(gpu_ids)).values_list("pk", "node_id")
    candidates = {f"gpu.{pk}" for pk, _ in rows} | {f"node.{node_id}" for _, node_id in rows}
    if not candidates:
        return []
    return live.watched(sorted(candidates))


def _delta(topic: str, watermark: str | None, states: Any) -> tuple[dict[str, Any] | None, str | None]:
    since = (
        datetime.fromisoformat(watermark) - WATERMARK_OVERLAP
        if watermark
        else timezone.now() - timedelta(seconds=settings.FLEET_STALE_SECONDS)
    )
    rows = list(states.filter(updated_at__gt=since).order_by("gpu_id").values(*_STATE_FIELDS))
    if not rows:
        return None, watermark
    newest = max(r["updated_at"] for r in rows)
    payload = {
        "type": "gpu.delta",
        "topic": topic,
        "ts": timezone.now().isoformat(),
        "points": [_point(r) for r in rows],
    }
    return payload, newest.isoformat()


def build_gpu_delta(topic: str, watermark: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The ``gpu.<id>`` topic's push: the GPU's newest sample, if it changed since the previous push."""
    return _delta(topic, watermark, GpuState.objects.filter(gpu_id=int(topic.split(".", 1)[1])))


def build_node_delta(topic: str, watermark: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The ``node.<id>`` topic's push: the newest samples of the node's physical GPUs that changed."""
    node_id = int(topic.split(".", 1)[1])
    return _delta(topic, watermark, GpuState.objects.filter(gpu__node_id=node_id, gpu__parent__isnull=True))


def node_incidents(node: Node, *, limit: int = 20) -> list[Any]:
    """Incidents that name this node (by its ``hostname`` label, as alerts do): open ones first."""
    from incidents.models import Incident

    incidents = Incident.objects.filter(Q(labels__hostname=node.hostname) | Q(labels__node=node.hostname))
    open_ = list(incidents.open().order_by("-detected_at")[:limit])
    return open_ + list(incidents.resolved().order_by("-detected_at")[: max(0, limit - len(open_))])
