"""goodput training client: report a training job's events to the console from any training loop.

Standard library only (no Django, no torch, no requests), so a training image needs nothing new::

    client = GoodputTrainingClient(url, token, name="llama-8b", team="foundation", gang_size=64)
    client.register(); client.allocated(); client.started()
    start = load_checkpoint()  # the step this run resumes from, 0 from scratch
    client.begin_run(start)
    for step, batch in enumerate(loader, start=start + 1):
        with client.timed_step(step, tokens=batch_tokens) as t:
            ...  # fetch the batch, call t.data_ready(), then forward/backward/step
    client.completed(); client.close()

Each call records one event with an id unique within the job (a random run id and a sequence
number, so a restarted script never reuses one) and the UTC time of the call. Events wait in a
buffer; a background daemon thread sends them in order, in batches, one batch at a time (the
console refuses an event older than the job's last stored one). Delivery follows the Prometheus
remote-write rules, like clients/agent.py: 5xx, 429 and connection errors are retried with capped
exponential backoff (a Retry-After from the console sets the floor) re-sending the same batch
with the same ids (the console stores each id once); other 4xx are never retried. The console
stores a batch whole or not at all, and its 400 names the event at fault (``item``, its index):
that event alone is logged with the console's message and dropped, and the rest is sent again,
for at most ``max_refusals`` rounds per batch; a refusal that names no event drops the batch. A
full buffer drops its oldest step events (never lifecycle events) and counts them in
``dropped_steps``.

A rerun of a job the console already holds steps for must say where it resumes from (a step
number may only go back through a restore): ``begin_run(n)`` (or ``started(resume_step=n)``),
0 for a run from scratch, sends ``restored`` when the job has stored steps (``last_step``, read
at ``register()``).

The Hugging Face and Lightning callbacks at the end subclass the libraries' callback base
classes when they are installed, and plain ``object`` otherwise, so this module imports either way.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import random
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

logger = logging.getLogger("goodput.training_client")

JOBS_PATH = "/api/v1/training/jobs/"
MAX_BACKOFF_S = 5.0
BASE_BACKOFF_S = 0.5
LIFECYCLE_KINDS = frozenset(
    {
        "allocated",
        "started",
        "checkpoint_started",
        "checkpoint_saved",
        "restored",
        "failed",
        "preempted",
        "resumed",
        "released",
        "completed",
    }
)


class Rejected(Exception):
    """The console refused a request for good (a 4xx other than 429): retrying cannot help.
    ``item`` and ``field`` are the index in the batch and the field of the event at fault, when
    the console named one."""

    def __init__(self, status: int, message: str, *, item: int | None = None, field: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.item = item
        self.field = field


class Unreachable(Exception):
    """The console did not answer usefully before the deadline."""


def default_scheduler_id() -> str:
    """A job id that every restart of the same scheduled job shares: the Slurm job id, the
    Kubernetes Job's name (``JOB_NAME``, from the downward API's ``job-name`` label), the
    torchrun rendezvous id, or else this host and process (stable for this run only).
    ``GOODPUT_JOB_ID`` overrides them all."""
    for variable in ("GOODPUT_JOB_ID", "SLURM_JOB_ID", "JOB_NAME", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value[:200]
    return f"{socket.gethostname()}-{os.getpid()}"


def default_node_name() -> str:
    """The fleet node this process runs on: ``NODE_NAME`` (in Kubernetes, set it from the downward
    API's ``spec.nodeName``: the pod's own hostname is the pod's name, not a node), else Slurm's
    ``SLURMD_NODENAME``, else this machine's hostname (bare metal)."""
    for variable in ("NODE_NAME", "SLURMD_NODENAME"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return socket.gethostname()


# The console's limits on a failed or preempted event's reason.
MAX_REASON_CHARS = 500


def clean_reason(reason: object) -> str:
    """``reason`` as text the console accepts: no NUL (PostgreSQL text cannot hold one), no lone
    surrogate (not encodable as UTF-8: the JSON would be refused whole), at most 500 characters."""
    text = str(reason).encode("utf-8", "replace").decode("utf-8").replace("\x00", "")
    return text[:MAX_REASON_CHARS]


def backoff_delay(attempt: int, retry_after: str | None, *, base: float = BASE_BACKOFF_S) -> float:
    """Seconds before retry ``attempt`` (0-based): exponential with jitter, capped at 5 s; the
    console's Retry-After raises the wait, still within the cap."""
    delay = min(MAX_BACKOFF_S, base * 2**attempt) * random.uniform(0.8, 1.0)
    if retry_after:
        with contextlib.suppress(ValueError):
            delay = max(delay, float(retry_after))
    return min(MAX_BACKOFF_S, delay)


def _as_int(value: object) -> int | None:
    """A JSON integer as an int; anything else (null, a bool, a string) as None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# Durations are measured on this clock (a module attribute, so tests can drive it by hand).
_clock = time.perf_counter


def _utc_now() -> str:
    return datetime.now(UTC).isoformat()


class StepTimer:
    """Times one step for ``GoodputTrainingClient.timed_step``: from entering the block to
    leaving it is the step; from entering to ``data_ready()`` is the wait for input data."""

    def __init__(self, client: GoodputTrainingClient, step: int, tokens: int | None, node: str | None) -> None:
        self.client = client
        self.step = step
        self.tokens = tokens
        self.node = node
        self.data_wait_s: float | None = None
        self.step_time_s: float | None = None
        self._started = 0.0

    def __enter__(self) -> StepTimer:
        self._started = _clock()
        return self

    def data_ready(self) -> None:
        """Call once the step's batch is in hand: the time so far was spent waiting for data."""
        self.data_wait_s = _clock() - self._started

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:  # the step did not finish: it is not progress
            return
        # The console wants step_time_s > 0; a clock tick of zero on a tiny step is still a step.
        self.step_time_s = max(_clock() - self._started, 1e-6)
        wait = None if self.data_wait_s is None else min(self.data_wait_s, self.step_time_s)
        self.client.step(self.step, step_time_s=self.step_time_s, data_wait_s=wait, tokens=self.tokens, node=self.node)


class CheckpointTimer:
    """Times a blocking checkpoint save for ``GoodputTrainingClient.timed_checkpoint``; set
    ``bytes`` inside the block to report the checkpoint's size."""

    def __init__(self, client: GoodputTrainingClient, step: int) -> None:
        self.client = client
        self.step = step
        self.bytes: int | None = None
        self._started = 0.0

    def __enter__(self) -> CheckpointTimer:
        self.client.checkpoint_started(self.step)
        self._started = _clock()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:  # a save that raised retains nothing
            self.client.checkpoint_saved(self.step, duration_s=_clock() - self._started, bytes=self.bytes)


class GoodputTrainingClient:
    """Buffered, ordered, retried delivery of one job's events to the console. Thread-safe."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        name: str,
        team: str,
        gang_size: int,
        scheduler: str = "other",
        scheduler_id: str | None = None,
        framework: str = "pytorch",
        nodes: list[str] | None = None,
        checkpoint_interval_s: int | None = None,
        cluster: str = "",
        flush_interval_s: float = 5.0,
        max_batch: int = 500,
        max_buffer: int = 100_000,
        timeout_s: float = 10.0,
        backoff_s: float = BASE_BACKOFF_S,
        max_refusals: int = 10,
    ) -> None:
        if gang_size < 1:
            raise ValueError("gang_size must be at least 1")
        if max_batch < 1 or max_buffer < max_batch:
            raise ValueError("need 1 <= max_batch <= max_buffer")
        if max_refusals < 0:
            raise ValueError("max_refusals must be 0 or more")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the console URL must start with http:// or https://, not {url!r}")
        self.base_url = url.rstrip("/")
        self.token = token
        self.job_fields: dict[str, Any] = {
            "name": name,
            "team": team,
            "gang_size": gang_size,
            "scheduler": scheduler,
            "scheduler_id": scheduler_id or default_scheduler_id(),
            "framework": framework,
            "nodes": list(nodes) if nodes is not None else [default_node_name()],
            "cluster": cluster,
        }
        if checkpoint_interval_s is not None:
            self.job_fields["checkpoint_interval_s"] = checkpoint_interval_s
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_buffer = max_buffer
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_refusals = max_refusals
        self.job_id: int | None = None
        # The job as register() found it: its state and last stored step (None: no step stored).
        self.job_state: str | None = None
        self.stored_last_step: int | None = None
        self._recorded_last_step: int | None = None  # the latest step or restore recorded here
        self._warned_behind = False
        # Ids: a random run id per client object, so a restarted script (or a second client of
        # the same job) never reuses an id the console has already stored.
        self.run_id = secrets.token_hex(6)
        self.dropped_steps = 0  # steps dropped because the buffer was full
        self.rejected_batches = 0  # batches dropped whole after a refusal (4xx)
        self.rejected_events = 0  # events the console refused, alone or with their batch
        self.sent_events = 0
        self._seq = 0
        self._buffer: deque[dict[str, Any]] = deque()
        self._in_flight: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._flush_requested = False
        self._buffered_since = 0.0
        self._stop_at: float | None = None  # monotonic deadline once close() was called
        self._thread: threading.Thread | None = None
        self._closed = False
        atexit.register(self.close)

    # --- HTTP ----------------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """One POST; returns (status, decoded body) for a 2xx, raises Rejected for a 4xx other than
        429, and _Retryable (with Retry-After) for a 5xx, a 429 or a connection error."""
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body, separators=(",", ":")).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:1000]
            if 400 <= exc.code < 500 and exc.code != 429:
                item = field = None
                with contextlib.suppress(ValueError, AttributeError):
                    answer = json.loads(text) if text else {}
                    text = answer.get("error", text)
                    # The console names the event at fault by its index in the batch.
                    item = _as_int(answer.get("item"))
                    if isinstance(answer.get("field"), str):
                        field = answer["field"]
                raise Rejected(exc.code, str(text), item=item, field=field) from None
            raise _Retryable(f"HTTP {exc.code}", exc.headers.get("Retry-After")) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise _Retryable(f"{exc.__class__.__name__}: {exc}", None) from None
        try:  # a 2xx stored the batch; an unreadable body must not send it again
            return status, json.loads(payload) if payload else None
        except ValueError:
            return status, None

    def _post_retrying(self, path: str, body: dict[str, Any], *, deadline: float | None) -> tuple[int, Any]:
        """POST until it succeeds, the console refuses it (Rejected), or ``deadline`` passes
        (Unreachable; without one, until close()'s deadline); the same body each time."""
        attempt = 0
        while True:
            try:
                return self._post(path, body)
            except _Retryable as exc:
                delay = backoff_delay(attempt, exc.retry_after, base=self.backoff_s)
                logger.warning(
                    "console did not take %s (%s), attempt %d; retrying in %.1f s", path, exc, attempt + 1, delay
                )
                limit = deadline if deadline is not None else self._stop_at  # close() sets a limit
                if limit is not None and time.monotonic() + delay > limit:
                    raise Unreachable(f"{path}: {exc}") from None
                time.sleep(delay)
                attempt += 1

    def register(self, *, timeout_s: float = 60.0) -> int:
        """Register the job (or find it again by scheduler and scheduler_id after a restart);
        return its id. Keeps the job's state and last stored step from the answer, which
        ``started(resume_step=...)`` needs. Events recorded before this wait in the buffer."""
        status, body = self._post_retrying(JOBS_PATH, self.job_fields, deadline=time.monotonic() + timeout_s)
        if status not in (200, 201) or not isinstance(body, dict) or "id" not in body:
            raise Rejected(status, f"unexpected answer to the registration: {str(body)[:300]}")
        with self._lock:
            self.job_id = int(body["id"])
            self.job_state = body.get("state") if isinstance(body.get("state"), str) else None
            self.stored_last_step = _as_int(body.get("last_step"))
            self._wake.notify_all()
        if self.job_state == "completed":
            logger.warning(
                "job %d has completed: the console refuses to allocate it again (register a new scheduler_id)",
                self.job_id,
            )
        self._ensure_thread()
        logger.info(
            "job %s registered as %d (%s)", self.job_fields["name"], self.job_id, "new" if status == 201 else "known"
        )
        return self.job_id

    # --- recording -----------------------------------------------------------------------------

    def _record(self, kind: str, **fields: Any) -> None:
        if self._closed:
            logger.warning("%s event after close() is not sent", kind)
            return
        event = {k: v for k, v in fields.items() if v is not None}
        with self._lock:
            self._seq += 1
            # The time is taken under the lock, so buffer order is time order even across threads.
            event = {"id": f"{self.run_id}-{self._seq}", "ts": _utc_now(), "kind": kind, **event}
            if not self._buffer:
                self._buffered_since = time.monotonic()
            elif len(self._buffer) >= self.max_buffer:
                self._drop_oldest_step()
            self._buffer.append(event)
            self._wake.notify_all()
        self._ensure_thread()

    def _drop_oldest_step(self) -> None:
        """Make room by dropping the oldest buffered step (lifecycle events are never dropped;
        a buffer of nothing but lifecycle events grows past its bound)."""
        for index, event in enumerate(self._buffer):
            if event["kind"] == "step":
                del self._buffer[index]
                self.dropped_steps += 1
                if self.dropped_steps in (1, 10, 100) or self.dropped_steps % 1000 == 0:
                    logger.warning(
                        "event buffer full (%d): %d step event(s) dropped so far", self.max_buffer, self.dropped_steps
                    )
                return

    @property
    def last_step(self) -> int | None:
        """The job's last step as far as this client knows: the latest step or restore recorded
        here, else the last step the console had stored at ``register()``; None when neither."""
        recorded = self._recorded_last_step
        return recorded if recorded is not None else self.stored_last_step

    def allocated(self, *, node: str | None = None) -> None:
        """The scheduler gave the job its GPUs."""
        self._record("allocated", node=node)

    def started(self, *, node: str | None = None, resume_step: int | None = None) -> None:
        """The training program started (initialisation begins). Call it after ``register()``.

        ``resume_step``: when the run already knows where it resumes from (a framework that
        loaded its checkpoint before this call), ``begin_run(resume_step)`` follows at once.
        Leave it out when the checkpoint is loaded after this call, and call ``begin_run``
        then, before the first step.
        """
        if resume_step is not None and resume_step < 0:
            raise ValueError("resume_step must be 0 (a run from scratch) or a checkpoint's step")
        self._record("started", node=node)
        if resume_step is not None:
            self.begin_run(resume_step)

    def begin_run(self, resume_step: int = 0, *, restore_duration_s: float | None = None) -> None:
        """The run is about to take its first step, from the checkpoint of ``resume_step`` (0: from
        scratch); call it once after ``started()`` and the checkpoint load, before the first step.

        A step number may only go back through a restore, so when the job already has steps
        stored (a rerun: ``last_step``, as read at ``register()`` or recorded since) this sends
        ``restored(resume_step, duration_s=restore_duration_s)``. On a job with no stored step
        there is nothing to go back from, and no checkpoint the console could restore: nothing
        is sent.
        """
        if resume_step < 0:
            raise ValueError("resume_step must be 0 (a run from scratch) or a checkpoint's step")
        if self.job_id is None:
            logger.warning("begin_run() before register(): the job's stored steps are not known")
            if resume_step == 0:  # a fresh run on a job with no stored step needs no restore
                return
        elif self.last_step is None:
            if resume_step > 0:
                logger.warning(
                    "job %d has no stored step, so no checkpoint of step %d: the restore is not reported",
                    self.job_id,
                    resume_step,
                )
            return
        self.restored(resume_step, duration_s=restore_duration_s)

    def step(
        self,
        step: int,
        *,
        step_time_s: float,
        data_wait_s: float | None = None,
        tokens: int | None = None,
        node: str | None = None,
    ) -> None:
        """Step ``step`` finished now, after ``step_time_s`` seconds (the first ``data_wait_s`` of
        them waiting for input data)."""
        known = self.last_step
        if known is not None and step < known and not self._warned_behind:
            # The console refuses it (a step may only go back through a restore): say how to fix it, once.
            self._warned_behind = True
            logger.warning(
                "step %d is behind the job's step %d: the console refuses it without a restore; "
                "call begin_run(<the step this run resumes from, 0 from scratch>) before the first step",
                step,
                known,
            )
        self._record("step", step=step, step_time_s=step_time_s, data_wait_s=data_wait_s, tokens=tokens, node=node)
        self._recorded_last_step = step

    def checkpoint_started(self, step: int) -> None:
        self._record("checkpoint_started", step=step)

    def checkpoint_saved(self, step: int, *, duration_s: float, bytes: int | None = None) -> None:
        """A checkpoint of ``step`` is saved; ``duration_s`` is the part that blocked training."""
        self._record("checkpoint_saved", step=step, duration_s=max(0.0, duration_s), bytes=bytes)

    def restored(self, step: int, *, duration_s: float | None = None) -> None:
        """Training resumed from the checkpoint of ``step``, 0 for a fresh start (loading took
        ``duration_s``)."""
        self._record("restored", step=step, duration_s=duration_s)
        self._recorded_last_step = step
        self._warned_behind = False

    def failed(self, reason: object) -> None:
        """The attempt failed; ``reason`` (an exception will do) is cleaned and cut to 500 characters."""
        self._record("failed", reason=clean_reason(reason))

    def preempted(self, reason: object) -> None:
        """The scheduler took the GPUs back; ``reason`` is cleaned and cut to 500 characters."""
        self._record("preempted", reason=clean_reason(reason))

    def resumed(self) -> None:
        self._record("resumed")

    def released(self) -> None:
        self._record("released")

    def completed(self, step: int | None = None) -> None:
        self._record("completed", step=step)

    def timed_step(self, step: int, *, tokens: int | None = None, node: str | None = None) -> StepTimer:
        """``with client.timed_step(n, tokens=k) as t: batch = next(it); t.data_ready(); ...``"""
        return StepTimer(self, step, tokens, node)

    def timed_checkpoint(self, step: int) -> CheckpointTimer:
        """``with client.timed_checkpoint(n) as c: save(...); c.bytes = size``"""
        return CheckpointTimer(self, step)

    # --- delivery --------------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="goodput-training-client", daemon=True)
                self._thread.start()

    def _next_batch(self) -> list[dict[str, Any]] | None:
        """Wait (lock held) for a batch worth sending: a full batch, a flush or close, or the
        oldest buffered event having waited ``flush_interval_s``. None when it is time to stop."""
        while True:
            closing = self._stop_at is not None
            if closing and (not self._buffer or self.job_id is None or time.monotonic() >= self._stop_at):
                return None
            if not self._buffer:
                self._flush_requested = False
                self._idle.notify_all()
                self._wake.wait(timeout=0.05 if closing else None)
                continue
            if self.job_id is None:  # register() wakes us
                self._wake.wait(timeout=0.05 if closing else None)
                continue
            now = time.monotonic()
            due = self._buffered_since + self.flush_interval_s
            if len(self._buffer) >= self.max_batch or self._flush_requested or closing or now >= due:
                batch = [self._buffer.popleft() for _ in range(min(self.max_batch, len(self._buffer)))]
                self._buffered_since = now
                return batch
            self._wake.wait(timeout=due - now)

    def _run(self) -> None:
        while True:
            with self._lock:
                batch = self._next_batch()
                if batch is None:
                    self._idle.notify_all()
                    return
                self._in_flight = batch
                path = f"{JOBS_PATH}{self.job_id}/events"
            try:
                self._deliver(path, batch)
            except Unreachable as exc:
                # Only at close(): the batch stays in flight, so pending() counts it as lost.
                logger.error("console unreachable at close: %d events not delivered (%s)", self.pending(), exc)
                with self._lock:
                    self._idle.notify_all()
                return
            with self._lock:
                self._in_flight = []
                if not self._buffer:
                    self._idle.notify_all()

    def _deliver(self, path: str, batch: list[dict[str, Any]]) -> None:
        """Send one batch. A 400 naming an event drops that event alone and sends the rest again
        (the console stored none of the batch); after ``max_refusals`` such rounds, or a refusal
        naming no event, what is left of the batch is dropped. Raises Unreachable at close()."""
        refusals = 0
        while batch:
            try:
                # The same body on every attempt: same ids, so the console stores it once.
                self._post_retrying(path, {"events": batch}, deadline=None)
                self.sent_events += len(batch)
                return
            except Rejected as exc:
                refusals += 1
                item = exc.item
                if exc.status != 400 or item is None or not 0 <= item < len(batch) or refusals > self.max_refusals:
                    why = f"refused {refusals} times" if refusals > self.max_refusals else "refused"
                    self.rejected_batches += 1
                    self.rejected_events += len(batch)
                    logger.error(
                        "console %s a batch of %d events (%s to %s), dropped: %s",
                        why,
                        len(batch),
                        batch[0]["id"],
                        batch[-1]["id"],
                        exc,
                    )
                    return
                event = batch[item]
                self.rejected_events += 1
                batch = batch[:item] + batch[item + 1 :]
                logger.error(
                    "console refused the %s event %s, dropped (%d other(s) sent again): %s",
                    event["kind"],
                    event["id"],
                    len(batch),
                    exc,
                )
                with self._lock:
                    self._in_flight = batch

    def pending(self) -> int:
        """Events recorded but not yet delivered (or dropped)."""
        with self._lock:
            return len(self._buffer) + len(self._in_flight)

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what is buffered now; wait up to ``timeout`` seconds. True when nothing is left."""
        if self._buffer:
            self._ensure_thread()
        deadline = time.monotonic() + timeout
        with self._lock:
            self._flush_requested = True
            self._wake.notify_all()
            while self._buffer or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    break
                self._idle.wait(timeout=min(remaining, 0.5))
            return not (self._buffer or self._in_flight)

    def close(self, timeout: float = 30.0) -> bool:
        """Deliver what is buffered (retrying for at most ``timeout`` seconds), then stop the
        sender. Also runs at interpreter exit. True when everything was delivered."""
        if self._closed:
            return not self.pending()
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if self.job_id is None and self._buffer:
            logger.error("close() before register(): %d events not sent", len(self._buffer))
        with self._lock:
            self._stop_at = time.monotonic() + timeout
            self._wake.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout + 1)
        left = self.pending()
        if left:
            logger.error("%d events were not delivered before close() gave up", left)
        return left == 0

    def __enter__(self) -> GoodputTrainingClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: str | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# --- framework callbacks --------------------------------------------------------------------------


def _base(module: str, name: str) -> type:
    """The library's callback base class when it is installed, else ``object``."""
    try:
        return getattr(__import__(module, fromlist=[name]), name)  # type: ignore[no-any-return]
    except Exception:  # not installed, or broken: the callback still imports
        return object


_TrainerCallback: type = _base("transformers", "TrainerCallback")
_LightningCallback: type = _base("lightning.pytorch.callbacks", "Callback")


class HuggingFaceGoodputCallback(_TrainerCallback):  # type: ignore[misc,valid-type]
    """A ``transformers.TrainerCallback``: ``Trainer(..., callbacks=[HuggingFaceGoodputCallback(client)])``.

    Hooks (documented ``TrainerCallback`` events, each called with ``args, state, control``):
    on_train_begin sends allocated and ``started(resume_step=state.global_step)``: a restore of
    the checkpoint the Trainer resumed from, or of step 0 when a job with stored steps runs again
    from scratch; on_step_begin / on_step_end
    time each optimizer step; on_save reports the checkpoint with the time since the step ended
    (the Trainer saves right after on_step_end, after any evaluation, which is not counted);
    on_train_end sends completed and flushes. Tokens: ``tokens_per_step``, or the growth of
    ``state.num_input_tokens_seen`` when ``args.include_num_input_tokens_seen`` is set. Only the
    world's process zero reports (the console wants one stream per job).
    """

    def __init__(
        self, client: GoodputTrainingClient, *, tokens_per_step: int | None = None, register: bool = True
    ) -> None:
        self.client = client
        self.tokens_per_step = tokens_per_step
        self.register = register
        self._step_started: float | None = None
        self._step_ended: float | None = None
        self._tokens_seen: int | None = None

    @staticmethod
    def _reports(state: Any) -> bool:
        return bool(getattr(state, "is_world_process_zero", True))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._reports(state):
            return
        if self.register and self.client.job_id is None:
            self.client.register()
        self.client.allocated()
        # global_step > 0 here: the Trainer loaded its state from a checkpoint; 0: from scratch.
        self.client.started(resume_step=int(getattr(state, "global_step", 0) or 0))
        self._tokens_seen = getattr(state, "num_input_tokens_seen", None)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_started = _clock()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = _clock()
        self._step_ended = now
        if not self._reports(state) or self._step_started is None:
            return
        tokens = self.tokens_per_step
        seen = getattr(state, "num_input_tokens_seen", None)
        if tokens is None and getattr(args, "include_num_input_tokens_seen", False) and seen is not None:
            tokens = max(0, int(seen) - int(self._tokens_seen or 0))
        self._tokens_seen = seen
        self.client.step(int(state.global_step), step_time_s=max(now - self._step_started, 1e-6), tokens=tokens)
        self._step_started = None

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Evaluation runs between on_step_end and the save: the save's time starts after it.
        self._step_ended = _clock()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._reports(state):
            return
        began = self._step_ended if self._step_ended is not None else _clock()
        self.client.checkpoint_saved(int(state.global_step), duration_s=_clock() - began)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._reports(state):
            return
        self.client.completed(step=int(state.global_step))
        self.client.flush()


class LightningGoodputCallback(_LightningCallback):  # type: ignore[misc,valid-type]
    """A ``lightning.pytorch.callbacks.Callback``: ``Trainer(callbacks=[LightningGoodputCallback(client)])``.

    Hooks (documented, each called with ``trainer, pl_module, ...``): on_train_start sends
    allocated and ``started(resume_step=...)``: the checkpoint's step when ``trainer.ckpt_path``
    says the fit resumed, else 0 (a restore is sent when the job has stored steps);
    on_train_batch_start / on_train_batch_end time each batch as a step numbered by
    ``trainer.global_step``; on_save_checkpoint (called while the checkpoint is being written)
    sends checkpoint_started, and the next hook sends checkpoint_saved with the time in between
    (an upper bound: it includes fetching the next batch); on_train_end sends completed and
    flushes; on_exception sends failed and flushes. Only the global-zero process reports.
    """

    def __init__(
        self, client: GoodputTrainingClient, *, tokens_per_step: int | None = None, register: bool = True
    ) -> None:
        self.client = client
        self.tokens_per_step = tokens_per_step
        self.register = register
        self._batch_started: float | None = None
        self._saving: tuple[int, float] | None = None

    @staticmethod
    def _reports(trainer: Any) -> bool:
        return bool(getattr(trainer, "is_global_zero", True))

    def _finish_save(self) -> None:
        if self._saving is not None:
            step, began = self._saving
            self._saving = None
            self.client.checkpoint_saved(step, duration_s=_clock() - began)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._reports(trainer):
            return
        if self.register and self.client.job_id is None:
            self.client.register()
        self.client.allocated()
        # Resumed from trainer.ckpt_path: global_step is the checkpoint's step; else 0, from scratch.
        resume_step = int(trainer.global_step) if getattr(trainer, "ckpt_path", None) else 0
        self.client.started(resume_step=resume_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._reports(trainer):
            self._finish_save()
        self._batch_started = _clock()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._reports(trainer) or self._batch_started is None:
            return
        elapsed = max(_clock() - self._batch_started, 1e-6)
        self._batch_started = None
        self.client.step(int(trainer.global_step), step_time_s=elapsed, tokens=self.tokens_per_step)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if not self._reports(trainer):
            return
        self._finish_save()
        step = int(trainer.global_step)
        self.client.checkpoint_started(step)
        self._saving = (step, _clock())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._reports(trainer):
            return
        self._finish_save()
        self.client.completed(step=int(trainer.global_step))
        self.client.flush()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not self._reports(trainer):
            return
        self._finish_save()
        self.client.failed(f"{exception.__class__.__name__}: {exception}")
        self.client.flush()


__all__ = [
    "GoodputTrainingClient",
    "HuggingFaceGoodputCallback",
    "LightningGoodputCallback",
    "Rejected",
    "StepTimer",
    "Unreachable",
    "clean_reason",
    "default_node_name",
    "default_scheduler_id",
]
