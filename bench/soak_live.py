"""The soak's live phases: websocket delivery latency under fleet load, and a rolling restart.

What runs (all against a ``soak_stack.Stack``: two uvicorn web processes, channels-redis, Celery):

* ``FleetLoad``: ``gpus`` GPUs (8 per host, hosts dealt over the sites whose agent tokens it is
  given) each report every 10 s through the JSON door ``POST /api/v1/ingest/gpu-samples``, in
  batches of up to 100 GPUs of one site, spread evenly over the 10 s (1,000 GPUs: a batch a
  second), alternating the web URLs. A sample's ``ts`` is the moment of posting. Each batch has
  one Idempotency-Key, kept across retries; 5xx, 429 and connection errors are retried on the next
  URL. Values are healthy (60 °C, 350 W, no XID, ECC or throttling) so no detector fires.
* ``LiveClients``: ``clients`` websocket clients in one asyncio loop, dealt evenly over the web
  URLs, signed in through the real login form (a session per web URL, shared by its clients), each
  subscribed to every page topic (fleet, incidents, training, serving, power). They reconnect as
  static/js/live.js does: after a socket that was open closes, wait a random 0-1 s, then connect
  (to the next web URL, as a load balancer would send them; failures back off), subscribe, and
  once subscribed fetch the fleet page's snapshot (``/api/v1/fleet/overview/?range=1h``) to check
  it (below). The first
  connection fetches no snapshot: only a reconnect can have missed anything.
* ``ApiProbe`` (bench/soak_sources.py): the dashboard APIs the pages read, over both web URLs,
  about 2 requests a second, with the personal token (or, given only agent tokens, the session).

Latency: per GPU row, not per message. A ``fleet.delta`` carries the GPU rows updated since the
previous push (rows the previous push's overlap window already carried are left out, but a row
can still come twice across pushes), and timing a re-sent row, or only a message's newest row,
would misstate when each sample arrived. So each client times every row of a FleetLoad GPU the first time it sees that
GPU at that ``ts``: receive wall time - ``ts`` (the posting moment; one clock, one machine). That
is the ingest -> page latency of each sample. The newest row per message is kept as well
(``msg_p99_ms``), and the message's own ``ts`` (stamped by the builder after reading the rows)
splits each message's latency into ``ts -> built`` (HTTP, queue, writer, the push's coalescing
wait) and ``built -> received`` (totals and site queries, channels-redis, the web process's send,
the client). Only the ``seconds`` after a 20 s warm-up count.

Rolling restart (issue item 5): each web process in turn is SIGTERMed (``Stack.stop`` with the
web grace; the seconds taken must be within it), started again, and served before the next. Per
client the gap is socket closed -> ``subscribed`` on the new socket (reported beside it: closed ->
the new socket open, and closed -> its first push). Every reconnect's snapshot
must hold, for each GPU, a ``ts`` no older than the newest the client saw before its socket
closed, and the 1 h chart series must have no missing minute bucket since the restart began; at
the end the series must hold every minute of the restart window (``snapshot_gaps`` counts the
failures). ``dropped`` counts clients not subscribed again within 30 s of the last restart. It
passes when no client is dropped, no snapshot has a gap and every stop is within the grace;
``within_gap_target`` says whether every client was back within 5 s (GAP_TARGET_MS; bench/soak.py
judges it in the full soak and notes it in ``--short``); ``told_to_move`` counts the closes with 1012
("service restart"), which the stopping process sends spread over its drain (console/drain.py).
Then one Celery worker is SIGTERMed under load and started again (``worker_stop``).

``tokens`` is bootstrap()'s answer or its agent tokens alone ({site: token}). ``run_live_load`` and
``rolling_restart`` start their own load and clients, or run under a started ``LiveLoad``
(``live=``), which they leave running. Each returns a dict whose ``result`` is the RESULT line it
printed, with the breakdown beside it.

Run alone: ``.venv/bin/python bench/soak_live.py [--clients 200 --seconds 120 --gpus 1000]``
builds a stack in a temporary directory, runs both phases, prints RESULT lines and shuts the
stack down however it ends. The client runs on the same machine as the stack: its CPU (JSON
decoding of every delta for every client) is reported, since it competes with the servers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from array import array
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psutil
import psycopg
import requests
import soak_stack
from _common import log, percentile
from soak_sources import ApiProbe
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

INGEST_PATH = "/api/v1/ingest/gpu-samples"
REPORT_INTERVAL_S = 10.0
GPUS_PER_HOST = 8
BATCH_GPUS = 100
MODEL = "NVIDIA H100 80GB HBM3"
HBM_MIB = 81559
UUID_PREFIX = "GPU-soaklive-"  # the GPUs FleetLoad reports; the clients time only these
KEY_PREFIX = "soaklive-"  # Idempotency-Keys, to find FleetLoad's batches in fleet_ingestbatch

TOPICS = ["fleet", "incidents", "training", "serving", "power"]  # every page topic (console/live.py)
# What the fleet page re-fetches (range: 1 h chart), showing a table page of FleetLoad's GPUs: the
# page's own topic (the snapshot's table.topic) carries those rows; the fleet topic carries none.
SNAPSHOT_PATH = "/api/v1/fleet/overview/?range=1h&q=soaklive&size=200"
API_PATHS = [
    SNAPSHOT_PATH,
    "/api/v1/incidents/?limit=500&ordering=-detected_at",
    "/api/v1/power/",
    "/api/v1/serving/overview",
    "/api/v1/training/overview?range=24h",
]
API_RATE = 2.0  # requests a second, over all paths and web URLs
WARMUP_S = 20.0
# static/js/live.js: a socket that was open reconnects after random 0-1 s; only repeated failures
# back off, min(10 s, 500 ms x 2^attempt) x (0.75 + random / 2).
RECONNECT_MAX_MS = 1000  # the page's longest wait before its first try
GAP_TARGET_MS = 5000.0  # issue 27: no client is away longer than this in a rolling restart
SERVICE_RESTART = 1012  # the close code of a stopping web process (console/drain.py)
BACK_WITHIN_S = 30.0  # a client not subscribed again this long after the last restart is dropped
P99_TARGET_MS = 1000.0


def page_delay(attempt: int) -> float:
    """static/js/live.js's reconnect delay in seconds (``attempt`` resets once a socket is subscribed)."""
    if attempt == 0:
        return random.random() * RECONNECT_MAX_MS / 1000
    return min(10.0, 0.5 * 2**attempt) * (0.75 + random.random() / 2)


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# --- the fleet ---------------------------------------------------------------------------------


@dataclass
class FakeGpu:
    uuid: str
    hostname: str
    index: int
    energy_mj: int = 0


class FleetLoad(threading.Thread):
    """``gpus`` GPUs reporting every ``interval`` s through the JSON ingest door (see the module
    docstring). ``start()``, ``stop()``, and counters: ``statuses`` (HTTP status or "conn_error"
    -> count, retries included), ``batches_acked``, ``samples_acked``, ``retries``, ``abandoned``
    (batches given up on at stop), ``last_acked_ts`` (GPU UUID -> newest acknowledged ts) and
    ``post_ms`` (latency of each acknowledged POST)."""

    def __init__(
        self,
        web_urls: list[str],
        agent_tokens: dict[str, str],
        *,
        gpus: int = 1000,
        interval: float = REPORT_INTERVAL_S,
        batch_gpus: int = BATCH_GPUS,
    ) -> None:
        super().__init__(name="fleet-load", daemon=True)
        self.urls = list(web_urls)
        self.interval = interval
        self.tokens = agent_tokens
        sites = sorted(agent_tokens)
        by_site: dict[str, list[FakeGpu]] = {s: [] for s in sites}
        for n in range(gpus):
            host = n // GPUS_PER_HOST
            site = sites[host % len(sites)]
            hostname = f"soaklive-{re.sub(r'[^A-Za-z0-9-]', '-', site)}-n{host:04d}"
            by_site[site].append(FakeGpu(f"{UUID_PREFIX}{n:06d}", hostname, n % GPUS_PER_HOST))
        # Batches of one site's GPUs (a token writes its own site only), interleaved across sites.
        per_site = [
            [(site, gpus_[i : i + batch_gpus]) for i in range(0, len(gpus_), batch_gpus)]
            for site, gpus_ in by_site.items()
        ]
        self.batches = [b for group in itertools.zip_longest(*per_site) for b in group if b]
        self.gpu_uuids = frozenset(g.uuid for gpus_ in by_site.values() for g in gpus_)
        self.statuses: Counter[int | str] = Counter()
        self.batches_acked = 0
        self.samples_acked = 0
        self.retries = 0
        self.abandoned = 0
        self.last_acked_ts: dict[str, datetime] = {}
        self.post_ms = array("d")
        self.lock = threading.Lock()
        self._turn = itertools.count()
        self._stop_event = threading.Event()
        self._http = requests.Session()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    def run(self) -> None:
        spacing = self.interval / len(self.batches)
        next_at = time.monotonic()
        for site, gpus in itertools.cycle(self.batches):
            if self._stop_event.wait(max(0.0, next_at - time.monotonic())):
                return
            self._post(site, gpus)
            next_at += spacing
            # Far behind (the console stalled): carry on from now rather than burst to catch up.
            next_at = max(next_at, time.monotonic() - self.interval)

    def _samples(self, gpus: list[FakeGpu], ts: datetime) -> list[dict[str, Any]]:
        stamp = ts.isoformat()
        samples = []
        for g in gpus:
            power = round(random.uniform(330, 370), 1)
            g.energy_mj += int(power * self.interval * 1000)
            used = random.randint(60000, 70000)
            samples.append(
                {
                    "gpu_uuid": g.uuid,
                    "hostname": g.hostname,
                    "ts": stamp,
                    "gpu_index": g.index,
                    "model": MODEL,
                    "gpu_util": round(random.uniform(70, 90), 1),
                    "mem_copy_util": round(random.uniform(20, 40), 1),
                    "fb_used_mib": used,
                    "fb_free_mib": HBM_MIB - used,
                    "gpu_temp_c": round(random.uniform(55, 65), 1),
                    "memory_temp_c": round(random.uniform(60, 68), 1),
                    "power_w": power,
                    "sm_clock_mhz": 1980,
                    "mem_clock_mhz": 2619,
                    "energy_mj": g.energy_mj,
                    "xid": 0,
                    "ecc_sbe_total": 0,
                    "ecc_dbe_total": 0,
                    "remapped_rows_uncorrectable": 0,
                    "remapped_rows_correctable": 0,
                    "row_remap_failure": 0,
                    "pcie_replay_total": 0,
                    "nvlink_crc_errors_total": 0,
                    "throttle_reasons": 0,
                    "tensor_active": 0.45,
                    "sm_active": 0.8,
                }
            )
        return samples

    def _post(self, site: str, gpus: list[FakeGpu]) -> None:
        """One batch, retried on the next URL until acknowledged (or the load stops)."""
        ts = datetime.now(UTC)
        body = json.dumps({"samples": self._samples(gpus, ts)})
        headers = {
            "Authorization": f"Bearer {self.tokens[site]}",
            "Content-Type": "application/json",
            "Idempotency-Key": f"{KEY_PREFIX}{uuid.uuid4().hex}",
        }
        for attempt in itertools.count():
            if attempt and self._stop_event.is_set():
                with self.lock:
                    self.abandoned += 1
                return
            url = self.urls[next(self._turn) % len(self.urls)] + INGEST_PATH
            started = time.monotonic()
            try:
                response = self._http.post(url, data=body, headers=headers, timeout=15)
                status: int | str = response.status_code
            except requests.RequestException:
                status = "conn_error"
            with self.lock:
                self.statuses[status] += 1
                if status == 202:
                    self.post_ms.append((time.monotonic() - started) * 1000)
                    self.batches_acked += 1
                    self.samples_acked += len(gpus)
                    for g in gpus:
                        self.last_acked_ts[g.uuid] = ts
                    return
                self.retries += 1
            if isinstance(status, int) and status < 500 and status != 429:
                log(f"fleet load: {url} answered {status}: {response.text[:300]}")
                return  # the batch itself is wrong: a retry would be refused again
            retry_after = response.headers.get("Retry-After") if status != "conn_error" else None
            self._stop_event.wait(float(retry_after) if retry_after else min(2.0, 0.1 * 2**attempt))


# --- signing in ----------------------------------------------------------------------------------


def sign_in(base: str, username: str, password: str) -> str:
    """Sign in through the login form; the Cookie header a browser would then send.

    The stack runs in production mode, so its cookies are Secure and requests would not send them
    back over plain HTTP: they are carried by hand, as a TLS-terminating proxy would pass them.
    """
    page = requests.get(base + "/accounts/login/", timeout=30)
    page.raise_for_status()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    if match is None:
        raise RuntimeError(f"no CSRF token on {base}/accounts/login/")
    cookies = dict(page.cookies)
    response = requests.post(
        base + "/accounts/login/",
        data={"csrfmiddlewaretoken": match.group(1), "username": username, "password": password, "next": "/"},
        headers={"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()), "Referer": base + "/accounts/login/"},
        allow_redirects=False,
        timeout=30,
    )
    if response.status_code != 302:
        raise RuntimeError(f"signing in at {base} answered {response.status_code}: {response.text[:300]}")
    cookies.update(dict(response.cookies))
    return "; ".join(f"{k}={v}" for k, v in cookies.items())


# --- the websocket clients ---------------------------------------------------------------------


class _Row(msgspec.Struct):
    uuid: str = ""
    ts: str = ""


class _FleetDelta(msgspec.Struct):
    """The parts of a message the clients read (other fields are skipped while decoding)."""

    type: str = ""
    ts: str | None = None
    gpus: list[_Row] | None = None


class _Typed(msgspec.Struct):
    type: str = ""


_decode_delta = msgspec.json.Decoder(_FleetDelta).decode
_decode_typed = msgspec.json.Decoder(_Typed).decode


@dataclass
class ClientState:
    number: int
    url_index: int
    connected: bool = False
    subscribed: bool = False
    seen: dict[str, float] = field(default_factory=dict)  # GPU UUID -> newest ts received (epoch)
    messages: int = 0
    window_messages: int = 0
    window_disconnects: int = 0
    disconnects: int = 0
    connect_failures: int = 0
    closed_at: float | None = None  # the socket closed, not yet subscribed again
    gaps_ms: list[float] = field(default_factory=list)  # socket closed -> subscribed again
    open_gaps_ms: list[float] = field(default_factory=list)  # socket closed -> the new one open
    data_gaps_ms: list[float] = field(default_factory=list)  # socket closed -> a push on the new one
    data_pending_since: float | None = None
    ws: ClientConnection | None = None  # the open socket
    close_codes: Counter[int | None] = field(default_factory=Counter)  # how its sockets were closed
    snapshot_due: tuple[str, dict[str, float]] | None = None  # a reconnect's check, once subscribed


class LiveClients(threading.Thread):
    """``clients`` websocket clients on their own event loop (see the module docstring)."""

    def __init__(
        self, web_urls: list[str], cookies: dict[str, str], gpu_uuids: frozenset[str], *, sites: set[str], clients: int
    ) -> None:
        super().__init__(name="live-clients", daemon=True)
        self.urls = list(web_urls)
        self.cookies = cookies
        self.gpu_uuids = gpu_uuids
        self.sites = sites
        self.clients = [ClientState(n, n % len(self.urls)) for n in range(clients)]
        self.types: Counter[str] = Counter()
        self.type_bytes: Counter[str] = Counter()
        self.recording = False
        self.row_lat = array("d")  # seconds, each FleetLoad sample's first arrival at each client
        self.msg_lat = array("d")  # seconds, per fleet.delta: received - its newest FleetLoad row
        self.built_lag = array("d")  # per fleet.delta: message ts - its newest row ts
        self.deliver_lag = array("d")  # per fleet.delta: received - message ts
        self.series_since: float | None = None  # check the chart series from here (a restart)
        self.snapshot_checks: list[dict[str, Any]] = []
        self.snapshots_pending = 0
        self._tasks: set[asyncio.Task[None]] = set()  # snapshot checks in flight (kept referenced)
        self._stamps: dict[str, float] = {}  # ISO ts -> epoch, shared: every client gets the same rows
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._closing = False
        self._ready = threading.Event()
        # A thread per client: each page's fetch is in flight at once, as browsers send them.
        self._http = ThreadPoolExecutor(clients, thread_name_prefix="snapshot")
        # The table page the clients show (SNAPSHOT_PATH's): its topic, named by the server.
        base = self.urls[0]
        snapshot = requests.get(base + SNAPSHOT_PATH, headers={"Cookie": cookies[base]}, timeout=60)
        snapshot.raise_for_status()
        self.view_topics = [snapshot.json()["table"]["topic"]]

    # --- control, from other threads ---

    def start_and_wait(self, timeout: float = 180) -> None:
        """Start the clients; return once every one of them is subscribed."""
        self.start()
        self._ready.wait(30)
        self.wait_subscribed(timeout)

    def wait_subscribed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(c.subscribed for c in self.clients):
                return True
            time.sleep(0.1)
        return False

    def begin_window(self) -> None:
        for c in self.clients:
            c.window_messages = c.window_disconnects = 0
        for samples in (self.row_lat, self.msg_lat, self.built_lag, self.deliver_lag):
            del samples[:]
        self.recording = True

    def end_window(self) -> None:
        self.recording = False

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self.join(30)
        self._http.shutdown(wait=False, cancel_futures=True)

    # --- the loop ---

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._ready.set()
        tasks = []
        for client in self.clients:  # a little apart, as pages open: not 200 handshakes at once
            tasks.append(asyncio.create_task(self._client(client)))
            await asyncio.sleep(0.01)
        await self._stopping.wait()
        # Close every socket with a close frame, as a page being left does. A client cancelled
        # mid-read would leave its socket open and unread until the process exits; the server
        # then keeps writing to it, and its graceful stop waits on that socket's full buffer.
        self._closing = True
        sockets = [c.ws for c in self.clients if c.ws is not None]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True), 15)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _client(self, c: ClientState) -> None:
        attempt = 0
        while not self._closing:
            base = self.urls[c.url_index]
            try:
                ws = await connect(
                    "ws" + base.removeprefix("http") + "/ws/live/",
                    origin=base,  # type: ignore[arg-type]
                    additional_headers={"Cookie": self.cookies[base]},
                    max_size=None,
                    open_timeout=30,
                )
            except (OSError, InvalidHandshake, TimeoutError):
                c.connect_failures += 1
                c.url_index = (c.url_index + 1) % len(self.urls)
                await asyncio.sleep(page_delay(attempt))
                attempt += 1
                continue
            attempt = 0
            if c.closed_at is not None:
                c.open_gaps_ms.append((time.time() - c.closed_at) * 1000)
                c.data_pending_since = c.closed_at
            c.ws = ws
            await self._follow(c, base, ws)
            c.ws = None
            if self._closing:
                return
            c.close_codes[ws.close_code] += 1
            c.connected = c.subscribed = False
            c.closed_at = time.time()
            c.disconnects += 1
            if self.recording:
                c.window_disconnects += 1
            # The page: retry within a second (1012, "service restart": without its paused banner);
            # the balancer sends it to the next process.
            await asyncio.sleep(page_delay(0))
            attempt = 1
            c.url_index = (c.url_index + 1) % len(self.urls)

    async def _follow(self, c: ClientState, base: str, ws: ClientConnection) -> None:
        """Subscribe, fetch the snapshot if this is a reconnect, then read until the socket closes."""
        c.connected = True
        try:
            await ws.send(json.dumps({"action": "subscribe", "topics": [*TOPICS, *self.view_topics]}))
            if c.closed_at is not None:  # as the page: the snapshot once the subscription holds
                c.snapshot_due = (base, dict(c.seen))
            async for raw in ws:
                self._receive(c, raw)
        except ConnectionClosed:
            pass
        finally:
            await ws.close()

    def _stamp(self, iso: str) -> float:
        value = self._stamps.get(iso)
        if value is None:
            if len(self._stamps) > 100_000:
                self._stamps.clear()
            value = self._stamps[iso] = epoch(iso)
        return value

    def _receive(self, c: ClientState, raw: str | bytes) -> None:
        received = time.time()
        c.messages += 1
        try:
            message = _decode_delta(raw)
        except msgspec.ValidationError:  # another topic's message, shaped otherwise
            message = _FleetDelta(type=_decode_typed(raw).type)
        self.types[message.type] += 1
        self.type_bytes[message.type] += len(raw)
        if message.type == "subscribed":
            c.subscribed = True
            if c.closed_at is not None:
                c.gaps_ms.append((received - c.closed_at) * 1000)
                c.closed_at = None
            if c.snapshot_due is not None:
                base, seen_before = c.snapshot_due
                c.snapshot_due = None
                self.snapshots_pending += 1  # counted now: the restart waits on it from another thread
                task = asyncio.create_task(self._check_snapshot(c, base, seen_before))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        if self.recording:
            c.window_messages += 1
        if c.data_pending_since is not None:
            c.data_gaps_ms.append((received - c.data_pending_since) * 1000)
            c.data_pending_since = None
        if message.type not in ("fleet.delta", "fleet.rows") or not message.gpus:
            return
        newest = 0.0
        seen, recording, row_lat = c.seen, self.recording, self.row_lat
        for row in message.gpus:
            if row.uuid not in self.gpu_uuids:
                continue
            ts = self._stamp(row.ts)
            newest = max(newest, ts)
            if ts > seen.get(row.uuid, 0.0):
                seen[row.uuid] = ts
                if recording:
                    row_lat.append(received - ts)
        if recording and newest:
            self.msg_lat.append(received - newest)
            if message.ts:
                built = self._stamp(message.ts)
                self.built_lag.append(built - newest)
                self.deliver_lag.append(received - built)

    # --- the snapshot after a reconnect ---

    async def _check_snapshot(self, c: ClientState, base: str, seen_before: dict[str, float]) -> None:
        asked = time.time()
        try:
            status, snapshot = await asyncio.get_running_loop().run_in_executor(
                self._http, self._fetch, base, self.cookies[base]
            )
            check: dict[str, Any] = {"client": c.number, "status": status, "took_ms": (time.time() - asked) * 1000}
            if status != 200:
                check["problems"] = [f"snapshot answered {status}"]
            else:
                have = {g["uuid"]: self._stamp(g["ts"]) for g in snapshot["gpus"]}
                behind = [u for u, ts in seen_before.items() if have.get(u, 0.0) < ts]
                problems = [f"{len(behind)} GPUs older than already seen, e.g. {behind[0]}"] if behind else []
                if self.series_since is not None:
                    problems += series_gaps(snapshot, sites=self.sites, since=self.series_since)
                check["problems"] = problems
            self.snapshot_checks.append(check)
        finally:
            self.snapshots_pending -= 1

    @staticmethod
    def _fetch(base: str, cookie: str) -> tuple[int | str, Any]:
        try:
            response = requests.get(base + SNAPSHOT_PATH, headers={"Cookie": cookie}, timeout=60)
        except requests.RequestException as exc:
            return exc.__class__.__name__, None
        return response.status_code, response.json() if response.status_code == 200 else None


def series_gaps(snapshot: dict[str, Any], *, sites: set[str], since: float, until: float | None = None) -> list[str]:
    """Missing buckets in the fleet chart's series of ``sites`` (FleetLoad's) from ``since`` on.

    Without ``until``: the buckets present must follow each other (the newest ones may not be
    rolled up yet). With it: every bucket from ``since`` to ``until`` must be there.
    """
    series = snapshot["series"]
    bucket = series["bucket_seconds"]
    problems = []
    for site in snapshot["sites"]:
        if site["name"] not in sites:
            continue
        points = series["sites"].get(str(site["id"]), {"ts": [], "util": []})
        start = math.floor(since / bucket) * bucket
        present = [(epoch(ts), util) for ts, util in zip(points["ts"], points["util"], strict=True)]
        present = [(t, u) for t, u in present if t >= start]
        empty = [t for t, u in present if u is None]
        if empty:
            problems.append(f"site {site['name']}: empty bucket at {datetime.fromtimestamp(empty[0], UTC):%H:%M}")
        times = [t for t, _ in present]
        if until is not None:
            wanted = range(int(start), int(math.floor(until / bucket) * bucket) + 1, bucket)
            missing = sorted(set(wanted) - set(map(int, times)))
            if missing:
                problems.append(
                    f"site {site['name']}: {len(missing)} missing buckets from "
                    f"{datetime.fromtimestamp(missing[0], UTC):%H:%M}"
                )
        for earlier, later in itertools.pairwise(times):
            if later - earlier > bucket:
                problems.append(
                    f"site {site['name']}: no bucket between {datetime.fromtimestamp(earlier, UTC):%H:%M} "
                    f"and {datetime.fromtimestamp(later, UTC):%H:%M}"
                )
    return problems


# --- the phases --------------------------------------------------------------------------------


class LiveLoad:
    """FleetLoad and LiveClients started together (sign-in first), for phases run under load."""

    def __init__(
        self,
        stack: soak_stack.Stack,
        tokens: dict[str, Any],
        *,
        password: str,
        clients: int = 200,
        gpus: int = 1000,
        username: str = "soak",
    ) -> None:
        self.stack = stack
        # bootstrap()'s answer, or its agent tokens alone ({site: token}).
        self.agents: dict[str, str] = tokens.get("agents", tokens)
        self.personal: str | None = tokens.get("personal")
        self.fleet = FleetLoad(stack.web_urls, self.agents, gpus=gpus)
        self.cookies = {base: sign_in(base, username, password) for base in stack.web_urls}
        self.clients = LiveClients(
            stack.web_urls, self.cookies, self.fleet.gpu_uuids, sites=set(self.agents), clients=clients
        )
        self.started_at = 0.0

    def start(self) -> None:
        self.fleet.start()
        self.started_at = time.monotonic()
        log(f"fleet load: {len(self.fleet.gpu_uuids)} GPUs, {len(self.fleet.batches)} batches per 10 s")
        self.clients.start_and_wait()
        log(f"{len(self.clients.clients)} websocket clients subscribed to {', '.join(TOPICS)}")

    def stop(self) -> None:
        self.clients.stop()
        self.fleet.stop()


def _ms(values: Any, pct: float) -> float | None:
    return round(percentile(list(values), pct) * 1000, 1) if len(values) else None


PUSH_TIMING = """
import json, time
from datetime import timedelta
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone
from fleet.telemetry.read import figures
from fleet.telemetry.read import fleet_summary

def median_ms(fn, runs=5):
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        value = fn()
        took.append(time.perf_counter() - started)
    return round(sorted(took)[runs // 2] * 1000, 1), value

# A push's watermark: the previous push's (its rows are left out when unchanged), as live pushes run.
_, previous = fleet_summary.build_fleet_delta("fleet", None)
time.sleep(0.5)
out = {}
out["build_ms"], (payload, _) = median_ms(lambda: fleet_summary.build_fleet_delta("fleet", previous))
since = timezone.now() - timedelta(seconds=3)
out["gpu_rows_ms"], rows = median_ms(lambda: figures.gpu_rows(updated_since=since))
out["totals_ms"], _ = median_ms(figures.fleet_totals)
out["sites_ms"], _ = median_ms(figures.site_summaries)
out["rows"] = len(payload.get("gpus", payload["worst"]))  # the fleet topic carries the worst GPUs, no table rows
out["payload_kib"] = round(len(json.dumps(payload)) / 1024, 1)
# channels-redis: the same message to CLIENTS sockets on two processes, as a real push fans out.
layer = get_channel_layer()
names = [f"specific.soakprobe{i % 2}!c{i}" for i in range(CLIENTS)]
for name in names:
    async_to_sync(layer.group_add)("soakprobe", name)
message = {"type": "live.message", "text": json.dumps(payload, separators=(",", ":"))}  # as live.broadcast
out["group_send_ms"], _ = median_ms(lambda: async_to_sync(layer.group_send)("soakprobe", message), runs=3)
for name in names:
    async_to_sync(layer.group_discard)("soakprobe", name)
# What each web process then does with this message: channels-redis decodes it once (one copy per
# process names all its sockets), then per socket uvicorn's permessage-deflate (websockets'
# settings). The JSON is encoded once, where the push is built (per_socket_json_ms is what each
# socket paid before that).
import msgpack, zlib
packed = msgpack.packb(message, use_bin_type=True)
out["per_process_unpack_ms"], _ = median_ms(lambda: msgpack.unpackb(packed, raw=False), runs=9)
out["per_socket_json_ms"], text = median_ms(lambda: json.dumps(payload), runs=9)
def deflate():
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15, 5)
    return compressor.compress(text.encode()) + compressor.flush(zlib.Z_SYNC_FLUSH)
out["per_socket_deflate_ms"], compressed = median_ms(deflate, runs=9)
out["deflated_kib"] = round(len(compressed) / 1024, 1)
print("PUSH " + json.dumps(out))
"""


def time_fleet_push(stack: soak_stack.Stack, clients: int) -> dict[str, Any]:
    """Time the fleet push's parts in a console process on the stack, under the running load: the
    delta's build (rows, totals, site cards) and channels-redis's group_send to ``clients``
    sockets. (The probe's messages go to channels nobody reads; they expire with the layer's.)"""
    out = stack.manage("shell", "-c", f"CLIENTS = {clients}\n" + PUSH_TIMING)
    line = next(line for line in out.splitlines() if line.startswith("PUSH "))
    return json.loads(line.removeprefix("PUSH "))


def _cpu_seconds(stack: soak_stack.Stack) -> dict[str, float]:
    """CPU seconds so far of each console process (with its children) and Redis."""
    taken = {}
    for name in [*stack.web_names(), *stack.worker_names(), "beat", "redis"]:
        total = 0.0
        for member in stack.tree(name):
            try:
                times = member.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        taken[name] = total
    return taken


def _drain_lag_ms(stack: soak_stack.Stack, since: float, until: float) -> list[float]:
    """Per FleetLoad batch stored in the window: accepted by the API -> its writer's transaction began."""
    with psycopg.connect(stack.database_url, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM received_at - enqueued_at) * 1000 FROM fleet_ingestbatch "
            "WHERE key LIKE %s AND enqueued_at >= to_timestamp(%s) AND enqueued_at < to_timestamp(%s)",
            [f"%:k:{KEY_PREFIX}%", since, until],
        ).fetchall()
    return [float(r[0]) for r in rows]


def run_live_load(
    stack: soak_stack.Stack,
    tokens: dict[str, Any],
    *,
    password: str,
    clients: int = 200,
    seconds: float = 120,
    gpus: int = 1000,
    live: LiveLoad | None = None,
) -> dict[str, Any]:
    """Issue item 2: ``seconds`` of measurement after a 20 s warm-up; prints the RESULT line.

    With ``live`` (already started) the load keeps running afterwards, for the next phase.
    """
    own = live is None
    if live is None:
        live = LiveLoad(stack, tokens, password=password, clients=clients, gpus=gpus)
        live.start()
    try:
        time.sleep(max(0.0, WARMUP_S - (time.monotonic() - live.started_at)))
        probe = ApiProbe(
            stack.web_urls, API_PATHS, live.personal or "", interval=len(API_PATHS) * len(stack.web_urls) / API_RATE
        )
        if live.personal is None:  # no personal token given: read as the pages do, with the session
            del probe.session.headers["Authorization"]
            probe.session.headers["Cookie"] = live.cookies[stack.web_urls[0]]
        process = psutil.Process()
        psutil.cpu_percent()  # the machine's CPU use from here (read at the end of the window)
        cpu_before = sum(process.cpu_times()[:2])
        stack_cpu_before = _cpu_seconds(stack)
        acked_before = live.fleet.samples_acked
        window_start = time.time()
        probe.start()
        live.clients.begin_window()
        time.sleep(seconds)
        live.clients.end_window()
        window_end = time.time()
        probe.stop()
        client_cpu = (sum(process.cpu_times()[:2]) - cpu_before) / (window_end - window_start)
        stack_cpu = {
            name: round((used - stack_cpu_before.get(name, 0.0)) / (window_end - window_start), 2)
            for name, used in _cpu_seconds(stack).items()
        }
        c = live.clients
        api_ms = [ms for values in probe.latencies_ms.values() for ms in values]
        stayed = [x for x in c.clients if x.window_disconnects == 0 and x.window_messages > 0 and x.connected]
        result: dict[str, Any] = {
            "ws_clients": len(stayed),
            "p50_ms": _ms(c.row_lat, 50),
            "p99_ms": _ms(c.row_lat, 99),
            "api_p95_ms": round(percentile(api_ms, 95), 1) if api_ms else None,
            "messages": sum(x.window_messages for x in c.clients),
            "api_5xx": probe.http_5xx,
            "rows_timed": len(c.row_lat),
            "msg_p50_ms": _ms(c.msg_lat, 50),
            "msg_p99_ms": _ms(c.msg_lat, 99),
            "ts_to_built_p50_ms": _ms(c.built_lag, 50),
            "ts_to_built_p99_ms": _ms(c.built_lag, 99),
            "built_to_received_p50_ms": _ms(c.deliver_lag, 50),
            "built_to_received_p99_ms": _ms(c.deliver_lag, 99),
            "samples_acked": live.fleet.samples_acked - acked_before,
            "ingest_post_p50_ms": round(percentile(list(live.fleet.post_ms), 50), 1) if live.fleet.post_ms else None,
            "client_cpu_cores": round(client_cpu, 2),
            "stack_cpu_cores": stack_cpu,
            "machine_cpu_pct": psutil.cpu_percent(),
            "api_statuses": {f"{path} {status}": n for (path, status), n in probe.statuses.items()},
            "api_errors": probe.errors[:5],
        }
        drains = _drain_lag_ms(stack, window_start, window_end)
        result["drain_p50_ms"] = round(percentile(drains, 50), 1) if drains else None
        result["drain_p99_ms"] = round(percentile(drains, 99), 1) if drains else None
        result["fleet_push"] = time_fleet_push(stack, len(c.clients))
        result["message_types"] = dict(c.types)
        result["message_kib_mean"] = {t: round(c.type_bytes[t] / n / 1024, 1) for t, n in c.types.items()}
        log("live load details: " + json.dumps({k: v for k, v in result.items() if k != "api_errors"}))
        for error in result["api_errors"]:
            log(f"API server error: {error}")
        result["result"] = (
            f"RESULT ws_clients={result['ws_clients']} p50_ms={result['p50_ms']} p99_ms={result['p99_ms']} "
            f"api_p95_ms={result['api_p95_ms']}"
        )
        print(result["result"], flush=True)
        return result
    finally:
        if own:
            live.stop()


def rolling_restart(
    stack: soak_stack.Stack,
    tokens: dict[str, Any] | None = None,
    *,
    password: str | None = None,
    clients: int = 200,
    gpus: int = 1000,
    live: LiveLoad | None = None,
) -> dict[str, Any]:
    """Issue item 5, web side: restart each web process in turn under load (module docstring).

    Runs under ``live`` (already started; left running), or starts its own load and clients
    from ``tokens`` and ``password`` and lets them settle (every GPU reported, seen by every
    client) before the first restart. The answer's ``result`` is the RESULT line it prints.
    """
    own = live is None
    if live is None:
        if tokens is None or password is None:
            raise ValueError("rolling_restart needs a running LiveLoad, or tokens and password to start one")
        live = LiveLoad(stack, tokens, password=password, clients=clients, gpus=gpus)
        live.start()
        time.sleep(REPORT_INTERVAL_S + 5)
    try:
        return _rolling_restart(stack, live)
    finally:
        if own:
            live.stop()


def _rolling_restart(stack: soak_stack.Stack, live: LiveLoad) -> dict[str, Any]:
    clients = live.clients
    for c in clients.clients:
        c.gaps_ms.clear()
        c.open_gaps_ms.clear()
        c.data_gaps_ms.clear()
        c.close_codes.clear()
    checks_before = len(clients.snapshot_checks)
    began = time.time()
    clients.series_since = began
    stop_s: dict[str, float] = {}
    gaps_by_stop: dict[str, dict[str, float | int | None]] = {}  # per restart: who moved, how long away
    for index, name in enumerate(stack.web_names()):
        before = {c.number: len(c.gaps_ms) for c in clients.clients}
        log(f"rolling restart: SIGTERM {name}")
        stop_s[name] = stack.stop(name, grace=soak_stack.WEB_GRACE_S)
        log(f"rolling restart: {name} stopped in {stop_s[name]:.1f} s; starting it again")
        stack.start_web(index)
        if not clients.wait_subscribed(BACK_WITHIN_S):
            log(f"rolling restart: not every client came back within {BACK_WITHIN_S:.0f} s of {name}'s restart")
        # The next process goes down only once this one's reconnects have their snapshots.
        _wait_snapshots(clients, timeout=60)
        these = [gap for c in clients.clients for gap in c.gaps_ms[before[c.number] :]]
        gaps_by_stop[name] = {
            "moved": len(these),
            "gap_p50_ms": round(percentile(these, 50), 1) if these else None,
            "gap_max_ms": round(max(these), 1) if these else None,
        }
    ended = time.time()
    back = clients.wait_subscribed(BACK_WITHIN_S)
    dropped = sum(1 for c in clients.clients if not c.subscribed)
    _wait_snapshots(clients, timeout=120)
    checks = clients.snapshot_checks[checks_before:]
    failed = [check for check in checks if check["problems"]]
    final = _final_series_check(stack, live.cookies[stack.web_urls[0]], sites=clients.sites, since=began, until=ended)
    gaps = [gap for c in clients.clients for gap in c.gaps_ms]
    open_gaps = [gap for c in clients.clients for gap in c.open_gaps_ms]
    data_gaps = [gap for c in clients.clients for gap in c.data_gaps_ms]
    moved = sum(1 for c in clients.clients if c.gaps_ms)
    max_gap = round(max(gaps), 1) if gaps else 0.0
    snapshot_gaps = len(failed) + (1 if final else 0)
    codes: Counter[int | None] = Counter()
    for c in clients.clients:
        codes.update(c.close_codes)
    told_to_move = codes[SERVICE_RESTART]
    result: dict[str, Any] = {
        "rolling_restart_webs": len(stop_s),
        "stop_s": {k: round(v, 2) for k, v in stop_s.items()},
        "stop_s_max": round(max(stop_s.values()), 2),
        "clients": moved,
        "reconnects": len(gaps),
        "max_gap_ms": max_gap,
        "gap_p50_ms": round(percentile(gaps, 50), 1) if gaps else None,
        "reconnect_max_ms": RECONNECT_MAX_MS,
        "gap_target_ms": GAP_TARGET_MS,
        "close_codes": {str(code): n for code, n in codes.items()},
        "open_gap_p50_ms": round(percentile(open_gaps, 50), 1) if open_gaps else None,
        "open_gap_max_ms": round(max(open_gaps), 1) if open_gaps else None,
        "data_gap_p50_ms": round(percentile(data_gaps, 50), 1) if data_gaps else None,
        "data_gap_max_ms": round(max(data_gaps), 1) if data_gaps else None,
        "gaps_by_stop": gaps_by_stop,
        "snapshot_ms_p50": _snapshot_ms(checks, 50),
        "snapshot_ms_max": _snapshot_ms(checks, 100),
        "snapshots_checked": len(checks),
        "snapshot_gaps": snapshot_gaps,
        "snapshot_problems": [check["problems"] for check in failed[:5]] + ([final] if final else []),
        "dropped": dropped,
    }
    result["passed"] = bool(
        back
        and dropped == 0
        and snapshot_gaps == 0
        # the drain, the grace, then cancelling and exiting
        and result["stop_s_max"] <= soak_stack.WEB_DRAIN_S + soak_stack.WEB_GRACE_S + 1
    )
    # A timing, judged by the caller (bench/soak.py: the full soak fails past it, --short notes it):
    # the stopping process closes its sockets with 1012, paced, and the page retries within
    # a second, so its herd reaches the other process a few at a time (console/drain.py).
    result["within_gap_target"] = max_gap <= GAP_TARGET_MS
    log("rolling restart details: " + json.dumps(result))
    result["result"] = (
        f"RESULT rolling_restart_webs={result['rolling_restart_webs']} stop_s_max={result['stop_s_max']} "
        f"clients={moved} max_gap_ms={max_gap} gap_p50_ms={result['gap_p50_ms']} gap_target_ms={GAP_TARGET_MS:.0f} "
        f"reconnect_max_ms={RECONNECT_MAX_MS} told_to_move={told_to_move} snapshot_gaps={snapshot_gaps} "
        f"dropped={dropped}"
    )
    print(result["result"], flush=True)
    return result


def _wait_snapshots(clients: LiveClients, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while clients.snapshots_pending and time.monotonic() < deadline:
        time.sleep(0.2)


def _snapshot_ms(checks: list[dict[str, Any]], pct: float) -> float | None:
    took = [check["took_ms"] for check in checks]
    return round(percentile(took, pct), 1) if took else None


def _final_series_check(
    stack: soak_stack.Stack, cookie: str, *, sites: set[str], since: float, until: float
) -> list[str]:
    """Once the rollups have caught up, the 1 h series must hold every minute of the restart."""
    problems: list[str] = ["the snapshot could not be read"]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            response = requests.get(stack.web_urls[0] + SNAPSHOT_PATH, headers={"Cookie": cookie}, timeout=60)
            if response.status_code == 200:
                problems = series_gaps(response.json(), sites=sites, since=since, until=until)
                if not problems:
                    return []
        except requests.RequestException:
            pass
        time.sleep(5)
    return problems


def worker_stop(stack: soak_stack.Stack, *, index: int = 0) -> dict[str, Any]:
    """Issue item 5, worker side: SIGTERM one worker under load, time its warm shutdown, restart it."""
    name = stack.worker_names()[index]
    log(f"SIGTERM {name}")
    taken = stack.stop(name, grace=soak_stack.WORKER_GRACE_S)
    stack.start_worker(index)
    result = {"worker": name, "stop_s": round(taken, 2), "grace_s": soak_stack.WORKER_GRACE_S}
    result["passed"] = taken <= soak_stack.WORKER_GRACE_S
    result["result"] = f"RESULT worker_stop={name} stop_s={result['stop_s']} grace_s={soak_stack.WORKER_GRACE_S}"
    print(result["result"], flush=True)
    return result


# --- run alone ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120, help="measured seconds, after a 20 s warm-up")
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--keep", action="store_true", help="keep the stack's directory (logs) afterwards")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="console setting, e.g. GOODPUT_LIVE_MIN_INTERVAL_MS=500",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    workdir = Path(tempfile.mkdtemp(prefix="goodput-soak-live-"))
    stack = soak_stack.Stack(workdir, env=dict(item.split("=", 1) for item in args.env))
    live: LiveLoad | None = None
    ok = False
    try:
        stack.start()
        password = secrets.token_urlsafe(16)
        tokens = soak_stack.bootstrap(stack, ["soak-a", "soak-b"], password)
        live = LiveLoad(stack, tokens, password=password, clients=args.clients, gpus=args.gpus)
        live.start()
        loaded = run_live_load(stack, tokens, password=password, seconds=args.seconds, live=live)
        restart = rolling_restart(stack, live=live)
        worker = worker_stop(stack)
        log(f"fleet load: {live.fleet.samples_acked} samples acknowledged, statuses {dict(live.fleet.statuses)}")
        ok = bool(loaded["p99_ms"] is not None and loaded["p99_ms"] <= P99_TARGET_MS)
        ok = ok and restart["passed"] and worker["passed"]
    finally:
        if live is not None:
            live.stop()
        stack.shutdown()
        log(f"logs under {workdir}")
        if not args.keep and ok:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
