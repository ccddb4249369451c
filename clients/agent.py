"""goodput-agent: read this host's GPUs through NVML and post them to the console.

A standalone program (no Django): it runs on GPU hosts with only ``nvidia-ml-py`` and ``requests``.

Delivery follows the Prometheus remote-write rules: 5xx, 429 and connection errors are retried
with capped exponential backoff (never more than 5 s apart; a Retry-After from the console sets
the floor), other 4xx are never retried. While the console cannot be reached, batches go to a
spool directory on disk and are drained oldest first once it answers again, so an agent restart
or a console outage loses nothing. Each batch carries one Idempotency-Key for all its attempts,
so a retry after a timeout cannot store a batch twice.

Two faults must not lose data or kill the agent. SIGTERM or SIGINT during a tick lets that tick
finish: the batch already read is sent, or spooled after a single attempt, then the agent exits 0.
A spool that cannot be written (disk full, quota, read-only) holds batches in memory instead, up
to an hour of them, until the console answers or the disk has room again.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

logger = logging.getLogger("goodput.agent")

MAX_BACKOFF_S = 5.0
BASE_BACKOFF_S = 0.5
HELD_SECONDS = 3600  # how much reading an unwritable spool's memory holds
MAX_HELD_BATCHES = 360  # an hour of batches at the default 10 s interval
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
        try:
            with open(tmp, "wb") as f:
                f.write(batch.body)
                f.flush()
                os.fsync(f.fileno())  # on disk before it is visible: power loss leaves no empty batch
            os.replace(tmp, self.directory / name)  # atomic: a crash never leaves half a batch to send
        except OSError:
            # A full disk fails mid-write: the partial file would only take the space the next try needs.
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise

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
    """Posts batches to the console with retries; ``stop`` cuts the retry schedule short.

    Once ``stop`` is set, a batch gets no attempt after the one in flight and the backoff wait ends
    at once, so shutdown waits for one HTTP timeout at most, never for a whole retry schedule.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        attempts: int = 5,
        timeout: float = 10,
        sleep: Callable[[float], object] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.url = url.rstrip("/") + INGEST_PATH
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        self.attempts = attempts
        self.timeout = timeout
        self.stop = stop or threading.Event()
        self.sleep = sleep or self.stop.wait  # a backoff wait that a stop request ends early

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
            if attempt and self.stop.is_set():
                raise Unreachable(f"stopping: gave up after {attempt} of {attempts} attempts")
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
    """One tick reads the GPUs and delivers the batch; what cannot be delivered waits.

    Waiting batches are delivered oldest first: the spool's files, then the batches held in
    memory because the spool could not be written, then the new batch. A batch goes to the spool
    only when nothing waits in memory, so every spooled file is older than every held batch.
    """

    def __init__(
        self, reader: Any, sender: Sender, spool: Spool, *, hostname: str, max_held: int = MAX_HELD_BATCHES
    ) -> None:
        self.reader = reader
        self.sender = sender
        self.spool = spool
        self.hostname = hostname
        self.stop = sender.stop
        self.held: deque[Batch] = deque()  # batches the spool could not take, oldest first
        self.max_held = max_held
        self.spool_error: OSError | None = None  # set while the spool cannot be written
        self.delivered: set[str] = set()  # spooled files sent but not removable (a read-only disk)

    @property
    def waiting(self) -> int:
        return len(self.spool) - len(self.delivered) + len(self.held)

    def _deliver_waiting(self, batch: Batch) -> bool:
        """One attempt for a waiting batch: True when it is done with (taken or refused for good)."""
        try:
            self.sender.send(batch, attempts=1)
        except Rejected as exc:
            if exc.is_auth:  # a revoked or rotated token: keep the data for the new one
                logger.error("console refused the token (%s); waiting batches kept", exc)
                return False
            logger.error("waiting batch %s refused, dropped: %s", batch.key, exc)
        except Unreachable:
            return False
        return True

    def drain(self) -> bool:
        """Send waiting batches oldest first; stop at the first that cannot be delivered.

        One attempt per batch: while the console is down, a drain must not hold up sampling
        for a whole retry schedule. What is not sent now waits for the next tick, and so does
        everything once the agent is stopping: it is on disk, or it is spooled below.
        """
        files = self.spool.files()
        self.delivered &= {path.name for path in files}  # forget the ones that are gone
        for path in files:
            if path.name in self.delivered:
                continue
            if self.stop.is_set() or not self._deliver_waiting(Spool.load(path)):
                return False
            self._remove(path)
        while self.held:
            if self.stop.is_set() or not self._deliver_waiting(self.held[0]):
                return False
            self.held.popleft()
        return True

    def _remove(self, path: Path) -> None:
        """A delivered batch leaves the spool; on a read-only disk it is remembered instead, so
        it is not sent again on every tick (its Idempotency-Key would keep it from being stored twice)."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            self._spool_failed(exc)
            self.delivered.add(path.name)

    def _spool_failed(self, exc: OSError) -> None:
        """Logged once per episode: a full disk stays full for many ticks, and one line says it all."""
        if self.spool_error is None:
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            logger.error(
                "cannot write to the spool %s (%s: %s): holding up to %d batches in memory until it can",
                self.spool.directory,
                code,
                exc.strerror or exc,
                self.max_held,
            )
        self.spool_error = exc

    def spool_held(self) -> None:
        """Move batches held in memory to the spool, oldest first, while the disk takes them."""
        while self.held:
            try:
                self.spool.put(self.held[0])
            except OSError as exc:
                self._spool_failed(exc)
                return
            self.held.popleft()
            if self.spool_error is not None:
                logger.warning("the spool %s can be written again", self.spool.directory)
                self.spool_error = None

    def keep(self, batch: Batch) -> None:
        """Keep an undelivered batch: on disk if it can be written, else in memory, within bounds."""
        self.held.append(batch)
        self.spool_held()
        while len(self.held) > self.max_held:
            dropped = self.held.popleft()
            samples = len(json.loads(dropped.body)["samples"])
            logger.error(
                "spool unwritable and %d batches held in memory: dropped the oldest, %d samples lost",
                self.max_held,
                samples,
            )

    def tick(self) -> None:
        samples = self.reader.read(self.hostname)
        batch = Batch(key=str(uuid.uuid4()), body=json.dumps({"samples": samples}).encode())
        # Order matters: older waiting batches go first, and a new batch queues behind them.
        if (self.held or len(self.spool)) and not self.drain():
            self.keep(batch)
            return
        try:
            self.sender.send(batch)
        except Rejected as exc:
            logger.error("batch refused by the console, not retried: %s", exc)
        except Unreachable as exc:
            logger.warning("console unreachable (%s): batch kept (%d waiting)", exc, self.waiting + 1)
            self.keep(batch)
        else:
            logger.debug("batch %s sent: %d samples", batch.key, len(samples))


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
    stop = threading.Event()
    agent = Agent(
        reader,
        Sender(args.url, token, stop=stop),
        Spool(Path(args.spool_dir)),
        hostname=args.hostname,
        max_held=max(1, int(HELD_SECONDS / args.interval)),  # an hour of batches at any interval
    )
    logger.info(
        "reporting %d GPU(s) on %s to %s every %g s", len(reader.handles), args.hostname, args.url, args.interval
    )
    reason = "--once"

    def request_stop(signum: int, frame: object) -> None:
        """Only ask for the stop: the tick in progress finishes, so the batch it read is kept.

        The event is set from a helper thread because Event.set takes the event's lock, which the
        main thread may hold inside stop.wait() at the moment the signal lands: setting it here
        could deadlock. Logging waits for that thread too, for the same reason.
        """
        nonlocal reason
        reason = signal.Signals(signum).name

        def stop_now() -> None:
            stop.set()
            logger.info("%s received: finishing this tick", reason)

        threading.Thread(target=stop_now, name="goodput-agent-stop").start()

    previous = {signum: signal.signal(signum, request_stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.is_set():
            started = time.monotonic()
            agent.tick()
            if args.once or stop.wait(max(0.0, args.interval - (time.monotonic() - started))):
                break
        agent.spool_held()  # one last try: memory does not survive the exit
        lost = f", {len(agent.held)} held in memory are lost (the spool cannot be written)" if agent.held else ""
        logger.info("stopping: %s; %d batch(es) wait in the spool%s", reason, len(agent.spool), lost)
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        reader.close()


if __name__ == "__main__":
    sys.exit(main())
