"""goodput-agent: read this host's GPUs through NVML and post them to the console.

A standalone program (no Django): it runs on GPU hosts with only ``nvidia-ml-py`` and ``requests``.

Delivery follows the Prometheus remote-write rules: 5xx, 429 and connection errors are retried
with capped exponential backoff (never more than 5 s apart; a Retry-After from the console sets
the floor), other 4xx are never retried. While the console cannot be reached, batches go to a
spool directory on disk and are drained oldest first once it answers again, so an agent restart
or a console outage loses nothing. Each batch carries one Idempotency-Key for all its attempts,
so a retry after a timeout cannot store a batch twice.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

logger = logging.getLogger("goodput.agent")

MAX_BACKOFF_S = 5.0
BASE_BACKOFF_S = 0.5
INGEST_PATH = "/api/v1/ingest/gpu-samples"


class AgentSetupError(Exception):
    """The agent cannot run on this host; the message says what to do instead."""


NO_DRIVER_HELP = (
    "NVML is not available on this host ({error}). goodput-agent needs the NVIDIA driver "
    "(libnvidia-ml.so). Alternatives: point the console at a dcgm-exporter /metrics URL as a scrape "
    "target, push a dcgm-exporter scrape to /api/v1/ingest/prometheus, or run `manage.py simulate` "
    "for a simulated fleet."
)


# --- reading the GPUs -------------------------------------------------------------------------


def _address(handle: Any) -> Any:
    """A device handle's address: pynvml hands back a new pointer object in each event, so
    handles compare by address, never by identity."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle


class NvmlReader:
    """Reads every GPU on the host through pynvml, the NVIDIA Management Library bindings."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise AgentSetupError(NO_DRIVER_HELP.format(error=exc)) from exc
        try:
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            self.uuids = [self._text(nvml.nvmlDeviceGetUUID(h)) for h in self.handles]
            self.models = [self._text(nvml.nvmlDeviceGetName(h)) for h in self.handles]
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            raise AgentSetupError(f"cannot enumerate the GPUs through NVML: {exc}") from exc
        self.last_xid = {u: 0 for u in self.uuids}
        self.events = self._xid_events()

    @staticmethod
    def _text(value: str | bytes) -> str:
        return value.decode() if isinstance(value, bytes) else value

    def _xid_events(self) -> Any:
        """XIDs arrive as NVML events, not as a readable value: register each GPU once.

        A GPU that cannot deliver events reports xid as null; the others still report theirs.
        """
        nvml = self.nvml
        self.xid_capable: set[str] = set()
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            logger.warning("XID events unavailable (%s); xid will be reported as null", exc)
            return None
        for uuid_, handle in zip(self.uuids, self.handles, strict=True):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                self.xid_capable.add(uuid_)
            except nvml.NVMLError as exc:
                logger.warning("XID events unavailable on %s (%s)", uuid_, exc)
        if not self.xid_capable:
            nvml.nvmlEventSetFree(event_set)
            return None
        return event_set

    def _drain_xids(self) -> None:
        if self.events is None:
            return
        nvml = self.nvml
        addresses = [_address(h) for h in self.handles]
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self.events, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as exc:
                logger.warning("reading XID events failed: %s", exc)
                return
            device = _address(event.device)
            for index, address in enumerate(addresses):
                if address == device:
                    self.last_xid[self.uuids[index]] = int(event.eventData)

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call; a field the GPU does not support is None, never a number."""
        try:
            return fn(*args)
        except self.nvml.NVMLError_NotSupported:
            return None
        except self.nvml.NVMLError as exc:
            logger.debug("NVML call %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def read(self, hostname: str, now: datetime | None = None) -> list[dict[str, Any]]:
        nvml = self.nvml
        now = now or datetime.now(UTC)
        self._drain_xids()
        samples = []
        for index, handle in enumerate(self.handles):
            util = self._read(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._read(nvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = self._read(nvml.nvmlDeviceGetPowerUsage, handle)
            reasons = self._read(nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
            remapped = self._read(nvml.nvmlDeviceGetRemappedRows, handle)
            uuid_ = self.uuids[index]
            samples.append(
                {
                    "gpu_uuid": uuid_,
                    "hostname": hostname,
                    "gpu_index": index,
                    "model": self.models[index][:64],
                    "ts": now.isoformat(),
                    "gpu_util": float(util.gpu) if util is not None else None,
                    "mem_copy_util": float(util.memory) if util is not None else None,
                    "fb_used_mib": memory.used / 2**20 if memory is not None else None,
                    "fb_free_mib": memory.free / 2**20 if memory is not None else None,
                    "gpu_temp_c": self._read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                    "power_w": power_mw / 1000 if power_mw is not None else None,
                    "sm_clock_mhz": self._read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                    "mem_clock_mhz": self._read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
                    "energy_mj": self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle),
                    "xid": self.last_xid[uuid_] if uuid_ in self.xid_capable else None,
                    "ecc_sbe_total": self._read(
                        nvml.nvmlDeviceGetTotalEccErrors,
                        handle,
                        nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                        nvml.NVML_VOLATILE_ECC,
                    ),
                    "ecc_dbe_total": self._read(
                        nvml.nvmlDeviceGetTotalEccErrors,
                        handle,
                        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        nvml.NVML_VOLATILE_ECC,
                    ),
                    "remapped_rows_correctable": remapped[0] if remapped is not None else None,
                    "remapped_rows_uncorrectable": remapped[1] if remapped is not None else None,
                    "row_remap_failure": (1 if remapped[3] else 0) if remapped is not None else None,
                    "pcie_replay_total": self._read(nvml.nvmlDeviceGetPcieReplayCounter, handle),
                    "throttle_reasons": reasons,
                }
            )
        return samples

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


# --- delivery ---------------------------------------------------------------------------------


@dataclass
class Batch:
    key: str
    body: bytes


class Spool:
    """Batches waiting for the console, one file each, drained oldest first (names sort by time)."""

    def __init__(self, directory: Path, *, max_batches: int = 10_000) -> None:
        self.directory = directory
        self.max_batches = max_batches
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.json.tmp"):  # a crash mid-write: the batch was never spooled
            leftover.unlink(missing_ok=True)

    def put(self, batch: Batch) -> None:
        files = self.files()
        if len(files) >= self.max_batches:
            logger.error("spool full (%d batches): dropping the oldest, %s", len(files), files[0].name)
            files[0].unlink(missing_ok=True)
        name = f"{time.time_ns():020d}-{batch.key}.json"
        tmp = self.directory / (name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(batch.body)
            f.flush()
            os.fsync(f.fileno())  # on disk before it is visible: power loss leaves no empty batch
        os.replace(tmp, self.directory / name)  # atomic: a crash never leaves half a batch to send

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.json"))

    def __len__(self) -> int:
        return len(self.files())

    @staticmethod
    def load(path: Path) -> Batch:
        key = path.stem.split("-", 1)[1]
        return Batch(key=key, body=path.read_bytes())


class Rejected(Exception):
    """The console refused the batch for good (a 4xx other than 429): retrying cannot help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def is_auth(self) -> bool:
        """401/403 say the token is wrong, not the batch: the batch is still worth keeping."""
        return self.status in (401, 403)


class Unreachable(Exception):
    """The console did not take the batch after every retry: keep it and try later."""


class Sender:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        attempts: int = 5,
        timeout: float = 10,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/") + INGEST_PATH
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        self.attempts = attempts
        self.timeout = timeout
        self.sleep = sleep

    @staticmethod
    def backoff(attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): exponential with jitter, capped at 5 s;
        the console's Retry-After raises the wait, still within the cap."""
        delay = min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2**attempt) * random.uniform(0.8, 1.0)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, float(retry_after))
        return min(MAX_BACKOFF_S, delay)

    def send(self, batch: Batch, *, attempts: int | None = None) -> None:
        attempts = attempts or self.attempts
        for attempt in range(attempts):
            retry_after = None
            try:
                response = self.session.post(
                    self.url, data=batch.body, headers={"Idempotency-Key": batch.key}, timeout=self.timeout
                )
            except requests.RequestException as exc:
                logger.warning("console unreachable (%s), attempt %d/%d", exc.__class__.__name__, attempt + 1, attempts)
            else:
                if response.status_code < 300:
                    return
                if 400 <= response.status_code < 500 and response.status_code != 429:
                    raise Rejected(response.status_code, f"HTTP {response.status_code}: {response.text[:500]}")
                retry_after = response.headers.get("Retry-After")
                logger.warning("console answered %d, attempt %d/%d", response.status_code, attempt + 1, attempts)
            if attempt + 1 < attempts:
                self.sleep(self.backoff(attempt, retry_after))
        raise Unreachable(f"gave up after {attempts} attempts")


class Agent:
    def __init__(self, reader: Any, sender: Sender, spool: Spool, *, hostname: str) -> None:
        self.reader = reader
        self.sender = sender
        self.spool = spool
        self.hostname = hostname

    def drain(self) -> bool:
        """Send spooled batches oldest first; stop at the first that cannot be delivered.

        One attempt per batch: while the console is down, a drain must not hold up sampling
        for a whole retry schedule. What is not sent now waits for the next tick.
        """
        for path in self.spool.files():
            batch = Spool.load(path)
            try:
                self.sender.send(batch, attempts=1)
            except Rejected as exc:
                if exc.is_auth:  # a revoked or rotated token: keep the data for the new one
                    logger.error("console refused the token (%s); spooled batches kept", exc)
                    return False
                logger.error("spooled batch %s refused, dropped: %s", batch.key, exc)
            except Unreachable:
                return False
            path.unlink(missing_ok=True)
        return True

    def tick(self) -> None:
        samples = self.reader.read(self.hostname)
        batch = Batch(key=str(uuid.uuid4()), body=json.dumps({"samples": samples}).encode())
        # Order matters: older spooled batches go first, and a new batch queues behind them.
        if len(self.spool) and not self.drain():
            self.spool.put(batch)
            return
        try:
            self.sender.send(batch)
        except Rejected as exc:
            logger.error("batch refused by the console, not retried: %s", exc)
        except Unreachable:
            logger.warning("console unreachable: batch spooled (%d waiting)", len(self.spool) + 1)
            self.spool.put(batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="goodput-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("GOODPUT_URL", "http://127.0.0.1:8000"),
        help="Console base URL (env GOODPUT_URL)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GOODPUT_AGENT_TOKEN"),
        help="Agent token (env GOODPUT_AGENT_TOKEN); see manage.py create_agent_token",
    )
    parser.add_argument("--token-file", help="Read the agent token from this file")
    parser.add_argument("--interval", type=float, default=10.0, help="Seconds between samples (default 10)")
    parser.add_argument("--hostname", default=socket.gethostname(), help="Host name to report")
    parser.add_argument(
        "--spool-dir",
        default=os.environ.get("GOODPUT_AGENT_SPOOL", "/var/lib/goodput-agent/spool"),
        help="Where batches wait while the console is unreachable",
    )
    parser.add_argument("--once", action="store_true", help="Sample and send once, then exit")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    token = Path(args.token_file).read_text().strip() if args.token_file else args.token
    if not token:
        parser.error("an agent token is required (--token, --token-file or GOODPUT_AGENT_TOKEN)")
    if args.interval <= 0:
        parser.error("--interval must be positive")
    try:
        reader = NvmlReader()
    except AgentSetupError as exc:
        print(f"goodput-agent: {exc}", file=sys.stderr)
        return 2
    agent = Agent(reader, Sender(args.url, token), Spool(Path(args.spool_dir)), hostname=args.hostname)
    logger.info(
        "reporting %d GPU(s) on %s to %s every %g s", len(reader.handles), args.hostname, args.url, args.interval
    )
    try:
        while True:
            started = time.monotonic()
            agent.tick()
            if args.once:
                return 0
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()


if __name__ == "__main__":
    sys.exit(main())
