"""Simulated inference endpoints that talk to the console exactly as a metrics pusher does: each
server's Prometheus exposition (vLLM's current names, one vLLM with the older names, one Triton)
pushed to POST /api/v1/ingest/prometheus with the site's agent token every 15 s, and the
endpoints' change events and eval results posted to /api/v1/serving/endpoints/<id>/changes and
/evals.

Each endpoint is a small fluid queueing model: arrivals follow a daily load curve in its site's
local time, a continuous batch completes up to its capacity, the surplus waits; TTFT is the
prefill time plus the wait, ITL grows with the batch, KV-cache usage is the batch's tokens over
the cache's capacity, and a cache past full preempts requests. Latencies and lengths are
log-normal, and the histograms' cumulative bucket counts follow their distribution functions, so
quantiles read back are what the model meant.

Scripted scenarios (``scenarios=True``), relative to the start of the live run:
  * queueing collapse (the Llama endpoint): from minute 3 to 13 arrivals run at 1.1 x what the
    batch completes, labelled on the endpoint by a config change naming the scripted surge; an
    autoscaler scales out at minute 4 and the replica takes 7.5 minutes to be ready (a cold
    start); its capacity drains the queue. TTFT p99 peaks near a minute; outside it every
    endpoint's is in the hundreds of milliseconds (or less);
  * KV-cache exhaustion (the Qwen endpoint): from minute 4 to 40 prompts are three times longer (a
    retrieval feature sends whole documents): the cache fills, requests are preempted;
  * quality regression (the Mistral endpoint, older vLLM metric names): at minute 2 its weights
    are re-quantised (fp16 -> awq-int4) and the evals after it score about 5 % lower.

``backfill`` pushes a few hours of history through the doors (timestamped scrapes a few minutes
apart, eval results every 20 minutes); ``history`` writes a week in-process (the demo's first
start: the last hour's scrapes through the serving writer, the minutes and hours before as the
rollups they would make, ``RollupMirror``). The clock is always an argument (``tick(now)``), so
tests can run a simulated hour in seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import requests
from django.db import connection

from fleet.telemetry.simulator import DEFAULT_SITES, Poster

SCRAPE_INTERVAL_S = 15.0
SUBSTEP_S = 15.0  # the queue model's step (a backfill minute is four of them)
EVAL_EVERY = timedelta(minutes=20)
HISTORY_EVAL_EVERY = timedelta(hours=3)
HISTORY_STEP = timedelta(minutes=10)  # a history's hour rollups: the sums of scrapes this far apart
SQRT2 = math.sqrt(2.0)
# Bucket bounds as vLLM exposes them (REFERENCE.md; vLLM's metrics.py).
TTFT_BOUNDS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BOUNDS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BOUNDS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 131072)
# Scenario timings, from the live run's start.
COLLAPSE_FROM, COLLAPSE_UNTIL = timedelta(minutes=3), timedelta(minutes=13)
# Arrivals x the batch's capacity: ten minutes of it leave about a minute of queue (TTFT p99 near
# a minute at the worst, as clients would still wait), which the scale-out drains.
COLLAPSE_SURGE = 1.1
# The change event that labels the surge on the endpoint's charts and list of changes.
SURGE_NOTE = "Scripted demo scenario: traffic surge at 1.1 x the batch's capacity (queueing collapse)"
SCALE_OUT_AT, SCALE_OUT_LOAD = timedelta(minutes=4), timedelta(minutes=7.5)
KV_FROM, KV_UNTIL = timedelta(minutes=4), timedelta(minutes=40)
PROMPT_SHIFT = 3.0
QUANTISED_AT = timedelta(minutes=2)
QUALITY_DROP = 0.95
EVALS = (("mmlu", "accuracy", 0.71), ("gsm8k", "exact_match", 0.79), ("humaneval", "pass@1", 0.55))


class ServingSender(Protocol):
    """What posts for the simulator: TextPoster (over fleet.telemetry.simulator.Poster), or a test's client."""

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any: ...

    def send_text(self, site: str, url: str, text: str) -> Any: ...


class TextPoster:
    """fleet.telemetry.simulator.Poster's token, session and retries, for a Prometheus text body too."""

    def __init__(self, poster: Poster) -> None:
        self.poster = poster

    def send(self, site: str, url: str, body: dict[str, Any]) -> requests.Response | None:
        return self.poster.send(site, url, body)

    def send_text(self, site: str, url: str, text: str) -> requests.Response | None:
        return self.poster.send_text(site, url, text)


@dataclass(frozen=True)
class EndpointSpec:
    name: str  # the served model name (vLLM's model_name, Triton's model): the endpoint's name
    site: str
    framework: str  # vllm or triton
    capacity_rps: float  # requests a second the batch completes, saturated
    peak_rps: float  # arrivals at the daily peak
    prompt_median: float  # tokens
    generation_median: float
    kv_tokens: float  # the KV cache's capacity in tokens
    ttft_s: float  # median prefill time, unloaded
    itl_s: float  # median inter-token latency, unloaded
    max_batch: int = 256
    daily_swing: float = 0.4  # the load curve runs from (1 - 2 x swing) to 1 x the peak
    legacy_names: bool = False  # vLLM before v0.9 / v0.11 (gpu_cache_usage_perc, time_per_output_token_seconds)
    scenario: str = "steady"  # steady, collapse, kv, quality
    region: str = ""
    replicas: int = 2
    version: str = "1"


ENDPOINTS = (
    EndpointSpec(
        "meta-llama/Llama-3.1-70B-Instruct", "iad-2", "vllm", 14.0, 9.0, 700, 220, 100_000, 0.07, 0.017,
        scenario="collapse", region="us-east", replicas=4,
    ),
    EndpointSpec(
        "Qwen/Qwen2.5-32B-Instruct", "ams-1", "vllm", 20.0, 8.0, 500, 180, 34_000, 0.05, 0.014,
        scenario="kv", region="eu-west", replicas=2, daily_swing=0.1,
    ),
    EndpointSpec(
        "mistralai/Mistral-7B-Instruct-v0.3", "sin-1", "vllm", 30.0, 15.0, 400, 150, 40_000, 0.03, 0.009,
        legacy_names=True, scenario="quality", region="ap-southeast", replicas=2,
    ),
    EndpointSpec(
        "bge-reranker-large", "iad-2", "triton", 400.0, 120.0, 300, 1, 1e9, 0.02, 0.01,
        region="us-east", replicas=2,
    ),
)  # fmt: skip


def _lognormal_cdf(x: float, median: float, sigma: float) -> float:
    if x <= 0:
        return 0.0
    if math.isinf(x):
        return 1.0
    return 0.5 * (1.0 + math.erf(math.log(x / median) / (sigma * SQRT2)))


@dataclass
class CumulativeHistogram:
    """A histogram's cumulative counts, as the server would expose them since it started."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    count: float = 0.0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * len(self.bounds)

    def observe(self, n: float, median: float, sigma: float) -> None:
        """``n`` observations of a log-normal with this median and sigma, spread over the buckets."""
        if n <= 0:
            return
        for i, bound in enumerate(self.bounds):
            self.counts[i] += n * _lognormal_cdf(bound, median, sigma)
        self.count += n
        self.total += n * median * math.exp(sigma * sigma / 2)  # the log-normal's mean


@dataclass
class SimEndpoint:
    spec: EndpointSpec
    utc_offset_h: int
    endpoint_id: int | None = None
    clock: datetime | None = None
    waiting: float = 0.0
    waiting_shown: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    extra_capacity: float = 0.0  # a scale-out's replica, once ready
    ok: float = 0.0
    length: float = 0.0
    aborted: float = 0.0
    failed: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0
    queue_s: float = 0.0  # Triton's cumulative durations
    compute_s: float = 0.0
    histograms: dict[str, CumulativeHistogram] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A server (re)start: every counter and histogram from zero."""
        self.ok = self.length = self.aborted = self.failed = 0.0
        self.prompt_tokens = self.generation_tokens = self.preemptions = self.queue_s = self.compute_s = 0.0
        self.histograms = {
            "ttft": CumulativeHistogram(TTFT_BOUNDS),
            "itl": CumulativeHistogram(ITL_BOUNDS),
            "e2e": CumulativeHistogram(E2E_BOUNDS),
            "queue": CumulativeHistogram(E2E_BOUNDS),
            "prompt": CumulativeHistogram(TOKEN_BOUNDS),
            "generation": CumulativeHistogram(TOKEN_BOUNDS),
        }


@dataclass
class PendingItem:
    ts: datetime
    endpoint: str
    kind: str  # changes or evals
    body: dict[str, Any]


class ServingSimulator:
    """Inference endpoints on the simulated sites. ``backfill(start, end)`` pushes history;
    ``tick(now)`` advances every endpoint to ``now``, pushes a scrape when one is due and posts
    the change events and evals whose time has come."""

    def __init__(
        self,
        sender: ServingSender,
        *,
        sites: list[str],
        endpoint_ids: dict[str, int] | None = None,
        seed: int = 7,
        scenarios: bool = True,
        scrape_interval_s: float = SCRAPE_INTERVAL_S,
        specs: tuple[EndpointSpec, ...] = ENDPOINTS,
        run: str = "",
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.sender = sender
        self.rng = random.Random(seed + 23)
        self.scenarios = scenarios
        self.interval = timedelta(seconds=scrape_interval_s)
        self.run = run or "r0"
        self.log = log or (lambda message: None)
        self.endpoint_ids = dict(endpoint_ids or {})
        self.started_at: datetime | None = None
        self.last_scrape: datetime | None = None
        self.pending: list[PendingItem] = []
        self.rejected: list[str] = []
        self.pushed = 0
        self.counter = 0
        self.eval_runs = 0  # live eval runs scheduled so far
        # A history's scripted scenario (``history``): its time zero and which scenarios it runs.
        self.script_origin: datetime | None = None
        self.script_only: frozenset[str] | None = None
        self.substep_s = SUBSTEP_S
        offsets = {s.name: s.utc_offset_h for s in DEFAULT_SITES}
        self.endpoints: list[SimEndpoint] = []
        for spec in specs:
            site = spec.site if spec.site in sites else sites[0]
            spec = EndpointSpec(**{**spec.__dict__, "site": site})
            self.endpoints.append(SimEndpoint(spec, offsets.get(site, 0), self.endpoint_ids.get(spec.name)))

    # --- the clock ------------------------------------------------------------------------------

    def elapsed(self, now: datetime) -> timedelta:
        return now - (self.started_at or now)

    def start(self, now: datetime) -> None:
        """Mark the live run's start (the scenarios' zero) and schedule its scripted events."""
        if self.started_at is not None:
            return
        self.started_at = now
        if not self.scenarios:
            return
        for ep in self.endpoints:
            if ep.spec.scenario == "collapse":
                self._label_surge(ep, now)
                at = now + SCALE_OUT_AT
                self._change(
                    ep,
                    at + SCALE_OUT_LOAD,  # posted once the replica is ready, as an autoscaler hook does
                    kind="scale_out",
                    ts=at,
                    ready_at=at + SCALE_OUT_LOAD,
                    from_value=str(ep.spec.replicas),
                    to_value=str(ep.spec.replicas + 1),
                    note="HPA: queue depth above target",
                )
            elif ep.spec.scenario == "quality":
                at = now + QUANTISED_AT
                self._change(ep, at, kind="quantisation", ts=at, from_value="fp16", to_value="awq-int4")
                self._evals(ep, at + timedelta(minutes=1), quality=QUALITY_DROP)
                self._evals(ep, at + timedelta(minutes=4), quality=QUALITY_DROP)

    def tick(self, now: datetime) -> None:
        """Advance every endpoint to ``now``; push a scrape if one is due; post what is due."""
        self.start(now)
        if self.last_scrape is None or now - self.last_scrape >= self.interval:
            for ep in self.endpoints:
                self._advance(ep, now)
                self._push(ep, now)
            self.last_scrape = now
            self._schedule_evals(now)
        self._post_due(now)

    def backfill(self, start: datetime, end: datetime, *, step: timedelta = timedelta(minutes=1)) -> None:
        """Push [start, end) as history: a timestamped scrape per endpoint every ``step``, eval
        results every 20 minutes, and a routine replica load per endpoint. The servers start at
        ``start`` (their counters from zero)."""
        for ep in self.endpoints:
            ep.restart()
            ep.clock = start
            load_at = start + timedelta(minutes=self.rng.uniform(10, 40))
            self._change(
                ep,
                load_at,
                kind="replica_load",
                ts=load_at,
                ready_at=load_at + timedelta(seconds=self.rng.uniform(80, 160)),
                note="rolling restart",
            )
        t = start + step
        while t < end:
            for ep in self.endpoints:
                self._advance(ep, t)
                self._push(ep, t)
            t += step
        evals_at = start + timedelta(minutes=5)
        while evals_at < end:
            for ep in self.endpoints:
                if ep.spec.framework == "vllm":
                    self._evals(ep, evals_at)
            evals_at += EVAL_EVERY
        self._post_due(end)
        self.last_scrape = None

    def history(
        self,
        start: datetime,
        end: datetime,
        *,
        site_ids: dict[str, int],
        collapse_at: datetime | None = None,
        raw: timedelta = timedelta(hours=1),
        minutes: timedelta = timedelta(hours=24),
    ) -> dict[str, int]:
        """Write [start, end) as history, in-process, with the servers starting at ``start``:

        * the last ``raw``: a scrape per endpoint every minute through the serving writer (the
          door's points, without the text and its parsing), for the rollup code to roll up;
        * before it, back to the hour ``minutes`` before ``end``: the minute rollups those scrapes
          would roll up to (``RollupMirror``), by COPY, the hours marked for the rollup code;
        * before that: the hour rollups, the sums of such minutes (scrapes HISTORY_STEP apart);

        and eval results every 20 minutes, a routine replica load per endpoint and, at
        ``collapse_at``, the collapse scenario's surge on the endpoint that runs it (its label, its
        slow scale-out, the queue it leaves): the history's one scripted incident, inside the
        minute rollups so the detectors can read it. The caller rolls up
        (fleet.serving.rollups.roll_everything). Returns the rows and points written, by kind. The
        live run's scenarios count from its own start."""
        from fleet.serving import rollups as serving_rollups
        from fleet.serving.store import store_serving_points

        for ep in self.endpoints:
            ep.restart()
            ep.clock = start
            load_at = start + timedelta(minutes=self.rng.uniform(10, 40))
            ready = load_at + timedelta(seconds=self.rng.uniform(80, 160))
            self._change(ep, load_at, kind="replica_load", ts=load_at, ready_at=ready, note="rolling restart")
        if collapse_at is not None:
            origin = collapse_at - COLLAPSE_FROM
            self.script_origin, self.script_only = origin, frozenset({"collapse"})
            for ep in self.endpoints:
                if self._runs(ep, "collapse"):
                    self._label_surge(ep, origin)
                    at = origin + SCALE_OUT_AT
                    self._change(
                        ep,
                        at + SCALE_OUT_LOAD,
                        kind="scale_out",
                        ts=at,
                        ready_at=at + SCALE_OUT_LOAD,
                        from_value=str(ep.spec.replicas),
                        to_value=str(ep.spec.replicas + 1),
                        note="HPA: queue depth above target",
                    )
        minute_from = (end - minutes).replace(minute=0, second=0, microsecond=0)
        raw_from = (end - raw).replace(second=0, microsecond=0)
        mirrors = {ep.spec.name: RollupMirror(ep) for ep in self.endpoints}
        hour_rows: list[tuple[Any, ...]] = []
        minute_rows: list[tuple[Any, ...]] = []
        points_by_site: dict[str, list[Any]] = {}
        hours: dict[str, datetime | None] = {}
        try:
            t = start
            while t < end:
                step = HISTORY_STEP if t + HISTORY_STEP < minute_from else timedelta(minutes=1)
                t += step
                if t >= end:
                    break
                hour = t.replace(minute=0)
                self.substep_s = step.total_seconds()  # the fluid model is linear within a step
                for ep in self.endpoints:
                    self._advance(ep, t)
                    mirror = mirrors[ep.spec.name]
                    if hours.get(ep.spec.name) not in (None, hour):  # an hour of sums is complete
                        hour_rows += [(ep.endpoint_id, hours[ep.spec.name], *r) for r in mirror.rows()]
                        hours[ep.spec.name] = None
                    if t < minute_from:
                        mirror.observe(ep, step.total_seconds())
                        hours[ep.spec.name] = hour
                        continue
                    if t < raw_from:
                        mirror.observe(ep, step.total_seconds())
                        minute_rows += [(ep.endpoint_id, t, *r) for r in mirror.rows()]
                    if t >= raw_from - timedelta(minutes=1):  # the raw minutes, and the scrape before them
                        points_by_site.setdefault(ep.spec.site, []).extend(points(ep, t))
        finally:
            self.script_origin = self.script_only = None
            self.substep_s = SUBSTEP_S
        written = {"hour_rollups": len(hour_rows), "minute_rollups": len(minute_rows), "points": 0}
        _copy_serving_rollups("1h", hour_rows)
        _copy_serving_rollups("1m", minute_rows)
        # The hours of the minute rollups: summed by the rollup code, as it sums live minutes.
        serving_rollups._mark("1h", sorted({(row[0], row[1].replace(minute=0)) for row in minute_rows}))
        for site, rows in points_by_site.items():
            key = f"{self.run}-history-{site}"
            written["points"] += store_serving_points(site_id=site_ids[site], batch_key=key, points=rows)
        # The scrape before the raw minutes is there for their first increase; its own minute keeps
        # the copied row (from raw it would have no scrape before it, and no increase).
        ids = [ep.endpoint_id for ep in self.endpoints if ep.endpoint_id is not None]
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM fleet_servingrollupdirty "
                "WHERE resolution = '1m' AND endpoint_id = ANY(%s) AND bucket < %s",
                [ids, raw_from],
            )
        evals_at = start + timedelta(minutes=5)
        while evals_at < end:
            for ep in self.endpoints:
                if ep.spec.framework == "vllm":
                    self._evals(ep, evals_at)
            # Nightly-style runs every few hours over the week, every 20 minutes over the last hours
            # (the quality detector's baseline is the last few runs before a change).
            evals_at += EVAL_EVERY if end - evals_at < timedelta(hours=3) else HISTORY_EVAL_EVERY
        sender, self.sender = self.sender, _InProcess()  # type: ignore[assignment]
        try:
            self._post_due(end)
        finally:
            self.sender = sender
        self.last_scrape = None
        return written

    # --- the model ------------------------------------------------------------------------------

    def _load(self, ep: SimEndpoint, t: datetime) -> float:
        """Arrivals a second: the daily curve in the site's local time (peak mid-afternoon)."""
        local = (t.hour + t.minute / 60 + ep.utc_offset_h) % 24
        swing = ep.spec.daily_swing
        curve = 1 - swing + swing * math.sin(2 * math.pi * (local - 9) / 24)
        rate = ep.spec.peak_rps * curve * self.rng.uniform(0.97, 1.03)
        if self._scenario(ep, "collapse", t, COLLAPSE_FROM, COLLAPSE_UNTIL):
            rate = max(rate, ep.spec.capacity_rps * COLLAPSE_SURGE)
        return rate

    def _origin(self) -> datetime | None:
        """The scenarios' time zero: a history's scripted moment, else the live run's start."""
        return self.script_origin or self.started_at

    def _runs(self, ep: SimEndpoint, name: str) -> bool:
        only = self.script_only
        return self.scenarios and ep.spec.scenario == name and (only is None or name in only)

    def _scenario(self, ep: SimEndpoint, name: str, t: datetime, start: timedelta, end: timedelta) -> bool:
        origin = self._origin()
        return self._runs(ep, name) and origin is not None and start <= t - origin < end

    def _label_surge(self, ep: SimEndpoint, origin: datetime) -> None:
        """Mark the scripted surge on the endpoint (a config change with a note): a demo's TTFT of
        tens of seconds is a labelled incident, never a healthy-looking endpoint's figure."""
        at = origin + COLLAPSE_FROM
        self._change(ep, at, kind="config", ts=at, note=SURGE_NOTE)

    def _advance(self, ep: SimEndpoint, now: datetime) -> None:
        if ep.clock is None:
            ep.clock = now
            return
        while ep.clock < now:
            dt = min(self.substep_s, (now - ep.clock).total_seconds())
            ep.clock += timedelta(seconds=dt)
            self._step(ep, ep.clock, dt)

    def _step(self, ep: SimEndpoint, t: datetime, dt: float) -> None:
        s = ep.spec
        origin = self._origin()
        if self._runs(ep, "collapse") and origin is not None:
            ready = t - origin >= SCALE_OUT_AT + SCALE_OUT_LOAD
            ep.extra_capacity = s.capacity_rps / s.replicas if ready else 0.0
        prompt_median = s.prompt_median
        if self._scenario(ep, "kv", t, KV_FROM, KV_UNTIL):
            prompt_median *= PROMPT_SHIFT
        arrivals = self._load(ep, t) * dt
        capacity = (s.capacity_rps + ep.extra_capacity) * dt
        # KV pressure: the batch's tokens against the cache. Past full the scheduler preempts.
        mean_tokens = prompt_median * math.exp(0.8**2 / 2) + s.generation_median * math.exp(0.7**2 / 2) / 2
        rho = min(1.0, (arrivals + ep.waiting) / capacity)
        itl = s.itl_s * (1 + 0.4 * rho)
        ttft_base = s.ttft_s * (prompt_median / s.prompt_median) ** 0.7 * (1 + 0.6 * rho * rho)
        e2e_run = ttft_base + s.generation_median * itl
        # Little's law on what the batch can hold: its throughput x how long a request runs.
        batch = min(s.max_batch, min(arrivals / dt, s.capacity_rps) * e2e_run)
        demand = batch * mean_tokens / s.kv_tokens
        preempted = 0.0
        if demand > 0.95:
            # Preempted requests are recomputed: the batch shrinks to what fits and some throughput is lost.
            preempted = (demand - 0.95) * batch * 0.15 * dt
            capacity *= max(0.8, 0.95 / demand)
        served = min(capacity, ep.waiting + arrivals)
        ep.waiting = max(0.0, ep.waiting + arrivals - served)
        wait_s = ep.waiting / max(capacity / dt, 1e-9)
        ep.running = batch
        # What a scrape sees waiting: the backlog, or a few requests between two batch steps.
        ep.waiting_shown = ep.waiting + max(0.0, self.rng.gauss(2 * rho**3, 1.0))
        ep.kv_usage = min(0.995, demand * self.rng.uniform(0.98, 1.02)) if demand > 0.95 else demand
        ep.preemptions += preempted
        if served <= 0:
            return
        failed = served * 0.0001
        aborted = served * 0.003
        length = served * 0.08
        ep.failed += failed
        ep.aborted += aborted
        ep.length += length
        ep.ok += served - failed - aborted - length
        tokens_out = served * s.generation_median * math.exp(0.7**2 / 2)
        ep.prompt_tokens += served * prompt_median * math.exp(0.8**2 / 2)
        ep.generation_tokens += tokens_out
        h = ep.histograms
        ttft = ttft_base + wait_s
        # Requests behind a backlog all wait about as long: the spread is the prefill's, not the
        # wait's (a queue's TTFT p99 is its wait plus a little, not three times it).
        h["ttft"].observe(served, ttft, 0.1 + 0.35 * ttft_base / ttft)
        h["itl"].observe(tokens_out, itl, 0.2)
        h["e2e"].observe(served, ttft + s.generation_median * itl, 0.6)
        h["queue"].observe(served, max(wait_s, 0.001), 0.5)
        h["prompt"].observe(served, prompt_median, 0.8)
        h["generation"].observe(served, s.generation_median, 0.7)
        ep.queue_s += served * max(wait_s, 0.0005)
        ep.compute_s += served * ttft_base

    # --- the exposition -------------------------------------------------------------------------

    def exposition(self, ep: SimEndpoint, ts: datetime) -> str:
        """The server's /metrics now, with explicit timestamps (milliseconds)."""
        return _render(ep, ts)

    def _push(self, ep: SimEndpoint, ts: datetime) -> None:
        response = self.sender.send_text(ep.spec.site, "/api/v1/ingest/prometheus", self.exposition(ep, ts))
        if response is None:
            self.log(f"endpoint {ep.spec.name}: scrape undelivered")
        elif response.status_code >= 400:
            self.rejected.append(f"{ep.spec.name}: HTTP {response.status_code} {_text(response)[:300]}")
        else:
            self.pushed += 1

    # --- change events and evals ----------------------------------------------------------------

    def _next_id(self) -> str:
        self.counter += 1
        return f"{self.run}-{self.counter}"

    def _change(self, ep: SimEndpoint, due: datetime, **body: Any) -> None:
        item = {"id": self._next_id(), **{k: v.isoformat() if isinstance(v, datetime) else v for k, v in body.items()}}
        self.pending.append(PendingItem(due, ep.spec.name, "changes", item))

    def _evals(self, ep: SimEndpoint, at: datetime, *, quality: float = 1.0) -> None:
        """One eval run: each suite's score (times ``quality``) with a little run-to-run noise."""
        for suite, metric, score in EVALS:
            noisy = score * quality * self.rng.uniform(0.997, 1.003)
            body = {
                "id": self._next_id(),
                "ts": at.isoformat(),
                "suite": suite,
                "metric": metric,
                "score": round(noisy, 4),
                "model_version": ep.spec.version,
            }
            self.pending.append(PendingItem(at, ep.spec.name, "evals", body))

    def _quantised(self, ep: SimEndpoint, at: datetime) -> bool:
        return self.scenarios and ep.spec.scenario == "quality" and self.elapsed(at) >= QUANTISED_AT

    def _schedule_evals(self, now: datetime) -> None:
        """Live eval runs every 20 minutes per vLLM endpoint (the quality scenario's after its change)."""
        if self.started_at is None:
            return
        due = int(self.elapsed(now) / EVAL_EVERY)
        if due > self.eval_runs:
            self.eval_runs = due
            for ep in self.endpoints:
                if ep.spec.framework == "vllm":
                    self._evals(ep, now, quality=QUALITY_DROP if self._quantised(ep, now) else 1.0)

    def _post_due(self, now: datetime) -> None:
        due = [p for p in self.pending if p.ts <= now]
        if not due:
            return
        self.pending = [p for p in self.pending if p.ts > now]
        grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for item in sorted(due, key=lambda p: p.ts):
            grouped.setdefault((item.endpoint, item.kind), []).append(item.body)
        for (name, kind), items in grouped.items():
            ep = next(e for e in self.endpoints if e.spec.name == name)
            endpoint_id = self.endpoint_ids.get(name)
            if endpoint_id is None:
                self.log(f"endpoint {name}: no id to post its {kind} to; dropped")
                continue
            url = f"/api/v1/serving/endpoints/{endpoint_id}/{kind}"
            response = self.sender.send(ep.spec.site, url, {"items": items})
            if response is None:
                self.pending.extend(PendingItem(now, name, kind, body) for body in items)  # next round
            elif response.status_code >= 400:
                self.rejected.append(f"{name} {kind}: HTTP {response.status_code} {_text(response)[:300]}")


# --- rendering ---------------------------------------------------------------------------------


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and bound >= 1 else repr(float(bound))


# A sample of an exposition: (metric name, labels in exposition order, value). The text and the
# in-process points of one scrape are rendered from the same samples.
Sample = tuple[str, dict[str, str], float]


def _vllm_samples(ep: SimEndpoint, *, labels: bool = True) -> tuple[list[tuple[str, str]], list[Sample]]:
    """The samples of a vLLM scrape; with ``labels=False`` the bucket samples carry no labels
    (a history's rollups need only the values, in this order)."""
    s = ep.spec
    base = {"model_name": s.name, "engine": "0"}
    types: list[tuple[str, str]] = []
    out: list[Sample] = []

    def metric(name: str, kind: str, samples: list[tuple[dict[str, str], float]]) -> None:
        types.append((name, kind))
        out.extend((name, labels, value) for labels, value in samples)

    def histogram(name: str, h: CumulativeHistogram, *, whole: bool = False) -> None:
        types.append((name, "histogram"))
        bucket = f"{name}_bucket"
        if labels:
            for bound, count in zip(h.bounds, h.counts, strict=True):
                out.append((bucket, {"le": _le(bound), **base}, float(round(count))))
        else:
            out.extend((bucket, base, float(round(count))) for count in h.counts)
        out.append((f"{name}_bucket", {"le": "+Inf", **base}, float(round(h.count))))
        out.append((f"{name}_count", base, float(round(h.count))))
        out.append((f"{name}_sum", base, float(round(h.total) if whole else round(h.total, 3))))

    metric("vllm:num_requests_running", "gauge", [(base, float(round(ep.running)))])
    metric("vllm:num_requests_waiting", "gauge", [(base, float(round(ep.waiting_shown)))])
    cache = "vllm:gpu_cache_usage_perc" if s.legacy_names else "vllm:kv_cache_usage_perc"
    metric(cache, "gauge", [(base, float(round(ep.kv_usage, 4)))])
    metric("vllm:num_preemptions_total", "counter", [(base, float(round(ep.preemptions)))])
    metric("vllm:prompt_tokens_total", "counter", [(base, float(round(ep.prompt_tokens)))])
    metric("vllm:generation_tokens_total", "counter", [(base, float(round(ep.generation_tokens)))])
    metric(
        "vllm:request_success_total",
        "counter",
        [
            ({"finished_reason": "stop", **base}, float(round(ep.ok))),
            ({"finished_reason": "length", **base}, float(round(ep.length))),
            ({"finished_reason": "abort", **base}, float(round(ep.aborted))),
            ({"finished_reason": "error", **base}, float(round(ep.failed))),
        ],
    )
    h = ep.histograms
    histogram("vllm:time_to_first_token_seconds", h["ttft"])
    itl = "vllm:time_per_output_token_seconds" if s.legacy_names else "vllm:inter_token_latency_seconds"
    histogram(itl, h["itl"])
    histogram("vllm:e2e_request_latency_seconds", h["e2e"])
    histogram("vllm:request_queue_time_seconds", h["queue"])
    histogram("vllm:request_prompt_tokens", h["prompt"], whole=True)
    histogram("vllm:request_generation_tokens", h["generation"], whole=True)
    return types, out


def _triton_samples(ep: SimEndpoint) -> tuple[list[tuple[str, str]], list[Sample]]:
    s = ep.spec
    base = {"model": s.name, "version": s.version}
    types: list[tuple[str, str]] = []
    out: list[Sample] = []

    def metric(name: str, kind: str, samples: list[tuple[dict[str, str], float]]) -> None:
        types.append((name, kind))
        out.extend((name, labels, float(round(value))) for labels, value in samples)

    metric("nv_inference_request_success", "counter", [(base, ep.ok + ep.length)])
    metric(
        "nv_inference_request_failure",
        "counter",
        [
            ({"model": s.name, "reason": "BACKEND", "version": s.version}, ep.failed),
            ({"model": s.name, "reason": "CANCELED", "version": s.version}, ep.aborted),
        ],
    )
    metric("nv_inference_pending_request_count", "gauge", [(base, ep.waiting_shown)])
    e2e = ep.histograms["e2e"].total
    metric("nv_inference_request_duration_us", "counter", [(base, e2e * 1e6)])
    metric("nv_inference_queue_duration_us", "counter", [(base, ep.queue_s * 1e6)])
    metric("nv_inference_compute_infer_duration_us", "counter", [(base, ep.compute_s * 1e6)])
    return types, out


def _samples(ep: SimEndpoint, *, labels: bool = True) -> tuple[list[tuple[str, str]], list[Sample]]:
    return _triton_samples(ep) if ep.spec.framework == "triton" else _vllm_samples(ep, labels=labels)


def _value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


def _render(ep: SimEndpoint, ts: datetime) -> str:
    """The server's /metrics text: each family's TYPE line, then its samples with the timestamp."""
    stamp = _ms(ts)
    types, samples = _samples(ep)
    lines: list[str] = []
    declared = iter(types)
    family = None
    for name, labels, value in samples:
        while family is None or not name.startswith(family):
            family, kind = next(declared)
            lines.append(f"# TYPE {family} {kind}")
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {_value(value)} {stamp}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# The label that names the endpoint, left out of the stored series (fleet.ingest.prometheus).
MODEL_LABEL = {"vllm": "model_name", "triton": "model"}


def points(ep: SimEndpoint, ts: datetime) -> list[Any]:
    """The scrape at ``ts`` as the Prometheus door stores it (fleet.serving.store.ServingPoint:
    labels sorted and escaped, the endpoint's model label left out), without the text and its
    parsing: how a history's scrapes are written in bulk. The same samples as ``exposition``."""
    from fleet.serving.store import ServingPoint

    s = ep.spec
    skip = MODEL_LABEL[s.framework]
    version = s.version if s.framework == "triton" else ""
    out = []
    for name, labels, value in _samples(ep)[1]:
        series = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != skip)
        out.append(ServingPoint(s.name, s.framework, s.name, ts, name, series, value, version))
    return out


def _text(response: Any) -> str:
    text = getattr(response, "text", None)
    if text is None:
        text = response.content.decode(errors="replace")
    return str(text)


# --- a history's rollups ------------------------------------------------------------------------


class RollupMirror:
    """What fleet.serving.rollups makes of an endpoint scraped once a step, without the scrapes:
    each series' increase since the step before (counters, histogram parts, Triton's failures by
    reason), histogram buckets per bucket (zero buckets left out but the one below a counted
    bucket), gauges' mean and maximum over the steps, and the seconds covered. The series are
    classified by the rollups' own rules (``rollups._classify``); a test holds the rows to what
    the rollup code makes of the same scrapes. ``observe`` takes a scrape; ``rows`` gives the
    rows since the last call (the sums of its steps, as an hour sums its minutes)."""

    def __init__(self, ep: SimEndpoint) -> None:
        from fleet.serving import rollups as serving_rollups

        s = ep.spec
        skip = MODEL_LABEL[s.framework]
        reason_of = getattr(serving_rollups, "_failure_reason", lambda metric, series: None)
        self.layout = []
        for name, labels, _ in _samples(ep)[1]:
            series = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != skip)
            info = serving_rollups._classify(name, series)
            reason = reason_of(name, series) if info is not None and info[1] == "counter" else None
            self.layout.append((info, reason))
        self.mean_gauges = serving_rollups.MEAN_GAUGES
        self.span = getattr(serving_rollups, "SPAN", None)
        self.previous: list[float] | None = None
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[tuple[str, float], float] = {}
        self.gauges: dict[str, list[float]] = {}  # quantity -> [sum of means, max, observations]
        self.covered = 0.0

    def observe(self, ep: SimEndpoint, seconds: float) -> None:
        """The endpoint's scrape now, ``seconds`` after the one before: its rows (a minute's, as
        the rollups make them of one scrape) are added to the sums since the last ``rows``, as an
        hour sums its minutes."""
        from fleet.serving import metrics as sm

        values = [v for _, _, v in _samples(ep, labels=False)[1]]
        previous, self.previous = self.previous, values
        sums, gauges = self.sums, self.gauges
        step: dict[tuple[str, float], float] = {}
        cumulative: dict[str, dict[float, float]] = {}
        step_gauges: dict[str, list[float]] = {}
        for (info, reason), before, value in zip(self.layout, previous or [None] * len(values), values, strict=True):
            if info is None:
                continue
            quantity, kind, scale, _, le = info
            if kind == "gauge":
                g = step_gauges.setdefault(quantity, [0.0, 0.0, 0.0])
                g[0] += value * scale
                g[1] += value * scale
                g[2] += 1
                continue
            if before is None:
                continue
            increase = sm.counter_increase(before, value)
            if kind == "bucket":
                per_le = cumulative.setdefault(quantity, {})
                per_le[le] = per_le.get(le, 0.0) + increase * scale
            elif increase:
                name = quantity if kind == "counter" else f"{quantity}:{kind}"
                step[(name, 0.0)] = step.get((name, 0.0), 0.0) + increase * scale
            if reason is not None and increase:
                step[(reason, 0.0)] = step.get((reason, 0.0), 0.0) + increase
        for quantity, per_le in cumulative.items():
            below, buckets = 0.0, []
            for le in sorted(per_le):
                buckets.append((le, per_le[le] - below))
                below = per_le[le]
            # Zero buckets are left out, but the one just below a counted bucket (its lower bound).
            for k, (le, count) in enumerate(buckets):
                if count or (k + 1 < len(buckets) and buckets[k + 1][1]):
                    step[(quantity, le)] = count
        for key, value in step.items():
            sums[key] = sums.get(key, 0.0) + value
        for quantity, (total, high, n) in step_gauges.items():
            mean, high = (total / n, high / n) if quantity in self.mean_gauges else (total, high)
            g = gauges.setdefault(quantity, [0.0, float("-inf"), 0])
            g[0] += mean
            g[1] = max(g[1], high)
            g[2] += 1
        if previous is not None:
            self.covered += seconds

    def rows(self) -> list[tuple[str, float, float]]:
        """(quantity, le, value) of the scrapes observed since the last call."""
        out = [(name, le, value) for (name, le), value in self.sums.items()]
        if self.span is not None and self.covered:
            out.append((self.span, 0.0, self.covered))
        for quantity, (means, high, n) in self.gauges.items():
            out.append((quantity, 0.0, means / n))
            out.append((f"{quantity}:max", 0.0, high))
        self._reset()
        return out


def _copy_serving_rollups(resolution: str, rows: list[tuple[Any, ...]]) -> None:
    """COPY (endpoint id, bucket, quantity, le, value) rows into a serving rollup table."""
    from fleet.telemetry import partitions

    if not rows:
        return
    table = partitions.SERVING_ROLLUP_1M if resolution == "1m" else partitions.SERVING_ROLLUP_1H
    partitions.ensure_partitions_for(table, sorted({row[1] for row in rows}))
    sql = f"COPY {table.name} (endpoint_id, bucket, quantity, le, value) FROM STDIN (FORMAT BINARY)"
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        copy.set_types(["int8", "timestamptz", "text", "float8", "float8"])
        for row in rows:
            copy.write_row(row)


# --- in-process set-up (the simulate command has the database) ----------------------------------


class _InProcess:
    """Stores a history's change events and evals as the serving API does (its item parser, one
    bulk insert per batch), without HTTP: the console's server may not be up yet. It has no
    send_text: a history writes its scrapes as points by COPY, never as exposition text."""

    def send(self, site: str, url: str, body: dict[str, Any]) -> Any:
        from fleet.serving.api import ChangeItemSerializer, EvalItemSerializer, parse_items
        from fleet.serving.models import EndpointChange, EndpointEval

        endpoint_id, kind = url.rstrip("/").split("/")[-2:]
        model, serializer = (
            (EndpointChange, ChangeItemSerializer) if kind == "changes" else (EndpointEval, EvalItemSerializer)
        )
        for start in range(0, len(body["items"]), 1000):  # the API's batch limit
            items = parse_items({"items": body["items"][start : start + 1000]}, serializer)
            model.objects.bulk_create([model(endpoint_id=int(endpoint_id), **item) for item in items])
        return type("Stored", (), {"status_code": 201})()


def prepare_endpoints(site_ids: dict[str, int], *, specs: tuple[EndpointSpec, ...] = ENDPOINTS) -> dict[str, int]:
    """The simulated endpoints as an operator registers them (site, model, region, replicas, the
    default SLOs), before their first scrape names them; their ids by name. A spec whose site is
    not simulated goes to the first site that is."""
    from fleet.serving.models import Endpoint

    first = sorted(site_ids)[0]
    ids = {}
    for spec in specs:
        site_id = site_ids.get(spec.site, site_ids[first])
        endpoint, _ = Endpoint.objects.get_or_create(
            site_id=site_id,
            name=spec.name,
            defaults={
                "framework": spec.framework,
                "model_name": spec.name,
                "region": spec.region,
                "replicas": spec.replicas,
                "version": spec.version if spec.framework == "triton" else "",
            },
        )
        ids[spec.name] = endpoint.pk
    return ids


def history_start(endpoint_ids: dict[str, int], *, now: datetime, hours: float) -> datetime | None:
    """Where a backfill of ``hours`` should begin: ``hours`` ago, or after the endpoints' latest
    stored scrape (a restarted demo does not push over its own history); None when that is less
    than two minutes ago (nothing to fill)."""
    from django.db import connection

    start = now - timedelta(hours=hours)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(last) FROM (SELECT (SELECT max(ts) FROM fleet_servingsample s "
            "WHERE s.endpoint_id = e AND s.ts >= %s AND s.ts <= %s) AS last "
            "FROM unnest(%s::bigint[]) AS e) latest",
            [start, now, sorted(endpoint_ids.values())],
        )
        latest = cursor.fetchone()[0]
    if latest is not None:
        start = max(start, latest + timedelta(minutes=1))
    return start if now - start >= timedelta(minutes=2) else None


def serving_for_command(
    poster: Poster,
    *,
    endpoints: int,
    seed: int,
    run: str,
    log: Callable[[str], None],
) -> ServingSimulator:
    """The `simulate` command's serving simulator: its endpoints registered on the sites the
    poster has tokens for (no history: ``push_history``, or the demo's week of history)."""
    from fleet.inventory.models import Site

    site_ids = dict(Site.objects.filter(name__in=poster.tokens).values_list("name", "pk"))
    specs = ENDPOINTS[:endpoints]
    ids = prepare_endpoints(site_ids, specs=specs)
    return ServingSimulator(
        TextPoster(poster), sites=sorted(site_ids), endpoint_ids=ids, seed=seed, specs=specs, run=run, log=log
    )


def push_history(sim: ServingSimulator, *, hours: float, now: datetime) -> None:
    """Push ``hours`` of history through the doors (scrapes five minutes apart) unless a previous
    session's is already there (``history_start``)."""
    start = history_start(sim.endpoint_ids, now=now, hours=hours)
    if start is not None:
        hours_pushed = (now - start).total_seconds() / 3600
        sim.log(f"pushing {hours_pushed:.1f} h of serving history for {len(sim.endpoints)} endpoints")
        sim.backfill(start, now, step=timedelta(minutes=5))
