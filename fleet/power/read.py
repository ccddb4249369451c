"""Power against budget, per site and rack: the read model of the power page, its API, its live
pushes and the power detectors.

* Draw: the GPUs' draw (fleet.telemetry.read.figures.gpu_power_w: the latest power of each physical
  GPU with a fresh state, the fleet page's "GPU power") plus the node overhead. The overhead is an
  assumption, not a measurement: settings.NODE_OVERHEAD_W (CPUs, memory, NICs, fans) for each node
  with a fresh GPU state; the console has no node power series to take it from. A MIG instance's
  power is its physical GPU's, so only parent-less GPUs count.
* Budget: the rack's power_budget_kw; the site's contracted_power_kw.
* Headroom: a rack's budget less its draw. A site's: the contracted power less its draw, but never
  more than its racks' budgets allow (each budgeted rack's headroom, a rack over budget giving
  none); when a node sits in no rack or in a rack with no budget, only the contract bounds it.
* Idle: energised (fresh) GPUs under IDLE_UTIL_PCT utilisation.
* GPUs beyond the power budget: GPUs on the nodes their rack's budget cannot run at full load
  (power_budget.energised_in_order: whole nodes in hostname order, each at its GPUs' board power
  plus the overhead; the rule of capacity's energised supply). A site's is the sum of its racks'.
* Energy over 24 h and 7 d: the GPUs' energy from the hourly group rollups (energy_j).
* Per-minute draw: the per-minute group rollups' power_sum plus the overhead of the nodes that
  reported in that minute (node-scope rows), for the chart and the detectors.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet.capacity import power_budget
from fleet.inventory.models import Gpu, Rack, Site
from fleet.telemetry.read.figures import gpu_power_w

IDLE_UTIL_PCT = 5.0
SERIES_WINDOW = timedelta(hours=1)
NO_RACK = "(no rack)"
DRAW_INCLUDES = "the GPUs' latest power plus an assumed node overhead per reporting node"


def _kw(watts: float | None, digits: int = 2) -> float | None:
    return None if watts is None else round(watts / 1000, digits)


def _pct(part: float, whole: float | None) -> float | None:
    return None if not whole else round(100 * part / whole, 1)


def _stale_cutoff(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.FLEET_STALE_SECONDS)


def _gpu_rows(now: datetime) -> list[dict[str, Any]]:
    """Every physical GPU with its node, rack, site and latest state (one query)."""
    return list(
        Gpu.objects.physical()
        .values(
            "id",
            "model",
            "node_id",
            "node__hostname",
            "node__rack_id",
            "node__site_id",
            "state__ts",
            "state__gpu_util",
        )
        .order_by("node__hostname", "index", "id")
    )


class _Tally:
    """One rack's or site's live figures, added up GPU by GPU (their power comes from gpu_power_w)."""

    def __init__(self) -> None:
        self.gpus = 0
        self.fresh_gpus = 0
        self.fresh_nodes: set[int] = set()
        self.nodes: dict[int, list[dict[str, Any]]] = {}
        self.idle = 0

    def add(self, row: dict[str, Any], fresh: bool) -> None:
        self.gpus += 1
        self.nodes.setdefault(row["node_id"], []).append(row)
        if fresh:
            self.fresh_gpus += 1
            self.fresh_nodes.add(row["node_id"])
            if row["state__gpu_util"] is not None and row["state__gpu_util"] < IDLE_UTIL_PCT:
                self.idle += 1

    def overhead_w(self, overhead_w: float) -> float:
        return overhead_w * len(self.fresh_nodes)


def _draw(gpu_w: float, overhead_w: float) -> dict[str, float | None]:
    """A draw and what it is made of (kW): the GPUs, the assumed node overhead, the two together."""
    return {"gpu_draw_kw": _kw(gpu_w), "node_overhead_kw": _kw(overhead_w), "draw_kw": _kw(gpu_w + overhead_w)}


def _energy_kwh(now: datetime) -> dict[tuple[str, int], dict[str, float]]:
    """GPU energy per (scope, id) over 24 h and 7 d, from the hourly group rollups (kWh)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT scope, scope_id,
                   coalesce(sum(energy_j) FILTER (WHERE bucket >= %(day)s), 0),
                   coalesce(sum(energy_j), 0)
            FROM fleet_grouprollup_1h
            WHERE scope IN ('rack', 'site') AND bucket >= %(week)s AND bucket <= %(now)s
            GROUP BY scope, scope_id
            """,
            {"day": now - timedelta(hours=24), "week": now - timedelta(days=7), "now": now},
        )
        return {
            (scope, scope_id): {"energy_kwh_24h": round(day / 3.6e6, 1), "energy_kwh_7d": round(week / 3.6e6, 1)}
            for scope, scope_id, day, week in cursor.fetchall()
        }


def _beyond_budget(tally: _Tally, budget_w: float | None, overhead_w: float) -> tuple[int, int]:
    """(GPUs the rack's budget cannot run at full load, nodes it runs): whole nodes in hostname
    order, each at its GPUs' board power plus the overhead (power_budget.energised_in_order)."""
    nodes = list(tally.nodes.values())
    watts = [sum(power_budget.board_power_w(row["model"]) for row in g) + overhead_w for g in nodes]
    energised = power_budget.energised_in_order(budget_w, watts)
    beyond = sum(len(g) for g, on in zip(nodes, energised, strict=True) if not on)
    return beyond, sum(energised)


def site_headroom_w(
    *, contracted_w: float | None, draw_w: float, rack_room_w: float | None
) -> tuple[float | None, str | None]:
    """A site's headroom (W) and what limits it ("contract" or "racks"): the contracted power less
    the draw, but no more than the room its racks' budgets leave (``rack_room_w``; None when some
    node is bounded by no rack budget). None when neither bounds the site."""
    candidates = []
    if contracted_w is not None:
        candidates.append((contracted_w - draw_w, "contract"))
    if rack_room_w is not None:
        candidates.append((rack_room_w, "racks"))
    if not candidates:
        return None, None
    return min(candidates, key=lambda c: c[0])


def snapshot(*, now: datetime | None = None) -> dict[str, Any]:
    """Everything the power page draws: per site (and per rack in it) the live draw against budget
    and contracted power, headroom, idle GPUs and GPUs beyond the power budget, energy over 24 h
    and 7 d, and the last hour's per-minute draw."""
    now = now or timezone.now()
    cutoff = _stale_cutoff(now)
    overhead_w = power_budget.node_overhead_w()
    racks = {r.pk: r for r in Rack.objects.order_by("site__name", "name")}
    sites = list(Site.objects.order_by("name"))
    rack_tally: dict[int, _Tally] = defaultdict(_Tally)
    site_tally: dict[int, _Tally] = defaultdict(_Tally)
    unracked: dict[int, _Tally] = defaultdict(_Tally)
    for row in _gpu_rows(now):
        fresh = row["state__ts"] is not None and row["state__ts"] >= cutoff
        site_tally[row["node__site_id"]].add(row, fresh)
        if row["node__rack_id"] is not None:
            rack_tally[row["node__rack_id"]].add(row, fresh)
        else:
            unracked[row["node__site_id"]].add(row, fresh)
    site_gpu_w = gpu_power_w(by="site", now=now)
    rack_gpu_w = gpu_power_w(by="rack", now=now)
    energy = _energy_kwh(now)
    empty_energy = {"energy_kwh_24h": 0.0, "energy_kwh_7d": 0.0}
    out_sites = []
    for site in sites:
        site_racks = []
        beyond_budget = 0
        rack_room_w: float | None = 0.0
        for rack in (r for r in racks.values() if r.site_id == site.pk):
            tally = rack_tally[rack.pk]
            budget_w = float(rack.power_budget_kw) * 1000 if rack.power_budget_kw is not None else None
            rack_beyond, energised = _beyond_budget(tally, budget_w, overhead_w)
            beyond_budget += rack_beyond
            gpu_w = rack_gpu_w.get(rack.pk, 0.0)
            draw = gpu_w + tally.overhead_w(overhead_w)
            if budget_w is None:
                rack_room_w = None  # its nodes are bounded by the contract alone
            elif rack_room_w is not None:
                rack_room_w += max(0.0, budget_w - draw)
            site_racks.append(
                {
                    "id": rack.pk,
                    "name": rack.name,
                    **_draw(gpu_w, tally.overhead_w(overhead_w)),
                    "budget_kw": _kw(budget_w, 1),
                    "headroom_kw": _kw(budget_w - draw) if budget_w is not None else None,
                    "utilisation_pct": _pct(draw, budget_w),
                    "gpus": tally.gpus,
                    "reporting": tally.fresh_gpus,
                    "nodes": len(tally.nodes),
                    "nodes_energisable": energised,
                    "idle_gpus": tally.idle,
                    "beyond_budget_gpus": rack_beyond,
                    **energy.get(("rack", rack.pk), empty_energy),
                }
            )
        if not site_racks or unracked[site.pk].gpus:
            rack_room_w = None  # no rack budgets, or nodes in no rack: the contract alone bounds them
        tally = site_tally[site.pk]
        contracted_w = float(site.contracted_power_kw) * 1000 if site.contracted_power_kw is not None else None
        gpu_w = site_gpu_w.get(site.pk, 0.0)
        draw = gpu_w + tally.overhead_w(overhead_w)
        headroom_w, limited_by = site_headroom_w(contracted_w=contracted_w, draw_w=draw, rack_room_w=rack_room_w)
        out_sites.append(
            {
                "id": site.pk,
                "name": site.name,
                "region": site.region,
                **_draw(gpu_w, tally.overhead_w(overhead_w)),
                "contracted_kw": _kw(contracted_w, 1),
                "budget_kw": _kw(sum(r["budget_kw"] or 0 for r in site_racks) * 1000, 1) if site_racks else None,
                "headroom_kw": _kw(headroom_w),
                "headroom_limited_by": limited_by,
                "rack_headroom_kw": _kw(rack_room_w),
                "utilisation_pct": _pct(draw, contracted_w),
                "gpus": tally.gpus,
                "reporting": tally.fresh_gpus,
                "idle_gpus": tally.idle,
                "beyond_budget_gpus": beyond_budget,
                **energy.get(("site", site.pk), empty_energy),
                "racks": site_racks,
            }
        )
    return {
        "ts": now.isoformat(),
        "draw_includes": DRAW_INCLUDES,
        "node_overhead_w": overhead_w,
        "node_overhead_measured": False,
        "idle_util_pct": IDLE_UTIL_PCT,
        "sites": out_sites,
        "series": minute_series(now=now),
    }


# --- per-minute draw, from the group rollups -------------------------------------------------

MINUTE_DRAW_SQL = """
WITH nodes AS (
    SELECT r.bucket, n.site_id, n.rack_id
    FROM fleet_grouprollup_1m r JOIN fleet_node n ON n.id = r.scope_id
    WHERE r.scope = 'node' AND r.bucket >= %(since)s AND r.bucket < %(until)s
), counts AS (
    SELECT 'site' AS scope, site_id AS scope_id, bucket, count(*) AS nodes FROM nodes GROUP BY site_id, bucket
    UNION ALL
    SELECT 'rack', rack_id, bucket, count(*) FROM nodes WHERE rack_id IS NOT NULL GROUP BY rack_id, bucket
)
SELECT g.scope, g.scope_id, g.bucket, coalesce(g.power_sum, 0), coalesce(c.nodes, 0), g.gpus, g.throttled_gpus
FROM fleet_grouprollup_1m g
LEFT JOIN counts c ON c.scope = g.scope AND c.scope_id = g.scope_id AND c.bucket = g.bucket
WHERE g.scope IN ('site', 'rack') AND g.bucket >= %(since)s AND g.bucket < %(until)s
ORDER BY g.scope, g.scope_id, g.bucket
"""


def minute_draws(since: datetime, until: datetime) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Per (scope, id) for sites and racks: each minute in [since, until) with its draw (W: the
    GPUs' mean power summed, plus the overhead of the nodes reporting that minute), GPUs and
    throttled GPUs, oldest first. One query over the per-minute group rollups."""
    overhead_w = power_budget.node_overhead_w()
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(MINUTE_DRAW_SQL, {"since": since, "until": until})
        for scope, scope_id, bucket, power_sum, nodes, gpus, throttled in cursor.fetchall():
            out.setdefault((scope, scope_id), []).append(
                {
                    "bucket": bucket,
                    "draw_w": float(power_sum) + overhead_w * nodes,
                    "gpus": gpus,
                    "throttled_gpus": throttled,
                }
            )
    return out


def minute_series(*, now: datetime | None = None) -> dict[str, Any]:
    """Site and rack draw per minute over the last hour (kW), for the chart."""
    now = now or timezone.now()
    until = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    draws = minute_draws(until - SERIES_WINDOW - timedelta(minutes=1), until)
    series: dict[str, dict[str, dict[str, list[Any]]]] = {"sites": {}, "racks": {}}
    for (scope, scope_id), minutes in draws.items():
        series[f"{scope}s"][str(scope_id)] = {
            "ts": [m["bucket"].isoformat() for m in minutes],
            "draw_kw": [_kw(m["draw_w"]) for m in minutes],
        }
    return series


# --- live pushes -----------------------------------------------------------------------------


def _figures(snap: dict[str, Any]) -> dict[str, Any]:
    """The figures a push compares: per site and rack, what the page shows."""
    keys = ("draw_kw", "headroom_kw", "utilisation_pct", "reporting", "idle_gpus", "beyond_budget_gpus")
    figures: dict[str, Any] = {}
    for site in snap["sites"]:
        figures[f"site.{site['id']}"] = {k: site[k] for k in keys}
        for rack in site["racks"]:
            figures[f"rack.{rack['id']}"] = {k: rack[k] for k in keys}
    return figures


def build_power_delta(topic: str, watermark: dict[str, Any] | None) -> tuple[dict[str, Any] | None, Any]:
    """The ``power`` topic's push: the sites and racks whose figures changed since the previous
    push (all of them the first time), and each site's newest per-minute draw points."""
    snap = snapshot()
    figures = _figures(snap)
    previous = watermark or {}
    changed = {key for key, value in figures.items() if previous.get(key) != value}
    sites = []
    for site in snap["sites"]:
        racks = [r for r in site["racks"] if f"rack.{r['id']}" in changed]
        if f"site.{site['id']}" in changed or racks:
            sites.append({**{k: v for k, v in site.items() if k != "racks"}, "racks": racks})
    points = {sid: {"ts": s["ts"][-2:], "draw_kw": s["draw_kw"][-2:]} for sid, s in snap["series"]["sites"].items()}
    if not sites and points == previous.get("_points"):
        return None, previous
    payload = {"type": "power.delta", "topic": topic, "ts": snap["ts"], "sites": sites, "points": points}
    return payload, {**figures, "_points": points}


# --- the overview tile -------------------------------------------------------------------------


def overview_tile(request: Any) -> dict[str, Any]:
    """The tile on /: total draw (GPUs plus the assumed node overhead, each shown) against contracted
    power, racks over 95 % of budget, idle GPUs and GPUs beyond the power budget."""
    snap = snapshot()
    sites = snap["sites"]
    hot = [
        {"site": s["name"], "rack": r["name"], "pct": r["utilisation_pct"]}
        for s in sites
        for r in s["racks"]
        if r["utilisation_pct"] is not None and r["utilisation_pct"] >= 95
    ]
    contracted = [s["contracted_kw"] for s in sites if s["contracted_kw"] is not None]
    return {
        "has_sites": bool(sites),
        "draw_kw": round(sum(s["draw_kw"] or 0 for s in sites), 1),
        "gpu_draw_kw": round(sum(s["gpu_draw_kw"] or 0 for s in sites), 1),
        "node_overhead_kw": round(sum(s["node_overhead_kw"] or 0 for s in sites), 1),
        "node_overhead_w": snap["node_overhead_w"],
        "contracted_kw": round(sum(contracted), 1) if contracted else None,
        "hot_racks": sorted(hot, key=lambda h: -h["pct"]),
        "idle_gpus": sum(s["idle_gpus"] for s in sites),
        "beyond_budget_gpus": sum(s["beyond_budget_gpus"] for s in sites),
    }
