"""The simulator: a realistic fleet, faults later detectors will catch, and agent-like posting."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from io import StringIO

import pytest
from django.core.management import call_command

from fleet.ingest.batches import parse_gpu_batch
from fleet.models import Gpu, GpuSample, Site
from fleet.telemetry.simulator import DEFAULT_SITES, REASON_HW_THERMAL, FleetSimulator, Poster, build_fleet


def test_the_default_fleet_is_three_sites_of_real_gpu_models() -> None:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=None, seed=7)
    gpus = [g for site in fleet.values() for g in site]
    assert len(fleet) == 3 and 256 <= len(gpus) <= 512
    assert {g.model.name for g in gpus} == {
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H200",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L40S",
    }
    assert len({g.uuid for g in gpus}) == len(gpus)
    # The same seed gives the same GPUs, so a restarted demo keeps its inventory.
    assert [g.uuid for g in build_fleet(DEFAULT_SITES, gpu_limit=None, seed=7)["ams-1"]] == [
        g.uuid for g in fleet["ams-1"]
    ]


def test_samples_pass_the_ingest_schema_and_training_runs_hot() -> None:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=None, seed=1)
    sim = FleetSimulator(fleet, fault_rate_per_gpu_hour=0, interval=5, seed=1)
    batches = sim.batches(datetime.now(UTC))
    for samples in batches.values():
        parse_gpu_batch(json.dumps({"samples": samples}).encode())  # raises on any invalid field
    training = [s for s in batches["ams-1"] if "h100" in s["hostname"]]
    assert sum(s["gpu_util"] for s in training) / len(training) > 85


def test_faults_show_up_as_xid_79_double_bit_ecc_and_thermal_throttling() -> None:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=64, seed=3)
    sim = FleetSimulator(fleet, fault_rate_per_gpu_hour=3600 / 5, interval=5, seed=3)  # every GPU faults at once
    samples = [s for batch in sim.batches(datetime.now(UTC)).values() for s in batch]
    assert any(s["xid"] == 79 and s["gpu_util"] == 0 for s in samples)
    assert any(s["ecc_dbe_total"] > 0 and s["remapped_rows_uncorrectable"] > 0 for s in samples)
    assert any(s["throttle_reasons"] & REASON_HW_THERMAL for s in samples)


class _Recorder(BaseHTTPRequestHandler):
    statuses: list[int] = []
    seen: list[tuple[str, str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.headers["Idempotency-Key"], self.headers.get("Authorization")))
        status = type(self).statuses.pop(0) if type(self).statuses else 202
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "1")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.statuses, _Recorder.seen = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_poster_retries_5xx_and_429_with_capped_backoff_and_the_same_key(recorder: str) -> None:
    sleeps: list[float] = []
    _Recorder.statuses = [503, 500, 429, 202]
    response = Poster(recorder, {"s": "gp_x_y"}, sleep=sleeps.append).post("s", [{"a": 1}])
    assert response is not None and response.status_code == 202
    assert sleeps == [0.25, 0.5, 1.0]  # exponential, then Retry-After: 1 honoured
    keys = {key for key, _ in _Recorder.seen}
    assert len(_Recorder.seen) == 4 and len(keys) == 1  # one idempotency key across retries
    assert _Recorder.seen[0][1] == "Bearer gp_x_y"


def test_the_poster_never_retries_other_4xx(recorder: str) -> None:
    sleeps: list[float] = []
    _Recorder.statuses = [400]
    response = Poster(recorder, {"s": "t"}, sleep=sleeps.append).post("s", [])
    assert response is not None and response.status_code == 400
    assert sleeps == [] and len(_Recorder.seen) == 1


@pytest.mark.django_db(transaction=True)
def test_simulate_posts_through_the_http_api(live_server) -> None:  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("simulate", url=live_server.url, gpus=24, ticks=2, interval=0.2, stdout=out, stderr=out)
    assert "Simulating 24 GPUs" in out.getvalue()
    assert Gpu.objects.count() == 24
    assert GpuSample.objects.count() == 48
    assert Site.objects.get(name="ams-1").contracted_power_kw == 520
