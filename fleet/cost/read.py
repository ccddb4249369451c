"""The /cost/ page's read model, its API parts, CSV, live pushes, overview tile and the sections it
adds to the job, incident and capacity pages. Every amount comes from fleet.cost.figures.

Amounts are strings of the currency's cents ("1234.56"), so a JSON reader never turns money into a
binary float; GPU-hours are numbers.
"""

from __future__ import annotations

import io
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from console.ranges import Window, window_from_query
from console.spreadsheet import writer as csv_writer
from fleet.cost import figures
from fleet.cost.figures import ZERO, Item, PriceBook
from fleet.cost.prices import CostError, money, own_or_rent, rate
from fleet.cost.usage import pool_keys
from fleet.training.goodput import CATEGORY_LABELS

PRESETS = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
    "365d": timedelta(days=365),
}
DEFAULT_RANGE = "30d"
SERVING_WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "30d": timedelta(days=30)}
OWN_OR_RENT_DAYS = (30, 90)
SERVING_CACHE_S = 300
SNAPSHOT_CACHE_S = 15
KINDS = {
    "training": "Training badput",
    "idle": "Idle energised GPUs",
    "reserved": "Reserved but unused",
    "incident": "Incidents",
}
CAUSE_LABELS = {
    **CATEGORY_LABELS,
    "idle_energised": "Idle energised (under 5 % utilisation)",
    "reserved_unused": "Reserved, not used",
}
TOP_JOBS = 10
CSV_COLUMNS = [
    "month",
    "team",
    "site",
    "pool",
    "kind",
    "cause",
    "gpu_hours",
    "amount",
    "currency",
    "unpriced_gpu_hours",
]


def window(params: Any, *, now: datetime | None = None) -> Window:
    return window_from_query(params, presets=PRESETS, default=DEFAULT_RANGE, now=now)


def book_for(win: Window) -> PriceBook:
    """The window's prices and rollup figures, read from own-or-rent's 90 days back at least."""
    read_from = figures.own_or_rent_start(max(OWN_OR_RENT_DAYS))
    return figures.price_book(figures.floor_hour(win.start), figures.ceil_hour(win.end), read_from=read_from)


def _amount(value: Decimal) -> str:
    return str(money(value))


def _hours(value: Decimal) -> float:
    return float(round(value, 2))


def _pool_name(book: PriceBook, pool_id: int | None) -> tuple[str, str]:
    pool = book.pools.get(pool_id) if pool_id is not None else None
    return (pool.site.name, pool.name) if pool else ("", "(no pool)")


def all_items(book: PriceBook) -> list[Item]:
    """Every priced GPU-hour of the stretch: training badput, idle, reserved-unused, incidents."""
    training = figures.training_items(book)
    return [*training, *figures.idle_items(book), *figures.reserved_items(book), *figures.incident_items(book)]


def _grouped(items: Iterable[Item], key: Any) -> list[dict[str, Any]]:
    amounts: dict[Any, Decimal] = defaultdict(Decimal)
    hours: dict[Any, Decimal] = defaultdict(Decimal)
    for item in items:
        k = key(item)
        amounts[k] += item.amount
        hours[k] += item.gpu_hours
    return [
        {"key": k, "gpu_hours": _hours(hours[k]), "amount": _amount(amounts[k])}
        for k in sorted(amounts, key=lambda k: (-amounts[k], str(k)))
    ]


def breakdown(book: PriceBook, items: list[Item]) -> dict[str, Any]:
    """The page's tables: by kind, cause, team, pool and month, and the costliest jobs."""
    by_kind = [
        {"kind": r["key"], "label": KINDS[r["key"]], "gpu_hours": r["gpu_hours"], "amount": r["amount"]}
        for r in _grouped(items, lambda i: i.kind)
    ]
    by_cause = _grouped(items, lambda i: (i.kind, i.cause))
    by_pool = _grouped(items, lambda i: i.pool_id)
    jobs = _grouped([i for i in items if i.job_id is not None], lambda i: i.job_id)[:TOP_JOBS]
    from fleet.training.models import Job

    names = dict(Job.objects.filter(pk__in=[r["key"] for r in jobs]).values_list("pk", "name"))
    months = _grouped(items, lambda i: i.month)
    return {
        "by_kind": by_kind,
        "by_cause": [
            {"kind": k, "cause": c, "label": CAUSE_LABELS.get(c, c), "gpu_hours": r["gpu_hours"], "amount": r["amount"]}
            for r in by_cause
            for k, c in [r["key"]]
        ],
        "by_team": [{"team": r.pop("key"), **r} for r in _grouped(items, lambda i: i.team)],
        "by_pool": [
            {"pool_id": r["key"], "site": s, "pool": p, "gpu_hours": r["gpu_hours"], "amount": r["amount"]}
            for r in by_pool
            for s, p in [_pool_name(book, r["key"])]
        ],
        "by_month": sorted(({"month": r.pop("key"), **r} for r in months), key=lambda r: r["month"]),
        "top_jobs": [
            {"job_id": r["key"], "name": names.get(r["key"], ""), **{k: r[k] for k in ("gpu_hours", "amount")}}
            for r in jobs
        ],
    }


def serving(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Per endpoint: its GPUs, their price now, and per window (1 h, 24 h, 30 d) the GPUs' cost,
    the generated tokens (fleet.serving.slo's counters) and the cost per million tokens.

    Kept for SERVING_CACHE_S: a unit cost over an hour to a month moves little in five minutes,
    and twenty endpoints' three windows are forty reads that every push and page load would
    otherwise repeat."""
    now = now or timezone.now()
    bucket = int(now.timestamp()) // SERVING_CACHE_S
    key = f"cost:serving:{bucket}"
    rows = cache.get(key)
    if rows is None:
        rows = _serving(now)
        cache.set(key, rows, timeout=SERVING_CACHE_S)
    return rows


def _serving(now: datetime) -> list[dict[str, Any]]:
    from fleet.serving.models import Endpoint
    from fleet.serving.slo import activity, window_totals

    book = figures.price_book(figures.floor_hour(now - SERVING_WINDOWS["30d"]), figures.ceil_hour(now))
    keys = pool_keys()
    rows = []
    endpoints = Endpoint.objects.select_related("site").prefetch_related("gpus").order_by("site__name", "name")
    for ep in endpoints:
        gpus = [g for g in ep.gpus.all() if g.parent_id is None]
        models = sorted({g.model for g in gpus})
        pool = keys.get((ep.site_id, models[0])) if models else None
        totals = window_totals(
            ep.pk, SERVING_WINDOWS, now=now, quantities=["generation_tokens", "generation_tokens_hist"]
        )
        windows = {}
        for name, length in SERVING_WINDOWS.items():
            tokens = activity(totals[name])["generated_tokens"] or 0.0
            start = figures.floor_hour(now - length)
            try:
                cost = book.cost(pool, Decimal(len(gpus)) * figures._hours(now - start), start, now) if gpus else None
            except CostError:
                cost = None
            amount = cost.total if cost and cost.parts else None
            per_million = amount / Decimal(str(tokens)) * 1_000_000 if amount is not None and tokens else None
            windows[name] = {
                "tokens": round(tokens),
                "amount": None if amount is None else _amount(amount),
                "per_million_tokens": None if per_million is None else str(rate(per_million)),
            }
        rows.append(
            {"id": ep.pk, "name": ep.name, "site": ep.site.name, "gpus": len(gpus), "pool_id": pool, "windows": windows}
        )
    return rows


def own_or_rent_rows(
    book: PriceBook, pool_ids: list[int] | None = None, *, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Per pool with a price: its hourly cost now (with the derivation), utilisation over 30 and 90
    days, the break-even utilisation against its cloud rate, and the one-sentence verdict."""
    now = now or timezone.now()
    first = figures.own_or_rent_start(max(OWN_OR_RENT_DAYS), now=now)
    if book.read_from is None or book.read_from > first or book.end < figures.floor_hour(now):
        # a window in the past: own or rent is about the last 90 days, at today's prices
        book = figures.price_book(figures.floor_hour(now - timedelta(days=1)), figures.ceil_hour(now), read_from=first)
    pool_ids = sorted(book.pools) if pool_ids is None else pool_ids
    used = {days: figures.utilisation(book, pool_ids, days=days, now=now) for days in OWN_OR_RENT_DAYS}
    rows = []
    for pk in pool_ids:
        found = figures.hourly_rate(book, pk)
        if found is None:
            continue
        price, per_hour = found
        site, name = _pool_name(book, pk)
        row: dict[str, Any] = {
            "pool_id": pk,
            "site": site,
            "pool": name,
            "mode": price.mode,
            "currency": price.currency,
            "hourly": str(rate(per_hour.total)),
            "derivation": list(per_hour.derivation),
            "cloud_rate": None if price.cloud_rate_per_gpu_hour is None else str(price.cloud_rate_per_gpu_hour),
            "break_even_pct": None,
            "periods": [],
        }
        if price.mode == "owned" and price.cloud_rate_per_gpu_hour:
            row["break_even_pct"] = float(round(per_hour.total / price.cloud_rate_per_gpu_hour * 100, 1))
            for days in OWN_OR_RENT_DAYS:
                u = used[days].get(pk)
                if u is None:
                    continue
                verdict = own_or_rent(u, owned_hourly=per_hour.total, cloud_rate=price.cloud_rate_per_gpu_hour)
                row["periods"].append(
                    {
                        "days": days,
                        "utilisation_pct": float(round(u * 100, 1)),
                        "cheaper": verdict.cheaper,
                        "sentence": verdict.sentence(),
                    }
                )
        rows.append(row)
    return rows


def snapshot(win: Window | None = None, *, now: datetime | None = None) -> dict[str, Any]:
    """Everything the /cost/ page shows over the window. A preset's figures are kept for
    SNAPSHOT_CACHE_S (the goodput accounts' refresh interval: the figures cannot change faster
    than the accounts they price), per preset and hour-bounded window; a custom window is
    computed each time."""
    win = win or window({}, now=now)
    if win.preset is None or now is not None:
        return compute_snapshot(win, now=now)
    key = f"cost:snapshot:{win.preset}:{int(time.time()) // SNAPSHOT_CACHE_S}"
    snap = cache.get(key)
    if snap is None:
        snap = compute_snapshot(win)
        cache.set(key, snap, timeout=SNAPSHOT_CACHE_S)
    return snap


def compute_snapshot(win: Window, *, now: datetime | None = None) -> dict[str, Any]:
    book = book_for(win)
    items = all_items(book)
    total = sum((i.amount for i in items), ZERO)
    return {
        "ts": timezone.now().isoformat(),
        "window": win.as_json(),
        "currency": book.currency,
        "total": _amount(total),
        "gpu_hours": _hours(sum((i.gpu_hours for i in items), ZERO)),
        "unpriced_gpu_hours": _hours(sum((i.uncovered_gpu_hours for i in items), ZERO)),
        "has_prices": bool(book.prices),
        **breakdown(book, items),
        "serving": serving(now=now),
        "own_or_rent": own_or_rent_rows(book, now=now),
    }


def part(name: str, win: Window) -> dict[str, Any]:
    """One figure of the page, for its own API route."""
    book = book_for(win)
    base = {"window": win.as_json(), "currency": book.currency}
    if name == "serving":
        return {**base, "endpoints": serving()}
    if name == "own-or-rent":
        return {**base, "pools": own_or_rent_rows(book)}
    reads = {
        "training": figures.training_items,
        "idle": figures.idle_items,
        "reserved": figures.reserved_items,
        "incidents": figures.incident_items,
    }
    items = reads[name](book)
    return {
        **base,
        "total": _amount(sum((i.amount for i in items), ZERO)),
        "gpu_hours": _hours(sum((i.gpu_hours for i in items), ZERO)),
        "rows": [item_row(book, i) for i in items],
    }


def item_row(book: PriceBook, item: Item) -> dict[str, Any]:
    site, pool = _pool_name(book, item.pool_id)
    row = {
        "month": item.month,
        "team": item.team,
        "site": site,
        "pool": pool,
        "kind": item.kind,
        "cause": item.cause,
        "gpu_hours": _hours(item.gpu_hours),
        "amount": _amount(item.amount),
        "unpriced_gpu_hours": _hours(item.uncovered_gpu_hours),
    }
    if item.job_id is not None:
        row["job_id"] = item.job_id
    if item.incident_id is not None:
        row["incident_id"] = item.incident_id
    return row


def monthly_rows(items: Iterable[Item]) -> dict[tuple[str, str, int | None, str, str], list[Decimal]]:
    """(month, team, pool, kind, cause) -> [GPU-hours, amount, unpriced GPU-hours]."""
    out: dict[tuple[str, str, int | None, str, str], list[Decimal]] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    for i in items:
        row = out[(i.month, i.team, i.pool_id, i.kind, i.cause)]
        row[0] += i.gpu_hours
        row[1] += i.amount
        row[2] += i.uncovered_gpu_hours
    return out


def export_csv(win: Window) -> str:
    """Cost by month, team, pool and cause, through the console's one CSV writer."""
    book = book_for(win)
    buffer = io.StringIO()
    out = csv_writer(buffer)
    out.writerow(CSV_COLUMNS)
    for (month, team, pool_id, kind, cause), (hours, amount, unpriced) in sorted(
        monthly_rows(all_items(book)).items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]), kv[0][3], kv[0][4])
    ):
        site, pool = _pool_name(book, pool_id)
        out.writerow(
            [
                month,
                team,
                site,
                pool,
                kind,
                cause,
                float(round(hours, 2)),
                money(amount),
                book.currency,
                float(round(unpriced, 2)),
            ]
        )
    return buffer.getvalue()


# --- live, tile and sections on other pages ------------------------------------------------------


def build_cost_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``cost`` topic's push: the default window's figures when they changed. Asked for after
    the accounts refresh, so computed afresh (and kept for the page's reads)."""
    win = window({})
    snap = compute_snapshot(win)
    cache.set(f"cost:snapshot:{win.preset}:{int(time.time()) // SNAPSHOT_CACHE_S}", snap, timeout=SNAPSHOT_CACHE_S)
    figures_now = {k: v for k, v in snap.items() if k not in ("ts", "window")}
    if watermark == figures_now:
        return None, watermark
    return {"type": "cost.delta", "topic": topic, "ts": snap["ts"], **figures_now}, figures_now


def overview_tile(request: Any) -> dict[str, Any]:
    """The tile on /: the last 30 days' losses in money, by kind, and the costliest team."""
    win = window({})
    book = book_for(win)
    if not book.prices:
        return {"has_prices": False}
    items = all_items(book)
    tables = breakdown(book, items)
    return {
        "has_prices": True,
        "currency": book.currency,
        "total": _amount(sum((i.amount for i in items), ZERO)),
        "by_kind": tables["by_kind"],
        "top_team": tables["by_team"][0] if tables["by_team"] else None,
    }


def job_section(job: Any) -> dict[str, Any]:
    """The job page's money: its badput by cause over its whole life, and its failures' cost."""
    from fleet.training.models import JobAccount

    end = timezone.now()
    first = JobAccount.objects.filter(job=job).order_by("hour").values_list("hour", flat=True).first()
    start = min(first or end, job.first_allocated_at or end, job.created_at)
    return {"cost": figures.job_cost(job.pk, start=start, end=end), "job": job}


def capacity_section(pools: list[Any]) -> dict[str, Any]:
    """The capacity page's own-or-rent line per pool (the same rows as /cost/'s)."""
    now = timezone.now()
    read_from = figures.own_or_rent_start(max(OWN_OR_RENT_DAYS), now=now)
    book = figures.price_book(figures.floor_hour(now - timedelta(days=1)), figures.ceil_hour(now), read_from=read_from)
    return {"own_or_rent": own_or_rent_rows(book, [p.pk for p in pools], now=now), "currency": settings.COST_CURRENCY}
