"""goodput-agent: NVML readings in console units, no-driver help, retry/backoff, the disk spool,
a graceful stop on SIGTERM/SIGINT, and a spool whose disk is full or read-only.

The only fake is at the pynvml boundary: ``FakeNvml`` answers the calls the agent makes, with the
real pynvml ctypes types for handles and results and the real pynvml exception classes, so the
agent's except-clauses run for real. The console's HTTP side is a small local ``http.server``;
delivery, retries and the spool go through real sockets, real ``requests`` and real files.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pynvml
import pytest

from clients import agent
from clients.agent import INGEST_PATH, Agent, AgentSetupError, Batch, NvmlReader, Rejected, Sender, Spool, Unreachable
from fleet.ingest.batches import parse_gpu_batch
from tests.parallel import free_port

HOST = "gpu-node-01"
MIB = 2**20

# --- the pynvml boundary ------------------------------------------------------------------------


@dataclass
class FakeGpu:
    """One GPU's NVML answers, in NVML's own units (bytes, mW, mJ)."""

    uuid: str | bytes
    name: str | bytes
    util_gpu: int = 0
    util_memory: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    temp_c: int = 40
    power_mw: int = 100_000
    sm_clock_mhz: int = 1410
    mem_clock_mhz: int = 1593
    energy_mj: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failed
    pcie_replays: int = 0
    clocks_event_reasons: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # NVML function name -> NVML_ERROR_* it returns


class FakeNvml:
    """The part of the pynvml module the agent uses. No driver, no GPU: answers come from FakeGpu."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        # Real handles are opaque ctypes pointers (c_nvmlDevice_t); give each GPU a distinct address.
        self._addresses = [0x7F00_0000_1000 + 0x100 * i for i in range(len(gpus))]
        self.event_sets: list[object] = []
        self.registered: list[tuple[int, int]] = []  # (gpu index, event types)
        self.freed: list[object] = []
        self.pending: deque[tuple[int, int]] = deque()  # (gpu index, xid) waiting in the event set
        self.register_error: int | None = None

    # the test's side

    def raise_xid(self, index: int, xid: int) -> None:
        self.pending.append((index, xid))

    # the module surface

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check()
        return self._handle(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return self._answer("nvmlDeviceGetUUID", handle, lambda g: g.uuid)

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._answer("nvmlDeviceGetName", handle, lambda g: g.name)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return self._answer(
            "nvmlDeviceGetUtilizationRates",
            handle,
            lambda g: pynvml.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_memory),
        )

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return self._answer(
            "nvmlDeviceGetMemoryInfo",
            handle,
            lambda g: pynvml.c_nvmlMemory_t(total=g.used_bytes + g.free_bytes, free=g.free_bytes, used=g.used_bytes),
        )

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._answer("nvmlDeviceGetTemperature", handle, lambda g: g.temp_c)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._answer("nvmlDeviceGetPowerUsage", handle, lambda g: g.power_mw)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        clocks = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}
        return self._answer("nvmlDeviceGetClockInfo", handle, lambda g: getattr(g, clocks[clock]))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._answer("nvmlDeviceGetTotalEnergyConsumption", handle, lambda g: g.energy_mj)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return self._answer(
            "nvmlDeviceGetTotalEccErrors", handle, lambda g: g.ecc_corrected if corrected else g.ecc_uncorrected
        )

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._answer("nvmlDeviceGetRemappedRows", handle, lambda g: g.remapped_rows)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._answer("nvmlDeviceGetPcieReplayCounter", handle, lambda g: g.pcie_replays)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._answer("nvmlDeviceGetCurrentClocksEventReasons", handle, lambda g: g.clocks_event_reasons)

    def nvmlEventSetCreate(self) -> object:
        self._check()
        event_set = object()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: object) -> None:
        self._check()
        assert event_set in self.event_sets
        if self.register_error is not None:
            raise pynvml.NVMLError(self.register_error)
        self.registered.append((self._index(handle), event_types))

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self._check()
        assert event_set in self.event_sets
        if not self.pending:
            raise pynvml.NVMLError_Timeout()
        index, xid = self.pending.popleft()
        # As pynvml returns it: a c_nvmlEventData_t whose .device is a NEW pointer object to the handle.
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handle(index)
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check()
        self.freed.append(event_set)

    # helpers

    def _check(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _handle(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.c_nvmlDevice_t.from_buffer_copy(ctypes.c_void_p(self._addresses[index]))

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if address not in self._addresses:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._addresses.index(address)

    def _answer(self, name: str, handle: Any, value: Any) -> Any:
        self._check()
        gpu = self.gpus[self._index(handle)]
        if name in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[name])
        return value(gpu)


def h100() -> FakeGpu:
    return FakeGpu(
        uuid="GPU-5b9f1a0e-8c4d-4e6f-9a21-3c7d2e8b1f40",
        name="NVIDIA H100 80GB HBM3",
        util_gpu=87,
        util_memory=41,
        used_bytes=61_440 * MIB,
        free_bytes=20_119 * MIB,
        temp_c=67,
        power_mw=612_345,
        sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        energy_mj=123_456_789_012,
        ecc_corrected=3,
        ecc_uncorrected=1,
        remapped_rows=(2, 1, 0, 1),
        pcie_replays=5,
        clocks_event_reasons=pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    )


def l40s() -> FakeGpu:
    # Older nvidia-ml-py returned bytes for UUID and name; the agent must accept both.
    return FakeGpu(
        uuid=b"GPU-0d3e7c21-44aa-4b0e-8f19-6a5e2c9d7b33",
        name=b"NVIDIA L40S",
        util_gpu=12,
        util_memory=3,
        used_bytes=1_024 * MIB,
        free_bytes=44_966 * MIB,
        temp_c=38,
        power_mw=88_000,
        errors={
            "nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetPcieReplayCounter": pynvml.NVML_ERROR_UNKNOWN,
        },
    )


def make_reader(*gpus: FakeGpu) -> tuple[NvmlReader, FakeNvml]:
    nvml = FakeNvml(list(gpus) or [h100(), l40s()])
    return NvmlReader(nvml=nvml), nvml


def validate(body: bytes) -> Any:
    """The console's own ingest schema; raises IngestError on any field it would refuse."""
    return parse_gpu_batch(body)


# --- the console's HTTP side -------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: Message
    body: bytes

    @property
    def key(self) -> str:
        return self.headers["Idempotency-Key"]


class FakeConsole:
    """Answers POSTs from a script of (status, headers), then 202; records every request it gets.

    ``hold_next()`` makes the next request wait in the handler, as a slow console would, until
    ``release()``: ``arrived`` says the request is being held.
    """

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._script: list[tuple[int, dict[str, str]]] = []
        self._gate: threading.Event | None = None
        self._gates: list[threading.Event] = []
        self.arrived = threading.Event()
        console = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with console._lock:
                    console._received.append(Received(self.path, self.headers, body))
                    gate, console._gate = console._gate, None
                if gate is not None:
                    console.arrived.set()
                    gate.wait()
                with console._lock:
                    status, headers = console._script.pop(0) if console._script else (202, {})
                payload = json.dumps({"error": "refused"} if 400 <= status < 500 else {}).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, *responses: int | tuple[int, dict[str, str]]) -> None:
        with self._lock:
            self._script = [r if isinstance(r, tuple) else (r, {}) for r in responses]

    def hold_next(self) -> None:
        with self._lock:
            self._gate = threading.Event()
            self._gates.append(self._gate)

    def release(self) -> None:
        for gate in self._gates:
            gate.set()

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def stop(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def console() -> Iterator[FakeConsole]:
    server = FakeConsole()
    yield server
    server.stop()


def batch(n: int = 0) -> Batch:
    return Batch(key=str(uuid.uuid4()), body=json.dumps({"samples": [], "n": n}).encode())


# --- 1. reading the GPUs -----------------------------------------------------------------------


def test_it_maps_nvml_readings_to_the_ingest_fields_in_console_units() -> None:
    reader, nvml = make_reader(h100(), l40s())
    samples = reader.read(HOST)

    assert [s["gpu_index"] for s in samples] == [0, 1]
    h, l = samples  # noqa: E741
    assert h["gpu_uuid"] == "GPU-5b9f1a0e-8c4d-4e6f-9a21-3c7d2e8b1f40" and h["model"] == "NVIDIA H100 80GB HBM3"
    assert l["gpu_uuid"] == "GPU-0d3e7c21-44aa-4b0e-8f19-6a5e2c9d7b33" and l["model"] == "NVIDIA L40S"  # bytes decoded
    assert h["hostname"] == HOST and datetime.fromisoformat(h["ts"]).tzinfo is not None
    assert h["gpu_util"] == 87.0 and h["mem_copy_util"] == 41.0
    assert h["fb_used_mib"] == 61_440.0 and h["fb_free_mib"] == 20_119.0  # bytes -> MiB
    assert h["power_w"] == pytest.approx(612.345)  # mW -> W
    assert h["gpu_temp_c"] == 67 and h["sm_clock_mhz"] == 1980 and h["mem_clock_mhz"] == 2619
    assert h["energy_mj"] == 123_456_789_012  # NVML already reports mJ
    assert h["ecc_sbe_total"] == 3 and h["ecc_dbe_total"] == 1  # volatile corrected / uncorrected
    assert (h["remapped_rows_correctable"], h["remapped_rows_uncorrectable"], h["row_remap_failure"]) == (2, 1, 1)
    assert h["pcie_replay_total"] == 5
    assert h["throttle_reasons"] == 0x4 | 0x40
    assert h["xid"] == 0  # events registered, none seen
    assert sorted(nvml.registered) == [(i, pynvml.nvmlEventTypeXidCriticalError) for i in (0, 1)]

    # NotSupported (and any other NVML error) on one field is null, never a number, and never a crash.
    assert l["remapped_rows_correctable"] is None and l["remapped_rows_uncorrectable"] is None
    assert l["row_remap_failure"] is None and l["energy_mj"] is None and l["pcie_replay_total"] is None
    assert l["power_w"] == 88.0 and l["fb_used_mib"] == 1_024.0

    parsed = validate(json.dumps({"samples": samples}).encode())
    assert [s.gpu_uuid for s in parsed.samples] == [h["gpu_uuid"], l["gpu_uuid"]]
    assert parsed.samples[0].power_w == pytest.approx(612.345) and parsed.samples[1].energy_mj is None

    reader.close()
    assert nvml.freed == nvml.event_sets and not nvml.initialised


def test_it_reports_a_whole_unsupported_reading_as_null_and_the_batch_still_validates() -> None:
    gpu = h100()
    gpu.errors = dict.fromkeys(
        ["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage"],
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    ) | {"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_GPU_IS_LOST}
    reader, _ = make_reader(gpu)
    [sample] = reader.read(HOST)
    for name in ("gpu_util", "mem_copy_util", "fb_used_mib", "fb_free_mib", "power_w", "throttle_reasons"):
        assert sample[name] is None, name
    assert sample["gpu_temp_c"] == 67
    validate(json.dumps({"samples": [sample]}).encode())


def test_it_shows_an_xid_event_on_the_gpu_that_raised_it_only() -> None:
    reader, nvml = make_reader(h100(), l40s())
    nvml.raise_xid(1, 79)  # "GPU has fallen off the bus" on the L40S
    samples = reader.read(HOST)
    assert [s["xid"] for s in samples] == [0, 79]
    assert not nvml.pending  # the agent drained the event set until NVML timed out
    validate(json.dumps({"samples": samples}).encode())


def test_it_reports_xid_as_null_when_the_gpu_cannot_deliver_xid_events() -> None:
    nvml = FakeNvml([h100(), l40s()])
    nvml.register_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    reader = NvmlReader(nvml=nvml)
    samples = reader.read(HOST)
    assert [s["xid"] for s in samples] == [None, None]
    assert samples[0]["power_w"] == pytest.approx(612.345)
    validate(json.dumps({"samples": samples}).encode())


# --- 2. no driver ------------------------------------------------------------------------------


def test_it_refuses_to_start_without_the_nvidia_driver_and_names_the_alternatives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        pynvml.nvmlInit()  # the real bindings: on a host without a driver, they refuse here
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        # A host with a driver: take it away at the pynvml boundary, the way a missing
        # libnvidia-ml.so fails.
        pynvml.nvmlShutdown()

        def no_library() -> None:
            raise pynvml.NVMLError_LibraryNotFound()

        monkeypatch.setattr(pynvml, "nvmlInit", no_library)

    with pytest.raises(AgentSetupError) as excinfo:
        NvmlReader()
    message = str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, pynvml.NVMLError_LibraryNotFound)
    assert "libnvidia-ml.so" in message and "dcgm-exporter" in message and "manage.py simulate" in message

    spool_dir = tmp_path / "spool"
    assert agent.main(["--token", "x", "--spool-dir", str(spool_dir)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"goodput-agent: {message}"
    assert not spool_dir.exists()  # it stopped before touching anything


def test_it_is_installed_as_the_goodput_agent_command() -> None:
    [script] = importlib.metadata.entry_points(group="console_scripts", name="goodput-agent")
    assert script.value == "clients.agent:main" and script.load() is agent.main


# --- 3. backoff --------------------------------------------------------------------------------


def test_backoff_is_exponential_from_half_a_second_capped_at_five_and_raised_by_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent.random, "uniform", lambda low, high: high)  # no jitter
    assert [Sender.backoff(a, None) for a in range(7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert Sender.backoff(0, "3") == 3.0  # Retry-After raises the wait
    assert Sender.backoff(1, "2.5") == 2.5
    assert Sender.backoff(3, "1") == 4.0  # ...but never shortens it
    assert Sender.backoff(0, "120") == 5.0  # ...and stays within the cap
    assert Sender.backoff(0, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.5  # an HTTP-date is ignored, not fatal

    monkeypatch.setattr(agent.random, "uniform", lambda low, high: low)  # most jitter
    assert [Sender.backoff(a, None) for a in range(6)] == [0.4, 0.8, 1.6, 3.2, 4.0, 4.0]

    monkeypatch.undo()
    for attempt, ceiling in enumerate([0.5, 1.0, 2.0, 4.0, 5.0, 5.0]):
        waits = [Sender.backoff(attempt, None) for _ in range(200)]
        assert all(0.8 * ceiling <= w <= ceiling for w in waits)


def test_it_retries_5xx_and_429_with_the_same_idempotency_key_on_the_backoff_schedule(console: FakeConsole) -> None:
    console.answer(503, 503, (429, {"Retry-After": "3"}), 500, 202)
    sleeps: list[float] = []
    sender = Sender(console.url + "/", "gp_site_secret", sleep=sleeps.append)
    sent = batch()
    sender.send(sent)

    received = console.received
    assert len(received) == 5
    assert {r.key for r in received} == {sent.key}
    assert all(r.body == sent.body and r.path == INGEST_PATH for r in received)
    assert received[0].headers["Authorization"] == "Bearer gp_site_secret"
    assert received[0].headers["Content-Type"] == "application/json"
    assert len(sleeps) == 4
    assert 0.4 <= sleeps[0] <= 0.5 and 0.8 <= sleeps[1] <= 1.0
    assert sleeps[2] == 3.0  # Retry-After: 3 beats the 1.6-2.0 s the schedule would give
    assert 3.2 <= sleeps[3] <= 4.0


def test_it_gives_up_after_its_attempts_when_the_console_keeps_failing(console: FakeConsole) -> None:
    console.answer(*[503] * 10)
    sleeps: list[float] = []
    with pytest.raises(Unreachable):
        Sender(console.url, "t", attempts=3, sleep=sleeps.append).send(batch())
    assert len(console.received) == 3 and len(sleeps) == 2  # no sleep after the last attempt

    sleeps.clear()
    with pytest.raises(Unreachable):
        Sender(f"http://127.0.0.1:{free_port()}", "t", attempts=3, sleep=sleeps.append).send(batch())
    assert len(sleeps) == 2  # connection refused is retried the same way


# --- 4. refused batches ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 413])
def test_it_never_retries_a_batch_the_console_refuses(console: FakeConsole, tmp_path: Path, status: int) -> None:
    sleeps: list[float] = []
    sender = Sender(console.url, "t", attempts=5, sleep=sleeps.append)
    console.answer(status)
    with pytest.raises(Rejected, match=f"HTTP {status}"):
        sender.send(batch())
    assert len(console.received) == 1 and sleeps == []

    console.answer(status)
    spool = Spool(tmp_path / "spool")
    reader, _ = make_reader()
    Agent(reader, sender, spool, hostname=HOST).tick()
    assert len(console.received) == 2 and sleeps == []
    assert len(spool) == 0 and list(spool.directory.iterdir()) == []  # dropped, not spooled


def test_a_spooled_batch_the_console_refuses_is_dropped_and_the_rest_still_drain(
    console: FakeConsole, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool")
    first, second = batch(1), batch(2)
    spool.put(first)
    spool.put(second)
    console.answer(400)
    reader, _ = make_reader()
    Agent(reader, Sender(console.url, "t", attempts=2, sleep=lambda s: None), spool, hostname=HOST).tick()
    assert [r.key for r in console.received][:2] == [first.key, second.key]
    assert len(console.received) == 3 and len(spool) == 0


def test_a_refused_token_keeps_the_spool_for_the_next_token(console: FakeConsole, tmp_path: Path) -> None:
    """After an outage and a token rotation, 401 says the token is wrong, not the data: keep it."""
    spool = Spool(tmp_path / "spool")
    spool.put(batch(1))
    spool.put(batch(2))
    console.answer(401)
    reader, _ = make_reader()
    Agent(reader, Sender(console.url, "old", attempts=2, sleep=lambda s: None), spool, hostname=HOST).tick()
    assert len(console.received) == 1  # stopped at the first refusal; the new batch waits too
    assert len(spool) == 3


# --- 5. the spool across an outage and a restart -----------------------------------------------


def test_the_spool_survives_an_agent_restart_and_drains_oldest_first(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spool_dir = tmp_path / "spool"
    sleeps: list[float] = []

    # The console is down: every tick's batch goes to disk, behind the ones already waiting.
    reader, _ = make_reader()
    before = Agent(reader, Sender(url, "t", attempts=2, sleep=sleeps.append), Spool(spool_dir), hostname=HOST)
    for _ in range(3):
        before.tick()
    waiting = sorted(spool_dir.glob("*.json"))
    # The first batch gets the full retry schedule; once batches wait in the spool, a tick probes
    # the console with one attempt and spools at once, so sampling keeps its pace during an outage.
    assert len(waiting) == 3 and sleeps == [pytest.approx(0.45, abs=0.05)]
    spooled_keys = [Spool.load(p).key for p in waiting]
    for path in waiting:
        validate(path.read_bytes())  # what waits on disk is a batch the console will take

    # The agent restarts (new objects, same directory) and the console comes back on the same URL.
    console = FakeConsole(port)
    try:
        reader, _ = make_reader()
        after = Agent(reader, Sender(url, "t", attempts=2, sleep=sleeps.append), Spool(spool_dir), hostname=HOST)
        after.tick()
        received = console.received
    finally:
        console.stop()

    assert [r.key for r in received][:3] == spooled_keys  # oldest first
    assert len(received) == 4 and received[3].key not in spooled_keys  # then this tick's batch
    stamps = [datetime.fromisoformat(json.loads(r.body)["samples"][0]["ts"]) for r in received]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4
    assert len(after.spool) == 0 and list(spool_dir.iterdir()) == []


# --- 6. the spool's files ----------------------------------------------------------------------


def test_a_spool_write_is_atomic_and_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path / "spool")
    written = batch()
    spool.put(written)
    [path] = list(spool.directory.iterdir())
    assert path.suffix == ".json" and not list(spool.directory.glob("*.tmp"))
    assert Spool.load(path) == written

    # A crash between writing and renaming never leaves half a batch where the drain would find it.
    def power_cut(src: object, dst: object) -> None:
        raise OSError("power cut")

    monkeypatch.setattr("clients.agent.os.replace", power_cut)
    with pytest.raises(OSError):
        spool.put(batch())
    assert spool.files() == [path]
    assert list(spool.directory.iterdir()) == [path]  # the written-but-not-renamed file is removed


def test_a_half_written_spool_file_from_a_crash_is_cleaned_up(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    (directory / "00000000000000000001-k.json.tmp").write_bytes(b'{"samp')
    spool = Spool(directory)
    assert not list(directory.iterdir()) and len(spool) == 0


def test_a_full_spool_drops_the_oldest_batch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path / "spool", max_batches=3)
    batches = [batch(n) for n in range(5)]
    for b in batches:
        spool.put(b)
    assert [Spool.load(p) for p in spool.files()] == batches[2:]
    assert len(list(spool.directory.iterdir())) == 3
    assert "spool full" in caplog.text


# --- 7. stopping on SIGTERM / SIGINT -----------------------------------------------------------


def test_a_stop_request_skips_the_remaining_attempts_and_spools_the_batch(console: FakeConsole, tmp_path: Path) -> None:
    stop = threading.Event()
    sender = Sender(console.url, "t", attempts=5, stop=stop)  # the real backoff wait: stop.wait
    console.answer(*[503] * 5)
    stop.set()
    with pytest.raises(Unreachable, match="stopping"):
        sender.send(batch())
    assert len(console.received) == 1  # the attempt in flight, then nothing

    spool = Spool(tmp_path / "spool")
    older = batch(1)
    spool.put(older)
    reader, _ = make_reader()
    Agent(reader, sender, spool, hostname=HOST).tick()
    # Stopping: the spooled batch waits on disk for the next start, and this tick's batch joins it.
    assert len(console.received) == 1
    waiting = [Spool.load(p) for p in spool.files()]
    assert waiting[0] == older and len(waiting) == 2
    assert len(json.loads(waiting[1].body)["samples"]) == 2


FAKE_PYNVML = """\
# pynvml as goodput-agent calls it, for running the agent as a process without a driver.
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


NVML_TEMPERATURE_GPU = {NVML_TEMPERATURE_GPU}
NVML_CLOCK_SM = {NVML_CLOCK_SM}
NVML_CLOCK_MEM = {NVML_CLOCK_MEM}
NVML_MEMORY_ERROR_TYPE_CORRECTED = {NVML_MEMORY_ERROR_TYPE_CORRECTED}
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = {NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
NVML_VOLATILE_ECC = {NVML_VOLATILE_ECC}
nvmlEventTypeXidCriticalError = {nvmlEventTypeXidCriticalError}
UUIDS = ["GPU-5b9f1a0e-8c4d-4e6f-9a21-3c7d2e8b1f40", "GPU-0d3e7c21-44aa-4b0e-8f19-6a5e2c9d7b33"]


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(UUIDS)
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetUUID(handle): return UUIDS[handle]
def nvmlDeviceGetName(handle): return "NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUtilizationRates(handle): return SimpleNamespace(gpu=87, memory=41)
def nvmlDeviceGetMemoryInfo(handle): return SimpleNamespace(used=61_440 * 2**20, free=20_119 * 2**20)
def nvmlDeviceGetTemperature(handle, sensor): return 67
def nvmlDeviceGetPowerUsage(handle): return 612_345
def nvmlDeviceGetClockInfo(handle, clock): return 1980
def nvmlDeviceGetTotalEnergyConsumption(handle): return 123_456_789
def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type): return 0
def nvmlDeviceGetRemappedRows(handle): return (0, 0, 0, 0)
def nvmlDeviceGetPcieReplayCounter(handle): return 0
def nvmlDeviceGetCurrentClocksEventReasons(handle): return 0
def nvmlEventSetCreate(): return object()
def nvmlDeviceRegisterEvents(handle, event_types, event_set): pass
def nvmlEventSetWait_v2(event_set, timeout_ms): raise NVMLError_Timeout()
def nvmlEventSetFree(event_set): pass
"""


class AgentProcess:
    """``python -m clients.agent`` as a service manager runs it, with the fake pynvml first on the path."""

    def __init__(self, tmp_path: Path, url: str, *args: str) -> None:
        fake = tmp_path / "fake-nvml"
        fake.mkdir(exist_ok=True)
        names = [n for n in dir(pynvml) if n.startswith("NVML_") or n == "nvmlEventTypeXidCriticalError"]
        (fake / "pynvml.py").write_text(FAKE_PYNVML.format(**{n: getattr(pynvml, n) for n in names}))
        self.spool_dir = tmp_path / "spool"
        env = {**os.environ, "PYTHONPATH": str(fake), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "clients.agent", "--url", url, "--token", "t"]
        self.proc = subprocess.Popen(
            [*command, "--spool-dir", str(self.spool_dir), "--verbose", *args],
            cwd=Path(agent.__file__).resolve().parents[1],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()

    @property
    def log(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def wait_for(self, text: str) -> None:
        with self._changed:
            found = self._changed.wait_for(lambda: text in "".join(self._lines), timeout=60)
        assert found, f"agent never logged {text!r}:\n{self.log}"

    def finish(self) -> int:
        """The exit status; a process still running after a minute has ignored the signal."""
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join()


def keys_in(spool_dir: Path) -> list[str]:
    return [Spool.load(p).key for p in sorted(spool_dir.glob("*.json"))]


@pytest.mark.parametrize("answer", [503, 202])
def test_sigterm_mid_tick_finishes_the_tick_and_exits_0_with_the_batch_sent_or_spooled(
    console: FakeConsole, tmp_path: Path, answer: int
) -> None:
    console.answer(*[answer] * 5)
    console.hold_next()  # the console is slow: the agent's first POST hangs until we release it
    process = AgentProcess(tmp_path, console.url, "--interval", "3600")
    try:
        assert console.arrived.wait(timeout=60), process.log
        process.proc.send_signal(signal.SIGTERM)
        process.wait_for("SIGTERM received")  # the stop is requested while the request is in flight
        console.release()
    finally:
        status = process.finish()
    assert status == 0, process.log  # well before the 3600 s interval, and before any retry schedule

    [posted] = console.received  # one attempt: a stopping agent skips its remaining retries
    validate(posted.body)
    assert len(json.loads(posted.body)["samples"]) == 2
    assert "Traceback" not in process.log
    if answer == 503:
        # Not taken: the batch is on disk, under its key, for the next start.
        assert keys_in(process.spool_dir) == [posted.key]
        assert "stopping: SIGTERM; 1 batch(es) wait in the spool" in process.log
        console.answer()
        assert AgentProcess(tmp_path, console.url, "--once").finish() == 0
        received = console.received
        assert [r.key for r in received][:2] == [posted.key, posted.key]  # the same key: stored once
        assert received[1].body == posted.body and len(received) == 3
        assert keys_in(process.spool_dir) == []
    else:
        assert keys_in(process.spool_dir) == []
        assert "stopping: SIGTERM; 0 batch(es) wait in the spool" in process.log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_between_ticks_exits_0_at_once_with_nothing_lost(
    console: FakeConsole, tmp_path: Path, signum: signal.Signals
) -> None:
    process = AgentProcess(tmp_path, console.url, "--interval", "3600")
    try:
        process.wait_for("sent: 2 samples")  # the first tick is done; the agent waits for the next
        process.proc.send_signal(signum)
    finally:
        status = process.finish()
    assert status == 0, process.log  # the 3600 s wait ends with the signal
    [posted] = console.received
    validate(posted.body)
    assert keys_in(process.spool_dir) == []
    assert f"stopping: {signum.name}; 0 batch(es) wait in the spool" in process.log
    assert "Traceback" not in process.log


# --- 8. a spool whose disk is full -------------------------------------------------------------


class SpoolDisk:
    """The spool's own small filesystem, which the test can fill and free.

    A 64 KiB tmpfs when the tests may mount one (they run as root): a real ENOSPC from write().
    Elsewhere, the spool directory is moved aside and a file put in its place: every write under
    it fails with ENOTDIR, the same OSError path, and moving it back is the space returning.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(root)]
        self.tmpfs = subprocess.run(mount, capture_output=True, check=False).returncode == 0
        self.errno = "ENOSPC" if self.tmpfs else "ENOTDIR"
        self.spool_dir = root / "spool"

    def fill(self) -> None:
        if self.tmpfs:
            with open(self.root / "filler", "ab", buffering=0) as f, pytest.raises(OSError) as excinfo:
                while True:
                    f.write(b"\0" * 4096)
            assert excinfo.value.errno == errno.ENOSPC
        else:
            self.spool_dir.rename(self.root / "spool.aside")
            self.spool_dir.write_bytes(b"")

    def free(self) -> None:
        if self.tmpfs:
            (self.root / "filler").unlink()
        else:
            self.spool_dir.unlink()
            (self.root / "spool.aside").rename(self.spool_dir)

    def close(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.root)], check=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SpoolDisk]:
    spool_disk = SpoolDisk(tmp_path / "disk")
    yield spool_disk
    spool_disk.close()


def test_a_full_spool_disk_holds_batches_in_memory_and_delivers_them_in_order_with_their_keys(
    disk: SpoolDisk, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    reader, _ = make_reader()
    spool = Spool(disk.spool_dir)
    # The first batch of an outage gets the full retry schedule; no test time goes to its waits.
    sender = Sender(url, "t", attempts=2, sleep=lambda s: None)
    ticker = Agent(reader, sender, spool, hostname=HOST, max_held=3)

    def unwritable_logs() -> list[str]:
        return [r.getMessage() for r in caplog.records if "cannot write to the spool" in r.getMessage()]

    # 1. The console is down and the disk has room: the batch is spooled.
    ticker.tick()
    [a] = keys_in(disk.spool_dir)

    # 2. The disk fills. Four ticks: no exception, batches held in memory, the oldest beyond 3 dropped.
    disk.fill()
    first_held: list[str] = []
    for n in range(4):
        ticker.tick()
        first_held = first_held or [held.key for held in ticker.held]
        assert not list(disk.root.rglob("*.tmp"))  # a failed write leaves no half-written file
        assert len(ticker.held) == min(n + 1, 3)
    [b] = first_held
    c, d, e = [held.key for held in ticker.held]
    assert b not in (c, d, e) and keys_in(disk.spool_dir) in ([a], [])  # [] when the spool is moved aside
    [message] = unwritable_logs()  # once for the episode, not once a tick
    assert str(disk.spool_dir) in message and disk.errno in message
    [drop] = [r for r in caplog.records if "dropped the oldest" in r.getMessage()]
    assert drop.levelname == "ERROR" and "2 samples lost" in drop.getMessage()

    # 3. Space returns, the console is still down: held batches go to disk behind the spooled one.
    disk.free()
    ticker.tick()
    assert not ticker.held
    f = keys_in(disk.spool_dir)[-1]
    assert keys_in(disk.spool_dir) == [a, c, d, e, f]
    assert "can be written again" in caplog.text

    # 4. The console answers: everything drains oldest first, then this tick's batch.
    console = FakeConsole(port)
    try:
        ticker.tick()
        delivered = [r.key for r in console.received]
    finally:
        console.stop()
    g = delivered[-1]
    assert delivered == [a, c, d, e, f, g] and keys_in(disk.spool_dir) == []

    # 5. A second episode: the disk fills while the console is down; the batches wait in memory.
    disk.fill()
    ticker.tick()
    ticker.tick()
    h, i = [held.key for held in ticker.held]
    assert len(unwritable_logs()) == 2 and keys_in(disk.spool_dir) == []

    # 6. The console answers while the disk is still full: held batches go straight from memory.
    console = FakeConsole(port)
    try:
        ticker.tick()
        received = console.received
    finally:
        console.stop()
    assert [r.key for r in received][:2] == [h, i] and len(received) == 3
    assert not ticker.held
    everything = delivered + [r.key for r in received]
    assert len(everything) == len(set(everything)) == 9 and b not in everything  # each once; only b lost
    assert sum(len(validate(r.body).samples) for r in received) == 6


def test_a_read_only_spool_does_not_resend_delivered_batches_or_crash(
    disk: SpoolDisk, console: FakeConsole, caplog: pytest.LogCaptureFixture
) -> None:
    """EROFS (a disk remounted read-only after an error): files can be read but not removed."""
    spool = Spool(disk.spool_dir)
    spooled = [batch(1), batch(2)]
    for waiting in spooled:
        spool.put(waiting)
    if disk.tmpfs:
        subprocess.run(["mount", "-o", "remount,ro", str(disk.root)], check=True)
        code = "EROFS"
    else:
        disk.spool_dir.chmod(0o555)  # not root: a directory we may not write to behaves the same
        code = "EACCES"
    reader, _ = make_reader()
    ticker = Agent(reader, Sender(console.url, "t", attempts=2, sleep=lambda s: None), spool, hostname=HOST)
    try:
        ticker.tick()
        ticker.tick()
    finally:
        if disk.tmpfs:
            subprocess.run(["mount", "-o", "remount,rw", str(disk.root)], check=True)
        else:
            disk.spool_dir.chmod(0o755)
    keys = [r.key for r in console.received]
    assert keys[:2] == [w.key for w in spooled] and len(keys) == 4 and len(set(keys)) == 4  # none sent twice
    assert len(spool) == 2 and not ticker.held and ticker.waiting == 0
    [message] = [r.getMessage() for r in caplog.records if "cannot write to the spool" in r.getMessage()]
    assert code in message
