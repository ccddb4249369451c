"""Read models for the fleet dashboard: totals, site cards, the GPU table, time series, live deltas.

The snapshot (HTTP) and the live deltas (websocket) are built from the same functions, so a page
that reconnects and re-fetches the snapshot lands on exactly what the deltas would have shown.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Avg, Count, Max, Q, Sum
from django.utils import timezone

from console import live
from console.ranges import Window
from fleet.inventory.models import Gpu, Node, Site
from fleet.telemetry.models import GpuState
from incidents.choices import OPEN_STATES, FindingStatus
from incidents.detectors import source_of
from incidents.models import Finding

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
    "gpu_id",
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


def stale_cutoff() -> datetime:
    return timezone.now() - timedelta(seconds=settings.FLEET_STALE_SECONDS)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(float(value), digits)


# The GPU-health detectors (fleet.telemetry.detectors) whose findings mean "this GPU has an XID or
# ECC error": critical XIDs and double-bit ECC errors.
XID_ECC_DETECTORS = ("critical-xid", "ecc-double-bit")


def gpus_with_open_xid_ecc() -> dict[str, int]:
    """The physical GPUs with an open XID or double-bit ECC finding: uuid -> site id.

    A finding is open while it fires, and after it clears for as long as its incident is open (an
    XID is one sample's value: the GPU's next sample reads 0 while the node still waits for its
    drain). A finding about a MIG instance names its physical GPU. Every "GPUs with XID / ECC
    errors" figure (the overview, the fleet page's totals and site cards, the GPU table's filter)
    comes from here, so they agree.
    """
    named = (
        Finding.objects.filter(source__in=[source_of(name) for name in XID_ECC_DETECTORS])
        .filter(Q(status=FindingStatus.FIRING) | Q(incident__state__in=OPEN_STATES))
        .values_list("labels__gpu", flat=True)
    )
    uuids = {uuid for uuid in named if isinstance(uuid, str)}
    if not uuids:
        return {}
    rows = Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "parent__uuid", "node__site_id")
    return {parent or uuid: site_id for uuid, parent, site_id in rows}


def gpu_power_w(*, by: str = "site", now: datetime | None = None) -> dict[int | None, float]:
    """The GPUs' power draw (W) per site or per rack (``by``): the latest power of each physical GPU
    with a fresh state, summed. GPUs only: no node overhead. A MIG instance's power is its physical
    GPU's and is not added again. The fleet page's and the overview's "GPU power" and the power
    page's GPU share of its draw all read this."""
    key = {"site": "gpu__node__site_id", "rack": "gpu__node__rack_id"}[by]
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.FLEET_STALE_SECONDS)
    rows = (
        GpuState.objects.filter(gpu__parent__isnull=True, ts__gte=cutoff)
        .values(key)
        .annotate(watts=Sum("power_w"))
        .values_list(key, "watts")
    )
    return {group: float(watts or 0.0) for group, watts in rows}


def fleet_totals(*, site_id: int | None = None) -> dict[str, Any]:
    """Totals over physical GPUs: a MIG instance is part of its GPU, not another GPU (its power,
    temperature and errors are the physical GPU's own)."""
    gpus = Gpu.objects.physical()
    states = GpuState.objects.filter(gpu__parent__isnull=True)
    if site_id is not None:
        gpus = gpus.filter(node__site_id=site_id)
        states = states.filter(gpu__node__site_id=site_id)
    cutoff = stale_cutoff()
    fresh = Q(ts__gte=cutoff)
    agg = states.aggregate(
        reporting=Count("pk", filter=fresh),
        mean_util=Avg("gpu_util", filter=fresh),
        max_temp=Max("gpu_temp_c", filter=fresh),
        mean_temp=Avg("gpu_temp_c", filter=fresh),
        throttled=Count("pk", filter=fresh & Q(throttle_reasons__gt=1)),
    )
    power = gpu_power_w(by="site")
    faulted = gpus_with_open_xid_ecc()
    hottest = [
        gpu_row(row, faulted=faulted)
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
        "power_kw": _round((power.get(site_id, 0.0) if site_id is not None else sum(power.values())) / 1000, 2),
        "max_temp": _round(agg["max_temp"]),
        "mean_temp": _round(agg["mean_temp"]),
        "with_errors": sum(1 for site in faulted.values() if site_id is None or site == site_id),
        "throttled": agg["throttled"],
        "hottest": hottest,
    }


def site_summaries() -> list[dict[str, Any]]:
    """One summary per site. Three grouped reads (GPUs, nodes, fresh states per site) rather than
    one join of sites, nodes, GPUs and states with COUNT(DISTINCT): at 100,000 GPUs the join's
    distinct counts took most of a second, the grouped reads a fraction of it."""
    cutoff = stale_cutoff()
    gpus = dict(
        Gpu.objects.physical().values("node__site_id").annotate(n=Count("pk")).values_list("node__site_id", "n")
    )
    nodes = dict(Node.objects.values("site_id").annotate(n=Count("pk")).values_list("site_id", "n"))
    fresh = {
        row["gpu__node__site_id"]: row
        for row in GpuState.objects.filter(gpu__parent__isnull=True, ts__gte=cutoff)
        .values("gpu__node__site_id")
        .annotate(
            reporting=Count("pk"),
            mean_util=Avg("gpu_util"),
            max_temp=Max("gpu_temp_c"),
            mean_temp=Avg("gpu_temp_c"),
        )
    }
    power = gpu_power_w(by="site")
    faulted = gpus_with_open_xid_ecc()
    none: dict[str, Any] = {"reporting": 0, "mean_util": None, "max_temp": None, "mean_temp": None}
    return [
        {
            "id": s.id,
            "name": s.name,
            "region": s.region,
            "contracted_power_kw": _round(s.contracted_power_kw),
            "gpus": gpus.get(s.id, 0),
            "nodes": nodes.get(s.id, 0),
            "reporting": fresh.get(s.id, none)["reporting"],
            "mean_util": _round(fresh.get(s.id, none)["mean_util"]),
            "power_kw": _round(power.get(s.id, 0.0) / 1000, 2),
            "max_temp": _round(fresh.get(s.id, none)["max_temp"]),
            "mean_temp": _round(fresh.get(s.id, none)["mean_temp"]),
            "with_errors": sum(1 for site in faulted.values() if site == s.id),
        }
        for s in Site.objects.order_by("name")
    ]


def mig_memory(parent_ids: Any) -> dict[int, tuple[float | None, float | None]]:
    """Per physical GPU in MIG mode, its instances' framebuffer from their latest states: (used MiB,
    free MiB), each summed over the instances that report it. In MIG mode the physical GPU reports
    no framebuffer of its own (DCGM gives it per instance), so its memory is its instances'."""
    ids = list(parent_ids)
    if not ids:
        return {}
    rows = (
        GpuState.objects.filter(gpu__parent_id__in=ids)
        .values("gpu__parent_id")
        .annotate(used=Sum("fb_used_mib"), free=Sum("fb_free_mib"))
        .values_list("gpu__parent_id", "used", "free")
    )
    return {parent: (used, free) for parent, used, free in rows}


def memory_used_pct(used: float | None, free: float | None) -> float | None:
    """Framebuffer used as a percentage of used + free (None when either is unknown)."""
    if used is None or free is None or used + free <= 0:
        return None
    return _round(100 * used / (used + free))


def gpu_row(
    row: dict[str, Any],
    *,
    faulted: dict[str, int] | None = None,
    mig: dict[int, tuple[float | None, float | None]] | None = None,
) -> dict[str, Any]:
    used, free = row["fb_used_mib"], row["fb_free_mib"]
    if used is None and mig and row["gpu_id"] in mig:  # a GPU in MIG mode: its instances' memory
        used, free = mig[row["gpu_id"]]
    return {
        "uuid": row["gpu__uuid"],
        "index": row["gpu__index"],
        "model": row["gpu__model"],
        "hostname": row["gpu__node__hostname"],
        "site_id": row["gpu__node__site_id"],
        "site": row["gpu__node__site__name"],
        "ts": row["ts"].isoformat(),
        "util": _round(row["gpu_util"]),
        "mem_used_pct": memory_used_pct(used, free),
        "temp": _round(row["gpu_temp_c"]),
        "mem_temp": _round(row["memory_temp_c"]),
        "power_w": _round(row["power_w"]),
        "sm_clock": _round(row["sm_clock_mhz"], 0),
        "xid": row["xid"],
        "ecc_dbe": row["ecc_dbe_total"],
        "open_xid_ecc": row["gpu__uuid"] in (faulted or {}),
        "throttle": row["throttle_reasons"],
        "tensor": _round(row["tensor_active"], 3),
    }


def gpu_rows(*, site_id: int | None = None, updated_since: datetime | None = None) -> list[dict[str, Any]]:
    """The GPU table's rows: physical GPUs (their MIG instances are listed on the GPU's page).
    ``open_xid_ecc`` marks a GPU with an open XID or ECC finding (gpus_with_open_xid_ecc)."""
    states = GpuState.objects.filter(gpu__parent__isnull=True)
    if site_id is not None:
        states = states.filter(gpu__node__site_id=site_id)
    if updated_since is not None:
        states = states.filter(updated_at__gt=updated_since)
    rows = list(states.order_by("gpu__node__hostname", "gpu__index").values(*GPU_ROW_FIELDS))
    mig = mig_memory(r["gpu_id"] for r in rows if r["fb_used_mib"] is None)
    faulted = gpus_with_open_xid_ecc()
    return [gpu_row(r, faulted=faulted, mig=mig) for r in rows]


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


def site_series_from_raw(*, seconds: int, site_id: int | None = None, end: datetime | None = None) -> dict[str, Any]:
    """Per-site series computed from raw samples (the live 15-minute view; the benchmark's baseline),
    over the ``seconds`` ending now, or ending at ``end`` (a custom window).

    The newest, still-filling bucket is left out: a half-reported bucket would draw a false dip.
    """
    bucket = max(10, seconds // MAX_POINTS)
    # A window ending before now stops at the bucket holding its end, as a live one at now's.
    now = timezone.now() if end is None else min(end, timezone.now())
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
        "since": (end or now) - timedelta(seconds=seconds),
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


def site_series_from_rollups(
    *, seconds: int, resolution: str, site_id: int | None = None, end: datetime | None = None
) -> dict[str, Any]:
    """Per-site series from the site rollups: a read of at most a few thousand rows, over the
    ``seconds`` ending now, or ending at ``end`` (a custom window)."""
    bucket = BUCKET_SECONDS[resolution]
    site_filter = "AND scope_id = %(site_id)s" if site_id is not None else ""
    end_filter = "AND bucket < %(until)s" if end is not None else ""
    sql = f"""
        SELECT {_bucket_columns("bucket")}, scope_id, util_mean, power_sum / 1000.0, temp_max
        FROM fleet_grouprollup_{resolution}
        WHERE scope = 'site' AND bucket >= %(since)s {end_filter} {site_filter}
        ORDER BY bucket, scope_id
    """
    params = {"since": (end or timezone.now()) - timedelta(seconds=seconds), "until": end, "site_id": site_id}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        series = _collect(cursor.fetchall(), bucket)
    return {
        "bucket_seconds": bucket,
        "range_seconds": seconds,
        "resolution": resolution,
        "sites": {str(k): v for k, v in series.items()},
    }


def site_series_between(window: Window, *, site_id: int | None = None) -> dict[str, Any]:
    """Per-site series over a custom window (console.ranges): the reads of the presets, at the
    resolution the window's span and age pick; the answer names the window."""
    if window.resolution == "raw":
        series = site_series_from_raw(seconds=window.seconds, site_id=site_id, end=window.end)
    else:
        series = site_series_from_rollups(
            seconds=window.seconds, resolution=window.resolution, site_id=site_id, end=window.end
        )
    return {**series, **window.as_json()}


def site_series(*, range_key: str, site_id: int | None = None, window: Window | None = None) -> dict[str, Any]:
    if window is not None and window.custom:
        return site_series_between(window, site_id=site_id)
    seconds, resolution = RANGES[range_key], RESOLUTION[range_key]
    if resolution == "raw":
        return site_series_from_raw(seconds=seconds, site_id=site_id)
    return site_series_from_rollups(seconds=seconds, resolution=resolution, site_id=site_id)


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


def _gpu_series(
    gpu_ids: list[int], *, range_key: str, window: Window | None = None
) -> tuple[dict[str, Any], dict[int, dict[str, list[Any]]]]:
    """Per-GPU series over a range: raw samples for 15 minutes, the GPU rollups beyond (1-minute
    up to a day, hourly for a week), so no series passes 1,440 points. A custom ``window``
    (console.ranges) reads at its own resolution, up to its end."""
    custom = window is not None and window.custom
    if window is not None and custom:
        seconds, resolution, end = window.seconds, window.resolution, window.end
    else:
        seconds, resolution, end = RANGES[range_key], RESOLUTION[range_key], None
    # A window ending before now stops at the bucket holding its end, as a live one at now's.
    now = timezone.now() if end is None else min(end, timezone.now())
    if resolution == "raw":
        bucket = max(10, seconds // MAX_POINTS)
        # The newest, still-filling bucket is left out: the live pushes draw it when it is whole.
        # A GPU in MIG mode reports no framebuffer of its own: its memory is its instances' (their
        # bucket means summed), as in the GPU table (mig_memory).
        sql = f"""
            WITH own AS (
                SELECT date_bin(%(bucket)s, ts, TIMESTAMPTZ '2000-01-01') AS bucket, gpu_id,
                       avg(gpu_util) AS util, max(gpu_temp_c) AS temp, avg(power_w) AS power,
                       avg(100.0 * fb_used_mib / nullif(fb_used_mib + fb_free_mib, 0)) AS mem
                FROM fleet_gpusample
                WHERE gpu_id = ANY(%(ids)s) AND ts >= %(since)s
                  AND ts < date_bin(%(bucket)s, %(now)s, TIMESTAMPTZ '2000-01-01')
                GROUP BY 1, 2
            ), instances AS (
                SELECT date_bin(%(bucket)s, s.ts, TIMESTAMPTZ '2000-01-01') AS bucket, g.parent_id, s.gpu_id,
                       avg(s.fb_used_mib) AS used, avg(s.fb_free_mib) AS free
                FROM fleet_gpusample s JOIN fleet_gpu g ON g.id = s.gpu_id
                WHERE g.parent_id = ANY(%(ids)s) AND s.ts >= %(since)s
                  AND s.ts < date_bin(%(bucket)s, %(now)s, TIMESTAMPTZ '2000-01-01')
                GROUP BY 1, 2, 3
            ), mig AS (
                SELECT bucket, parent_id, 100.0 * sum(used) / nullif(sum(used + free), 0) AS mem
                FROM instances GROUP BY 1, 2
            )
            SELECT {_bucket_columns("own.bucket")}, own.gpu_id, util, temp, power, coalesce(own.mem, mig.mem)
            FROM own LEFT JOIN mig ON mig.bucket = own.bucket AND mig.parent_id = own.gpu_id
            ORDER BY own.bucket, own.gpu_id
        """
        params: dict[str, Any] = {"bucket": timedelta(seconds=bucket)}
    else:
        bucket = BUCKET_SECONDS[resolution]
        end_filter = "AND bucket < %(until)s" if end is not None else ""
        sql = f"""
            SELECT {_bucket_columns("bucket")}, gpu_id, util_mean, temp_max, power_mean, NULL
            FROM fleet_gpurollup_{resolution}
            WHERE gpu_id = ANY(%(ids)s) AND bucket >= %(since)s {end_filter}
            ORDER BY bucket, gpu_id
        """
        params = {"until": end}
    params.update({"ids": gpu_ids, "since": (end or now) - timedelta(seconds=seconds), "now": now})
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        series = _collect_per_gpu(cursor.fetchall(), bucket, GPU_SERIES_KEYS)
    meta = {"range": range_key, "resolution": resolution, "bucket_seconds": bucket, "range_seconds": seconds}
    if window is not None and custom:
        meta.update(window.as_json())
    return meta, series


def _empty(keys: tuple[str, ...]) -> dict[str, list[Any]]:
    return {"ts": [], **{k: [] for k in keys}}


def gpu_series(gpu: Gpu, *, range_key: str = DEFAULT_RANGE, window: Window | None = None) -> dict[str, Any]:
    """One GPU's page snapshot: its series over the range (or a custom window) and the keys it charts."""
    keys = MIG_SERIES_KEYS if gpu.is_mig_instance else GPU_SERIES_KEYS
    meta, series = _gpu_series([gpu.pk], range_key=range_key, window=window)
    s = series.get(gpu.pk, _empty(GPU_SERIES_KEYS))
    return {
        **meta,
        "ts": timezone.now().isoformat(),
        "gpu": {"id": gpu.pk, "uuid": gpu.uuid, "label": gpu.label},
        "keys": list(keys),
        "series": {"ts": s["ts"], **{k: s[k] for k in keys}},
    }


def node_series(node: Node, *, range_key: str = DEFAULT_RANGE, window: Window | None = None) -> dict[str, Any]:
    """A node's page snapshot: one series per physical GPU, side by side on each chart."""
    gpus = list(Gpu.objects.physical().filter(node=node).order_by("index", "uuid").values("id", "uuid", "index"))
    meta, series = _gpu_series([g["id"] for g in gpus], range_key=range_key, window=window)
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


def _point(row: dict[str, Any], mig: dict[int, tuple[float | None, float | None]]) -> dict[str, Any]:
    used, free = row["fb_used_mib"], row["fb_free_mib"]
    if used is None and row["gpu_id"] in mig:  # a GPU in MIG mode: its instances' memory
        used, free = mig[row["gpu_id"]]
    return {
        "id": row["gpu_id"],
        "uuid": row["gpu__uuid"],
        "ts": row["ts"].isoformat(),
        "util": _round(row["gpu_util"]),
        "temp": _round(row["gpu_temp_c"]),
        "power_w": _round(row["power_w"]),
        "mem_used_pct": memory_used_pct(used, free),
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
    mig = mig_memory(r["gpu_id"] for r in rows if r["fb_used_mib"] is None)
    payload = {
        "type": "gpu.delta",
        "topic": topic,
        "ts": timezone.now().isoformat(),
        "points": [_point(r, mig) for r in rows],
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
