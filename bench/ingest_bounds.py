"""Ingest bounds: how much memory the web process takes for the worst request each ingest door
accepts, against a small valid request in the same run.

A door's limits (the body's bytes, its items, lines, labels and timestamps) bound what a request
may hold; what the web process builds from it must be bounded too, or a small request can cost a
great deal (issue 37: a remote_write series with a 10 KB label and 60,000 samples, 300 KB on the
wire, took a web process from 217 to 1,383 MB). For each door this sends the requests that push
its limits hardest, each just inside them, and checks each is accepted:

* ``gpu_samples`` (POST /api/v1/ingest/gpu-samples): GOODPUT_INGEST_MAX_ITEMS samples of as many
  GPUs, identities as long as they may be, as many fields set as GOODPUT_INGEST_MAX_BYTES leaves.
* ``prometheus`` (POST /api/v1/ingest/prometheus, the text door), every family under a ``# TYPE``
  (a parser that groups samples by family holds a family until it ends): the most lines of series
  the console ignores; the most dcgm-exporter GPUs, one field each and every field each; the most
  vLLM samples in one family, in the 0.0.4 format and in OpenMetrics; one line with a single label
  as long as the body allows.
* ``node_exporter`` (the text door with node_exporter's series): the most port series of many
  hosts, and file-system series with the longest device and mount point the columns take.
* ``remote_write`` (POST /api/v1/ingest/prometheus/remote-write, snappy-compressed protobuf): a
  series with labels at GOODPUT_REMOTE_WRITE_MAX_LABEL_BYTES and as many samples as its text bound
  allows; the most series the console ignores in one scrape; a GPU at the most timestamps; the most
  GPUs, and the most vLLM series, in one scrape. The issue's own request (a 10 KB label, 60,000
  samples) is sent too and must be refused (4xx): its growth is printed, not judged.
* ``training_events`` (POST /api/v1/training/jobs/<id>/events): GOODPUT_INGEST_MAX_ITEMS step
  events with every field, the longest ids and node names, within the byte limit.
* ``alertmanager`` (POST /api/v1/alertmanager): the most alerts the webhook's 2 MiB take (about
  6,100 in one group: some 11 minutes on a 2-core machine, as each alert re-reads its incident's
  findings; ``--alerts N`` sends fewer), and a few alerts with labels and annotations as large as
  they may be.

Each request goes to a fresh web process (uvicorn, one process, production mode, on the bench's
own database, ``bench_ingest_bounds`` unless BENCH_DATABASE_URL says otherwise, and Redis
database, BENCH_REDIS_URL, flushed before each; no Celery worker: what the doors queue waits in
Redis), warmed by the door's small valid request twice. Then the small request once more (its
growth: ``baseline``) and the request measured. Growth = the process's peak resident memory
during the request (VmHWM, reset through /proc/<pid>/clear_refs just before it; VmRSS sampled
every 2 ms where the kernel refuses that) less its resident memory before it.

Prints each request's figures on stderr and ends with
RESULT remote_write_mb=... prometheus_mb=... gpu_samples_mb=... node_exporter_mb=...
training_events_mb=... alertmanager_mb=... baseline_mb=... max_mb=... target_mb=64 ok=yes|no
(a door's figure is its worst request's growth; ``ok`` when every door is under the target and
every request was answered as expected).
"""

from __future__ import annotations

import os

# The bench's own database unless told otherwise, chosen before _common reads it.
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_ingest_bounds")

import argparse
import contextlib
import http.client
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import BENCH_REDIS_URL, Processes, bench_env, free_port, log, setup_django

from console.processes import healthy, uvicorn_command

TARGET_MB = 64
DOORS = ("remote_write", "prometheus", "gpu_samples", "node_exporter", "training_events", "alertmanager")
GPU_SAMPLES = "/api/v1/ingest/gpu-samples"
PROMETHEUS = "/api/v1/ingest/prometheus"
REMOTE_WRITE = "/api/v1/ingest/prometheus/remote-write"
ALERTMANAGER = "/api/v1/alertmanager"
EVENTS = "/api/v1/training/jobs/{}/events"
TEXT = {"Content-Type": "text/plain; version=0.0.4"}
JSON = {"Content-Type": "application/json"}
PROTOBUF = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


@dataclass
class Request:
    path: str
    body: bytes
    headers: dict[str, str]


@dataclass
class Shape:
    """One request to measure: ``build`` makes it (given the run's context), ``small`` makes the
    door's small valid request (called afresh for each use: a job's events must move on)."""

    door: str
    name: str
    build: Callable[[Context], Request]
    small: Callable[[Context], Request]
    refused: bool = False  # the issue's own request: it must get a 4xx


@dataclass
class Context:
    token: str
    job_id: int
    now_ms: int  # an hour ago: every sample is inside the window the doors accept
    serial: Iterator[int]
    alerts: int | None = None  # --alerts: fewer alerts than the webhook's 2 MiB take


# --- the requests ------------------------------------------------------------------------------


def limits() -> dict[str, int]:
    from django.conf import settings

    from fleet.ingest import prometheus, remote_write
    from incidents.api import alertmanager

    return {
        "bytes": settings.INGEST_MAX_BYTES,
        "items": settings.INGEST_MAX_ITEMS,
        "gpus": settings.INGEST_MAX_ITEMS,  # GPUs (and MIG instances) in one Prometheus push
        "lines": prometheus.MAX_LINES,
        "openmetrics_lines": prometheus.OPENMETRICS_MAX_LINES,
        "label_bytes": settings.REMOTE_WRITE_MAX_LABEL_BYTES,
        "timestamps": remote_write.MAX_TIMESTAMPS,
        "alertmanager_bytes": alertmanager.MAX_BYTES,
    }


def filled(make_line: Callable[[int], str], *, lines: int, head: str = "", tail: str = "") -> str:
    """``head``, then ``make_line(0)``, ``make_line(1)``, ... and ``tail``, as many as keep the
    text within INGEST_MAX_BYTES and ``lines`` lines."""
    budget = limits()["bytes"] - len(tail.encode())
    out, size = [head], len(head.encode())
    for n in range(lines - head.count("\n") - tail.count("\n")):
        line = make_line(n) + "\n"
        size += len(line.encode())
        if size > budget:
            break
        out.append(line)
    return "".join(out) + tail


def text_request(text: str, *, openmetrics: bool = False) -> Request:
    kind = "application/openmetrics-text; version=1.0.0" if openmetrics else TEXT["Content-Type"]
    return Request(PROMETHEUS, text.encode(), {"Content-Type": kind})


def small_text(ctx: Context) -> Request:
    n = next(ctx.serial)
    return text_request(
        f'DCGM_FI_DEV_GPU_TEMP{{UUID="GPU-bench-small-0000",Hostname="bench-small",gpu="0"}} 50 {ctx.now_ms + n}\n'
    )


def small_node(ctx: Context) -> Request:
    n = next(ctx.serial)
    return text_request(
        f'node_network_receive_bytes_total{{device="eth0",hostname="bench-small"}} {n} {ctx.now_ms + n}\n'
    )


# A push of series the console ignores alone is refused (400): one GPU line makes it a push.
ONE_GPU = 'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-bench-one-0000",Hostname="bench-one",gpu="0"} 50\n'


def typed(name: str, kind: str) -> str:
    """A family's metadata: a parser that groups samples by family holds them until it ends."""
    return f"# HELP {name} bench\n# TYPE {name} {kind}\n"


def text_unmapped(ctx: Context) -> Request:
    lim = limits()
    head = ONE_GPU + typed("bench_unmapped", "gauge")
    return text_request(filled(lambda n: f'bench_unmapped{{id="{n}"}} 1', lines=lim["lines"], head=head))


def text_dcgm_gpus(ctx: Context) -> Request:
    lim = limits()
    return text_request(
        filled(
            lambda n: (
                f'DCGM_FI_DEV_GPU_TEMP{{UUID="GPU-{n:012d}-bench",Hostname="bench-{n // 8:05d}",'
                f'gpu="{n % 8}"}} 50 {ctx.now_ms}'
            ),
            lines=min(lim["lines"], lim["gpus"] + 2),
            head=typed("DCGM_FI_DEV_GPU_TEMP", "gauge"),
        )
    )


def text_dcgm_fields(ctx: Context) -> Request:
    """Every field of as many GPUs (one family a field, as dcgm-exporter writes them)."""
    from fleet.telemetry.mappings import DCGM_FIELDS

    lim = limits()
    names = list(DCGM_FIELDS)
    per_field = lim["lines"] // len(names) - 2
    parts = []
    for name in names:
        parts.append(typed(name, "gauge"))
        parts += [
            f'{name}{{UUID="GPU-{n:012d}-bench",Hostname="bench-{n // 8:05d}",gpu="{n % 8}",'
            f'modelName="NVIDIA H100 80GB HBM3"}} 1 {ctx.now_ms}\n'
            for n in range(min(per_field, lim["gpus"]))
        ]
    text = "".join(parts)
    while len(text.encode()) > lim["bytes"]:
        per_field = per_field * lim["bytes"] // len(text.encode()) - 1
        text = "".join(
            typed(name, "gauge")
            + "".join(
                f'{name}{{UUID="GPU-{n:012d}-bench",Hostname="bench-{n // 8:05d}",gpu="{n % 8}",'
                f'modelName="NVIDIA H100 80GB HBM3"}} 1 {ctx.now_ms}\n'
                for n in range(per_field)
            )
            for name in names
        )
    return text_request(text)


def vllm_line(n: int, stamp: str) -> str:
    return f'vllm:num_requests_running{{model_name="bench-model-{n % 100:03d}",engine="{n}"}} 1 {stamp}'


def text_vllm(ctx: Context) -> Request:
    """The most serving samples, in one family (a vLLM gauge across many engines)."""
    lim = limits()
    head = typed("vllm:num_requests_running", "gauge")
    return text_request(filled(lambda n: vllm_line(n, str(ctx.now_ms)), lines=lim["lines"], head=head))


def text_vllm_openmetrics(ctx: Context) -> Request:
    """The same in the OpenMetrics format, whose parser holds a family whole until it ends."""
    lim = limits()
    head = typed("vllm:num_requests_running", "gauge")
    stamp = f"{ctx.now_ms / 1000:.3f}"
    text = filled(lambda n: vllm_line(n, stamp), lines=lim["openmetrics_lines"], head=head, tail="# EOF\n")
    return text_request(text, openmetrics=True)


def text_one_label(ctx: Context) -> Request:
    lim = limits()
    return text_request(ONE_GPU + 'bench_long{label="' + "x" * (lim["bytes"] - 40 - len(ONE_GPU)) + '"} 1\n')


def node_ports(ctx: Context) -> Request:
    lim = limits()
    name = "node_infiniband_port_data_received_bytes_total"
    return text_request(
        filled(
            lambda n: (
                f'{name}{{device="mlx5_{n % 64}",port="{n // 64 % 2 + 1}",'
                f'hostname="bench-node-{n // 128:05d}"}} {n} {ctx.now_ms}'
            ),
            lines=lim["lines"],
            head=typed(name, "counter"),
        )
    )


def node_long_labels(ctx: Context) -> Request:
    from fleet.ingest.prometheus import NODE_LABEL_LIMITS

    lim = limits()
    widths = NODE_LABEL_LIMITS["filesystem"]

    def line(n: int) -> str:
        device = f"/dev/{n:08d}".ljust(widths["device"], "d")
        mountpoint = f"/{n:08d}".ljust(widths["mountpoint"], "m")
        host = f"bench-{n // 16:05d}".ljust(widths["hostname"], "h")
        return (
            f'node_filesystem_avail_bytes{{device="{device}",mountpoint="{mountpoint}",fstype="ext4",'
            f'hostname="{host}"}} {n} {ctx.now_ms}'
        )

    return text_request(filled(line, lines=lim["lines"], head=typed("node_filesystem_avail_bytes", "gauge")))


def gpu_body(samples: list[dict[str, Any]]) -> Request:
    return Request(GPU_SAMPLES, json.dumps({"samples": samples}, separators=(",", ":")).encode(), JSON)


def small_gpu(ctx: Context) -> Request:
    ts = datetime.fromtimestamp((ctx.now_ms + next(ctx.serial)) / 1000, UTC).isoformat()
    return gpu_body([{"gpu_uuid": "GPU-bench-small-0000", "hostname": "bench-small", "ts": ts, "gpu_util": 50.0}])


def gpu_max_items(ctx: Context) -> Request:
    """INGEST_MAX_ITEMS samples of as many GPUs with the longest identities, and as many fields
    set as the byte limit leaves room for (every field of 10,000 samples is about 10 MB)."""
    from fleet.telemetry.fields import GPU_SAMPLE_FIELDS

    lim = limits()
    ts = datetime.fromtimestamp(ctx.now_ms / 1000, UTC).isoformat()
    values = [(f.name, f.kind(f.maximum)) for f in GPU_SAMPLE_FIELDS]

    def batch(fields: int) -> Request:
        return gpu_body(
            [
                {
                    "gpu_uuid": f"GPU-{n:012d}-".ljust(64, "b"),
                    "hostname": f"bench-{n // 8:05d}".ljust(253, "h"),
                    "ts": ts,
                    "gpu_index": n % 8,
                    "model": "NVIDIA H100 80GB HBM3".ljust(64, "m"),
                    **dict(values[:fields]),
                }
                for n in range(lim["items"])
            ]
        )

    for fields in range(len(values), -1, -1):
        request = batch(fields)
        if len(request.body) <= lim["bytes"]:
            return request
    raise RuntimeError("no GPU batch of INGEST_MAX_ITEMS samples fits in INGEST_MAX_BYTES")


def write_request(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> Request:
    from fleet.ingest.remote_write import encode

    return Request(REMOTE_WRITE, encode(series), PROTOBUF)


def small_remote(ctx: Context) -> Request:
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-bench-small-0000", "Hostname": "bench-small"}
    return write_request([(labels, [(50.0, ctx.now_ms + next(ctx.serial))])])


def remote_label_bound(ctx: Context) -> Request:
    """A series with labels at the bound, then as many samples (one a timestamp) as its text may
    come to: the amplification the bound leaves."""
    lim = limits()
    labels = {"__name__": "bench_long", "job": "bench"}
    labels["long"] = "x" * (lim["label_bytes"] - sum(len(k) + len(v) for k, v in labels.items()) - len("long"))
    line = len('bench_long{job="bench",long=""}') + len(labels["long"]) + len(" 1.0 ") + len(str(ctx.now_ms)) + 1
    samples = min(lim["timestamps"], lim["bytes"] // line)
    return write_request([(labels, [(1.0, ctx.now_ms - n) for n in range(samples)])])


def fitted(build: Callable[[int], Request], count: int) -> Request:
    """``build(count)``, fewer where the WriteRequest would inflate past INGEST_MAX_BYTES."""
    from fleet.ingest.remote_write import _uncompressed_length

    limit = limits()["bytes"]
    while True:
        request = build(count)
        size = _uncompressed_length(request.body)
        if size <= limit:
            return request
        count = count * limit // size - 1


def remote_many_series(ctx: Context) -> Request:
    """The most series the console ignores, one sample each, at one timestamp."""
    lim = limits()
    per_series = len('bench_unmapped{id="000000"} 1.0 ') + len(str(ctx.now_ms)) + 1
    return fitted(
        lambda count: write_request(
            [({"__name__": "bench_unmapped", "id": f"{n:06d}"}, [(1.0, ctx.now_ms)]) for n in range(count)]
        ),
        min(lim["lines"], lim["bytes"] // per_series),
    )


def remote_timestamps(ctx: Context) -> Request:
    """A GPU at the most timestamps: each is an exposition parsed and queued on its own."""
    lim = limits()
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-bench-timestamps-0", "Hostname": "bench-ts", "gpu": "0"}
    return write_request([(labels, [(50.0, ctx.now_ms - n) for n in range(lim["timestamps"])])])


def remote_dcgm_scrape(ctx: Context) -> Request:
    """The most GPUs in one scrape (one timestamp), one field each."""
    lim = limits()
    line = len('DCGM_FI_DEV_GPU_TEMP{Hostname="bench-00000",UUID="GPU-000000000000-bench",gpu="0"} 50.0 ') + 14
    return fitted(
        lambda count: write_request(
            [
                (
                    {
                        "__name__": "DCGM_FI_DEV_GPU_TEMP",
                        "UUID": f"GPU-{n:012d}-bench",
                        "Hostname": f"bench-{n // 8:05d}",
                        "gpu": str(n % 8),
                    },
                    [(50.0, ctx.now_ms)],
                )
                for n in range(count)
            ]
        ),
        min(lim["gpus"], lim["lines"], lim["bytes"] // line),
    )


def remote_vllm_scrape(ctx: Context) -> Request:
    """The most serving series in one scrape (one timestamp)."""
    lim = limits()
    line = len(vllm_line(0, str(ctx.now_ms))) + 8
    return fitted(
        lambda count: write_request(
            [
                (
                    {
                        "__name__": "vllm:num_requests_running",
                        "model_name": f"bench-model-{n % 100:03d}",
                        "engine": str(n),
                    },
                    [(1.0, ctx.now_ms)],
                )
                for n in range(count)
            ]
        ),
        min(lim["lines"], lim["bytes"] // line),
    )


def remote_finding(ctx: Context) -> Request:
    """Issue 37's request: one series, a 10 KB label, 60,000 samples (about 300 KB on the wire)."""
    labels = {"__name__": "bench_probe", "big": "A" * 10_240}
    return write_request([(labels, [(1.0, ctx.now_ms - 60_000 + n) for n in range(60_000)])])


def events_request(ctx: Context, events: list[dict[str, Any]]) -> Request:
    return Request(EVENTS.format(ctx.job_id), json.dumps({"events": events}, separators=(",", ":")).encode(), JSON)


def step_event(n: int, ts: datetime, *, long: bool = False) -> dict[str, Any]:
    event = {
        "id": f"step-{n:09d}".ljust(100, "e") if long else f"small-{n:09d}",
        "ts": ts.isoformat(),
        "kind": "step",
        "step": n,
        "tokens": 2**40,
        "step_time_s": 1.0,
        "data_wait_s": 0.5,
    }
    event["node"] = f"bench-node-{n % 64:03d}".ljust(253, "n") if long else "bench-node"
    return event


def small_events(ctx: Context) -> Request:
    n = next(ctx.serial)
    return events_request(ctx, [step_event(n, datetime.fromtimestamp(ctx.now_ms / 1000, UTC) + timedelta(seconds=n))])


def events_max_items(ctx: Context) -> Request:
    """INGEST_MAX_ITEMS step events after the small ones (the job's events only move forward)."""
    lim = limits()
    start = 1_000_000
    base = datetime.fromtimestamp(ctx.now_ms / 1000, UTC) + timedelta(seconds=1000)
    events = [step_event(start + n, base + timedelta(milliseconds=n), long=True) for n in range(lim["items"])]
    request = events_request(ctx, events)
    while len(request.body) > lim["bytes"]:
        events = events[: len(events) * lim["bytes"] // len(request.body)]
        request = events_request(ctx, events)
    return request


def alert(n: int, *, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict:
    now = datetime.now(UTC).replace(microsecond=0)
    return {
        "status": "firing",
        "labels": {"alertname": "BenchBounds", "severity": "warning", "instance": f"bench-{n}", **(labels or {})},
        "annotations": annotations or {"summary": f"bench alert {n}"},
        "startsAt": (now - timedelta(minutes=5)).isoformat(),
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"{n:016x}",
    }


def alert_payload(alerts: list[dict[str, Any]], group: str) -> Request:
    payload = {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="BenchBounds",group="{group}"}}',
        "status": "firing",
        "receiver": "goodput",
        "groupLabels": {"alertname": "BenchBounds"},
        "commonLabels": {"alertname": "BenchBounds"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.bench:9093",
        "truncatedAlerts": 0,
        "alerts": alerts,
    }
    return Request(ALERTMANAGER, json.dumps(payload, separators=(",", ":")).encode(), JSON)


def small_alert(ctx: Context) -> Request:
    return alert_payload([alert(0)], "small")


def alerts_most(ctx: Context) -> Request:
    lim = limits()
    one = len(json.dumps(alert(10**6), separators=(",", ":"))) + 1
    count = (lim["alertmanager_bytes"] - 1000) // one
    return alert_payload([alert(n) for n in range(min(count, ctx.alerts or count))], "most")


def alerts_large(ctx: Context) -> Request:
    lim = limits()
    width = (lim["alertmanager_bytes"] - 4000) // 8 // 2
    alerts = [
        alert(n, labels={"detail": "l" * width}, annotations={"description": "d" * (width - 20)}) for n in range(8)
    ]
    return alert_payload(alerts, "large")


SHAPES = [
    Shape("gpu_samples", "max_items", gpu_max_items, small_gpu),
    Shape("prometheus", "unmapped_lines", text_unmapped, small_text),
    Shape("prometheus", "dcgm_gpus", text_dcgm_gpus, small_text),
    Shape("prometheus", "dcgm_every_field", text_dcgm_fields, small_text),
    Shape("prometheus", "vllm_series", text_vllm, small_text),
    Shape("prometheus", "vllm_openmetrics", text_vllm_openmetrics, small_text),
    Shape("prometheus", "one_long_label", text_one_label, small_text),
    Shape("node_exporter", "port_series", node_ports, small_node),
    Shape("node_exporter", "long_labels", node_long_labels, small_node),
    Shape("remote_write", "label_bound_series", remote_label_bound, small_remote),
    Shape("remote_write", "unmapped_series", remote_many_series, small_remote),
    Shape("remote_write", "max_timestamps", remote_timestamps, small_remote),
    Shape("remote_write", "dcgm_scrape", remote_dcgm_scrape, small_remote),
    Shape("remote_write", "vllm_scrape", remote_vllm_scrape, small_remote),
    Shape("remote_write", "issue_37_request", remote_finding, small_remote, refused=True),
    Shape("training_events", "max_items", events_max_items, small_events),
    Shape("alertmanager", "most_alerts", alerts_most, small_alert),
    Shape("alertmanager", "large_alerts", alerts_large, small_alert),
]


# --- measuring ---------------------------------------------------------------------------------


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


class PeakMeter:
    """A process's peak resident memory over a span: VmHWM reset at its start, or VmRSS sampled
    every 2 ms where /proc/<pid>/clear_refs cannot be written."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sampled = 0
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> PeakMeter:
        self.before = status_kb(self.pid, "VmRSS")
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the present RSS
            self.hwm = True
        except OSError:
            self.hwm = False
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(OSError):
                self.sampled = max(self.sampled, status_kb(self.pid, "VmRSS"))
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()
        peak = status_kb(self.pid, "VmHWM") if self.hwm else max(self.sampled, status_kb(self.pid, "VmRSS"))
        self.growth_mb = max(0, peak - self.before) / 1024


def send(port: int, request: Request, token: str, timeout: float = 60) -> tuple[int, bytes, float]:
    """(HTTP status, body, seconds); status 0 when no answer came within ``timeout``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    try:
        conn.request("POST", request.path, request.body, {**request.headers, "Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    except TimeoutError:
        return 0, f"no answer within {timeout:.0f} s".encode(), time.perf_counter() - started
    finally:
        conn.close()


@dataclass
class Measured:
    shape: Shape
    status: int
    growth_mb: float
    baseline_mb: float
    seconds: float
    body_bytes: int
    answer: bytes

    @property
    def as_expected(self) -> bool:
        return 400 <= self.status < 500 if self.shape.refused else 200 <= self.status < 300


def measure(shape: Shape, ctx: Context, procs: Processes, timeout: float) -> Measured:
    import redis

    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()
    request = shape.build(ctx)
    port = free_port()
    env = bench_env(GOODPUT_INGEST_QUEUE_BOUND="1000000")
    name = f"web-{shape.door}-{shape.name}"
    procs.spawn(name, uvicorn_command(port, access_log=False), env)
    try:
        procs.wait_until(name, lambda: healthy(port))
        pid = procs.procs[name].pid
        for _ in range(2):  # warm-up: imports, connections, caches
            status, answer, _ = send(port, shape.small(ctx), ctx.token)
            if not 200 <= status < 300:
                raise RuntimeError(f"{shape.door} small request: HTTP {status} {answer[:300]!r}")
        with PeakMeter(pid) as small:
            status, answer, _ = send(port, shape.small(ctx), ctx.token)
        if not 200 <= status < 300:
            raise RuntimeError(f"{shape.door} small request: HTTP {status} {answer[:300]!r}")
        with PeakMeter(pid) as worst:
            status, answer, seconds = send(port, request, ctx.token, timeout)
    finally:
        proc = procs.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # still in the request: uvicorn waits for it
            proc.kill()
            proc.wait()
    return Measured(shape, status, worst.growth_mb, small.growth_mb, seconds, len(request.body), answer)


def prepare() -> Context:
    """The bench's site, an agent token, and a running job for the events door."""
    from console.models import AgentToken
    from fleet.models import Job, Site
    from fleet.training.events import parse_job_events, record_job_events

    site, _ = Site.objects.get_or_create(name="bench-bounds", defaults={"region": "bench", "contracted_power_kw": 1})
    run = secrets.token_hex(3)
    token = AgentToken.issue(site=site, name=f"bench-bounds-{run}")[1]
    now_ms = int(time.time() * 1000) - 3_600_000  # an hour ago; events step forward from there
    job = Job.objects.create(
        site=site, name=f"bench-bounds-{run}", team="bench", gang_size=8, scheduler_id=f"bench-bounds/{run}"
    )
    start = datetime.fromtimestamp(now_ms / 1000, UTC) - timedelta(minutes=5)
    begin = [
        {"id": "allocated", "ts": start.isoformat(), "kind": "allocated"},
        {"id": "started", "ts": (start + timedelta(seconds=30)).isoformat(), "kind": "started"},
    ]
    record_job_events(job.pk, parse_job_events(json.dumps({"events": begin}).encode()))
    return Context(token=token, job_id=job.pk, now_ms=now_ms, serial=iter(range(1, 10**6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--door", action="append", choices=DOORS, help="measure only this door (repeatable)")
    parser.add_argument("--shape", action="append", help="measure only the request of this name (repeatable)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds to wait for an answer (default 1200)")
    parser.add_argument(
        "--alerts",
        type=int,
        help="send this many alerts rather than all the webhook's 2 MiB take (about 6,100, which take some 11 "
        "minutes on a 2-core machine: each alert re-reads its incident's findings)",
    )
    args = parser.parse_args()
    setup_django()
    from fleet.telemetry import partitions

    partitions.ensure_partitions(
        partitions.SAMPLES, datetime.now(UTC) - timedelta(days=1), datetime.now(UTC) + timedelta(days=1)
    )
    ctx = prepare()
    ctx.alerts = args.alerts
    log(f"limits: {limits()}")
    procs = Processes()
    results: list[Measured] = []
    for shape in SHAPES:
        if (args.door and shape.door not in args.door) or (args.shape and shape.name not in args.shape):
            continue
        result = measure(shape, ctx, procs, args.timeout)
        results.append(result)
        log(
            f"{shape.door:>15} {shape.name:<20} {result.body_bytes / 2**20:6.2f} MiB -> HTTP {result.status} in "
            f"{result.seconds:5.1f} s: peak RSS growth {result.growth_mb:6.1f} MB (small request "
            f"{result.baseline_mb:.2f} MB){'' if result.as_expected else '  UNEXPECTED: ' + repr(result.answer[:300])}"
        )
        if shape.refused:
            log(f"{'':>15} {'':<20} answer: {result.answer[:300].decode(errors='replace')}")
    procs.stop()
    procs.discard_logs()
    judged = [r for r in results if not r.shape.refused]
    by_door = {door: max((r.growth_mb for r in judged if r.shape.door == door), default=None) for door in DOORS}
    worst = max((r.growth_mb for r in judged), default=0.0)
    baseline = max((r.baseline_mb for r in results), default=0.0)
    ok = worst < TARGET_MB and all(r.as_expected for r in results)
    refused = [r for r in results if r.shape.refused]
    parts = [f"{door}_mb={mb:.1f}" for door, mb in by_door.items() if mb is not None]
    parts += [f"issue_37_request_mb={r.growth_mb:.1f} issue_37_status={r.status}" for r in refused]
    parts += [
        f"baseline_mb={baseline:.2f}",
        f"max_mb={worst:.1f}",
        f"target_mb={TARGET_MB}",
        f"ok={'yes' if ok else 'no'}",
    ]
    print("RESULT " + " ".join(parts), flush=True)


if __name__ == "__main__":
    main()
