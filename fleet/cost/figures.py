"""GPU-hours turned into money: the one set of functions every cost figure comes from (the /cost/
page, its API and CSV, the job page, an incident's page and the capacity page's own-or-rent line).

No GPU-hour is counted here: each comes from the figure its own room already keeps, and this module
only prices it with fleet.cost.prices.cost_of, at the prices valid at the time.

* Training badput by cause, per job and team: the goodput accounts (fleet.training.accounts
  .accounts_between, the training pages' read), one read per *segment*: the window cut at every
  month start and every price change, so a month with a price change on the 16th prices its
  first 15 days at the old price and the rest at the new one, and each month's figure is its own.
* Idle energised GPUs: GPU-hours whose hourly mean utilisation was under the power page's
  IDLE_UTIL_PCT (fleet.power.read: an energised GPU reports; under 5 % it idles), from the
  hour rollups, leaving out the hours a job held the GPU (those are the job's badput already).
* Reserved but unused: committed reservations' GPU-hours less what the team used in the pool
  over the same segment, never below zero: the larger of its jobs' allocated GPU-hours (the
  goodput accounts) and, where the scheduler reports, the GPUs Kueue admitted on the team's
  ClusterQueues mapped to the pool (``resource_usage`` of ``nvidia.com/gpu``, each minute's last
  value), since a team's workloads need not all report as training jobs.
* Incidents: Incident.current_gpu_hours, priced at the incident's start day in the pool of its
  job or GPU label (unpriced when it names neither).
* Serving: an endpoint's GPUs x the window's hours at its pool's price, over the generated tokens
  of fleet.serving.slo's counters (activity's ``generated_tokens``), per million tokens.

A job's, endpoint's or GPU's pool is the pool of its site and GPU model (fleet.capacity.Pool).
The owned price's energy uses the pool's measured draw per GPU over the window (the hour rollups'
mean power), or the model's board power where none was measured.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet.capacity.models import COMMITTED_STATES, Pool, Reservation, ReservationState
from fleet.capacity.power_budget import board_power_w
from fleet.cost.models import PoolPrice
from fleet.cost.prices import Cost, CostError, Span, cost_of, hourly, money
from fleet.cost.usage import DAY, DayFigures, midnight, pool_keys, rollup_days, scheduler_gpu_hours
from fleet.inventory.models import Gpu
from fleet.training.accounts import accounts_between
from fleet.training.goodput import BADPUT_CATEGORIES, CATEGORY_LABELS
from incidents.models import Incident

HOUR = timedelta(hours=1)
ZERO = Decimal(0)
NANO = Decimal("1e-9")
UNASSIGNED = "(no team)"
# Reservations that held capacity over their stretch: committed now, or expired after holding it.
HELD_STATES = (*COMMITTED_STATES, ReservationState.EXPIRED)


def floor_hour(ts: datetime) -> datetime:
    return ts.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(ts: datetime) -> datetime:
    floor = floor_hour(ts)
    return floor if floor == ts else floor + HOUR


def month_of(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m")


def _hours(delta: timedelta) -> Decimal:
    return Decimal(delta // timedelta(seconds=1)) / 3600


def _dec(value: float | int | None) -> Decimal:
    return Decimal(str(value or 0))


# --- prices and pools ----------------------------------------------------------------------------


@dataclass
class PriceBook:
    """The prices of every pool over a stretch, and each pool's draw per GPU for owned prices.
    Only prices in the console's currency are read: amounts in two currencies do not add up."""

    start: datetime
    end: datetime
    currency: str
    prices: dict[int, list[PoolPrice]]
    watts: dict[int, Decimal]
    pools: dict[int, Pool] = field(default_factory=dict)
    days: dict[tuple[int, datetime], DayFigures] = field(default_factory=dict)
    read_from: datetime | None = None  # where ``days`` begin
    _accounts: dict[tuple[datetime, datetime], dict[Any, Any]] = field(default_factory=dict)
    _jobs: dict[int, tuple[int | None, str]] | None = None
    _units: dict[tuple[int | None, datetime, datetime], tuple[Decimal, Decimal] | None] = field(default_factory=dict)

    def jobs(self) -> dict[int, tuple[int | None, str]]:
        """Every job's pool and team (job_facts), read once per book."""
        if self._jobs is None:
            self._jobs = job_facts()
        return self._jobs

    def accounts(self, start: datetime, end: datetime) -> dict[Any, Any]:
        """The jobs' goodput accounts over a segment (fleet.training.accounts), read once per book:
        training badput and reserved-unused share them."""
        if (start, end) not in self._accounts:
            self._accounts[(start, end)] = accounts_between(start, end, group_by="job")
        return self._accounts[(start, end)]

    def cost(self, pool_id: int | None, gpu_hours: Decimal, start: datetime, end: datetime) -> Cost | None:
        """What ``gpu_hours`` spread evenly over [start, end) cost in the pool, at the prices valid
        then (None: no pool)."""
        if pool_id is None or not gpu_hours or end <= start:
            return None
        span = Span(start, end, gpu_hours / _hours(end - start))
        return cost_of(self.prices.get(pool_id, []), [span], watts_per_gpu=self.watts.get(pool_id))

    def unit(self, pool_id: int | None, start: datetime, end: datetime) -> tuple[Decimal, Decimal] | None:
        """What one GPU-hour spread over [start, end) costs in the pool, and the share of it no
        price covers: a cost is linear in its GPU-hours, so each segment's is worked out once and
        every job's, team's and cause's hours in it are multiples of it."""
        key = (pool_id, start, end)
        if key not in self._units:
            # One GPU held the whole segment: its GPU-hours are the segment's hours exactly, so a
            # rate's cost divides back to the rate exactly (2.50 x 744 h / 744 h).
            hours = _hours(end - start)
            try:
                cost = self.cost(pool_id, hours, start, end)
            except CostError:
                cost = None
            self._units[key] = (cost.total / hours, cost.uncovered_gpu_hours / hours) if cost else None
        return self._units[key]

    def boundaries(self) -> list[datetime]:
        """The instants inside [start, end) where a segment ends: month starts and price changes."""
        cuts: set[datetime] = set()
        day = self.start.date().replace(day=1)
        while midnight(day) < self.end:
            cuts.add(midnight(day))
            day = (day + timedelta(days=32)).replace(day=1)
        for prices in self.prices.values():
            for p in prices:
                cuts.add(midnight(p.valid_from))
                if p.valid_to:
                    cuts.add(midnight(p.valid_to + DAY))
        return sorted(c for c in cuts if self.start < c < self.end)

    def segments(self) -> list[tuple[datetime, datetime]]:
        """[start, end) cut at every boundary: within a segment each pool has one price and one month."""
        edges = [self.start, *self.boundaries(), self.end]
        return list(pairwise(edges))


def price_book(start: datetime, end: datetime, *, read_from: datetime | None = None) -> PriceBook:
    """The prices valid on some day of [start, end) and the pools' hour-rollup figures per day
    (``rollup_days``) from ``read_from`` (default ``start``: earlier for own-or-rent's 90 days)
    to ``end``: the measured draw per GPU over [start, end) comes from them. Four queries."""
    currency = str(settings.COST_CURRENCY)
    prices: dict[int, list[PoolPrice]] = defaultdict(list)
    last_day = (end - timedelta(microseconds=1)).date()
    for p in PoolPrice.objects.valid_between(start.date(), last_day).filter(currency=currency):
        prices[p.pool_id].append(p)
    pools = {p.pk: p for p in Pool.objects.select_related("site")}
    days = rollup_days(min(read_from or start, start), end)
    watts = {pk: Decimal(str(board_power_w(pool.gpu_model))) for pk, pool in pools.items()}
    drawn: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    first_day = midnight(start.date())
    for (pool, day), f in days.items():
        if first_day <= day < end and f.power_n:
            drawn[pool][0] += f.power_sum
            drawn[pool][1] += f.power_n
    for pool, (total, n) in drawn.items():
        watts[pool] = Decimal(str(round(total / n, 1)))
    return PriceBook(start, end, currency, dict(prices), watts, pools, days, min(read_from or start, start))


def job_facts(job_ids: Iterable[int] | None = None) -> dict[int, tuple[int | None, str]]:
    """job id -> (its pool, its team). The pool is that of its site and its GPUs' model; a job
    with no GPUs recorded falls in its site's pool when the site has one pool only (else None:
    not priced)."""
    keys = pool_keys()
    per_site: dict[int, list[int]] = defaultdict(list)
    for (site, _), pk in keys.items():
        per_site[site].append(pk)
    ids = None if job_ids is None else list(job_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT j.id, j.site_id, j.team, min(g.model)
              FROM fleet_job j LEFT JOIN fleet_job_gpus jg ON jg.job_id = j.id LEFT JOIN fleet_gpu g ON g.id = jg.gpu_id
             WHERE %s::int8[] IS NULL OR j.id = ANY(%s::int8[])
             GROUP BY j.id, j.site_id, j.team
            """,
            [ids, ids],
        )
        out: dict[int, tuple[int | None, str]] = {}
        for job_id, site_id, team, model in cursor.fetchall():
            pool = keys.get((site_id, model)) if model else None
            if pool is None and len(per_site[site_id]) == 1:
                pool = per_site[site_id][0]
            out[job_id] = (pool, team)
        return out


def job_pools(job_ids: Iterable[int] | None = None) -> dict[int, int | None]:
    """job id -> its pool (job_facts)."""
    return {pk: pool for pk, (pool, _) in job_facts(job_ids).items()}


# --- the figures ---------------------------------------------------------------------------------


@dataclass
class Item:
    """GPU-hours of one kind and cause, for one team, pool and month (and job, where there is one),
    and what they cost. ``uncovered_gpu_hours``: hours on days no price of the pool covers."""

    kind: str  # training, idle, reserved, incident
    cause: str
    team: str
    pool_id: int | None
    month: str
    gpu_hours: Decimal
    amount: Decimal
    uncovered_gpu_hours: Decimal = ZERO
    job_id: int | None = None
    incident_id: int | None = None


def _item(book: PriceBook, start: datetime, end: datetime, gpu_hours: Decimal, **keys: Any) -> Item:
    unit = book.unit(keys.get("pool_id"), start, end)
    amount = unit[0] * gpu_hours if unit else ZERO
    # Spreading GPU-hours over a segment's hours divides by a number of hours (744 in January),
    # which Decimal rounds in its 28th digit: hours are kept to the nanosecond-hour.
    uncovered = (unit[1] * gpu_hours if unit else gpu_hours).quantize(NANO)
    return Item(month=month_of(start), gpu_hours=gpu_hours, amount=amount, uncovered_gpu_hours=uncovered, **keys)


def training_items(book: PriceBook, *, job_id: int | None = None) -> list[Item]:
    """Training badput, per job and cause, per segment, priced (one accounts read per segment)."""
    jobs = book.jobs() if job_id is None else job_facts([job_id])
    out = []
    for start, end in book.segments():
        for key, acc in book.accounts(start, end).items():
            if job_id is not None and key != job_id:
                continue
            for cause in BADPUT_CATEGORIES:
                seconds = acc.seconds(cause)
                if seconds:
                    gpu_hours = _dec(seconds) / 3600
                    pool, team = jobs.get(key, (None, UNASSIGNED))
                    out.append(
                        _item(
                            book,
                            start,
                            end,
                            gpu_hours,
                            kind="training",
                            cause=cause,
                            team=team,
                            pool_id=pool,
                            job_id=key,
                        )
                    )
    return out


def idle_items(book: PriceBook) -> list[Item]:
    """Idle energised GPU-hours per pool and day, priced on their day; no team holds them."""
    out = []
    first_day = midnight(book.start.date())
    for (pool, day), f in sorted(book.days.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if f.idle and first_day <= day < book.end:
            start, end = max(day, book.start), min(day + DAY, book.end)
            out.append(
                _item(
                    book,
                    start,
                    end,
                    Decimal(f.idle),
                    kind="idle",
                    cause="idle_energised",
                    team=UNASSIGNED,
                    pool_id=pool,
                )
            )
    return out


def reserved_items(book: PriceBook) -> list[Item]:
    """Reserved GPU-hours a team's jobs did not use, per team, pool and segment: the committed (or
    expired) reservations' GPU-hours less the team's jobs' allocated GPU-hours in that pool."""
    reservations = list(
        Reservation.objects.filter(state__in=HELD_STATES)
        .overlapping(book.start, book.end)
        .values_list("team_id", "pool_id", "gpus", "start", "end")
    )
    if not reservations:
        return []
    jobs = book.jobs()
    out = []
    for start, end in book.segments():
        reserved: dict[tuple[str, int], Decimal] = defaultdict(Decimal)
        for team, pool, gpus, r_start, r_end in reservations:
            overlap = min(end, r_end) - max(start, r_start)
            if overlap > timedelta(0):
                reserved[(team, pool)] += gpus * _hours(overlap)
        if not reserved:
            continue
        used: dict[tuple[str, int | None], Decimal] = defaultdict(Decimal)
        for job_id, acc in book.accounts(start, end).items():
            pool, team = jobs.get(job_id, (None, UNASSIGNED))
            used[(team, pool)] += _dec(acc.allocated_s) / 3600
        admitted = scheduler_gpu_hours(set(reserved), start, end)
        for (team, pool), hours in sorted(reserved.items()):
            unused = hours - max(used.get((team, pool), ZERO), admitted.get((team, pool), ZERO))
            if unused > 0:
                out.append(
                    _item(book, start, end, unused, kind="reserved", cause="reserved_unused", team=team, pool_id=pool)
                )
    return out


def incident_pool(labels: dict[str, Any], job_pools_: dict[int, int | None], gpu_pools: dict[str, int]) -> int | None:
    """The pool an incident's GPU-hours were lost in: its job's, else its GPU's."""
    job = str(labels.get("job", ""))
    if job.isdigit() and job_pools_.get(int(job)) is not None:
        return job_pools_[int(job)]
    return gpu_pools.get(str(labels.get("gpu", "")))


def incident_items(book: PriceBook, *, incident_ids: list[int] | None = None) -> list[Item]:
    """Incidents that began in the window (or these incidents): their current GPU-hours, priced at
    the hour they began in the pool of their job or GPU, for the team their labels name."""
    # Only what current_gpu_hours and the labels need: an incident row carries its postmortem.
    qs = Incident.objects.filter(merged_into__isnull=True).only(
        "labels", "category", "started_at", "resolved_at", "gpu_hours_lost", "gpus_out_of_service"
    )
    qs = (
        qs.filter(pk__in=incident_ids)
        if incident_ids is not None
        else qs.filter(started_at__gte=book.start, started_at__lt=book.end)
    )
    incidents = [i for i in qs if i.current_gpu_hours() > 0]
    if not incidents:
        return []
    jobs = [int(j) for i in incidents if str(j := i.labels.get("job", "")).isdigit()]
    facts = job_facts(jobs)
    pools = {pk: pool for pk, (pool, _) in facts.items()}
    teams = {pk: team for pk, (_, team) in facts.items()}
    gpu_pools = _gpu_pools([str(i.labels["gpu"]) for i in incidents if i.labels.get("gpu")])
    out = []
    for inc in incidents:
        start = floor_hour(inc.started_at)
        job = str(inc.labels.get("job", ""))
        team = inc.labels.get("team") or (teams.get(int(job)) if job.isdigit() else None) or UNASSIGNED
        pool = incident_pool(inc.labels, pools, gpu_pools)
        cause = inc.category or "incident"
        hours = _dec(inc.current_gpu_hours())
        out.append(
            _item(
                book,
                start,
                start + HOUR,
                hours,
                kind="incident",
                cause=cause,
                team=str(team),
                pool_id=pool,
                incident_id=inc.pk,
            )
        )
    return out


def _gpu_pools(uuids: list[str]) -> dict[str, int]:
    if not uuids:
        return {}
    keys = pool_keys()
    out = {}
    for uuid, site, model in Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "node__site_id", "model"):
        if (site, model) in keys:
            out[uuid] = keys[(site, model)]
    return out


# --- the figures on other pages ------------------------------------------------------------------


def job_cost(job_id: int, *, start: datetime, end: datetime) -> dict[str, Any]:
    """A job's badput cost by cause over [start, end): what the job page shows beside its GPU-hours."""
    book = price_book(floor_hour(start), ceil_hour(end))
    items = training_items(book, job_id=job_id)
    by_cause: dict[str, Decimal] = defaultdict(Decimal)
    hours: dict[str, Decimal] = defaultdict(Decimal)
    for item in items:
        by_cause[item.cause] += item.amount
        hours[item.cause] += item.gpu_hours
    return {
        "currency": book.currency,
        "total": str(money(sum(by_cause.values(), ZERO))),
        "gpu_hours": float(round(sum(hours.values(), ZERO), 2)),
        "uncovered_gpu_hours": float(round(sum((i.uncovered_gpu_hours for i in items), ZERO), 2)),
        "by_cause": [
            {
                "cause": c,
                "label": CATEGORY_LABELS[c],
                "gpu_hours": float(round(hours[c], 2)),
                "amount": str(money(by_cause[c])),
            }
            for c in BADPUT_CATEGORIES
            if c in by_cause
        ],
    }


def incident_cost(incident_id: int) -> dict[str, Any] | None:
    """An incident's GPU-hours lost and what they cost: the incident page's line and /cost/'s row."""
    inc = Incident.objects.filter(pk=incident_id).first()
    if inc is None:
        return None
    start = floor_hour(inc.started_at)
    items = incident_items(price_book(start, start + HOUR), incident_ids=[incident_id])
    if not items or not items[0].amount:
        return None
    item = items[0]
    return {
        "currency": str(settings.COST_CURRENCY),
        "gpu_hours": float(item.gpu_hours),
        "amount": str(money(item.amount)),
    }


def own_or_rent_start(days: int, *, now: datetime | None = None) -> datetime:
    """Where own-or-rent's ``days`` begin: that many UTC midnights before today's."""
    return midnight((now or timezone.now()).astimezone(UTC).date()) - timedelta(days=days)


def utilisation(
    book: PriceBook, pool_ids: list[int], *, days: int, now: datetime | None = None
) -> dict[int, Decimal | None]:
    """Each pool's busy GPU-hours (hour rollups at or over IDLE_UTIL_PCT) over its installed
    GPU-hours (physical GPUs now x the hours) over the last ``days`` whole UTC days and today so
    far, from the book's rollup days (read from at least that far back: price_book's ``read_from``)."""
    end = now or timezone.now()
    start = own_or_rent_start(days, now=end)
    busy: dict[int, int] = defaultdict(int)
    for (pool, day), f in book.days.items():
        if start <= day < end:
            busy[pool] += f.busy
    keys = pool_keys()
    installed: dict[int, int] = defaultdict(int)
    for site, model in Gpu.objects.physical().values_list("node__site_id", "model"):
        if (site, model) in keys:
            installed[keys[(site, model)]] += 1
    out: dict[int, Decimal | None] = {}
    for pk in pool_ids:
        total = installed.get(pk, 0) * _hours(end - start)
        out[pk] = min(Decimal(1), Decimal(busy.get(pk, 0)) / total) if total else None
    return out


def current_price(book: PriceBook, pool_id: int) -> PoolPrice | None:
    """The pool's price valid at the end of the book's stretch."""
    day = (book.end - timedelta(microseconds=1)).date()
    for p in book.prices.get(pool_id, []):
        if p.valid_from <= day and (p.valid_to is None or p.valid_to >= day):
            return p
    return None


def hourly_rate(book: PriceBook, pool_id: int) -> tuple[PoolPrice, Any] | None:
    price = current_price(book, pool_id)
    if price is None:
        return None
    try:
        return price, hourly(price, watts_per_gpu=book.watts.get(pool_id))
    except CostError:
        return None
