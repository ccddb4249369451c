"""The soak's telemetry sources and probes: what feeds the console and what watches it answer.

* ``read_ledger``: the samples the real goodput-agents produced, from the ledger the fake NVML
  (``bench/soak_nvml/pynvml.py``) writes: GPU UUID -> highest reading number ``n``; that GPU's
  samples carry the energy values 1000, 2000, ..., 1000 * n mJ.
* ``Pusher``: a dcgm-exporter push client. It pushes scrapes of fake GPUs to the Prometheus door
  with explicit millisecond timestamps (a sample is named by GPU UUID + timestamp), keeps what was
  not acknowledged in a backlog and retries it, with the same Idempotency-Key, on the next web
  process. ``generated`` and ``sent`` say which samples it made and which the console took.
* ``VllmTarget``: a vLLM ``/metrics`` endpoint for the console to scrape: healthy and steady
  (no queue, KV cache at 42 %, every request well inside the default TTFT and ITL SLOs).
* ``ApiProbe``: a reader of API pages (with an admin's personal token) that counts every answer,
  keeps the latencies of the good ones and the text of every server error.

No Django here: the soak orchestrator only talks HTTP and SQL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from soak_nvml.soak_ledger import gpu_uuid, read_ledger  # noqa: F401 (read_ledger: for bench/soak.py)

PUSH_PATH = "/api/v1/ingest/prometheus"
MODEL = "NVIDIA H100 80GB HBM3"


# --- dcgm-exporter pushes ---------------------------------------------------------------------------

# dcgm-exporter's default counters: name -> (type, help).
DCGM_METRICS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active."),
}


def dcgm_values(index: int, seq: int) -> dict[str, float]:
    """GPU ``index``'s reading number ``seq``: healthy and steady (fleet/telemetry/detectors.py sees no XID,
    ECC error, remapped row, PCIe replay, throttling or heat); what is not listed is 0."""
    i = index % 8
    return {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_MEMORY_TEMP": 58 + i + seq % 3,
        "DCGM_FI_DEV_GPU_TEMP": 52 + i + seq % 3,
        "DCGM_FI_DEV_POWER_USAGE": 420.5 + 15 * i + seq % 7,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": seq * 1000,  # with the timestamp, names the sample
        "DCGM_FI_DEV_GPU_UTIL": 50 + 4 * i + seq % 5,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 25 + i,
        "DCGM_FI_DEV_FB_FREE": 31_559 - 500 * i,
        "DCGM_FI_DEV_FB_USED": 50_000 + 500 * i,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.3 + 0.02 * i,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.4,
    }


@dataclass
class Push:
    key: str  # the Idempotency-Key, the same on every attempt
    body: bytes
    ts_ms: int
    uuids: list[str]


class Pusher(threading.Thread):
    """Pushes a dcgm-exporter scrape of ``hosts`` x ``gpus_per_host`` GPUs every ``interval`` s.

    Delivery: pushes wait in a backlog, oldest first. A 2xx acknowledges one; a 5xx, 429 or
    connection error keeps it for the next loop, sent to the next base URL (a dead web process is
    skipped); any other 4xx is a rejection (a soak failure) and the push is dropped.
    """

    def __init__(
        self,
        bases: list[str],
        token: str,
        *,
        hosts: int = 2,
        gpus_per_host: int = 8,
        interval: float = 2.0,
        host_prefix: str = "soak-push",
        timeout: float = 5.0,
    ) -> None:
        super().__init__(name="pusher", daemon=True)
        self.bases = [b.rstrip("/") for b in bases]
        self.interval = interval
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )
        # (hostname, GPU index, UUID) of every fake GPU
        self.gpus = [
            (f"{host_prefix}{h}", i, gpu_uuid(f"{host_prefix}{h}", i))
            for h in range(hosts)
            for i in range(gpus_per_host)
        ]
        self.seq = 0
        self.last_ts_ms = 0
        self.backlog: deque[Push] = deque()
        self.statuses: Counter[int | str] = Counter()
        self.generated: dict[str, list[int]] = {u: [] for _, _, u in self.gpus}
        self.sent: dict[str, list[int]] = {u: [] for _, _, u in self.gpus}
        self.rejected: list[dict[str, Any]] = []
        self._base_index = 0
        self._generating = threading.Event()
        self._generating.set()
        self._quit = threading.Event()

    # the orchestrator's side

    def stop(self) -> None:
        """Make no new pushes; what is in the backlog is still delivered."""
        self._generating.clear()

    def drain(self, timeout: float) -> bool:
        """Stop generating and deliver the backlog; True once it is empty within ``timeout`` s."""
        self.stop()
        self.join(timeout)
        if self.is_alive():
            self._quit.set()
            self.join(self.timeout + 1)
        return not self.backlog

    # the thread

    def run(self) -> None:
        next_push = time.monotonic()
        while not self._quit.is_set():
            generating = self._generating.is_set()
            if generating and time.monotonic() >= next_push:
                self.backlog.append(self._make_push())
                # After a slow delivery, carry on from now rather than catch up with a burst.
                next_push = max(next_push + self.interval, time.monotonic())
            if not generating and not self.backlog:
                return
            outcome = self._deliver(until=next_push if generating else float("inf"))
            retry = 0.5 if outcome == "failed" else 0.0  # a failed push is retried soon, on the next base URL
            wait = min(retry or float("inf"), next_push - time.monotonic()) if generating else retry
            self._quit.wait(max(0.0, wait))

    def _make_push(self) -> Push:
        self.seq += 1
        # Strictly increasing: the timestamp names the sample, two pushes must never share one.
        ts_ms = self.last_ts_ms = max(int(time.time() * 1000), self.last_ts_ms + 1)
        values = [dcgm_values(index, self.seq) for _, index, _ in self.gpus]
        lines = []
        for metric, (kind, help_text) in DCGM_METRICS.items():
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
            for (host, index, gpu), value in zip(self.gpus, values, strict=True):
                labels = (
                    f'gpu="{index}",UUID="{gpu}",pci_bus_id="00000000:{0x18 + 0x10 * index:02X}:00.0",'
                    f'device="nvidia{index}",modelName="{MODEL}",Hostname="{host}"'
                )
                lines.append(f"{metric}{{{labels}}} {value.get(metric, 0)} {ts_ms}")
        for _, _, gpu in self.gpus:
            self.generated[gpu].append(ts_ms)
        body = ("\n".join(lines) + "\n").encode()
        return Push(key=str(uuid.uuid4()), body=body, ts_ms=ts_ms, uuids=[u for _, _, u in self.gpus])

    def _next_base(self) -> None:
        self._base_index = (self._base_index + 1) % len(self.bases)

    def _deliver(self, *, until: float) -> str:
        """Send the backlog oldest first until it is "empty", a push "failed", or the next push
        is "due"."""
        while self.backlog and not self._quit.is_set():
            if time.monotonic() >= until:
                return "due"
            push = self.backlog[0]
            base = self.bases[self._base_index]
            try:
                response = self.session.post(
                    base + PUSH_PATH, data=push.body, headers={"Idempotency-Key": push.key}, timeout=self.timeout
                )
            except requests.RequestException:
                self.statuses["conn_error"] += 1
                self._next_base()
                return "failed"
            status = response.status_code
            self.statuses[status] += 1
            if 200 <= status < 300:
                self.backlog.popleft()
                for gpu in push.uuids:
                    self.sent[gpu].append(push.ts_ms)
            elif status >= 500 or status == 429:
                self._next_base()
                return "failed"
            else:
                self.backlog.popleft()
                self.rejected.append(
                    {"url": base + PUSH_PATH, "status": status, "body": response.text[:300], "ts_ms": push.ts_ms}
                )
        return "empty"


# --- a vLLM server to scrape ------------------------------------------------------------------------

VLLM_MODEL = "soak/Llama-3.1-8B-Instruct"
# vLLM's bucket bounds (seconds), and where each scrape's new observations fall: every TTFT under
# 100 ms and every inter-token latency under 25 ms, far inside the default 500 ms / 50 ms SLOs.
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
TTFT_BOUNDS += (40.0, 80.0, 160.0, 640.0, 2560.0)
TTFT_NEW = {0.04: 6, 0.06: 12, 0.08: 8, 0.1: 4}  # bucket -> observations per scrape (30 requests)
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BOUNDS += (40.0, 80.0)
ITL_NEW = {0.01: 1200, 0.025: 4800}  # 6,000 tokens after the first, per scrape
PROMPT_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 131072)
PROMPT_NEW = {200: 10, 500: 15, 1000: 5}


class _Histogram:
    def __init__(self, bounds: tuple[float, ...], new: dict[float, int], mean: float) -> None:
        self.bounds, self.new, self.mean = bounds, new, mean
        self.counts = dict.fromkeys(bounds, 0)  # per bucket, not cumulative
        self.sum = 0.0

    def observe(self) -> None:
        for bound, n in self.new.items():
            self.counts[bound] += n
        self.sum += sum(self.new.values()) * self.mean

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        for bound in self.bounds:
            total += self.counts[bound]
            out.append(f'{name}_bucket{{le="{bound}",{labels}}} {float(total)}')
        out.append(f'{name}_bucket{{le="+Inf",{labels}}} {float(total)}')
        out.append(f"{name}_count{{{labels}}} {float(total)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum:.3f}")
        return out


class VllmTarget:
    """A vLLM server's ``/metrics`` on 127.0.0.1: each scrape is 30 more requests served well.

    ``served`` holds the time of every scrape answered (its length is the count).
    """

    def __init__(self) -> None:
        self.served: list[float] = []
        self.requests = 0
        self.ttft = _Histogram(TTFT_BOUNDS, TTFT_NEW, 0.057)
        self.itl = _Histogram(ITL_BOUNDS, ITL_NEW, 0.016)
        self.prompt = _Histogram(PROMPT_BOUNDS, PROMPT_NEW, 350)
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = target.scrape().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="vllm-target", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def start(self) -> VllmTarget:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def scrape(self) -> str:
        with self._lock:
            self.served.append(time.time())
            self.requests += 30
            for histogram in (self.ttft, self.itl, self.prompt):
                histogram.observe()
            n = self.requests
            labels = f'model_name="{VLLM_MODEL}",engine="0"'

            def metric(name: str, kind: str, help_text: str, samples: list[str]) -> list[str]:
                return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]

            lines = [
                *metric("vllm:num_requests_running", "gauge", "Requests in model execution batches.",
                        [f"vllm:num_requests_running{{{labels}}} 12.0"]),
                *metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be processed.",
                        [f"vllm:num_requests_waiting{{{labels}}} 0.0"]),
                *metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                        [f"vllm:kv_cache_usage_perc{{{labels}}} 0.42"]),
                *metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
                        [f"vllm:num_preemptions_total{{{labels}}} 0.0"]),
                *metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                        [f"vllm:prompt_tokens_total{{{labels}}} {n * 350.0}"]),
                *metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                        [f"vllm:generation_tokens_total{{{labels}}} {n * 201.0}"]),
                *metric("vllm:request_success_total", "counter", "Count of successfully processed requests.", [
                    f'vllm:request_success_total{{finished_reason="stop",{labels}}} {n * 0.9}',
                    f'vllm:request_success_total{{finished_reason="length",{labels}}} {n * 0.1}',
                    f'vllm:request_success_total{{finished_reason="abort",{labels}}} 0.0',
                ]),
                *metric("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
                        self.ttft.lines("vllm:time_to_first_token_seconds", labels)),
                *metric("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
                        self.itl.lines("vllm:inter_token_latency_seconds", labels)),
                *metric("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.",
                        self.prompt.lines("vllm:request_prompt_tokens", labels)),
            ]  # fmt: skip
        return "\n".join(lines) + "\n"


# --- the API probe --------------------------------------------------------------------------------


class ApiProbe(threading.Thread):
    """GETs every path on every base URL each ``interval`` s with an admin's personal API token.

    ``statuses`` counts answers per (path, status), "conn_error" when no answer came;
    ``latencies_ms`` holds each path's 2xx latencies; ``errors`` every 5xx with its text.
    """

    def __init__(self, bases: list[str], paths: list[str], token: str, *, interval: float = 0.5) -> None:
        super().__init__(name="api-probe", daemon=True)
        self.bases = [b.rstrip("/") for b in bases]
        self.paths = paths
        self.interval = interval
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.statuses: Counter[tuple[str, int | str]] = Counter()
        self.latencies_ms: dict[str, list[float]] = {p: [] for p in paths}
        self.errors: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    @property
    def http_5xx(self) -> int:
        """Server errors other than 503 (a 503 is the console saying, correctly, that it cannot
        serve now: its database or broker is down)."""
        return sum(n for (_, s), n in self.statuses.items() if isinstance(s, int) and s >= 500 and s != 503)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    def run(self) -> None:
        while not self._stop_event.is_set():
            started = time.monotonic()
            for base in self.bases:
                for path in self.paths:
                    self._get(base, path)
            self._stop_event.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _get(self, base: str, path: str) -> None:
        started = time.monotonic()
        try:
            response = self.session.get(base + path, timeout=10, allow_redirects=False)
        except requests.RequestException:
            self.statuses[(path, "conn_error")] += 1
            return
        elapsed_ms = (time.monotonic() - started) * 1000
        self.statuses[(path, response.status_code)] += 1
        if 200 <= response.status_code < 300:
            self.latencies_ms[path].append(elapsed_ms)
        elif response.status_code >= 500:
            self.errors.append(
                {"url": base + path, "status": response.status_code, "body": response.text[:300], "time": time.time()}
            )
