"""The capacity CSV exports: the plan as monthly rows per pool and in total, and reservations.
Cells a spreadsheet would run as a formula are escaped (console.spreadsheet)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

from console import spreadsheet
from fleet.capacity.models import Reservation
from fleet.choices import PriorityTier

PLAN_CSV_COLUMNS = (
    ["month", "site", "pool", "gpu_model", "installed", "energised", "healthy"]
    + [f"reserved_{t.value.replace('-', '_')}" for t in PriorityTier]
    + ["conflict", "curtailed", "curtailed_why"]
)


def plan_csv(data: dict[str, Any]) -> str:
    """The plan as monthly rows, one per pool and month, then the totals (pool "total")."""
    buf = io.StringIO()
    w = spreadsheet.writer(buf)
    w.writerow(PLAN_CSV_COLUMNS)
    tiers = [t.value for t in PriorityTier]

    def write(row: dict[str, Any], site: str, pool: str, model: str) -> None:
        healthy = "" if row["healthy"] is None else row["healthy"]
        w.writerow(
            [row["month"], site, pool, model, row["installed"], row["energised"], healthy]
            + [row["reserved"][t] for t in tiers]
            + [int(row["conflict"]), row["curtailed"], spreadsheet.cell(row["curtailed_why"] or "")]
        )

    for p in data["pools"]:
        for row in p["months"]:
            write(row, p["site"], p["name"], p["gpu_model"])
    for row in data["total"]:
        write(row, "", "total", "")
    return buf.getvalue()


RESERVATION_CSV_COLUMNS = ["id", "team", "site", "pool", "gpus", "start", "end", "tier", "priority", "state"]


def reservations_csv(reservations: Iterable[Reservation]) -> str:
    """One row per reservation, in the order given (the API's filtered list)."""
    buf = io.StringIO()
    w = spreadsheet.writer(buf)
    w.writerow(RESERVATION_CSV_COLUMNS)
    for r in reservations:
        w.writerow(
            [
                r.pk,
                r.team_id,
                r.pool.site.name,
                r.pool.name,
                r.gpus,
                r.start.isoformat(),
                r.end.isoformat(),
                r.tier,
                r.priority,
                r.state,
            ]
        )
    return buf.getvalue()
