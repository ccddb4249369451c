"""GPU-health detectors: functions from recent telemetry to the findings present now.

Registered with the incident engine's registry (incidents.detectors); the engine raises new
findings and clears vanished ones. Each finding carries site, hostname and GPU labels, so
findings of one node group into one incident. A fault that takes GPUs out (a critical XID,
double-bit ECC, remapped rows) on a GPU or node a training job runs on also carries the job's
labels and cost: rooms above this one (training) register a hook that adds them
(``register_gpu_fault_hook``), so the finding joins the job's incident and the job's lost
GPU-hours show on the GPU fault that caused them.

Counters are read as Prometheus increase() reads them (a decrease is a reset); a finding's
started_at is the first sample that showed its condition (MTTD counts from the fault); and a GPU
finding clears only while its GPU reports (``_gpu_judged``): missing data is not health. Who
stopped reporting is fleet.telemetry.silent_sources's to say.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import F, Max, Q

from fleet.inventory.models import Gpu
from fleet.telemetry.models import GpuState
from fleet.telemetry.xid import DRAIN, XID_MEANINGS
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector

CRITICAL_XIDS = {
    48: Severity.SEV2,
    63: Severity.SEV3,
    64: Severity.SEV2,
    74: Severity.SEV2,
    79: Severity.SEV2,
    94: Severity.SEV3,
    95: Severity.SEV2,
    119: Severity.SEV2,
    120: Severity.SEV2,
}
# Heard from within this long: still in service (older: decommissioned, not silent).
SILENT_HORIZON = timedelta(hours=24)
THERMAL_BITS = 0x20 | 0x40  # SW and HW thermal slowdown
POWER_CAP_BITS = 0x4 | 0x80  # SW power cap, HW power brake
WINDOW = timedelta(minutes=10)
THERMAL_TEMP_C = 83
THERMAL_CLOCK_RATIO = 0.85  # SM clock below this share of the model's top clock in the fleet
POWER_CAP_SHARE = 0.8
PCIE_REPLAYS_PER_WINDOW = 100
NVLINK_CRC_ERRORS_PER_WINDOW = 100
# Cumulative counters that _window_stats reads as Prometheus increase() does (see _rise). The
# energy counter is not read here: energy comes from power x time in the rollups.
WINDOW_COUNTERS = (
    "ecc_dbe_total",
    "remapped_rows_uncorrectable",
    "pcie_replay_total",
    "nvlink_crc_errors_total",
    "thermal_violation_us",
    "power_violation_us",
)


# What rooms above this one add to a GPU fault's findings (training: the job running on the GPU,
# its labels and its cost). Each hook takes (now, findings) and returns them, enriched.
GpuFaultHook = Callable[[datetime, list[FindingSpec]], list[FindingSpec]]
_gpu_fault_hooks: list[GpuFaultHook] = []


def register_gpu_fault_hook(hook: GpuFaultHook) -> None:
    """Add to the findings of faults that take GPUs out (called once, at import, by the room that
    knows more about those GPUs)."""
    if hook not in _gpu_fault_hooks:
        _gpu_fault_hooks.append(hook)


def _with_hooks(now: datetime, specs: list[FindingSpec]) -> list[FindingSpec]:
    for hook in _gpu_fault_hooks:
        specs = hook(now, specs)
    return specs


def _labels(row: dict[str, Any]) -> dict[str, str]:
    return {
        "site": row["site"],
        "hostname": row["hostname"],
        "gpu": row["uuid"],
        "gpu_index": str(row["index"]),
        "model": row["model"],
        # A rack-scope maintenance window or silence matches on it: only where the node has a rack.
        **({"rack": row["rack"]} if row.get("rack") else {}),
    }


def gpu_rows(gpu_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The GPUs' labels, and what a fault on each takes out: ``physical_uuid`` (the GPU itself, or
    a MIG instance's parent) and ``node_gpu_uuids`` (the node's physical GPUs, for a drain)."""
    ids = list(set(gpu_ids))
    if not ids:
        return {}
    rows = Gpu.objects.filter(pk__in=ids).values(
        "id",
        "uuid",
        "index",
        "model",
        hostname=F("node__hostname"),
        site=F("node__site__name"),
        rack=F("node__rack__name"),
        node_pk=F("node_id"),
        parent_uuid=F("parent__uuid"),
    )
    out = {r["id"]: r for r in rows}
    node_gpus: dict[int, list[str]] = {}
    physical = Gpu.objects.physical().filter(node_id__in={r["node_pk"] for r in out.values()})
    for node_id, uuid in physical.order_by("uuid").values_list("node_id", "uuid"):
        node_gpus.setdefault(node_id, []).append(uuid)
    for row in out.values():
        row["physical_uuid"] = row["parent_uuid"] or row["uuid"]
        row["node_gpu_uuids"] = node_gpus.get(row["node_pk"]) or [row["physical_uuid"]]
        row["node_gpu_count"] = len(row["node_gpu_uuids"])
    return out


def gpu_impact(gpu: dict[str, Any]) -> dict[str, Any]:
    """One physical GPU out of service. A fault on a MIG instance names the instance's physical
    GPU: that is what the incident engine counts, each GPU in ``gpu_uuids`` once per incident."""
    return {"gpus": 1, "unit": f"gpu:{gpu['physical_uuid']}", "gpu_uuids": [gpu["physical_uuid"]]}


def node_impact(gpu: dict[str, Any]) -> dict[str, Any]:
    """Every physical GPU of the node out of service: it must drain."""
    return {"gpus": gpu["node_gpu_count"], "unit": f"node:{gpu['hostname']}", "gpu_uuids": gpu["node_gpu_uuids"]}


def _rise(column: str) -> str:
    """SQL for a counter's rise since the GPU's previous sample, as Prometheus increase() counts
    it: a fall is a reset (driver reload, reboot) and the value after it counted from zero, never
    a negative rise. NULL on a GPU's first sample in the window, or where either value is NULL."""
    previous = f"lag({column}) OVER gpu_order"
    return (
        f"CASE WHEN {column} >= {previous} THEN {column} - {previous} "
        f"WHEN {column} < {previous} THEN {column} END AS {column}_rise"
    )


@lru_cache(maxsize=2)
def _window_stats(now: datetime) -> dict[int, dict[str, Any]]:
    """Per GPU over the last ten minutes (one scan): counter increases, thermal-violation time
    (µs) and the power-capped share of the samples.

    A sample is judged power-capped by its clocks-event bitmask; one without a bitmask (an older
    exporter) by a rise of the power-violation counter since the previous sample. The share is of
    the samples that could be judged.
    """
    rises = ", ".join(_rise(c) for c in WINDOW_COUNTERS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT gpu_id,
                   sum(ecc_dbe_total_rise)::bigint,
                   sum(remapped_rows_uncorrectable_rise)::bigint,
                   sum(pcie_replay_total_rise)::bigint,
                   sum(nvlink_crc_errors_total_rise)::bigint,
                   sum(thermal_violation_us_rise)::bigint,
                   count(*) FILTER (WHERE throttle_reasons & {POWER_CAP_BITS} > 0
                                       OR throttle_reasons IS NULL AND power_violation_us_rise > 0)::float
                       / nullif(count(throttle_reasons)
                                + count(power_violation_us_rise) FILTER (WHERE throttle_reasons IS NULL), 0),
                   count(*)
            FROM (
                SELECT gpu_id, throttle_reasons, {rises}
                FROM fleet_gpusample
                WHERE ts > %s AND ts <= %s
                WINDOW gpu_order AS (PARTITION BY gpu_id ORDER BY ts)
            ) steps
            GROUP BY gpu_id
            """,
            [now - WINDOW, now],
        )
        return {
            gpu_id: {
                "dbe": dbe or 0,
                "remap": remap or 0,
                "pcie": pcie or 0,
                "nvlink_crc": nvlink_crc or 0,
                "thermal_us": thermal_us or 0,
                "capped": capped or 0,
                "n": n,
            }
            for gpu_id, dbe, remap, pcie, nvlink_crc, thermal_us, capped, n in cursor.fetchall()
        }


def _first_bad_sample(
    now: datetime, gpu_ids: Iterable[int], condition: str, *, event: bool = False
) -> dict[int, datetime]:
    """When each GPU's condition began: its first sample in the window showing it (SQL over a
    sample's columns and its counters' ``<column>_rise``), after the last sample that did not.
    For an ``event`` (a counter rising) the first sample showing it: the samples after a rise
    show no rise, yet the fault they reported is the same one.

    MTTD counts from here, not from our detection.
    """
    ids = sorted(set(gpu_ids))
    if not ids:
        return {}
    rises = ", ".join(_rise(c) for c in WINDOW_COUNTERS)
    # One pass: each GPU's last healthy sample is a window aggregate over its partition, not a
    # correlated subquery re-scanning the window's samples for every bad one.
    since_healthy = "" if event else "AND ts > coalesce(last_healthy, '-infinity')"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH steps AS (
                SELECT s.*, {rises}
                FROM fleet_gpusample s
                WHERE s.gpu_id = ANY(%s) AND s.ts > %s AND s.ts <= %s
                WINDOW gpu_order AS (PARTITION BY s.gpu_id ORDER BY s.ts)
            ), marked AS (
                SELECT gpu_id, ts, coalesce(({condition}), false) AS bad FROM steps
            ), judged AS (
                SELECT gpu_id, ts, bad, max(ts) FILTER (WHERE NOT bad) OVER (PARTITION BY gpu_id) AS last_healthy
                FROM marked
            )
            SELECT gpu_id, min(ts) FROM judged
            WHERE bad {since_healthy}
            GROUP BY gpu_id
            """,
            [ids, now - WINDOW, now],
        )
        return dict(cursor.fetchall())


@lru_cache(maxsize=2)
def _reporting_gpus(now: datetime) -> frozenset[str]:
    """UUIDs of the GPUs reporting now (a fresh state): what a GPU finding can be judged by."""
    return frozenset(_fresh_states(now).values_list("gpu__uuid", flat=True))


def _gpu_judged(now: datetime, labels: dict[str, Any]) -> bool:
    """A GPU finding that vanished clears only if its GPU is still reporting: then the data says
    it is healthy. A GPU that went quiet (after an XID 79 it is off the bus) keeps its findings
    firing, and its silence is a finding of its own, until SILENT_HORIZON: a GPU not heard from
    for a day (or deleted) is decommissioned, as gpu-silent judges it, and its findings clear."""
    if labels.get("gpu") in _reporting_gpus(now):
        return True
    return not GpuState.objects.filter(gpu__uuid=labels.get("gpu"), updated_at__gte=now - SILENT_HORIZON).exists()


def gpu_finding(
    gpu: dict[str, Any],
    kind: str,
    *,
    severity: str,
    summary: str,
    impact: dict[str, Any] | None = None,
    category: str = "gpu-health",
    **extra: Any,
) -> FindingSpec:
    """A finding about one GPU: fingerprinted by its kind and the GPU's UUID; by default its
    physical GPU is the impact."""
    return FindingSpec(
        fingerprint=f"{kind}:{gpu['uuid']}",
        labels=_labels(gpu),
        severity=severity,
        summary=summary,
        impact=gpu_impact(gpu) if impact is None else impact,
        category=category,
        **extra,
    )


def _fresh_states(now: datetime) -> Any:
    return GpuState.objects.filter(ts__gte=now - timedelta(seconds=settings.FLEET_STALE_SECONDS))


@detector("critical-xid", judged=_gpu_judged)
def critical_xids(now: datetime) -> list[FindingSpec]:
    states = list(_fresh_states(now).filter(xid__in=list(CRITICAL_XIDS)).values("gpu_id", "xid"))
    gpus = gpu_rows(s["gpu_id"] for s in states)
    first_seen = _xid_first_seen(now, {s["gpu_id"]: s["xid"] for s in states})
    specs = []
    for state in states:
        gpu, xid = gpus[state["gpu_id"]], state["xid"]
        drain = xid in DRAIN
        specs.append(
            FindingSpec(
                fingerprint=f"xid:{gpu['uuid']}:{xid}",
                labels={**_labels(gpu), "xid": str(xid)},
                severity=CRITICAL_XIDS[xid],
                summary=f"XID {xid} ({XID_MEANINGS[xid]}) on {gpu['hostname']} GPU {gpu['index']}",
                description=(
                    "The node must be drained: its jobs cannot use this GPU."
                    if drain
                    else "Check the GPU; it may recover after a reset."
                ),
                # A drain takes every GPU of the node out of service, whichever GPU faulted.
                impact=node_impact(gpu) if drain else gpu_impact(gpu),
                category="gpu-health",
                started_at=first_seen.get(state["gpu_id"]),
            )
        )
    return _with_hooks(now, specs)


def _xid_first_seen(now: datetime, xids: dict[int, int]) -> dict[int, datetime]:
    """When each GPU's current XID first appeared (its first sample carrying it after the last
    sample without it, within the window): MTTD counts from the fault, not from our detection."""
    if not xids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT s.gpu_id, min(s.ts)
            FROM fleet_gpusample s
            JOIN unnest(%s::bigint[], %s::bigint[]) AS x(gpu_id, xid) ON x.gpu_id = s.gpu_id
            WHERE s.ts > %s AND s.xid = x.xid
              AND s.ts > coalesce((SELECT max(o.ts) FROM fleet_gpusample o
                                   WHERE o.gpu_id = s.gpu_id AND o.ts > %s AND o.xid IS DISTINCT FROM x.xid),
                                  '-infinity')
            GROUP BY s.gpu_id
            """,
            [list(xids), list(xids.values()), now - WINDOW, now - WINDOW],
        )
        return dict(cursor.fetchall())


def _counter_rising(
    now: datetime, key: str, column: str, *, name: str, severity: str, what: str, threshold: int = 1
) -> list[FindingSpec]:
    stats = _window_stats(now)
    rising = {gpu_id: s[key] for gpu_id, s in stats.items() if s[key] >= threshold}
    gpus = gpu_rows(rising)
    began = _first_bad_sample(now, rising, f"{column}_rise > 0", event=True)
    return [
        gpu_finding(
            gpus[gpu_id],
            name,
            severity=severity,
            summary=f"{what} on {gpus[gpu_id]['hostname']} GPU {gpus[gpu_id]['index']} (+{int(delta)} in 10 min)",
            started_at=began.get(gpu_id),
        )
        for gpu_id, delta in rising.items()
    ]


@detector("ecc-double-bit", judged=_gpu_judged)
def double_bit_ecc(now: datetime) -> list[FindingSpec]:
    """Double-bit ECC errors: the volatile count above zero on a GPU reporting now, or rising in
    the window. The count is of errors since the driver loaded and only a driver reload (a GPU
    reset) clears it, so a GPU first seen with a count of 2 has two errors nobody has handled."""
    rising = {gpu_id: s["dbe"] for gpu_id, s in _window_stats(now).items() if s["dbe"] > 0}
    counts = dict(_fresh_states(now).filter(ecc_dbe_total__gt=0).values_list("gpu_id", "ecc_dbe_total"))
    gpus = gpu_rows([*rising, *counts])
    # A rise began where the counter first rose; a standing count where it first read above zero.
    began = _first_bad_sample(now, rising, "ecc_dbe_total_rise > 0", event=True)
    began |= _first_bad_sample(now, set(counts) - set(rising), "ecc_dbe_total > 0")
    specs = []
    for gpu_id, gpu in gpus.items():
        summary = f"Double-bit ECC errors on {gpu['hostname']} GPU {gpu['index']}"
        if gpu_id in counts:
            summary += f": {counts[gpu_id]} since the driver loaded"
        if gpu_id in rising:
            summary += f" (+{int(rising[gpu_id])} in 10 min)"
        specs.append(gpu_finding(gpu, "ecc-dbe", severity=Severity.SEV2, summary=summary, started_at=began.get(gpu_id)))
    return _with_hooks(now, specs)


@detector("remapped-rows", judged=_gpu_judged)
def remapped_rows_rising(now: datetime) -> list[FindingSpec]:
    return _with_hooks(
        now,
        _counter_rising(
            now,
            "remap",
            "remapped_rows_uncorrectable",
            name="remap-unc",
            severity=Severity.SEV3,
            what="Uncorrectable remapped rows rising",
        ),
    )


@detector("pcie-replays", judged=_gpu_judged)
def pcie_replays(now: datetime) -> list[FindingSpec]:
    return _counter_rising(
        now,
        "pcie",
        "pcie_replay_total",
        name="pcie-replay",
        severity=Severity.SEV4,
        what="PCIe replays",
        threshold=PCIE_REPLAYS_PER_WINDOW,
    )


@detector("nvlink-crc-errors", judged=_gpu_judged)
def nvlink_crc_errors(now: datetime) -> list[FindingSpec]:
    return _counter_rising(
        now,
        "nvlink_crc",
        "nvlink_crc_errors_total",
        name="nvlink-crc",
        severity=Severity.SEV4,
        what="NVLink CRC errors",
        threshold=NVLINK_CRC_ERRORS_PER_WINDOW,
    )


@detector("row-remap-failure", judged=_gpu_judged)
def row_remap_failure(now: datetime) -> list[FindingSpec]:
    states = list(_fresh_states(now).filter(row_remap_failure__gt=0).values_list("gpu_id", flat=True))
    gpus = gpu_rows(states)
    began = _first_bad_sample(now, gpus, "row_remap_failure > 0")
    return _with_hooks(
        now,
        [
            gpu_finding(
                g,
                "remap-failure",
                severity=Severity.SEV2,
                summary=f"Row remapping failed on {g['hostname']} GPU {g['index']}: the GPU needs replacing",
                started_at=began.get(g["id"]),
            )
            for g in gpus.values()
        ],
    )


@detector("thermal-throttling", judged=_gpu_judged)
def thermal_throttling(now: datetime) -> list[FindingSpec]:
    """A thermal bit in the clocks-event bitmask, whatever the load: throttling itself lowers
    utilisation, so a busy-only rule finds it late or never. On a GPU whose exporter sends no
    bitmask: a rise of its thermal-violation counter (time spent throttled) in the window, or
    busy at the temperature limit with the SM clock pulled down (an idle GPU's clock is low
    anyway, so there the load must say it)."""
    throttled_us = {gpu_id: s["thermal_us"] for gpu_id, s in _window_stats(now).items() if s["thermal_us"] > 0}
    top_clock = dict(
        _fresh_states(now).values("gpu__model").annotate(top=Max("sm_clock_mhz")).values_list("gpu__model", "top")
    )
    candidates = (
        _fresh_states(now)
        .annotate(thermal_bits=F("throttle_reasons").bitand(THERMAL_BITS))
        .filter(
            Q(thermal_bits__gt=0)
            | Q(throttle_reasons__isnull=True, gpu_id__in=list(throttled_us))
            | Q(throttle_reasons__isnull=True, gpu_temp_c__gte=THERMAL_TEMP_C, gpu_util__gte=50)
        )
        .values("gpu_id", "gpu__model", "sm_clock_mhz", "throttle_reasons", "gpu_temp_c", "gpu_util")
    )
    hot: list[tuple[int, str]] = []
    for c in candidates:
        if c["throttle_reasons"] is None and c["gpu_id"] in throttled_us:
            hot.append((c["gpu_id"], f"{throttled_us[c['gpu_id']] / 1e6:.1f} s throttled in 10 min"))
        elif c["throttle_reasons"] or _busy_hot_and_slowed(c, top_clock):
            temp = "?" if c["gpu_temp_c"] is None else f"{c['gpu_temp_c']:.0f}"
            hot.append((c["gpu_id"], f"{temp} °C, SM clock {c['sm_clock_mhz'] or 0:.0f} MHz"))
    gpus = gpu_rows(gpu_id for gpu_id, _ in hot)
    began = _first_bad_sample(
        now,
        gpus,
        f"throttle_reasons & {THERMAL_BITS} > 0 OR throttle_reasons IS NULL AND "
        f"(thermal_violation_us_rise > 0 OR gpu_temp_c >= {THERMAL_TEMP_C} AND gpu_util >= 50)",
    )
    return [
        gpu_finding(
            gpus[gpu_id],
            "thermal",
            severity=Severity.SEV3,
            summary=f"Thermal throttling on {gpus[gpu_id]['hostname']} GPU {gpus[gpu_id]['index']}: {detail}",
            started_at=began.get(gpu_id),
        )
        for gpu_id, detail in hot
    ]


def _busy_hot_and_slowed(state: dict[str, Any], top_clock: dict[str, float]) -> bool:
    """Without a bitmask: busy at the temperature limit with the SM clock well below the top
    clock of its model in the fleet."""
    if state["gpu_temp_c"] is None or state["gpu_temp_c"] < THERMAL_TEMP_C:
        return False
    if state["gpu_util"] is None or state["gpu_util"] < 50:
        return False
    top = top_clock.get(state["gpu__model"])
    return bool(state["sm_clock_mhz"] is not None and top and state["sm_clock_mhz"] < THERMAL_CLOCK_RATIO * top)


@detector("power-capping", judged=_gpu_judged)
def power_capping(now: datetime) -> list[FindingSpec]:
    """Capped in most of the window's samples: by the clocks-event bitmask, or, without one, by
    the power-violation counter rising since the sample before (see _window_stats)."""
    stats = _window_stats(now)
    capped = [gpu_id for gpu_id, s in stats.items() if s["n"] >= 5 and s["capped"] >= POWER_CAP_SHARE]
    gpus = gpu_rows(capped)
    began = _first_bad_sample(
        now,
        gpus,
        f"throttle_reasons & {POWER_CAP_BITS} > 0 OR throttle_reasons IS NULL AND power_violation_us_rise > 0",
    )
    return [
        gpu_finding(
            g,
            "power-cap",
            severity=Severity.SEV4,
            summary=f"Power capping on {g['hostname']} GPU {g['index']} for most of the last 10 minutes",
            impact={},
            category="power",
            started_at=began.get(g["id"]),
        )
        for g in gpus.values()
    ]
