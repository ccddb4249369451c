"""The scheduler's side of the capacity page: the live queue panel beside the pools, the plan API's
``queues`` part and the ``scheduler`` live topic. Capacity sits below the scheduler and cannot
import it, so each is handed to capacity's hooks (fleet.capacity.read.tables.register_pool_section,
fleet.capacity.api.register_capacity_part) from fleet/scheduler/plugins.py."""

from __future__ import annotations

from typing import Any

from fleet.capacity.models import Pool, Team
from fleet.scheduler import drift
from fleet.scheduler.models import SchedulerQueue
from fleet.scheduler.read import pool_queues, team_queues
from fleet.scheduler.store import TOPIC


def duration(seconds: float | None) -> str:
    """An admission wait as a person reads it: 42 s, 3.5 min, 2.1 h; a dash without one (the same
    rule as static/js/scheduler_queues.js, which redraws the figures live)."""
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def queues_part(pool_ids: list[int]) -> list[dict[str, Any]]:
    """The plan API's ``queues``: one entry per pool of the plan, in the plan's order."""
    figures = pool_queues(pool_ids)
    return [figures[pk] for pk in pool_ids]


def quota_waits_part(pool_ids: list[int]) -> list[dict[str, Any]]:
    """The plan API's ``quota_waits``: each team's wait beside its quota on the plan's pools
    (quota_waits), the snapshot the pages' quota cells are redrawn from after a reconnect."""
    return quota_waits(pool_queues(pool_ids))


def _with_wait_text(queues: list[dict[str, Any]]) -> None:
    """Each queue's 1 h and 24 h waits as the panel prints them: p50 / p95."""
    for q in queues:
        for key in ("wait_1h", "wait_24h"):
            w = q[key] or {}
            q[f"{key}_text"] = f"{duration(w.get('p50'))} / {duration(w.get('p95'))}"


def pool_section(pools: list[Pool]) -> dict[str, Any]:
    """The panel's context: the pools with a mapped queue, each with its figures, its waits as text
    and its queues whose quota drifts from the console's; and ``quota_notes``, each team's queue
    wait to set beside its quota in capacity's quota table (fleet.capacity.read.tables.pool_sections)."""
    figures = pool_queues([p.pk for p in pools])
    drifts = _drifts_by_pool(pools)
    rows = []
    for pool in pools:
        f = figures[pool.pk]
        if not f["queues"]:
            continue
        _with_wait_text(f["queues"])
        over = f["gpus_allocated"] is not None and f["gpus_allocated"] > f["gpus_reserved"]
        rows.append({"pool": pool, "figures": f, "over_reserved": over, "drifts": drifts.get(pool.pk, [])})
    return {
        "pool_queue_rows": rows,
        "unmapped": not rows,
        "topic": TOPIC,
        "quota_notes": quota_notes(figures),
    }


# How each of the console's quota fields reads in the panel's drift lines.
DRIFT_FIELDS = {
    "nominal_gpus": "nominal",
    "borrowing_limit_gpus": "borrowing limit",
    "lending_limit_gpus": "lending limit",
}


def _limit(value: Any) -> str:
    """A quota figure as the drift line prints it."""
    return "no limit" if value is None else f"{drift.number(value)}"


def _drifts_by_pool(pools: list[Pool]) -> dict[int, list[dict[str, Any]]]:
    """pool id -> its queues whose quota drifts, each with the fields that differ (the scheduler's
    value against the console's). quota_drift's three statements, whatever the number of queues:
    the same reading the queues page and its import act on."""
    shown = {p.pk for p in pools}
    out: dict[int, list[dict[str, Any]]] = {}
    for d in drift.quota_drift():
        if not d.drifted or d.queue.pool_id not in shown:
            continue
        fields = [
            {"field": DRIFT_FIELDS[name], "scheduler": _limit(theirs), "console": _limit(ours)}
            for name, (theirs, ours) in d.differences.items()
        ]
        out.setdefault(d.queue.pool_id, []).append(
            {
                "queue": d.queue.name,
                "team": d.queue.team.name if d.queue.team else None,
                "status": d.status,
                "fields": fields,
            }
        )
    return out


def quota_notes(figures: dict[int, dict[str, Any]]) -> dict[tuple[int, str], dict[str, str]]:
    """(pool id, team) -> the team's p95 admission wait over the last hour on that pool, as text,
    with a title naming the queue and its 24 h figure. A team with several queues on a pool shows
    its longest wait: the one it feels."""
    notes: dict[tuple[int, str], dict[str, str]] = {}
    worst: dict[tuple[int, str], float] = {}
    for pool_id, f in figures.items():
        for q in f["queues"]:
            if not q["team"]:
                continue
            key = (pool_id, q["team"])
            p95 = (q["wait_1h"] or {}).get("p95")
            if key in notes and (p95 is None or p95 <= worst.get(key, -1.0)):
                continue
            day = (q["wait_24h"] or {}).get("p95")
            notes[key] = {
                "text": duration(p95),
                "title": f"{q['name']}: p95 admission wait {duration(p95)} over 1 h, {duration(day)} over 24 h; "
                f"{q['pending'] or 0:.0f} pending",
            }
            if p95 is not None:
                worst[key] = p95
    return notes


def quota_waits(figures: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """quota_notes as a list a push carries: {"pool", "team", "text", "title"}, the text each
    page's quota cell (``data-value="queue_wait"``) shows."""
    return [{"pool": pk, "team": team, **note} for (pk, team), note in sorted(quota_notes(figures).items())]


def team_section(team: Team, pools: list[Pool]) -> dict[str, Any]:
    """The team page's queue figures: for each pool the team holds a quota on or has a queue
    mapped to, the team's queues with the capacity panel's figures (pool_queues, the same
    statements), ``quota_notes``, the wait beside each of its quotas, computed as the
    capacity page's quota table computes it (one number, one definition), and
    ``team_local_queues``, its Kueue LocalQueues and Slurm accounts with pending and admitted now."""
    mapped = SchedulerQueue.objects.filter(team=team, pool__isnull=False).values_list("pool_id", flat=True)
    pool_ids = sorted({p.pk for p in pools} | set(mapped))
    figures = pool_queues(pool_ids)
    named = Pool.objects.select_related("site").in_bulk(pool_ids)
    rows = []
    for pk in sorted(pool_ids, key=lambda pk: str(named[pk])):
        queues = [q for q in figures[pk]["queues"] if q["team"] == team.name]
        if queues:
            _with_wait_text(queues)
            rows.append({"pool": named[pk], "queues": queues})
    return {
        "team": team,
        "team_queue_rows": rows,
        "team_local_queues": team_queues(team.pk),
        "topic": TOPIC,
        "quota_notes": quota_notes(figures),
    }


def build_scheduler_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``scheduler`` topic's push: the queue figures of the pools whose figures changed since
    the last push (all of them on the first); the page redraws pool by pool."""
    figures = pool_queues()
    before = watermark or {}
    changed = [f for pk, f in sorted(figures.items()) if before.get(pk) != f]
    if not changed:
        return None, watermark
    waits = quota_waits({f["pool"]: f for f in changed})  # the quota cells of the pools that changed
    return {"type": "scheduler.delta", "topic": topic, "pools": changed, "quota_waits": waits}, figures
