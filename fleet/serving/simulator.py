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
  * queueing collapse (the Llama endpoint): from minute 3 to 13 arrivals run at 1.2 x what the
    batch completes; an autoscaler scales out at minute 4 and the replica takes 7.5 minutes to be
    ready (a cold start); its capacity drains the queue;
  * KV-cache exhaustion (the Qwen endpoint): from minute 4 to 40 prompts are three times longer (a
    retrieval feature sends whole documents): the cache fills, requests are preempted;
  * quality regression (the Mistral endpoint, older vLLM metric names): at minute 2 its weights
    are re-quantised (fp16 -> awq-int4) and the evals after it score about 5 % lower.

``backfill`` first pushes a few hours of history (timestamped scrapes a few minutes apart, eval
results every 20 minutes), so the pages and the 7-day prompt-length baseline are not empty. The
clock is always an argument (``tick(now)``), so tests can run a simulated hour in seconds.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import requests

from fleet.telemetry.simulator import DEFAULT_SITES, Poster

SCRAPE_INTERVAL_S = 15.0
SUBSTEP_S = 15.0  # the queue model's step (a backfill minute is four of them)
EVAL_EVERY = timedelta(minutes=20)
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
COLLAPSE_SURGE = 1.2  # arrivals x the batch's capacity
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
        p = self.poster
        headers = {
            "Authorization": f"Bearer {p.tokens[site]}",
            "Idempotency-Key": str(uuid.uuid4()),
            "Content-Type": "text/plain; version=0.0.4",
        }
        for attempt in range(p.max_attempts):
            try:
                response = p.session.post(p.base_url + url, data=text.encode(), headers=headers, timeout=10)
            except requests.RequestException:
                response = None
            if response is not None and response.status_code < 500 and response.status_code != 429:
                return response
            retry_after = response.headers.get("Retry-After") if response is not None else None
            delay = min(5.0, float(retry_after) if retry_after and retry_after.isdigit() else 0.25 * 2**attempt)
            p.sleep(delay)
        return None


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

    def _scenario(self, ep: SimEndpoint, name: str, t: datetime, start: timedelta, end: timedelta) -> bool:
        return self.scenarios and ep.spec.scenario == name and start <= self.elapsed(t) < end

    def _advance(self, ep: SimEndpoint, now: datetime) -> None:
        if ep.clock is None:
            ep.clock = now
            return
        while ep.clock < now:
            dt = min(SUBSTEP_S, (now - ep.clock).total_seconds())
            ep.clock += timedelta(seconds=dt)
            self._step(ep, ep.clock, dt)

    def _step(self, ep: SimEndpoint, t: datetime, dt: float) -> None:
        s = ep.spec
        if self.scenarios and s.scenario == "collapse" and self.started_at is not None:
            ready = self.elapsed(t) >= SCALE_OUT_AT + SCALE_OUT_LOAD
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
        h["ttft"].observe(served, ttft, 0.45)
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
        return _triton_text(ep, ts) if ep.spec.framework == "triton" else _vllm_text(ep, ts)

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


def _num(value: float) -> str:
    return repr(float(value))


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and bound >= 1 else repr(float(bound))


def _vllm_text(ep: SimEndpoint, ts: datetime) -> str:
    s, stamp = ep.spec, _ms(ts)
    base = f'model_name="{s.name}",engine="0"'
    lines: list[str] = []

    def metric(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {_num(value)} {stamp}" for labels, value in samples)

    def histogram(name: str, h: CumulativeHistogram, *, whole: bool = False) -> None:
        lines.append(f"# TYPE {name} histogram")
        for bound, count in zip(h.bounds, h.counts, strict=True):
            lines.append(f'{name}_bucket{{le="{_le(bound)}",{base}}} {_num(round(count))} {stamp}')
        lines.append(f'{name}_bucket{{le="+Inf",{base}}} {_num(round(h.count))} {stamp}')
        lines.append(f"{name}_count{{{base}}} {_num(round(h.count))} {stamp}")
        lines.append(f"{name}_sum{{{base}}} {_num(round(h.total) if whole else round(h.total, 3))} {stamp}")

    metric("vllm:num_requests_running", "gauge", [(base, round(ep.running))])
    metric("vllm:num_requests_waiting", "gauge", [(base, round(ep.waiting_shown))])
    cache = "vllm:gpu_cache_usage_perc" if s.legacy_names else "vllm:kv_cache_usage_perc"
    metric(cache, "gauge", [(base, round(ep.kv_usage, 4))])
    metric("vllm:num_preemptions_total", "counter", [(base, round(ep.preemptions))])
    metric("vllm:prompt_tokens_total", "counter", [(base, round(ep.prompt_tokens))])
    metric("vllm:generation_tokens_total", "counter", [(base, round(ep.generation_tokens))])
    metric(
        "vllm:request_success_total",
        "counter",
        [
            (f'finished_reason="stop",{base}', round(ep.ok)),
            (f'finished_reason="length",{base}', round(ep.length)),
            (f'finished_reason="abort",{base}', round(ep.aborted)),
            (f'finished_reason="error",{base}', round(ep.failed)),
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
    return "\n".join(lines) + "\n"


def _triton_text(ep: SimEndpoint, ts: datetime) -> str:
    s, stamp = ep.spec, _ms(ts)
    base = f'model="{s.name}",version="{s.version}"'
    lines: list[str] = []

    def metric(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {round(value)} {stamp}" for labels, value in samples)

    metric("nv_inference_request_success", "counter", [(base, ep.ok + ep.length)])
    metric(
        "nv_inference_request_failure",
        "counter",
        [
            (f'model="{s.name}",reason="BACKEND",version="{s.version}"', ep.failed),
            (f'model="{s.name}",reason="CANCELED",version="{s.version}"', ep.aborted),
        ],
    )
    metric("nv_inference_pending_request_count", "gauge", [(base, ep.waiting_shown)])
    e2e = ep.histograms["e2e"].total
    metric("nv_inference_request_duration_us", "counter", [(base, e2e * 1e6)])
    metric("nv_inference_queue_duration_us", "counter", [(base, ep.queue_s * 1e6)])
    metric("nv_inference_compute_infer_duration_us", "counter", [(base, ep.compute_s * 1e6)])
    return "\n".join(lines) + "\n"


def _text(response: Any) -> str:
    text = getattr(response, "text", None)
    if text is None:
        text = response.content.decode(errors="replace")
    return str(text)


# --- in-process set-up (the simulate command has the database) ----------------------------------


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


def start_for_command(
    poster: Poster,
    *,
    endpoints: int,
    seed: int,
    run: str,
    history_hours: float,
    now: datetime,
    log: Callable[[str], None],
) -> ServingSimulator:
    """The `simulate` command's serving simulator: its endpoints registered on the sites the
    poster has tokens for, and ``history_hours`` of history pushed (scrapes five minutes apart)
    unless a previous session's is already there."""
    from fleet.inventory.models import Site

    site_ids = dict(Site.objects.filter(name__in=poster.tokens).values_list("name", "pk"))
    specs = ENDPOINTS[:endpoints]
    ids = prepare_endpoints(site_ids, specs=specs)
    sim = ServingSimulator(
        TextPoster(poster), sites=sorted(site_ids), endpoint_ids=ids, seed=seed, specs=specs, run=run, log=log
    )
    start = history_start(ids, now=now, hours=history_hours) if history_hours > 0 else None
    if start is not None:
        log(f"pushing {(now - start).total_seconds() / 3600:.1f} h of serving history for {len(specs)} endpoints")
        sim.backfill(start, now, step=timedelta(minutes=5))
    return sim
