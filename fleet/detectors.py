"""GPU-health detectors: functions from recent telemetry to the findings present now.

Registered with the incident engine's registry (incidents.detectors); the engine raises new
findings and clears vanished ones. Each finding carries site, hostname and GPU labels, so
findings of one node group into one incident.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Max

from fleet.models import Gpu, GpuState
from fleet.xid import DRAIN, XID_MEANINGS
from incidents.choices import Severity
from incidents.detectors import FindingSpec, register

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
THERMAL_BITS = 0x20 | 0x40  # SW and HW thermal slowdown
POWER_CAP_BITS = 0x4 | 0x80  # SW power cap, HW power brake
WINDOW = timedelta(minutes=10)
THERMAL_TEMP_C = 83
THERMAL_CLOCK_RATIO = 0.85  # SM clock below this share of the model's top clock in the fleet
POWER_CAP_SHARE = 0.8
PCIE_REPLAYS_PER_WINDOW = 100
SILENT_HORIZON = timedelta(hours=24)


def _labels(row: dict[str, Any]) -> dict[str, str]:
    return {
        "site": row["site"],
        "hostname": row["hostname"],
        "gpu": row["uuid"],
        "gpu_index": str(row["index"]),
        "model": row["model"],
    }


def _gpu_rows(gpu_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    ids = list(set(gpu_ids))
    if not ids:
        return {}
    rows = Gpu.objects.filter(pk__in=ids).values(
        "id", "uuid", "index", "model", hostname=F("node__hostname"), site=F("node__site__name"), node_pk=F("node_id")
    )
    out = {r["id"]: r for r in rows}
    per_node = dict(
        Gpu.objects.filter(node_id__in={r["node_pk"] for r in out.values()})
        .values("node_id")
        .annotate(n=Count("pk"))
        .values_list("node_id", "n")
    )
    for row in out.values():
        row["node_gpu_count"] = per_node.get(row["node_pk"], 1)
    return out


@lru_cache(maxsize=2)
def _window_stats(now: datetime) -> dict[int, dict[str, Any]]:
    """Per GPU over the last ten minutes: counter increases and power-capped share (one scan)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT gpu_id,
                   max(ecc_dbe_total) - min(ecc_dbe_total),
                   max(remapped_rows_uncorrectable) - min(remapped_rows_uncorrectable),
                   max(pcie_replay_total) - min(pcie_replay_total),
                   count(*) FILTER (WHERE throttle_reasons & {POWER_CAP_BITS} > 0)::float / count(*),
                   count(*)
            FROM fleet_gpusample
            WHERE ts > %s AND ts <= %s
            GROUP BY gpu_id
            """,
            [now - WINDOW, now],
        )
        return {
            gpu_id: {"dbe": dbe or 0, "remap": remap or 0, "pcie": pcie or 0, "capped": capped or 0, "n": n}
            for gpu_id, dbe, remap, pcie, capped, n in cursor.fetchall()
        }


def _gpu_finding(
    gpu: dict[str, Any],
    kind: str,
    *,
    severity: str,
    summary: str,
    impact: dict[str, Any] | None = None,
    category: str = "gpu-health",
    **extra: Any,
) -> FindingSpec:
    """A finding about one GPU: fingerprinted by its kind and the GPU's UUID; by default the GPU
    is its impact."""
    return FindingSpec(
        fingerprint=f"{kind}:{gpu['uuid']}",
        labels=_labels(gpu),
        severity=severity,
        summary=summary,
        impact={"gpus": 1, "unit": f"gpu:{gpu['uuid']}"} if impact is None else impact,
        category=category,
        **extra,
    )


def _fresh_states(now: datetime) -> Any:
    return GpuState.objects.filter(ts__gte=now - timedelta(seconds=settings.FLEET_STALE_SECONDS))


@register("critical-xid")
def critical_xids(now: datetime) -> list[FindingSpec]:
    states = list(_fresh_states(now).filter(xid__in=list(CRITICAL_XIDS)).values("gpu_id", "xid"))
    gpus = _gpu_rows(s["gpu_id"] for s in states)
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
                # A drain takes every GPU of the node out of service: the node counts once.
                impact=(
                    {"gpus": gpu["node_gpu_count"], "unit": f"node:{gpu['hostname']}"}
                    if drain
                    else {"gpus": 1, "unit": f"gpu:{gpu['uuid']}"}
                ),
                category="gpu-health",
                started_at=first_seen.get(state["gpu_id"]),
            )
        )
    return specs


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
    now: datetime, key: str, *, name: str, severity: str, what: str, threshold: int = 1
) -> list[FindingSpec]:
    stats = _window_stats(now)
    rising = {gpu_id: s[key] for gpu_id, s in stats.items() if s[key] >= threshold}
    gpus = _gpu_rows(rising)
    return [
        _gpu_finding(
            gpus[gpu_id],
            name,
            severity=severity,
            summary=f"{what} on {gpus[gpu_id]['hostname']} GPU {gpus[gpu_id]['index']} (+{int(delta)} in 10 min)",
        )
        for gpu_id, delta in rising.items()
    ]


@register("ecc-double-bit")
def double_bit_ecc(now: datetime) -> list[FindingSpec]:
    return _counter_rising(now, "dbe", name="ecc-dbe", severity=Severity.SEV2, what="Double-bit ECC errors")


@register("remapped-rows")
def remapped_rows_rising(now: datetime) -> list[FindingSpec]:
    return _counter_rising(
        now, "remap", name="remap-unc", severity=Severity.SEV3, what="Uncorrectable remapped rows rising"
    )


@register("pcie-replays")
def pcie_replays(now: datetime) -> list[FindingSpec]:
    return _counter_rising(
        now, "pcie", name="pcie-replay", severity=Severity.SEV4, what="PCIe replays", threshold=PCIE_REPLAYS_PER_WINDOW
    )


@register("row-remap-failure")
def row_remap_failure(now: datetime) -> list[FindingSpec]:
    states = list(_fresh_states(now).filter(row_remap_failure__gt=0).values_list("gpu_id", flat=True))
    gpus = _gpu_rows(states)
    return [
        _gpu_finding(
            g,
            "remap-failure",
            severity=Severity.SEV2,
            summary=f"Row remapping failed on {g['hostname']} GPU {g['index']}: the GPU needs replacing",
        )
        for g in gpus.values()
    ]


@register("thermal-throttling")
def thermal_throttling(now: datetime) -> list[FindingSpec]:
    """Temperature at its limit and the SM clock pulled down while the GPU is busy."""
    top_clock = dict(
        _fresh_states(now).values("gpu__model").annotate(top=Max("sm_clock_mhz")).values_list("gpu__model", "top")
    )
    candidates = (
        _fresh_states(now)
        .filter(gpu_temp_c__gte=THERMAL_TEMP_C, gpu_util__gte=50)
        .values("gpu_id", "gpu__model", "sm_clock_mhz", "throttle_reasons", "gpu_temp_c")
    )
    hot = [
        c
        for c in candidates
        if (c["throttle_reasons"] or 0) & THERMAL_BITS
        or (
            c["sm_clock_mhz"] is not None
            and top_clock.get(c["gpu__model"])
            and c["sm_clock_mhz"] < THERMAL_CLOCK_RATIO * top_clock[c["gpu__model"]]
        )
    ]
    gpus = _gpu_rows(c["gpu_id"] for c in hot)
    return [
        _gpu_finding(
            gpus[c["gpu_id"]],
            "thermal",
            severity=Severity.SEV3,
            summary=f"Thermal throttling on {gpus[c['gpu_id']]['hostname']} GPU {gpus[c['gpu_id']]['index']}: "
            f"{c['gpu_temp_c']:.0f} °C, SM clock {c['sm_clock_mhz'] or 0:.0f} MHz",
        )
        for c in hot
    ]


@register("power-capping")
def power_capping(now: datetime) -> list[FindingSpec]:
    stats = _window_stats(now)
    capped = [gpu_id for gpu_id, s in stats.items() if s["n"] >= 5 and s["capped"] >= POWER_CAP_SHARE]
    gpus = _gpu_rows(capped)
    return [
        _gpu_finding(
            g,
            "power-cap",
            severity=Severity.SEV4,
            summary=f"Power capping on {g['hostname']} GPU {g['index']} for most of the last 10 minutes",
            impact={},
            category="power",
        )
        for g in gpus.values()
    ]


@register("gpu-silent")
def gpu_silent(now: datetime) -> list[FindingSpec]:
    """No sample for three reporting intervals (but heard from within a day: not decommissioned)."""
    cutoff = now - timedelta(seconds=3 * settings.FLEET_SAMPLE_INTERVAL_SECONDS)
    silent = list(GpuState.objects.filter(ts__lt=cutoff, ts__gte=now - SILENT_HORIZON).values_list("gpu_id", "ts"))
    gpus = _gpu_rows(gpu_id for gpu_id, _ in silent)
    last_seen = dict(silent)
    return [
        _gpu_finding(
            g,
            "silent",
            severity=Severity.SEV3,
            summary=f"{g['hostname']} GPU {g['index']} silent since {last_seen[g['id']]:%H:%M:%S} UTC",
            started_at=last_seen[g["id"]],
        )
        for g in gpus.values()
    ]
