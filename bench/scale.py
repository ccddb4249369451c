"""A fleet of N GPUs on the console's own engines, simulated and measured (issue 27).

The console runs in production mode on services of its own (bench/soak_stack.Stack: a PostgreSQL
server and a Redis server on free ports, two uvicorn web processes, two Celery workers, beat), as
the soak runs it. Then:

1. **Register and seed.** One round of agent reports registers the fleet's nodes and GPUs (sites
   of 10,000 GPUs, nodes of 8). 24 h of rollups are then written by SQL, an hour a statement: the
   fleet's and each site's group rollups at 1 minute and 1 hour (what the overview and a site's
   page chart), and the probed GPUs' own minutes (what a GPU's page charts). Node and rack
   rollups come from the run itself. The database is then ANALYZEd, as autovacuum would have
   done by the time a fleet this size had grown.
2. **Load** for ``--minutes`` (``--short``: 3): every GPU reports every 10 s through the JSON door,
   one POST a node (the NVML agent's batch: 8 GPUs), spread evenly over the 10 s by ``--posters``
   threads over both web processes, each POST with an Idempotency-Key kept across retries (429,
   5xx and connection errors are retried, on the other process). Alongside:
   * probes, about one request a second each, from a process of their own (the load generator's
     threads share this one's GIL), with an Admin's session: the fleet overview over 24 h
     (``/api/v1/fleet/overview/?range=24h``), a site's (``&site=<id>``) and a GPU's page
     (``/fleet/gpus/<uuid>/``);
   * ``--clients`` websocket clients (signed in through the login form), each subscribed to the
     ``fleet`` topic and to the topic of the GPU table page its snapshot names: every row of a
     ``fleet.rows`` push is timed from its sample's ``ts`` (the posting moment) to its arrival;
   * every 5 s: the rollups' lag (the oldest minute waiting, less the minute itself, as
     ``fleet.telemetry.rollups.rollup_lag_seconds`` reads it) and the database's size.
3. **Drain.** The load stops; the bench waits until every acknowledged sample is stored (up to
   120 s). ``drain_s`` is how long that took: the age of the oldest unwritten batch when the load
   stopped, at most. The run keeps up when sent = stored, ``drain_s`` <= 30, the rollups' lag
   stayed within 2 minutes, and the agents and serving pushers never fell more than one interval
   behind their schedule (``posters_behind_s``: a console that answers slowly holds its agents
   back, and then stores all they sent at a lower rate).

The workloads, in proportion to the fleet: in each site the first 80 % of the nodes train and the
rest serve. Once the GPUs are registered (before the load), and through the load:

* **Training jobs**, one per 8 training nodes (a 64-GPU gang), each registered and reporting
  through the training API exactly as the training client does (POST /api/v1/training/jobs/,
  then batches to /api/v1/training/jobs/<id>/events, with the site's agent token). Their lives are
  fleet.training.simulator's (steps of 15-30 s at 49-53 % MFU, every node reporting its share of
  each step, checkpoints every few minutes, failures at Llama 3's rate restarted from the last
  checkpoint); only the placement is this bench's. A job registers as allocated 2 minutes before,
  and sends its start-up and first steps at once, so the load sees it stepping; then its events go
  in a batch every 30 s. Their GPUs' samples show what the job does (idle while it starts or
  restarts).
* **Serving endpoints**, one per inference node (8 GPUs), each pushing its vLLM server's
  Prometheus exposition (fleet.serving.simulator's queueing model and vLLM's metric names: TTFT,
  inter-token latency and end-to-end histograms, KV-cache usage, queue depth) to POST
  /api/v1/ingest/prometheus?endpoint=<name> every 15 s with the site's agent token.

Both run in threads of their own (``--workload-threads`` each), apart from the GPU posters, and are
retried as the agents are. Two more probes time the training overview
(``/api/v1/training/overview?range=24h``) and the serving overview (``/api/v1/serving/overview``).

Prints progress on stderr and ends with one line:
RESULT gpus=... samples_per_s=... sent=... stored=... lag_p99_s=... drain_s=... rollup_lag_max_s=...
overview_p95_ms=... site_p95_ms=... gpu_page_p95_ms=... ws_clients=... ws_p99_ms=... web_cpu=...
worker_cpu=... pg_cpu=... db_growth_mb_per_h=... jobs=... endpoints=... training_events_per_s=...
serving_samples_per_s=... training_p95_ms=... serving_p95_ms=... posters_behind_s=... keeps_up=yes|no
(``*_cpu``: cores used on average, summed over that component's processes; ``lag_p99_s``: a
batch's accept -> commit, from fleet_ingestbatch; ``training_events_per_s``: job events the
events door acknowledged (stored: its write is synchronous), ``serving_samples_per_s``: serving
samples the Prometheus door acknowledged, both over the load.) Every run judges correctness
(sent = stored for the GPU samples, every acknowledged job event stored, no 5xx answer and no
refused training or serving request) and exits non-zero when it fails; timings are printed, not
judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import multiprocessing
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import psycopg
import requests
import soak_stack
from _common import log, percentile
from soak_live import sign_in
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from fleet.serving.simulator import ENDPOINTS, SCRAPE_INTERVAL_S, ServingSimulator
from fleet.telemetry.simulator import H100, FleetSimulator, SimGpu
from fleet.training.simulator import JOB_KINDS, SimJob, TrainingSimulator

INGEST_PATH = "/api/v1/ingest/gpu-samples"
INTERVAL_S = 10.0
GPUS_PER_NODE = 8
GPUS_PER_SITE = 10_000
KEY_PREFIX = "scale-"
MODEL = "NVIDIA H100 80GB HBM3"
HBM_MIB = 81559
PROBED_GPUS = 20
PASSWORD = "scale-" + uuid.uuid4().hex
TRAINING_SHARE = 0.8  # of each site's nodes; the rest serve
JOB_NODES = 8  # a training job's gang: 64 GPUs
TRAINING_FLUSH_S = 30.0  # a job's events go in a batch this often
# The jobs were allocated this long before they register (their events since are sent then): their
# start-up (20-45 s, then 20-40 s loading the model) is behind them, and the load sees them stepping.
TRAINING_HEAD_START = timedelta(minutes=2)
# A job fails when any of its GPUs does: Llama 3's pre-training saw 419 unexpected interruptions in
# 54 days on 16,384 H100s (The Llama 3 Herd of Models, 3.3.4), about 2e-5 a GPU-hour. (The demo's
# simulator fails jobs 100 times as often, to show its detectors.)
FAILURE_RATE_PER_GPU_HOUR = 2e-5
# The simulator's vLLM servers (its Triton reranker is not a vLLM exposition), steady: no scripted incident.
SERVING_SPECS = tuple(replace(spec, scenario="steady") for spec in ENDPOINTS if spec.framework == "vllm")


@dataclass
class Node:
    site: str
    hostname: str
    uuids: list[str]
    energy_mj: list[int] = field(default_factory=lambda: [0] * GPUS_PER_NODE)


def build_fleet(gpus: int) -> tuple[list[str], list[Node]]:
    sites = [f"scale-{n + 1:02d}" for n in range(max(1, math.ceil(gpus / GPUS_PER_SITE)))]
    nodes = []
    for n in range(math.ceil(gpus / GPUS_PER_NODE)):
        site = sites[n * GPUS_PER_NODE // GPUS_PER_SITE]
        first = n * GPUS_PER_NODE
        uuids = [f"GPU-scale-{g:07d}" for g in range(first, min(gpus, first + GPUS_PER_NODE))]
        nodes.append(Node(site, f"{site}-n{n:05d}", uuids))
    return sites, nodes


def split_fleet(nodes: list[Node]) -> tuple[list[list[Node]], list[Node]]:
    """Each site's first TRAINING_SHARE of nodes in gangs of JOB_NODES (a site's last gang may be
    smaller), and the rest, each node an inference endpoint's."""
    by_site: dict[str, list[Node]] = {}
    for node in nodes:
        by_site.setdefault(node.site, []).append(node)
    gangs: list[list[Node]] = []
    serving: list[Node] = []
    for site_nodes in by_site.values():
        training = round(len(site_nodes) * TRAINING_SHARE)
        gangs += [site_nodes[i : min(training, i + JOB_NODES)] for i in range(0, training, JOB_NODES)]
        serving += site_nodes[training:]
    return gangs, serving


def node_body(node: Node, ts: datetime, overrides: dict[str, dict[str, float]] | None = None) -> bytes:
    """The node's GPUs' samples; a training job's GPUs show what the job does (``overrides``:
    fleet.telemetry.simulator.FleetSimulator.overrides, set by the training simulator)."""
    stamp = ts.isoformat()
    samples = []
    for index, gpu in enumerate(node.uuids):
        util = (overrides or {}).get(gpu, {}).get("gpu_util")
        power = round(random.uniform(330, 370), 1)
        node.energy_mj[index] += int(power * INTERVAL_S * 1000)
        used = random.randint(60000, 70000)
        samples.append(
            {
                "gpu_uuid": gpu,
                "hostname": node.hostname,
                "ts": stamp,
                "gpu_index": index,
                "model": MODEL,
                "gpu_util": round(random.uniform(70, 90), 1) if util is None else util,
                "fb_used_mib": used,
                "fb_free_mib": HBM_MIB - used,
                "gpu_temp_c": round(random.uniform(55, 65), 1),
                "power_w": power,
                "energy_mj": node.energy_mj[index],
                "xid": 0,
                "ecc_dbe_total": 0,
                "throttle_reasons": 0,
            }
        )
    return json.dumps({"samples": samples}).encode()


class Paced:
    """Items shared over threads, each item acted on once every ``interval`` seconds, spread evenly
    over it; ``behind_s``: how far a thread fell behind that schedule, at most."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.behind_s = 0.0
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self._behind_lock = threading.Lock()

    def start_paced(self, items: list[Any], threads: int, act: Callable[[Any], None]) -> None:
        for i in range(threads):
            share = items[i::threads]
            if share:
                t = threading.Thread(target=self._paced, args=(share, act), daemon=True)
                t.start()
                self.threads.append(t)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(60)

    def _paced(self, items: list[Any], act: Callable[[Any], None]) -> None:
        spacing = self.interval / len(items)
        next_at = time.monotonic() + random.uniform(0, spacing)
        for item in itertools.cycle(items):
            if self.stop_event.wait(max(0.0, next_at - time.monotonic())):
                return
            with self._behind_lock:
                self.behind_s = max(self.behind_s, time.monotonic() - next_at)
            act(item)
            next_at += spacing


class Agents(Paced):
    """Every node POSTs its GPUs' samples every INTERVAL_S, spread over the interval by
    ``posters`` threads; counts what was acknowledged."""

    def __init__(
        self,
        urls: list[str],
        tokens: dict[str, str],
        nodes: list[Node],
        posters: int,
        overrides: dict[str, dict[str, float]] | None = None,
    ) -> None:
        super().__init__(INTERVAL_S)
        self.urls, self.tokens, self.nodes, self.posters = urls, tokens, nodes, posters
        self.overrides = overrides
        self.statuses: Counter[int | str] = Counter()
        self.samples_acked = 0
        self.lock = threading.Lock()
        self.local = threading.local()  # a session per poster thread

    def one_round(self) -> None:
        """Every node once, as fast as the posters go (registration)."""
        chunks = [self.nodes[i :: self.posters] for i in range(self.posters)]
        threads = [threading.Thread(target=self._post_all, args=(c,)) for c in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _post_all(self, nodes: list[Node]) -> None:
        session = requests.Session()
        for node in nodes:
            self._post(session, node)

    def start(self) -> None:
        self.start_paced(self.nodes, self.posters, self._post_paced)

    def _post_paced(self, node: Node) -> None:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        self._post(self.local.session, node)

    def _post(self, session: requests.Session, node: Node) -> None:
        body = node_body(node, datetime.now(UTC), self.overrides)
        headers = {
            "Authorization": f"Bearer {self.tokens[node.site]}",
            "Content-Type": "application/json",
            "Idempotency-Key": f"{KEY_PREFIX}{uuid.uuid4().hex}",
        }
        for attempt in itertools.count():
            url = self.urls[(hash(node.hostname) + attempt) % len(self.urls)] + INGEST_PATH
            try:
                status: int | str = session.post(url, data=body, headers=headers, timeout=30).status_code
            except requests.RequestException:
                status = "conn_error"
            with self.lock:
                self.statuses[status] += 1
                if status == 202:
                    self.samples_acked += len(node.uuids)
                    return
            if isinstance(status, int) and status < 500 and status != 429:
                log(f"agents: {url} answered {status}")
                return
            if attempt >= 20:
                return
            time.sleep(min(2.0, 0.1 * 2**attempt))


class WorkloadPoster:
    """POSTs for the training and serving simulators with the site's agent token, retried as the
    agents' posts are (429, 5xx and connection errors, on the other process); counts the answers
    and what the door acknowledged (``acked(response)`` of a 2xx). A session per thread."""

    def __init__(self, urls: list[str], tokens: dict[str, str], acked: Callable[[requests.Response], int]) -> None:
        self.urls, self.tokens, self.acked_of = urls, tokens, acked
        self.statuses: Counter[int | str] = Counter()
        self.acked = 0
        self.refused: list[str] = []  # 4xx answers other than 429: a bug in the bench or the door
        self.lock = threading.Lock()
        self.local = threading.local()

    def send(self, site: str, url: str, body: dict[str, Any]) -> requests.Response | None:
        """JSON (fleet.training.simulator.Sender)."""
        return self.post(site, url, json.dumps(body).encode(), "application/json")

    def post(self, site: str, path: str, data: bytes, content_type: str) -> requests.Response | None:
        """The answer (2xx or a refusal), or None when every attempt failed."""
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = requests.Session()
        headers = {"Authorization": f"Bearer {self.tokens[site]}", "Content-Type": content_type}
        for attempt in range(21):
            url = self.urls[(hash(path) + attempt) % len(self.urls)] + path
            try:
                response = session.post(url, data=data, headers=headers, timeout=30)
            except requests.RequestException:
                with self.lock:
                    self.statuses["conn_error"] += 1
            else:
                code = response.status_code
                with self.lock:
                    self.statuses[code] += 1
                if code < 300:
                    acked = self.acked_of(response)
                    with self.lock:
                        self.acked += acked
                    return response
                if code < 500 and code != 429:
                    with self.lock:
                        self.refused.append(f"{path}: HTTP {code} {response.text[:300]}")
                    log(f"workloads: {url} answered {code}: {response.text[:300]}")
                    return response
            time.sleep(min(2.0, 0.1 * 2**attempt))
        return None


def events_acked(response: requests.Response) -> int:
    """Events a 2xx of the events door stored now or before (a retry); 0 for a registration."""
    if not response.request.path_url.endswith("/events"):
        return 0
    body = response.json()
    return int(body["written"]) + int(body["repeated"])


def serving_acked(response: requests.Response) -> int:
    return int(response.json().get("serving_samples", 0))


class ScaleJobs(TrainingSimulator):
    """fleet.training.simulator's jobs on this bench's gangs (``gangs``: the fleet's job number and
    the job's nodes, one site's). Everything but the placement is the simulator's: the kinds of job,
    the step lengths and MFU band, checkpoints, failures and restores, the events and their batches."""

    def __init__(
        self, fleet_sim: FleetSimulator, sender: WorkloadPoster, *, gangs: list[tuple[int, list[Node]]], seed: int
    ) -> None:
        self.gangs = gangs
        super().__init__(
            fleet_sim,
            sender,
            jobs=len(gangs),
            seed=seed,
            scenarios=False,
            failure_rate_per_gpu_hour=FAILURE_RATE_PER_GPU_HOUR,
            flush_interval_s=TRAINING_FLUSH_S,
            run="scale",
        )

    def _place(self, count: int, seed: int) -> list[SimJob]:
        """One job on each gang of nodes, sized as the simulator sizes its own (sized_job)."""
        jobs = []
        for offset, (n, gang) in enumerate(self.gangs):
            kind = JOB_KINDS[n % len(JOB_KINDS)]
            gpus = [SimGpu(u, node.hostname, i, H100, "training", 0) for node in gang for i, u in enumerate(node.uuids)]
            jobs.append(
                self.sized_job(
                    index=offset,
                    site=gang[0].site,
                    name=f"{kind.name}-{n + 1:05d}",
                    kind=kind,
                    scheduler_id=f"scale/job-{n + 1:05d}",
                    nodes=[node.hostname for node in gang],
                    gpus=gpus,
                )
            )
        return jobs


class Trainers:
    """The training jobs, ``threads`` simulators each ticking its share every second."""

    def __init__(self, poster: WorkloadPoster, gangs: list[list[Node]], threads: int) -> None:
        self.poster = poster
        # One holder of the GPUs' overrides for every simulator: the agents read it.
        self.fleet_sim = FleetSimulator({}, fault_rate_per_gpu_hour=0.0, interval=INTERVAL_S, seed=0)
        numbered = list(enumerate(gangs))
        shares = [numbered[i::threads] for i in range(threads)]
        self.sims = [
            ScaleJobs(self.fleet_sim, poster, gangs=share, seed=100 + i) for i, share in enumerate(shares) if share
        ]
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []

    @property
    def jobs(self) -> int:
        return sum(1 for sim in self.sims for job in sim.jobs if job.job_id is not None)

    def register(self) -> None:
        """Register every job, allocated TRAINING_HEAD_START ago, and send its events since then
        (its start-up, its first steps); then spread the jobs' batches over TRAINING_FLUSH_S."""
        allocated = datetime.now(UTC) - TRAINING_HEAD_START
        self._each_sim(lambda sim: sim.tick(allocated))
        now = datetime.now(UTC)
        self._each_sim(lambda sim: sim.tick(now))
        for sim in self.sims:
            for job in sim.jobs:
                job.sent_at = now - timedelta(seconds=random.uniform(0, TRAINING_FLUSH_S))

    def _each_sim(self, work: Callable[[ScaleJobs], None]) -> None:
        threads = [threading.Thread(target=work, args=(sim,)) for sim in self.sims]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def start(self) -> None:
        for sim in self.sims:
            t = threading.Thread(target=self._run, args=(sim,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(60)

    def _run(self, sim: ScaleJobs) -> None:
        while not self.stop_event.wait(1.0):
            sim.tick(datetime.now(UTC))


@dataclass
class Endpoint:
    name: str
    sim: ServingSimulator  # one endpoint's vLLM server (fleet.serving.simulator's model)


class Servers(Paced):
    """One vLLM endpoint per inference node, each pushing its exposition every SCRAPE_INTERVAL_S
    (to ``?endpoint=<name>``), spread over the interval by ``threads`` threads."""

    def __init__(self, poster: WorkloadPoster, nodes: list[Node], threads: int) -> None:
        super().__init__(SCRAPE_INTERVAL_S)
        self.poster, self.threads_wanted = poster, threads
        self.endpoints = []
        for n, node in enumerate(nodes):
            spec = replace(SERVING_SPECS[n % len(SERVING_SPECS)], site=node.site)
            # The simulator pushes when its tick says; here the threads keep the cadence (interval 0).
            sim = ServingSimulator(self, sites=[node.site], seed=n, scenarios=False, scrape_interval_s=0, specs=(spec,))
            self.endpoints.append(Endpoint(f"{node.site}-serve-{n + 1:05d}", sim))
        self.local = threading.local()

    # fleet.serving.simulator.ServingSender: the endpoint's name goes on the door's query.
    def send(self, site: str, url: str, body: dict[str, Any]) -> requests.Response | None:
        # Change events and evals are not this bench's load: with no endpoint ids the simulator
        # drops its (20-minutely) evals before sending them.
        return None

    def send_text(self, site: str, url: str, text: str) -> requests.Response | None:
        path = f"{url}?endpoint={quote(self.local.endpoint, safe='')}"
        return self.poster.post(site, path, text.encode(), "text/plain; version=0.0.4")

    def push(self, endpoint: Endpoint) -> None:
        self.local.endpoint = endpoint.name
        endpoint.sim.tick(datetime.now(UTC))

    def one_round(self) -> None:
        """Every endpoint once (its first push creates it)."""
        threads = [
            threading.Thread(target=lambda c=chunk: [self.push(e) for e in c])
            for chunk in (self.endpoints[i :: self.threads_wanted] for i in range(self.threads_wanted))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def start(self) -> None:
        self.start_paced(self.endpoints, self.threads_wanted, self.push)


class Probe(threading.Thread):
    """GETs ``path`` about once a second with the session's cookie; 2xx latencies in ms."""

    def __init__(self, urls: list[str], cookies: dict[str, str], path: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.cookies, self.path = urls, cookies, path
        self.ms: list[float] = []
        self.statuses: Counter[int | str] = Counter()
        self.stop_event = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        for n in itertools.count():
            if self.stop_event.wait(1.0):
                return
            base = self.urls[n % len(self.urls)]
            started = time.monotonic()
            try:
                response = session.get(base + self.path, headers={"Cookie": self.cookies[base]}, timeout=30)
                status: int | str = response.status_code
            except requests.RequestException:
                status = "conn_error"
            self.statuses[status] += 1
            if status == 200:
                self.ms.append((time.monotonic() - started) * 1000)


@dataclass
class ProbeResult:
    ms: list[float]
    statuses: Counter[int | str]


def _run_probes(urls: list[str], cookies: dict[str, str], paths: dict[str, str], conn: Any) -> None:
    """The probe process: one Probe thread a path until told to stop, then their timings back."""
    probes = {name: Probe(urls, cookies, path) for name, path in paths.items()}
    for p in probes.values():
        p.start()
    conn.recv()
    for p in probes.values():
        p.stop_event.set()
    for p in probes.values():
        p.join(timeout=35)
    conn.send({name: (p.ms, dict(p.statuses)) for name, p in probes.items()})


class Probes:
    """The probes in a process of their own. In this one, the load's sixty-odd threads (agents,
    trainers, serving pushers, the websocket clients' loop) share one GIL, and a probe whose
    answer had arrived waited its turn for it: its time was the bench's as much as the
    console's. A browser does not share a GIL with the load."""

    def __init__(self, urls: list[str], cookies: dict[str, str], paths: dict[str, str]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_run_probes, args=(urls, cookies, paths, child), daemon=True)

    def start(self) -> None:
        self.process.start()

    def stop(self) -> dict[str, ProbeResult]:
        self.conn.send("stop")
        got = self.conn.recv() if self.conn.poll(60) else {}
        self.process.join(timeout=10)
        return {name: ProbeResult(ms, Counter(statuses)) for name, (ms, statuses) in got.items()}


class Watchers(threading.Thread):
    """``clients`` websocket clients on the fleet topic and their table page's topic."""

    def __init__(self, urls: list[str], cookies: dict[str, str], clients: int) -> None:
        super().__init__(daemon=True)
        self.urls, self.cookies, self.clients = urls, cookies, clients
        self.row_ms: list[float] = []
        self.messages: Counter[str] = Counter()
        self.subscribed = 0
        self.recording = False
        self.stop_event = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        tasks = [asyncio.create_task(self._client(n)) for n in range(self.clients)]
        while not self.stop_event.is_set():
            await asyncio.sleep(0.5)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _client(self, n: int) -> None:
        base = self.urls[n % len(self.urls)]
        snapshot = await asyncio.to_thread(
            requests.get, base + "/api/v1/fleet/overview/", headers={"Cookie": self.cookies[base]}, timeout=60
        )
        topic = snapshot.json()["table"]["topic"]
        with contextlib.suppress(ConnectionClosed):
            async with connect(
                "ws" + base.removeprefix("http") + "/ws/live/",
                origin=base,  # type: ignore[arg-type]
                additional_headers={"Cookie": self.cookies[base]},
                max_size=None,
                open_timeout=60,
            ) as ws:
                await ws.send(json.dumps({"action": "subscribe", "topics": ["fleet", topic]}))
                self.subscribed += 1
                seen: dict[str, str] = {}  # GPU -> the sample ts its row last showed
                async for raw in ws:
                    received = time.time()
                    message = json.loads(raw)
                    kind = message.get("type", "?")
                    self.messages[kind] += 1
                    if kind != "fleet.rows":
                        continue
                    for row in message.get("gpus", []):
                        # A sample's first arrival at this client (not the page's first push,
                        # which shows samples that came before it subscribed).
                        ts, before = row.get("ts"), seen.get(row["uuid"])
                        seen[row["uuid"]] = ts
                        if self.recording and ts and before is not None and ts != before:
                            self.row_ms.append((received - datetime.fromisoformat(ts).timestamp()) * 1000)


def wait_for_gpus(stack: soak_stack.Stack, gpus: int, timeout: float = 300) -> None:
    """Until the first round's samples have registered every GPU."""
    deadline = time.monotonic() + timeout
    while (found := stack.sql("SELECT count(*) FROM fleet_gpu")[0][0]) < gpus:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {found:,} of {gpus:,} GPUs registered after {timeout:.0f} s")
        time.sleep(1)


def cpu_seconds(stack: soak_stack.Stack, names: list[str]) -> float:
    total = 0.0
    for name in names:
        for proc in stack.tree(name):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


def postgres_cpu(stack: soak_stack.Stack) -> float:
    pid = int((stack.pgdata / "postmaster.pid").read_text().split()[0])
    master = psutil.Process(pid)
    t = master.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in master.children():
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def seed_rollups(stack: soak_stack.Stack, probed: list[str]) -> None:
    """24 h of the fleet's and each site's group rollups (1 min and 1 h) and the probed GPUs' own
    minutes, by SQL an hour a statement, from the GPUs registered (see the module docstring)."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    start = now - timedelta(hours=24)
    stack.manage("shell", "-c", SEED.replace("@START@", start.isoformat()).replace("@PROBED@", json.dumps(probed)))


SEED = """
from datetime import datetime, timedelta
from django.db import connection
from fleet.telemetry import partitions
start = datetime.fromisoformat("@START@")
for table in (partitions.GROUP_ROLLUP_1M, partitions.GPU_ROLLUP_1M, partitions.GROUP_ROLLUP_1H):
    partitions.ensure_partitions(table, start - timedelta(hours=1), start + timedelta(hours=25))
with connection.cursor() as c:
    c.execute("SELECT id FROM fleet_site")
    scopes = [("fleet", 0, "TRUE")] + [("site", s, f"n.site_id = {s}") for (s,) in c.fetchall()]
    for scope, scope_id, where in scopes:
        c.execute(f"SELECT count(*) FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id WHERE {where}")
        gpus = c.fetchone()[0]
        for h in range(24):
            c.execute(
                "INSERT INTO fleet_grouprollup_1m (scope, scope_id, bucket, gpus, util_mean, util_max, temp_mean,"
                " temp_max, power_mean, power_sum, energy_j, error_gpus, throttled_gpus)"
                " SELECT %s, %s, b, %s, 80, 90, 60, 65, 350, 350.0 * %s, 350.0 * 60 * %s, 0, 0"
                " FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute', interval '1 minute') b"
                " ON CONFLICT DO NOTHING",
                [scope, scope_id, gpus, gpus, gpus, start + timedelta(hours=h), start + timedelta(hours=h + 1)],
            )
        c.execute(
            "INSERT INTO fleet_grouprollup_1h (scope, scope_id, bucket, gpus, util_mean, util_max, temp_mean,"
            " temp_max, power_mean, power_sum, energy_j, error_gpus, throttled_gpus)"
            " SELECT %s, %s, b, %s, 80, 90, 60, 65, 350, 350.0 * %s, 350.0 * 3600 * %s, 0, 0"
            " FROM generate_series(date_trunc('hour', %s::timestamptz), %s::timestamptz + interval '23 hours',"
            " interval '1 hour') b ON CONFLICT DO NOTHING",
            [scope, scope_id, gpus, gpus, gpus, start, start],
        )
    c.execute(
        "INSERT INTO fleet_gpurollup_1m (gpu_id, bucket, samples, util_mean, util_max, temp_mean, temp_max,"
        " power_mean, power_max, energy_j, xid_max, error_samples, throttled_samples)"
        " SELECT g.id, b, 6, 80, 90, 60, 65, 350, 370, 21000, 0, 0, 0 FROM fleet_gpu g,"
        " generate_series(%s::timestamptz, %s::timestamptz + interval '1439 minutes', interval '1 minute') b"
        " WHERE g.uuid = ANY(%s) ON CONFLICT DO NOTHING",
        [start, start, @PROBED@],
    )
print("SEEDED")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=100_000, help="GPUs in the fleet (default 100,000)")
    parser.add_argument("--minutes", type=float, default=15, help="minutes of load (default 15)")
    parser.add_argument("--short", action="store_true", help="3 minutes; correctness judged (CI)")
    parser.add_argument("--posters", type=int, default=16, help="agent threads (default 16)")
    parser.add_argument("--clients", type=int, default=50, help="websocket clients (default 50)")
    parser.add_argument(
        "--workload-threads",
        type=int,
        default=8,
        help="threads for the training jobs, and for the endpoints (default 8)",
    )
    parser.add_argument("--keep", action="store_true", help="leave the stack's directory behind")
    args = parser.parse_args()
    if args.short:
        args.minutes = 3
    sites, nodes = build_fleet(args.gpus)
    workdir = Path(tempfile.mkdtemp(prefix="goodput-scale-"))
    stack = soak_stack.Stack(workdir, env={"GOODPUT_WS_MAX_PER_USER": "1000"})
    try:
        return run(args, stack, sites, nodes)
    finally:
        stack.shutdown()
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, stack: soak_stack.Stack, sites: list[str], nodes: list[Node]) -> int:
    stack.start()
    boot = soak_stack.bootstrap(stack, sites, PASSWORD)
    tokens = boot["agents"]
    urls = stack.web_urls
    gangs, serving_nodes = split_fleet(nodes)
    training_poster = WorkloadPoster(urls, tokens, events_acked)
    serving_poster = WorkloadPoster(urls, tokens, serving_acked)
    trainers = Trainers(training_poster, gangs, args.workload_threads)
    servers = Servers(serving_poster, serving_nodes, args.workload_threads)
    agents = Agents(urls, tokens, nodes, args.posters, trainers.fleet_sim.overrides)
    started = time.monotonic()
    agents.one_round()
    took = time.monotonic() - started
    log(f"registered {args.gpus:,} GPUs on {len(nodes):,} nodes in {len(sites)} site(s) in {took:.0f} s")
    # A job names its GPUs: they must be stored (the posts above are queued) before it registers.
    wait_for_gpus(stack, args.gpus)
    started = time.monotonic()
    trainers.register()
    servers.one_round()
    log(
        f"registered {trainers.jobs:,} training jobs and pushed {len(servers.endpoints):,} endpoints' first "
        f"scrapes in {time.monotonic() - started:.0f} s"
    )
    probed = [u for n in nodes[:: max(1, len(nodes) // PROBED_GPUS)] for u in n.uuids[:1]][:PROBED_GPUS]
    seed_rollups(stack, probed)
    # The fleet appeared in seconds, not over months: give the planner the statistics autovacuum
    # would have gathered by now (with none, it joins GPUs to their states one node at a time).
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    site_id = stack.sql("SELECT id FROM fleet_site WHERE name = %s", [sites[0]])[0][0]
    cookies = {base: sign_in(base, "soak", PASSWORD) for base in urls}
    prober = Probes(
        urls,
        cookies,
        {
            "overview": "/api/v1/fleet/overview/?range=24h",
            "site": f"/api/v1/fleet/overview/?range=24h&site={site_id}",
            "gpu_page": f"/fleet/gpus/{random.choice(probed)}/",
            "training": "/api/v1/training/overview?range=24h",
            "serving": "/api/v1/serving/overview",
        },
    )
    watchers = Watchers(urls, cookies, args.clients)
    watchers.start()
    sent_before = agents.samples_acked
    events_before, serving_before = training_poster.acked, serving_poster.acked
    db_before = stack.sql("SELECT pg_database_size(current_database())")[0][0]
    cpu_before = {
        "web": cpu_seconds(stack, stack.web_names()),
        "worker": cpu_seconds(stack, [*stack.worker_names(), "beat"]),
        "pg": postgres_cpu(stack),
    }
    load_started = time.monotonic()
    started_at = datetime.now(UTC)
    agents.start()
    trainers.start()
    servers.start()
    prober.start()
    time.sleep(min(20.0, args.minutes * 60 / 6))  # warm-up: the first pushes, the clients' sockets
    watchers.recording = True
    rollup_lags: list[float] = []
    deadline = load_started + args.minutes * 60
    while time.monotonic() < deadline:
        time.sleep(5)
        lag = stack.sql(
            "SELECT coalesce(extract(epoch FROM now() - min(bucket)) - 60, 0) FROM fleet_rollupdirty "
            "WHERE resolution = '1m'"
        )[0][0]
        rollup_lags.append(max(0.0, float(lag)))
        log(
            f"  {time.monotonic() - load_started:5.0f} s: {agents.samples_acked - sent_before:,} samples acknowledged, "
            f"posters behind {agents.behind_s:.1f} s, {training_poster.acked - events_before:,} job events, "
            f"{serving_poster.acked - serving_before:,} serving samples (pushers behind {servers.behind_s:.1f} s), "
            f"rollup lag {rollup_lags[-1]:.0f} s, "
            f"{watchers.subscribed} client(s), {len(watchers.row_ms):,} rows timed"
        )
    agents.stop()
    trainers.stop()
    servers.stop()
    load_s = time.monotonic() - load_started
    watchers.recording = False
    probes = prober.stop()
    cpu = {
        "web": cpu_seconds(stack, stack.web_names()) - cpu_before["web"],
        "worker": cpu_seconds(stack, [*stack.worker_names(), "beat"]) - cpu_before["worker"],
        "pg": postgres_cpu(stack) - cpu_before["pg"],
    }
    sent = agents.samples_acked
    drain_started = time.monotonic()
    stored = 0
    while time.monotonic() - drain_started < 120:
        stored = stack.sql(
            "SELECT coalesce(sum(samples), 0) FROM fleet_ingestbatch WHERE key LIKE %s", [f"%{KEY_PREFIX}%"]
        )[0][0]
        if stored >= sent:
            break
        time.sleep(1)
    drain_s = time.monotonic() - drain_started
    rows = stack.sql("SELECT count(*) FROM fleet_gpusample WHERE ts >= %s", [started_at - timedelta(minutes=5)])[0][0]
    lag_p99 = stack.sql(
        "SELECT coalesce(percentile_cont(0.99) WITHIN GROUP"
        " (ORDER BY extract(epoch FROM received_at - enqueued_at)), 0)"
        " FROM fleet_ingestbatch WHERE key LIKE %s AND enqueued_at >= %s",
        [f"%{KEY_PREFIX}%", started_at],
    )[0][0]
    db_after = stack.sql("SELECT pg_database_size(current_database())")[0][0]
    # The events door writes before it answers: every event it acknowledged is stored.
    events_stored = stack.sql("SELECT count(*) FROM fleet_jobevent")[0][0]
    watchers.stop_event.set()
    errors_5xx = sum(n for s, n in agents.statuses.items() if isinstance(s, int) and s >= 500)
    errors_5xx += sum(n for p in probes.values() for s, n in p.statuses.items() if isinstance(s, int) and s >= 500)
    for poster in (training_poster, serving_poster):
        errors_5xx += sum(n for s, n in poster.statuses.items() if isinstance(s, int) and s >= 500)
    refused = training_poster.refused + serving_poster.refused
    rollup_max = max(rollup_lags or [0.0])
    # Keeping up also means reporting on schedule: agents and pushers that fell more than one
    # interval behind were held back by the console, whatever it then stored.
    on_schedule = agents.behind_s <= INTERVAL_S and servers.behind_s <= INTERVAL_S
    keeps_up = stored == sent and drain_s <= 30 and rollup_max <= 120 and on_schedule
    p95 = {name: percentile(p.ms, 95) if p.ms else float("nan") for name, p in probes.items()}
    ws_p99 = percentile(watchers.row_ms, 99) if watchers.row_ms else float("nan")
    log(
        f"statuses: agents {dict(agents.statuses)}; training {dict(training_poster.statuses)}; "
        f"serving {dict(serving_poster.statuses)}; probes "
        + ", ".join(f"{n} {dict(p.statuses)}" for n, p in probes.items())
        + f"; messages {dict(watchers.messages)}; rows in fleet_gpusample since the start {rows:,}; "
        f"job events acknowledged {training_poster.acked:,}, stored {events_stored:,}"
    )
    print(
        f"RESULT gpus={args.gpus} samples_per_s={(sent - sent_before) / load_s:.0f} sent={sent} stored={stored} "
        f"lag_p99_s={float(lag_p99):.1f} drain_s={drain_s:.1f} rollup_lag_max_s={rollup_max:.0f} "
        f"overview_p95_ms={p95['overview']:.0f} site_p95_ms={p95['site']:.0f} gpu_page_p95_ms={p95['gpu_page']:.0f} "
        f"ws_clients={watchers.subscribed} ws_p99_ms={ws_p99:.0f} web_cpu={cpu['web'] / load_s:.2f} "
        f"worker_cpu={cpu['worker'] / load_s:.2f} pg_cpu={cpu['pg'] / load_s:.2f} "
        f"db_growth_mb_per_h={(db_after - db_before) / 2**20 / load_s * 3600:.0f} "
        f"jobs={trainers.jobs} endpoints={len(servers.endpoints)} "
        f"training_events_per_s={(training_poster.acked - events_before) / load_s:.1f} "
        f"serving_samples_per_s={(serving_poster.acked - serving_before) / load_s:.0f} "
        f"training_p95_ms={p95['training']:.0f} serving_p95_ms={p95['serving']:.0f} "
        f"posters_behind_s={agents.behind_s:.1f} keeps_up={'yes' if keeps_up else 'no'}"
    )
    workloads_ok = (
        trainers.jobs == len(gangs)
        and events_stored >= training_poster.acked
        and (training_poster.acked > events_before or not gangs)
        and (serving_poster.acked > serving_before or not serving_nodes)
    )
    if stored != sent or errors_5xx or refused or not workloads_ok:
        log(
            f"FAILED: sent {sent:,}, stored {stored:,}, {errors_5xx} 5xx answer(s), {len(refused)} training or "
            f"serving request(s) refused, {trainers.jobs}/{len(gangs)} jobs registered, job events acknowledged "
            f"{training_poster.acked:,} (during the load {training_poster.acked - events_before:,}), stored "
            f"{events_stored:,}, serving samples during the load {serving_poster.acked - serving_before:,}"
        )
        for line in refused[:5]:
            log(f"  refused: {line}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
