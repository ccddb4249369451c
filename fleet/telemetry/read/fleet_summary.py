"""The fleet page's read model and live topics, sized for 100,000 GPUs.

No page holds the whole GPU table or receives every changed row. The page shows:
- fleet aggregates and one row per site (GPUs, healthy / degraded / failed, utilisation,
  temperatures, errors), and the worst GPUs (a bounded list): the ``fleet`` topic pushes these;
- one page of the GPU table, filtered and sorted on the server (gpu_list): its rows come from a
  *view topic*, ``fleetview.<digest>``, whose push carries only that page's rows;
- with a site chosen, the site's aggregates and worst GPUs: the ``site.<id>`` topic.

The figures are computed about once every ``FLEET_SUMMARY_SECONDS`` for all processes and
sockets (``console.figures.fresh``: kept in the shared cache, recomputed in the background by one process while
every reader is answered the previous value), so a read costs a cache lookup at any fleet size, and a push of the
``fleet`` topic twice a second does not recompute what a page read a moment ago. A view's rows
are computed afresh for its push (their delivery is timed from the sample) and written back for
the reads.

A view topic's name is a digest of the canonical table query, made here by code: the client never
names a group. The snapshot (or the table API) registers the query under its digest for as long
as a page watches it (live.watch_topic's lease, renewed by the socket while subscribed), and each
``fleet`` push asks for the pushes of the watched view and site topics. Many pages on the same
view share one topic and one build. The snapshot and the pushes are built from the same functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from typing import Any

from django.core.cache import cache
from django.utils import timezone
from redis.exceptions import RedisError

from console import live
from console.figures import fresh, keep
from console.ranges import Window
from fleet.telemetry.read import figures, gpu_list
from fleet.telemetry.read.gpu_list import TableQuery

VIEW_PREFIX = "fleetview"
SITE_PREFIX = "site"
_VIEW_KEY = "fleet:view:{}"
_VIEWS_INDEX = "fleet:views"
MAX_VIEWS = 500  # distinct table views followed at once; past it the oldest stop getting pushes

logger = logging.getLogger(__name__)


def current_sites() -> list[dict[str, Any]]:
    return fresh("sites", site_rows)


def current_totals(sites: list[dict[str, Any]], site_id: int | None = None) -> dict[str, Any]:
    return fresh(f"totals.{site_id}", lambda: aggregates(sites, site_id=site_id))


def current_worst(site_id: int | None = None) -> list[dict[str, Any]]:
    return fresh(f"worst.{site_id}", lambda: gpu_list.worst_gpus(site_id=site_id))


def current_series(range_key: str, site_id: int | None, window: Window | None) -> dict[str, Any]:
    """The charts' series over a preset range ending now, shared like the figures (their newest
    point is a minute's rollup, or 10 s of raw samples over 15 minutes); a custom window's are
    read for its caller."""
    if window is not None and window.custom:
        return figures.site_series(range_key=range_key, site_id=site_id, window=window)
    return fresh(f"series.{range_key}.{site_id}", lambda: figures.site_series(range_key=range_key, site_id=site_id))


def current_page(query: TableQuery) -> dict[str, Any]:
    return fresh(view_topic(query), lambda: gpu_list.table_page(query))


def site_rows() -> list[dict[str, Any]]:
    """One row per site: figures.site_summaries with healthy / degraded / failed GPUs (gpu_list
    defines them; failed is the site's "GPUs with XID / ECC errors", so the two always agree)."""
    healthy = gpu_list.healthy_by_site()
    rows = figures.site_summaries()
    for row in rows:
        row["healthy"] = healthy.get(row["id"], 0)
        row["failed"] = row["with_errors"]
        row["degraded"] = max(0, row["gpus"] - row["healthy"] - row["failed"])
    return rows


def aggregates(sites: list[dict[str, Any]], *, site_id: int | None = None) -> dict[str, Any]:
    """The fleet's totals (or one site's), with its health counts summed from the site rows."""
    totals = figures.fleet_totals(site_id=site_id)
    chosen = [s for s in sites if site_id is None or s["id"] == site_id]
    totals["healthy"] = sum(s["healthy"] for s in chosen)
    totals["failed"] = totals["with_errors"]
    totals["degraded"] = max(0, totals["gpus"] - totals["healthy"] - totals["failed"])
    return totals


# --- Table views: one topic per distinct page of the table being watched ---------------------


def view_topic(query: TableQuery) -> str:
    """The view's topic, from its canonical query: the same view from any page is one topic."""
    text = json.dumps(query.as_params(), sort_keys=True, separators=(",", ":"))
    return f"{VIEW_PREFIX}.{hashlib.blake2b(text.encode(), digest_size=8).hexdigest()}"


def watch_view(query: TableQuery) -> str:
    """Keep this view's query under its topic while a page watches it; returns the topic."""
    topic = view_topic(query)
    try:
        cache.set(_VIEW_KEY.format(topic), query.as_params(), timeout=live.WATCH_SECONDS)
        _index(topic)
        live.watch_topic(topic)
    except RedisError as exc:  # Redis restarting: the page still gets its snapshot; the socket's renewal watches it
        logger.warning("table view %s not watched now (%s)", topic, exc.__class__.__name__)
    return topic


def renew_view(topic: str) -> None:
    """The socket's renewal of a subscribed view topic (console.consumers): its lease and its query's."""
    if cache.touch(_VIEW_KEY.format(topic), live.WATCH_SECONDS):
        _index(topic)
        live.watch_topic(topic)


def _index(topic: str) -> None:
    # Read-modify-write without a lock: a view lost to a race is put back by its next renewal.
    now = timezone.now().timestamp()
    views = {t: seen for t, seen in (cache.get(_VIEWS_INDEX) or {}).items() if seen > now - live.WATCH_SECONDS}
    views[topic] = now
    if len(views) > MAX_VIEWS:
        views = dict(sorted(views.items(), key=lambda item: item[1])[-MAX_VIEWS:])
    cache.set(_VIEWS_INDEX, views, timeout=live.WATCH_SECONDS)


def watched_views() -> list[str]:
    return live.watched(sorted(cache.get(_VIEWS_INDEX) or {}))


def build_view_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """A ``fleetview.<digest>`` push: that page of the table now, if it changed since the previous
    push (a digest of the rows and count is the watermark). The whole page, not a diff: at most
    gpu_list.MAX_SIZE rows, and a page sorted by a live figure changes members, not just values."""
    params = cache.get(_VIEW_KEY.format(topic))
    if params is None:  # nobody watches it any more
        return None, watermark
    query = gpu_list.query_from_params(params)
    page = gpu_list.table_page(query)
    keep(view_topic(query), page)
    digest = zlib.crc32(repr((page["count"], [tuple(r.values()) for r in page["gpus"]])).encode())
    if digest == watermark:
        return None, watermark
    return {"type": "fleet.rows", "topic": topic, "ts": timezone.now().isoformat(), **page}, digest


# --- Pushes -----------------------------------------------------------------------------------


def build_fleet_delta(topic: str, watermark: Any) -> tuple[dict[str, Any], Any]:
    """The ``fleet`` topic's push: aggregates, site rows and the worst GPUs; no table rows (those go
    to the view topics, whose pushes this asks for, with the watched site topics')."""
    sites = current_sites()
    payload = {
        "type": "fleet.delta",
        "topic": topic,
        "ts": timezone.now().isoformat(),
        "totals": current_totals(sites),
        "sites": sites,
        "worst": current_worst(),
    }
    followers = [*watched_views(), *live.watched([f"{SITE_PREFIX}.{s['id']}" for s in sites])]
    if followers:
        live.request_push(*followers)
    return payload, None


def build_site_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """A ``site.<id>`` push: the site's row, its aggregates and its worst GPUs."""
    site_id = int(topic.split(".", 1)[1])
    sites = current_sites()
    row = next((s for s in sites if s["id"] == site_id), None)
    if row is None:
        return None, watermark
    return {
        "type": "site.delta",
        "topic": topic,
        "ts": timezone.now().isoformat(),
        "site": row,
        "totals": current_totals(sites, site_id),
        "worst": current_worst(site_id),
    }, None


# --- The snapshot -----------------------------------------------------------------------------


def overview_snapshot(
    *,
    range_key: str = figures.DEFAULT_RANGE,
    site_id: int | None = None,
    window: Window | None = None,
    query: TableQuery | None = None,
) -> dict[str, Any]:
    """Everything the fleet page draws, for a first load or after a websocket reconnect: totals,
    site rows, the worst GPUs, one page of the GPU table (``gpus``, with ``table`` saying which page
    and its live topic) and per-site series. A ``site_id`` scopes the totals, the worst GPUs and
    the table to one site, and names its topic. A custom ``window`` (from / to) moves the charts;
    the rest is the fleet now."""
    query = query or TableQuery()
    if site_id is not None:
        query = TableQuery(
            filters={**query.filters, "site_id": str(site_id)}, sort=query.sort, page=query.page, size=query.size
        )
    # The worst GPUs follow the table's site, if it has one (the totals only an explicit site_id).
    scope = int(query.filters["site_id"]) if "site_id" in query.filters else None
    sites = current_sites()
    page = dict(current_page(query))
    topics = {"fleet": "fleet", "view": watch_view(query), "site": None}
    if scope is not None:
        topics["site"] = f"{SITE_PREFIX}.{scope}"
        live.watch_topic(topics["site"])
    gpus = page.pop("gpus")
    return {
        "ts": timezone.now().isoformat(),
        "range": "custom" if window is not None and window.custom else range_key,
        "totals": current_totals(sites, site_id),
        "sites": sites,
        "worst": current_worst(scope),
        "gpus": gpus,
        "table": {**page, "topic": topics["view"]},
        "topics": topics,
        "series": current_series(range_key, site_id, window),
    }


def table_snapshot(query: TableQuery) -> dict[str, Any]:
    """The table API's answer: one page and the topic that keeps it live; filtered to a site by
    its id, also that site's worst GPUs and its topic (``site_topic``), which keeps them live."""
    answer = {**current_page(query), "topic": watch_view(query)}
    site_id = query.filters.get("site_id")
    if site_id is not None:
        answer["site_topic"] = f"{SITE_PREFIX}.{int(site_id)}"
        answer["worst"] = current_worst(int(site_id))
        live.watch_topic(answer["site_topic"])
    return answer
