"""The real thing: a Prometheus server (Debian's `prometheus`, installed by .ci/run) scrapes a
dcgm-exporter and remote-writes to a running console (uvicorn and a Celery worker, production
mode), with an agent token and write_relabel_configs keeping the series the console maps."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from fleet.models import GpuSample, GpuState, IngestBatch
from tests.conftest import redis_url
from tests.stack import Stack, free_port

PROMETHEUS = shutil.which("prometheus")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DCGM = (FIXTURES / "dcgm-exporter.prom").read_bytes()
GPU0 = "GPU-3f1c2a9e-8b1d-4c55-9e0a-1b2c3d4e5f60"
GPU1 = "GPU-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"

pytestmark = [
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
]

CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dcgm
    static_configs:
      - targets: ["127.0.0.1:{exporter}"]
remote_write:
  - url: "{console}/api/v1/ingest/prometheus/remote-write"
    authorization:
      credentials: "{token}"
    write_relabel_configs:
      - source_labels: [__name__]
        regex: "DCGM_FI_.*|vllm:.*|nv_.*|tgi_.*|node_(infiniband|network|disk|filesystem|mountstats)_.*"
        action: keep
    queue_config:
      batch_send_deadline: 1s
      min_backoff: 100ms
      max_backoff: 1s
"""


class Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(DCGM)))
        self.end_headers()
        self.wfile.write(DCGM)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url(), tmp_path)
    stack.flush_redis()
    stack.start_worker()
    stack.start_server()
    yield stack
    stack.stop()
    stack.flush_redis()  # pushes Prometheus sent while the worker stopped: no later test's queue


def remote_storage_metric(port: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_prometheus_remote_writes_dcgm_exporter_series_into_the_console(
    tmp_path: Path, console: Stack, exporter: int, token_a: str
) -> None:
    # A real client is the point of this test: without one it fails, it does not skip.
    assert PROMETHEUS, "needs Debian's prometheus package: apt-get install prometheus (.ci/run installs it)"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(CONFIG.format(exporter=exporter, console=console.base_url, token=token_a))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    prometheus = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and GpuState.objects.filter(gpu__uuid__in=[GPU0, GPU1]).count() < 2:
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        states = {s.gpu.uuid: s for s in GpuState.objects.select_related("gpu__node")}
        assert set(states) == {GPU0, GPU1}, (tmp_path / "prometheus.log").read_text()[-3000:]
        assert (states[GPU0].gpu_temp_c, states[GPU1].gpu_temp_c) == (61, 87)
        assert states[GPU1].memory_temp_c is None and states[GPU1].xid == 79
        assert states[GPU0].energy_mj == 918273645512
        assert states[GPU0].gpu.node.hostname == "gpu-a-001"
        assert GpuSample.objects.count() >= 2 and IngestBatch.objects.exists()
        # Every sample Prometheus sent was taken (2xx): none failed, none dropped as a 4xx.
        sent = remote_storage_metric(port, "prometheus_remote_storage_samples_total")
        assert sent > 0
        assert remote_storage_metric(port, "prometheus_remote_storage_samples_failed_total") == 0
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prometheus.kill()
        log.close()
