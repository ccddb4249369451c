"""A fake ``pynvml`` for the soak: the NVML boundary of the real goodput-agent, and nothing else.

Put ``bench/soak_nvml`` first on PYTHONPATH and ``goodput-agent`` imports this module instead of
the NVIDIA bindings. It answers exactly the calls ``clients.agent.NvmlReader`` makes, with healthy,
steady GPUs that no detector flags (util 40-90 %, 45-70 °C, 300-600 W of a 700 W H100, normal
clocks, no ECC errors, remapped rows, PCIe replays or clock-event reasons).

Configured by environment variables:

* ``SOAK_NVML_GPUS``: GPUs on this host (default 8);
* ``SOAK_NVML_HOST``: the host they belong to; each GPU's UUID is derived from it and the index,
  so an agent restart reports the same GPUs (default: this machine's hostname);
* ``SOAK_NVML_MODEL``: the model name (default ``NVIDIA H100 80GB HBM3``);
* ``SOAK_NVML_LEDGER``: a file where every energy reading is recorded (see below);
* ``SOAK_NVML_CONTROL``: an optional JSON file, re-read at most once a second.
  ``{"xid": {"<uuid>": 79}}`` raises XID 79 on that GPU once, as an NVML event.

The ledger is what proves delivery: ``nvmlDeviceGetTotalEnergyConsumption`` returns ``seq * 1000``
mJ, where ``seq`` counts that GPU's readings (the agent reads it exactly once per GPU per sample),
and appends ``<uuid> <seq>`` to the ledger. Every sample the agent produced is therefore named by
(GPU UUID, energy value), and the console must hold each exactly once. ``seq`` carries on from the
ledger after a restart. XIDs already delivered are listed in ``xids-delivered`` beside the ledger,
so a restarted agent does not see them again.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from soak_ledger import gpu_uuid, read_ledger  # beside this file, on the agents' PYTHONPATH

# --- the constants and exceptions the agent uses (values as in NVML) -----------------------------

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 0x8

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value} (soak fake)"


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_Timeout(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_TIMEOUT)


# --- configuration --------------------------------------------------------------------------------

GPU_COUNT = int(os.environ.get("SOAK_NVML_GPUS", "8"))
HOST = os.environ.get("SOAK_NVML_HOST") or socket.gethostname()
MODEL = os.environ.get("SOAK_NVML_MODEL", "NVIDIA H100 80GB HBM3")
LEDGER = Path(os.environ["SOAK_NVML_LEDGER"]) if os.environ.get("SOAK_NVML_LEDGER") else None
CONTROL = Path(os.environ["SOAK_NVML_CONTROL"]) if os.environ.get("SOAK_NVML_CONTROL") else None
DELIVERED = LEDGER.parent / "xids-delivered" if LEDGER else None

HANDLE_BASE = 0x7F00_0000_1000  # handles are addresses, as real ones are; never 0 (a NULL pointer)
MIB = 2**20
TOTAL_MIB = 81_559


UUIDS = [gpu_uuid(HOST, i) for i in range(GPU_COUNT)]


def _read_delivered() -> set[tuple[str, int]]:
    if DELIVERED is None or not DELIVERED.exists():
        return set()
    return {(u, int(x)) for u, x in (line.split() for line in DELIVERED.read_text().splitlines() if line.strip())}


_seq = {u: n for u, n in read_ledger(LEDGER).items() if u in UUIDS}
_ledger_file = LEDGER.open("a") if LEDGER is not None else None
_delivered = _read_delivered()
_control: dict[str, Any] = {"read_at": float("-inf"), "xid": {}}
_initialised = False
_rng = random.Random()


# --- the module surface ---------------------------------------------------------------------------


def nvmlInit() -> None:
    global _initialised
    _initialised = True


def nvmlShutdown() -> None:
    global _initialised
    _check()
    _initialised = False


def nvmlDeviceGetCount() -> int:
    _check()
    return GPU_COUNT


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _check()
    if not 0 <= index < GPU_COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return HANDLE_BASE + 0x100 * index


def nvmlDeviceGetUUID(handle: int) -> str:
    return UUIDS[_index(handle)]


def nvmlDeviceGetName(handle: int) -> str:
    _index(handle)
    return MODEL


def nvmlDeviceGetUtilizationRates(handle: int) -> Any:
    base = 45 + 5 * (_index(handle) % 8)  # 45..80 by GPU, +-3 of noise
    return SimpleNamespace(gpu=base + _rng.randint(-3, 3), memory=base // 2 + _rng.randint(-2, 2))


def nvmlDeviceGetMemoryInfo(handle: int) -> Any:
    used = (50_000 + 1_000 * (_index(handle) % 8)) * MIB
    return SimpleNamespace(total=TOTAL_MIB * MIB, used=used, free=TOTAL_MIB * MIB - used)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError_NotSupported()
    return 55 + _index(handle) % 8 + _rng.randint(-2, 2)  # 53..64 °C


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return (400 + 20 * (_index(handle) % 8)) * 1000 + _rng.randint(-15_000, 15_000)  # 385..555 W, in mW


def nvmlDeviceGetClockInfo(handle: int, clock: int) -> int:
    _index(handle)
    if clock == NVML_CLOCK_SM:
        return 1980
    if clock == NVML_CLOCK_MEM:
        return 2619
    raise NVMLError_NotSupported()


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    """The sample's identity: this GPU's reading number times 1000 mJ, recorded in the ledger."""
    gpu = UUIDS[_index(handle)]
    seq = _seq[gpu] = _seq.get(gpu, 0) + 1
    if _ledger_file is not None:
        _ledger_file.write(f"{gpu} {seq}\n")  # one write: lines from several agents never interleave
        _ledger_file.flush()
    return seq * 1000


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter_type: int) -> int:
    _index(handle)
    return 0


def nvmlDeviceGetRemappedRows(handle: int) -> tuple[int, int, int, int]:
    _index(handle)
    return (0, 0, 0, 0)  # correctable, uncorrectable, pending, failed


def nvmlDeviceGetPcieReplayCounter(handle: int) -> int:
    _index(handle)
    return 0


def nvmlDeviceGetCurrentClocksEventReasons(handle: int) -> int:
    _index(handle)
    return 0


# --- XID events -------------------------------------------------------------------------------------


class _EventSet:
    def __init__(self) -> None:
        self.handles: set[int] = set()


def nvmlEventSetCreate() -> _EventSet:
    _check()
    return _EventSet()


def nvmlDeviceRegisterEvents(handle: int, event_types: int, event_set: _EventSet) -> None:
    _index(handle)
    if event_types & nvmlEventTypeXidCriticalError:
        event_set.handles.add(handle)


def nvmlEventSetWait_v2(event_set: _EventSet, timeout_ms: int) -> Any:
    """The next XID the control file asks for on a registered GPU, once; else NVMLError_Timeout."""
    _check()
    for gpu, xid in _wanted_xids().items():
        handle = nvmlDeviceGetHandleByIndex(UUIDS.index(gpu))
        if handle in event_set.handles and (gpu, xid) not in _delivered:
            _delivered.add((gpu, xid))
            if DELIVERED is not None:
                with DELIVERED.open("a") as f:
                    f.write(f"{gpu} {xid}\n")
            return SimpleNamespace(device=handle, eventType=nvmlEventTypeXidCriticalError, eventData=xid)
    raise NVMLError_Timeout()


def nvmlEventSetFree(event_set: _EventSet) -> None:
    _check()
    event_set.handles.clear()


# --- helpers ----------------------------------------------------------------------------------------


def _check() -> None:
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _index(handle: int) -> int:
    _check()
    index, rest = divmod(handle - HANDLE_BASE, 0x100)
    if rest or not 0 <= index < GPU_COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def _wanted_xids() -> dict[str, int]:
    """This host's GPUs the control file raises an XID on (the file is read at most once a second;
    a missing or half-written file means no change)."""
    now = time.monotonic()
    if CONTROL is not None and now - _control["read_at"] >= 1.0:
        _control["read_at"] = now
        try:
            wanted = json.loads(CONTROL.read_text()).get("xid", {})
            _control["xid"] = {u: int(x) for u, x in wanted.items() if u in UUIDS}
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    return _control["xid"]
