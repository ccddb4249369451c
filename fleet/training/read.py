"""Read models for the training pages: the goodput overview, one job's snapshot, and their live pushes.

The snapshot (HTTP) and the live deltas (websocket) are built from the same functions, so a page
that reconnects and re-fetches its snapshot lands on exactly what the deltas would have shown.

The overview reads the hourly accounts (JobAccount, kept by fleet.training.accounts) in
two aggregate queries, and the last five minutes of step events in one more, whatever the number
of jobs: it is the page an SRE leaves open, and the benchmark holds it to p95 <= 150 ms for a
week of 200 jobs. A job's page reads its own events for its exact account (the hourly rows are
hour-granular and up to a refresh late), except a long job's (LONG_JOB_EVENTS): see job_snapshot.

Windows ("1h", "24h", "7d") are whole clock hours: "last N hours" is the N hourly buckets ending
with the current one, so "1h" is the current clock hour so far (from HH:00 to now), "24h" the
current hour and the 23 before it. The pages say "since HH:00" under each number.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections import namedtuple
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Max
from django.http import HttpRequest
from django.utils import timezone

from console.ranges import Window
from fleet.choices import JobEventKind
from fleet.inventory.models import Gpu
from fleet.training.accounts import accounts_by_hour, last_hours_window
from fleet.training.advisor import advise_job
from fleet.training.failures import failure_fields
from fleet.training.goodput import (
    BADPUT_CATEGORIES,
    CATEGORIES,
    CATEGORY_LABELS,
    Account,
    FailureLoss,
    Span,
    account,
    add_accounts,
    failure_losses,
    job_report,
)
from fleet.training.models import Job, JobEvent

logger = logging.getLogger(__name__)

# Each window in whole hourly buckets, the current (still filling) hour included.
RANGES = {"1h": 1, "24h": 24, "7d": 7 * 24}
DEFAULT_RANGE = "24h"
RATE_WINDOW_S = 300  # running jobs' step rate: steps over the last five minutes
TOP_JOBS = 10
TIMELINE_LIMIT = 200
JOB_SERIES_S = 86400  # a job's charts: its last 24 hours
MINUTE = 60
EPOCH_START = datetime(1970, 1, 1, tzinfo=UTC)
# Categories the stacked chart draws: productive and at-risk first, then the badput.
LOST_CATEGORIES = BADPUT_CATEGORIES  # every badput category (at_risk is neither retained nor lost yet)
MARKER_LIMIT = 1000
MARKER_KINDS = (JobEventKind.CHECKPOINT_SAVED, JobEventKind.FAILED, JobEventKind.PREEMPTED, JobEventKind.RESTORED)
# Above this many events a job's page takes its account from the hourly rows (see job_snapshot).
LONG_JOB_EVENTS = 50_000
# A push that finds no watermark (the cache forgot it after an idle hour) re-sends this many of
# the newest non-step events; the page drops the seqs it already shows, or re-reads its snapshot.
RESYNC_EVENTS = 50


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(float(value), digits)


def _hours(gpu_seconds: float) -> float:
    return round(gpu_seconds / 3600, 2)


def _ratio(acc: Account) -> float | None:
    return None if acc.goodput is None else round(acc.goodput, 4)


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


# --- the overview -----------------------------------------------------------------------------

_LOST_SQL = " + ".join(f"a.{c}_s" for c in LOST_CATEGORIES)


def _hourly(since: datetime, until: datetime) -> list[tuple[datetime, Account]]:
    """Accounts of all jobs per hour over [since, until), one aggregate query: the hours that start
    in it (accounts_by_hour; ``since`` is on an hour here, from window_start)."""
    return sorted(accounts_by_hour(since, until).items())


def _hour_floor(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def window_start(range_key: str, now: datetime) -> datetime:
    """The first hour of a window: "last N hours" is exactly N hourly buckets ending with the
    hour that holds ``now`` (at 10:59, "1h" starts at 10:00 and "24h" at 11:00 the day before),
    as goodput_accounts.last_hours_window defines it for accounts_between and accounts_by_hour."""
    return last_hours_window(now, RANGES[range_key])[0]


def _goodput_block(acc: Account) -> dict[str, Any]:
    """Retained goodput and, beside it, the share at risk and the share lost (together 1, up to
    rounding); and their GPU-hours, which add up to the allocated GPU-hours. Work not yet
    checkpointed is neither retained nor lost: a running job that has not checkpointed yet reads
    0 % retained with its work at risk beside it, not a bare 0 %."""
    lost_s = sum(acc.seconds(c) for c in LOST_CATEGORIES)
    return {
        "goodput": _ratio(acc),
        "at_risk_share": round(acc.at_risk_s / acc.allocated_s, 4) if acc.allocated_s else None,
        "lost_share": round(lost_s / acc.allocated_s, 4) if acc.allocated_s else None,
        "allocated_gpu_h": _hours(acc.allocated_s),
        "productive_gpu_h": _hours(acc.productive_s),
        "at_risk_gpu_h": _hours(acc.at_risk_s),
        "lost_gpu_h": _hours(lost_s),
    }


def cluster_goodput(hourly: list[tuple[datetime, Account]], *, now: datetime) -> dict[str, dict[str, Any]]:
    """Goodput over the windows of RANGES from hourly accounts: each the N hourly buckets ending with
    the current hour (window_start), with ``since``, the window's first hour, for the page to show."""
    out = {}
    for key in RANGES:
        start = window_start(key, now)
        out[key] = {
            **_goodput_block(add_accounts(a for hour, a in hourly if hour >= start)),
            "since": start.isoformat(),
        }
    return out


def breakdown(acc: Account) -> list[dict[str, Any]]:
    """GPU-hours per category, with its label and share of the allocated time."""
    return [
        {
            "category": c,
            "label": CATEGORY_LABELS[c],
            "gpu_h": _hours(acc.seconds(c)),
            "share": round(acc.seconds(c) / acc.allocated_s, 4) if acc.allocated_s else None,
            "badput": c in LOST_CATEGORIES,
        }
        for c in CATEGORIES
    ]


def top_jobs_by_loss(since: datetime, until: datetime, *, limit: int = TOP_JOBS) -> list[dict[str, Any]]:
    """The jobs that lost the most GPU-hours over the hours that start in [since, until) (every
    badput category, as accounts_between counts a window), one query."""
    sql = f"""
        SELECT j.id, j.name, j.team, j.state, j.gang_size, j.cluster,
               SUM({_LOST_SQL}) AS lost, SUM(a.allocated_s), SUM(a.productive_s), SUM(a.at_risk_s),
               {", ".join(f"SUM(a.{c}_s)" for c in LOST_CATEGORIES)}
          FROM fleet_jobaccount a JOIN fleet_job j ON j.id = a.job_id
         WHERE a.hour >= %s AND a.hour < %s
         GROUP BY j.id HAVING SUM({_LOST_SQL}) > 0
         ORDER BY lost DESC, j.id LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [since, until, limit])
        rows = cursor.fetchall()
    out = []
    for job_id, name, team, state, gang, cluster, lost, allocated, productive, at_risk, *parts in rows:
        by_cause = dict(zip(LOST_CATEGORIES, parts, strict=True))
        cause = max(by_cause, key=lambda c: by_cause[c])
        out.append(
            {
                "id": job_id,
                "name": name,
                "team": team,
                "state": state,
                "gang_size": gang,
                "cluster": cluster,
                "lost_gpu_h": _hours(lost),
                "allocated_gpu_h": _hours(allocated),
                "goodput": round(productive / allocated, 4) if allocated else None,
                "at_risk_share": round(at_risk / allocated, 4) if allocated else None,
                "top_cause": cause,
                "top_cause_label": CATEGORY_LABELS[cause],
                "url": f"/training/jobs/{job_id}/",
            }
        )
    return out


_RATE_SQL = """
    WITH w AS (
        SELECT job_id, ts, seq, step, tokens
          FROM fleet_jobevent
         WHERE job_id = ANY(%s) AND kind = 'step' AND ts >= %s AND ts <= %s
    ), head AS (
        -- The window's first step, and when the first event of another step arrived: every node of
        -- a gang reports each step (a few milliseconds apart), and those reports are one step.
        SELECT w.job_id, min(w.ts) FILTER (WHERE w.step <> f.step) AS next_ts
          FROM w
          JOIN (SELECT DISTINCT ON (job_id) job_id, step FROM w ORDER BY job_id, ts, seq) f USING (job_id)
         GROUP BY w.job_id
    )
    SELECT w.job_id, count(*), max(w.ts) FILTER (WHERE w.ts < h.next_ts), max(w.ts), min(w.step), max(w.step),
           sum(w.tokens::float8) FILTER (WHERE w.ts >= h.next_ts)
      FROM w JOIN head h USING (job_id)
     GROUP BY w.job_id
"""


def step_rates(job_ids: list[int], *, now: datetime, window_s: int = RATE_WINDOW_S) -> dict[int, dict[str, Any]]:
    """Per job, over the step events of the last ``window_s``: steps/s and tokens/s from the end of
    the window's first step to its last event (so a trainer that logs every tenth step is measured
    right), in one query on the (job, ts, seq) index. The reports of one step by the gang's nodes
    are one step: the first step's tokens were made before the measured span began, and a window
    holding a single step (its nodes' reports milliseconds apart) has no rate, not its tokens over
    those milliseconds. Fewer than two steps: no rate."""
    if not job_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_RATE_SQL, [job_ids, now - timedelta(seconds=window_s), now])
        rows = cursor.fetchall()
    out = {}
    for job_id, count, first_end, last_ts, min_step, max_step, tokens in rows:
        rate = tokens_rate = None
        span = (last_ts - first_end).total_seconds() if first_end is not None else 0.0
        if span > 0:
            rate = max(0, max_step - min_step) / span
            tokens_rate = tokens / span if tokens is not None else None
        out[job_id] = {
            "steps_window": count,
            "step_rate": _round(rate, 3),
            "tokens_per_s": _round(tokens_rate, 1),
        }
    return out


_RUNNING_FIELDS = (
    "id",
    "name",
    "team",
    "cluster",
    "state",
    "gang_size",
    "last_step",
    "last_step_at",
    "last_step_time_s",
    "last_checkpoint_at",
    "allocated_since",
    "failures",
    "site__name",
)


def running_jobs(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Jobs that hold GPUs now, with their step rate: two queries whatever their number."""
    now = now or timezone.now()
    jobs = list(Job.objects.holding().order_by("-gang_size", "name").values(*_RUNNING_FIELDS))
    rates = step_rates([j["id"] for j in jobs], now=now)
    out = []
    for j in jobs:
        rate = rates.get(j["id"], {"steps_window": 0, "step_rate": None, "tokens_per_s": None})
        last_step_at = j["last_step_at"]
        out.append(
            {
                "id": j["id"],
                "name": j["name"],
                "team": j["team"],
                "cluster": j["cluster"],
                "site": j["site__name"],
                "state": j["state"],
                "gang_size": j["gang_size"],
                "last_step": j["last_step"],
                "last_step_at": _iso(last_step_at),
                "last_step_age_s": _round((now - last_step_at).total_seconds(), 0) if last_step_at else None,
                "step_time_s": _round(j["last_step_time_s"], 3),
                "last_checkpoint_at": _iso(j["last_checkpoint_at"]),
                "allocated_since": _iso(j["allocated_since"]),
                "failures": j["failures"],
                **rate,
                "url": f"/training/jobs/{j['id']}/",
            }
        )
    return out


def custom_hours(window: Window) -> tuple[datetime, datetime]:
    """A custom window (from / to) in whole hourly buckets, as the accounts are kept: from the hour
    holding its start to the end of the hour holding its end (02:10 to 02:40 reads 02:00 to 03:00)."""
    end = _hour_floor(window.end)
    return _hour_floor(window.start), end if end == window.end else end + timedelta(hours=1)


def overview_snapshot(
    *, range_key: str = DEFAULT_RANGE, now: datetime | None = None, window: Window | None = None
) -> dict[str, Any]:
    """Everything /training/ draws, for a first load or after a websocket reconnect. A custom
    ``window`` (from / to, in whole hours: custom_hours) moves the account, breakdown, chart and
    top jobs; the goodput tiles stay the last hour, 24 hours and 7 days.

    Queries: the hourly accounts of the last 7 days (one aggregate; one more for a custom window),
    the top jobs (one), the holding jobs (one) and their recent steps (one).
    """
    now = now or timezone.now()
    until = _hour_floor(now) + timedelta(hours=1)
    hourly = _hourly(window_start("7d", now), until)
    start = window_start(range_key, now)
    in_range = [(hour, a) for hour, a in hourly if hour >= start]
    custom: dict[str, Any] = {}
    if window is not None and window.custom:
        start, until = custom_hours(window)
        in_range = _hourly(start, until)
        custom = {**window.as_json(), "range_end": until.isoformat()}
    total = add_accounts(a for _, a in in_range)
    return {
        "ts": now.isoformat(),
        "range": range_key,
        **custom,
        "range_start": start.isoformat(),
        "goodput": cluster_goodput(hourly, now=now),
        "account": {
            **_goodput_block(total),
            "steps": total.steps,
            "tokens": total.tokens,
        },
        "breakdown": breakdown(total),
        "categories": [{"category": c, "label": CATEGORY_LABELS[c]} for c in CATEGORIES],
        "series": {
            "hours": [hour.isoformat() for hour, _ in in_range],
            "gpu_h": {c: [_hours(a.seconds(c)) for _, a in in_range] for c in CATEGORIES},
            "goodput": [_ratio(a) for _, a in in_range],
        },
        "top_jobs": top_jobs_by_loss(start, until),
        "running": running_jobs(now=now),
    }


def overview_tile(request: HttpRequest | None = None) -> dict[str, Any]:
    """The overview page's training section: goodput and GPU-hours lost over the 24 hourly buckets
    ending with the current hour, the biggest cause."""
    now = timezone.now()
    start = window_start("24h", now)
    acc = add_accounts(a for _, a in _hourly(start, _hour_floor(now) + timedelta(hours=1)))
    lost = {c: acc.seconds(c) for c in LOST_CATEGORIES}
    cause = max(lost, key=lambda c: lost[c]) if any(lost.values()) else None
    return {
        "goodput_24h": _goodput_block(acc),
        "since": start,
        "goodput_pct": round(acc.goodput * 100, 1) if acc.goodput is not None else None,
        "at_risk_pct": round(acc.at_risk_s / acc.allocated_s * 100, 1) if acc.allocated_s else None,
        "running": Job.objects.running().count(),
        "holding": Job.objects.holding().count(),
        "jobs": Job.objects.exists(),
        "top_cause": {"label": CATEGORY_LABELS[cause], "gpu_h": _hours(lost[cause])} if cause else None,
    }


# --- one job -----------------------------------------------------------------------------------

# An event as goodput's pure functions read it (kind, ts, step, ...), without building model rows.
_Event = namedtuple("_Event", "kind ts step step_time_s data_wait_s duration_s tokens reason")
_EVENTS_SQL = """
    SELECT kind, ts, step, step_time_s, data_wait_s, duration_s, tokens, reason
      FROM fleet_jobevent WHERE job_id = %s ORDER BY ts, seq
"""


def job_events(job_id: int) -> list[_Event]:
    """Every event of the job, in stored order, as light tuples (one query)."""
    with connection.cursor() as cursor:
        cursor.execute(_EVENTS_SQL, [job_id])
        return [_Event(*row) for row in cursor.fetchall()]


def _event_row(e: JobEvent) -> dict[str, Any]:
    return {
        "id": e.event_id,
        "seq": e.seq,
        "ts": e.ts.isoformat(),
        "kind": e.kind,
        "label": JobEventKind(e.kind).label if e.kind in JobEventKind.values else e.kind,
        "step": e.step,
        "duration_s": _round(e.duration_s, 2),
        "bytes": e.bytes,
        "reason": e.reason,
        **failure_fields(e.kind, e.reason),
        "node": e.node,
    }


def timeline(job_id: int, *, limit: int = TIMELINE_LIMIT) -> list[dict[str, Any]]:
    """The job's events other than steps, newest first."""
    events = JobEvent.objects.filter(job_id=job_id).exclude(kind=JobEventKind.STEP)
    return [_event_row(e) for e in events.order_by("-ts", "-seq")[:limit]]


_EVENT_COLUMNS = "event_id, seq, ts, kind, step, duration_s, bytes, reason, node"
# On the (job, seq) index: the live push's "stored after seq N", oldest first.
_EVENTS_AFTER_SQL = f"""
    SELECT {_EVENT_COLUMNS} FROM fleet_jobevent
     WHERE job_id = %s AND seq > %s AND kind <> 'step'
     ORDER BY seq LIMIT %s
"""
# The newest non-step events by seq (a backward walk of the same index), for a push with no watermark.
_EVENTS_NEWEST_SQL = f"""
    SELECT {_EVENT_COLUMNS} FROM fleet_jobevent
     WHERE job_id = %s AND kind <> 'step'
     ORDER BY seq DESC LIMIT %s
"""


def _event_rows(sql: str, params: list[Any]) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [
            _event_row(
                JobEvent(
                    event_id=r[0],
                    seq=r[1],
                    ts=r[2],
                    kind=r[3],
                    step=r[4],
                    duration_s=r[5],
                    bytes=r[6],
                    reason=r[7],
                    node=r[8],
                )
            )
            for r in cursor.fetchall()
        ]


def events_after(job_id: int, after_seq: int, *, limit: int = TIMELINE_LIMIT) -> list[dict[str, Any]]:
    """The job's non-step events with seq > after_seq, oldest first (``limit`` at most)."""
    return _event_rows(_EVENTS_AFTER_SQL, [job_id, after_seq, limit])


def newest_events(job_id: int, *, limit: int = RESYNC_EVENTS) -> list[dict[str, Any]]:
    """The job's newest ``limit`` non-step events by seq, oldest first."""
    return list(reversed(_event_rows(_EVENTS_NEWEST_SQL, [job_id, limit])))


_STEP_SERIES_SQL = """
    SELECT extract(epoch FROM bucket)::int8, bucket,
           sum(greatest(step::float8 - coalesce(prev::float8, step::float8 - 1), 0)), sum(tokens::float8),
           avg(step_time_s), avg(coalesce(data_wait_s, 0) / step_time_s), max(step)
      FROM (
        SELECT date_bin(%s, ts, TIMESTAMPTZ '2000-01-01') AS bucket, step, tokens, step_time_s,
               data_wait_s, lag(step) OVER (ORDER BY ts, seq) AS prev
          FROM fleet_jobevent
         WHERE job_id = %s AND kind = 'step' AND ts >= %s AND ts < %s::timestamptz
      ) s
     WHERE bucket >= %s
     GROUP BY bucket ORDER BY bucket
"""


def step_series(
    job_id: int, *, since: datetime, until: datetime | None = None, bucket_s: int = MINUTE
) -> dict[str, list[Any]]:
    """Per minute (per ``bucket_s``: an hour for a custom window of days) from ``since`` (to
    ``until``, when given): steps completed, steps/s (steps / 60: an event at step s after one
    at step p completed s - p steps, the first event of the job one step; a restore backwards
    completes none), tokens/s, mean step time and data-wait share. The lag reaches back one bucket
    before ``since`` so the first bucket counts its steps right. Sums are float8 in SQL: no
    bigint overflow (a 500) whatever the tokens and steps."""
    bucket = timedelta(seconds=bucket_s)
    end: datetime | str = "infinity" if until is None else until
    with connection.cursor() as cursor:
        cursor.execute(_STEP_SERIES_SQL, [bucket, job_id, since - bucket, end, since])
        rows = cursor.fetchall()
    out: dict[str, list[Any]] = {
        "ts": [],
        "steps": [],
        "step_rate": [],
        "tokens_per_s": [],
        "step_time_s": [],
        "data_wait_share": [],
        "step": [],
    }
    previous: int | None = None
    for epoch, start, steps, tokens, step_time, wait_share, last_step in rows:
        if previous is not None and epoch - previous > 3 * bucket_s:
            # Minutes without a step (a failure, a hang) are drawn as a gap, not as a slope.
            out["ts"].append((start - timedelta(seconds=epoch - previous - bucket_s)).isoformat())
            for key in ("steps", "step_rate", "tokens_per_s", "step_time_s", "data_wait_share", "step"):
                out[key].append(None)
        previous = epoch
        out["ts"].append(start.isoformat())
        out["steps"].append(int(steps or 0))
        out["step_rate"].append(_round((steps or 0) / bucket_s, 3))
        out["tokens_per_s"].append(_round((tokens or 0) / bucket_s, 1) if tokens is not None else None)
        out["step_time_s"].append(_round(step_time, 3))
        out["data_wait_share"].append(_round(wait_share, 3))
        out["step"].append(last_step)
    return out


def job_gpu_ids(job: Job) -> list[int]:
    """The job's GPUs: those registered with it, else the physical GPUs of its nodes."""
    ids = list(job.gpus.values_list("pk", flat=True))
    if ids:
        return ids
    return list(Gpu.objects.physical().filter(node__in=job.nodes.all()).values_list("pk", flat=True))


_GPU_SERIES_SQL = """
    SELECT bucket, avg(util_mean), min(util_mean), sum(power_mean) / 1000.0, count(*)
      FROM fleet_gpurollup_1m
     WHERE gpu_id = ANY(%s) AND bucket >= %s AND bucket < %s
     GROUP BY bucket ORDER BY bucket
"""
GPU_ROLLUP_TABLES = {"1m": "fleet_gpurollup_1m", "1h": "fleet_gpurollup_1h"}


def gpu_series(gpu_ids: list[int], *, since: datetime, until: datetime, rollup: str = "1m") -> dict[str, list[Any]]:
    """The job's GPUs per minute from the 1-minute rollups (per hour from the hour rollups, for a
    custom window of days): mean and lowest utilisation (a straggler shows as a low minimum), and
    their summed power in kW."""
    out: dict[str, list[Any]] = {"ts": [], "util_mean": [], "util_min": [], "power_kw": [], "gpus": []}
    if not gpu_ids:
        return out
    sql = _GPU_SERIES_SQL.replace("fleet_gpurollup_1m", GPU_ROLLUP_TABLES[rollup])
    with connection.cursor() as cursor:
        cursor.execute(sql, [gpu_ids, since, until])
        for bucket, util_mean, util_min, power_kw, gpus in cursor.fetchall():
            out["ts"].append(bucket.isoformat())
            out["util_mean"].append(_round(util_mean))
            out["util_min"].append(_round(util_min))
            out["power_kw"].append(_round(power_kw, 2))
            out["gpus"].append(gpus)
    return out


def job_account(job: Job, events: list[Any], spans: list[Span]) -> dict[str, Any]:
    """The job's exact account (every event, to the microsecond) from its spans, its parts and labels."""
    acc = account(spans, gang_size=job.gang_size)
    steps = sum(1 for e in events if e.kind == JobEventKind.STEP)
    return {**_account_block(acc), "steps": steps, "exact": True, "as_of": None}


def _account_block(acc: Account) -> dict[str, Any]:
    return {
        **_goodput_block(acc),
        "gpu_s": {c: round(acc.seconds(c), 3) for c in CATEGORIES},
        "allocated_gpu_s": round(acc.allocated_s, 3),
        "breakdown": breakdown(acc),
    }


def job_account_from_hours(job: Job, *, now: datetime) -> dict[str, Any]:
    """A long job's account from its hourly rows (one aggregate query): as of the accounts' last
    refresh (every 15 s; ``as_of`` is the oldest event not yet counted, or None when none is
    waiting), hour rows written by the same accounting as the exact path."""
    hours = accounts_by_hour(EPOCH_START, _hour_floor(now) + timedelta(hours=1), job_id=job.pk)
    acc = add_accounts(hours.values())
    return {
        **_account_block(acc),
        "steps": acc.steps,
        "exact": False,
        "as_of": _iso(job.accounts_dirty_at),
    }


def loss_row(loss: FailureLoss) -> dict[str, Any]:
    """One disruption as the job page, the API and its incident show it: what it cost in all
    (``cost_gpu_h``) and the parts beside it, which add up to it (each rounded once, the cost
    their sum)."""
    parts = {
        "lost_gpu_h": _hours(loss.lost_gpu_s),
        "waiting_gpu_h": _hours(loss.waiting_gpu_s),
        "reinit_gpu_h": _hours(loss.reinit_gpu_s),
        "restore_gpu_h": _hours(loss.restore_gpu_s),
    }
    return {
        "ts": loss.ts.isoformat(),
        "kind": loss.kind,
        "reason": loss.reason,
        **failure_fields(loss.kind, loss.reason),
        "cost_gpu_h": round(sum(parts.values()), 2),
        **parts,
        "lost_gpu_s": round(loss.lost_gpu_s, 3),
        "cost_gpu_s": round(loss.cost_gpu_s, 3),
        "recovered": loss.recovered,
        "growing": loss.growing,
        "checkpoint_step": loss.checkpoint_step,
        "checkpoint_ts": _iso(loss.checkpoint_ts),
    }


def losses(found: list[FailureLoss]) -> list[dict[str, Any]]:
    """failure_losses as rows (loss_row): when, what, why, what it cost and its parts, the
    checkpoint it fell back to."""
    return [loss_row(loss) for loss in found]


def losses_total(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The job's disruptions together: the sum of its rows' costs and of each part."""
    keys = ("cost_gpu_h", "lost_gpu_h", "waiting_gpu_h", "reinit_gpu_h", "restore_gpu_h")
    return {k: round(sum(r[k] for r in rows), 2) for k in keys}


def _jsonable(value: Any) -> Any:
    """An advisor's dataclasses as JSON: datetimes as ISO text, enums by value, floats as they are."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def advice(job: Job, *, now: datetime) -> dict[str, Any] | None:
    """The checkpoint advisor's answer for the job, every input and assumption included. None when
    no checkpoint cost can be measured yet, or (logged) when the advisor fails: the rest of the
    page still loads."""
    try:
        return _jsonable(advise_job(job, now=now))  # type: ignore[no-any-return]
    except Exception:
        logger.exception("the checkpoint advisor failed for job %s", job.pk)
        return None


def job_state(job: Job, *, now: datetime) -> dict[str, Any]:
    """The job's row as the page shows it (and as the job topic pushes it)."""
    return {
        "id": job.pk,
        "name": job.name,
        "team": job.team,
        "cluster": job.cluster,
        "site": job.site.name,
        "framework": job.framework,
        "scheduler": job.scheduler,
        "scheduler_id": job.scheduler_id,
        "priority_tier": job.priority_tier,
        "gang_size": job.gang_size,
        "checkpoint_interval_s": job.checkpoint_interval_s,
        "state": job.state,
        "state_label": job.get_state_display(),
        "holds_gpus": job.holds_gpus,
        "first_allocated_at": _iso(job.first_allocated_at),
        "allocated_since": _iso(job.allocated_since),
        "ended_at": _iso(job.ended_at),
        "last_event_at": _iso(job.last_event_at),
        "last_step": job.last_step,
        "last_step_at": _iso(job.last_step_at),
        "last_step_age_s": _round((now - job.last_step_at).total_seconds(), 0) if job.last_step_at else None,
        "last_step_time_s": _round(job.last_step_time_s, 3),
        "last_checkpoint_at": _iso(job.last_checkpoint_at),
        "last_checkpoint_step": job.last_checkpoint_step,
        "failures": job.failures,
        "events_seen": job.events_seen,
    }


def _series_window(job: Job, now: datetime) -> tuple[datetime, datetime]:
    """The job's last 24 hours: up to now while it holds GPUs, else up to its last event; from its
    first allocation when that is later (a young job's charts are not a day of empty axis)."""
    end = now if job.holds_gpus or job.last_event_at is None else min(now, job.last_event_at + timedelta(minutes=1))
    start = end - timedelta(seconds=JOB_SERIES_S)
    if job.first_allocated_at is not None and job.first_allocated_at > start:
        start = job.first_allocated_at.replace(second=0, microsecond=0)
    return start, end


def job_snapshot(job: Job, *, now: datetime | None = None, window: Window | None = None) -> dict[str, Any]:
    """Everything a job's page draws, for a first load or after a websocket reconnect. A custom
    ``window`` (from / to) moves the charts and their markers; the account, losses and timeline
    are the whole job's."""
    now = now or timezone.now()
    # One read of the job's events (eight columns, no model rows). The losses need the whole
    # history: a restore or a failure re-classifies compute from any earlier hour.
    # A short job: one sweep (goodput.job_report) gives the exact account and the losses.
    # A long job (over LONG_JOB_EVENTS) takes its account from the hourly rows instead, and says
    # so on the page: building its spans costs more than the sweep (job_report and the account:
    # ~2.2 s at 300,000 events, against ~0.6 s for failure_losses alone), while the hourly rows
    # are one refresh behind at most (15 s; a minute for a holding job with no new events) and
    # computed by the same accounting. Its losses stay exact (that one sweep).
    events = job_events(job.pk)
    if job.events_seen > LONG_JOB_EVENTS:
        job_acc = job_account_from_hours(job, now=now)
        found = failure_losses(events, gang_size=job.gang_size, now=now)
    else:
        spans, found = job_report(events, gang_size=job.gang_size, now=now)
        job_acc = job_account(job, events, spans)
    since, until = _series_window(job, now)
    custom: dict[str, Any] = {}
    marker_filter: dict[str, Any] = {}
    bucket_s, rollup = MINUTE, "1m"
    steps_since = since
    if window is not None and window.custom:
        # A custom window (from / to): per minute up to a day, per hour beyond (console.ranges),
        # its first bucket whole.
        bucket_s, rollup = (3600, "1h") if window.resolution == "1h" else (MINUTE, "1m")
        since, until = window.start, window.end
        steps_since = datetime.fromtimestamp(since.timestamp() // bucket_s * bucket_s, UTC)
        custom = {**window.as_json(), "bucket_seconds": bucket_s}
        marker_filter = {"ts__lt": until}
    marked = JobEvent.objects.filter(job_id=job.pk, kind__in=MARKER_KINDS, ts__gte=since, **marker_filter)
    markers = [_event_row(e) for e in marked.order_by("ts", "seq")[:MARKER_LIMIT]]
    return {
        "ts": now.isoformat(),
        "job": job_state(job, now=now),
        "account": job_acc,
        "timeline": timeline(job.pk),
        "series": {
            "since": since.isoformat(),
            "until": until.isoformat(),
            **custom,
            "steps": step_series(job.pk, since=steps_since, until=until if custom else None, bucket_s=bucket_s),
            "gpus": gpu_series(job_gpu_ids(job), since=steps_since, until=until, rollup=rollup),
        },
        "markers": {
            "checkpoints": [m for m in markers if m["kind"] == JobEventKind.CHECKPOINT_SAVED],
            "failures": [m for m in markers if m["kind"] in (JobEventKind.FAILED, JobEventKind.PREEMPTED)],
            "restores": [m for m in markers if m["kind"] == JobEventKind.RESTORED],
        },
        "losses": (rows := losses(found)),
        "losses_total": losses_total(rows),
        "advice": advice(job, now=now),
        # The live pushes continue from here: events stored after this seq are new to the page.
        "watermark": job.events_seen,
    }


# --- live pushes -------------------------------------------------------------------------------


def build_training_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``training`` topic's push: the goodput numbers and the running jobs' steps and rates.

    Small on purpose: the stacked chart and the top jobs move by the hour and come with the
    snapshot; a push carries what changes by the second.
    """
    now = timezone.now()
    newest = Job.objects.aggregate(m=Max("last_event_at"))["m"]
    hourly = _hourly(window_start("7d", now), _hour_floor(now) + timedelta(hours=1))
    payload = {
        "type": "training.delta",
        "topic": topic,
        "ts": now.isoformat(),
        "goodput": cluster_goodput(hourly, now=now),
        "running": running_jobs(now=now),
    }
    return payload, newest.isoformat() if newest else watermark


def build_job_delta(topic: str, watermark: Any) -> tuple[dict[str, Any] | None, Any]:
    """The ``job.<id>`` topic's push: the job's state, its non-step events stored since the
    previous push, and its per-minute step points from the minute of the previous push on (that
    minute was still filling then: the page replaces its point).

    ``events_from_seq``: the events list holds every non-step event with seq >= it. Pages know
    the seq below which they hold everything (their snapshot's ``watermark``, then each push's);
    one that is behind ``events_from_seq`` re-reads its snapshot, the others drop the seqs they
    show. With no watermark (a first push, or the cache forgot it after an idle hour) the push
    re-sends the newest RESYNC_EVENTS non-step events rather than none, so an open page still
    sees a restart or a restore.
    """
    job_id = int(topic.split(".", 1)[1])
    job = Job.objects.select_related("site").filter(pk=job_id).first()
    if job is None:
        return None, watermark
    now = timezone.now()
    previous = watermark if isinstance(watermark, dict) else {}
    after_seq = previous.get("seq")  # the next seq the previous push had not seen (events_seen)
    since_minute = (
        datetime.fromisoformat(previous["minute"])
        if previous.get("minute")
        else now.replace(second=0, microsecond=0) - timedelta(minutes=5)
    )
    # job.events_seen is read before the events: a batch stored in between is sent now and again
    # next time (pages drop repeated seqs), never skipped.
    next_seq = job.events_seen
    if after_seq is None:
        events = newest_events(job_id, limit=RESYNC_EVENTS)
        # Complete from the oldest one sent, or from the job's first event when all fit.
        from_seq = events[0]["seq"] if len(events) == RESYNC_EVENTS else 0
    else:
        events = events_after(job_id, after_seq - 1, limit=TIMELINE_LIMIT)
        from_seq = after_seq
        if len(events) == TIMELINE_LIMIT:
            next_seq = events[-1]["seq"] + 1  # the rest comes with the next push
    steps = step_series(job_id, since=since_minute)
    payload = {
        "type": "job.delta",
        "topic": topic,
        "ts": now.isoformat(),
        "job": job_state(job, now=now),
        "steps": steps,
        "events": events,  # oldest first, by seq
        "events_from_seq": from_seq,
        "watermark": next_seq,
    }
    minute = steps["ts"][-1] if steps["ts"] else since_minute.isoformat()
    return payload, {"seq": next_seq, "minute": minute}
