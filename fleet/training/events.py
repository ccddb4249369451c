"""Training job events: the door's validation and the one writer every event goes through.

A batch is checked whole before anything is written (``parse_job_events`` for its shape,
``check_job_events`` against the job's stored state), so a bad batch gets one 400 naming the event
and field, and nothing of it is stored. Events are keyed by (job, event id): a retried batch, or
an event repeated in a later batch, is stored once and otherwise skipped without error.

The writer is shaped like the telemetry writer: binary COPY into a temporary table, one
INSERT ... ON CONFLICT DO NOTHING, the job's current facts updated once per batch, the goodput
accounts marked dirty, and the live pushes requested on commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

import msgspec
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from console import counters, live
from fleet.choices import JobEventKind, JobState
from fleet.training.models import HOLDING_STATES, Job
from fleet.validation import HOSTNAME_PATTERN, IngestError

EVENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,99}$"
# Bounds that keep every sum the accounts and pages take inside a bigint: 2**53 steps (exact in a
# double), 2**40 tokens (a trillion) in one step, 8 PiB in one checkpoint.
_MAX_STEP = 2**53
_MAX_TOKENS = 2**40
_MAX_BYTES = 2**53
_WEEK_S = 7 * 86400.0

EventKind = Literal[
    "allocated",
    "started",
    "step",
    "checkpoint_started",
    "checkpoint_saved",
    "restored",
    "failed",
    "preempted",
    "resumed",
    "released",
    "completed",
]


class JobEventIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: Annotated[str, msgspec.Meta(pattern=EVENT_ID_PATTERN)]
    ts: Annotated[datetime, msgspec.Meta(tz=True)]
    kind: EventKind
    step: Annotated[int, msgspec.Meta(ge=0, le=_MAX_STEP)] | None = None
    tokens: Annotated[int, msgspec.Meta(ge=0, le=_MAX_TOKENS)] | None = None
    step_time_s: Annotated[float, msgspec.Meta(gt=0, le=_WEEK_S)] | None = None
    data_wait_s: Annotated[float, msgspec.Meta(ge=0, le=_WEEK_S)] | None = None
    duration_s: Annotated[float, msgspec.Meta(ge=0, le=_WEEK_S)] | None = None
    bytes: Annotated[int, msgspec.Meta(ge=0, le=_MAX_BYTES)] | None = None
    # No NUL: PostgreSQL text cannot hold one (an exception's text can).
    reason: Annotated[str, msgspec.Meta(max_length=500, pattern=r"^[^\x00]*$")] | None = None
    node: Annotated[str, msgspec.Meta(max_length=253, pattern=HOSTNAME_PATTERN)] | None = None


class JobEventBatchIn(msgspec.Struct, forbid_unknown_fields=True):
    events: list[JobEventIn]


# Which optional fields each kind takes, and which of them it must carry.
OPTIONAL_FIELDS = ("step", "tokens", "step_time_s", "data_wait_s", "duration_s", "bytes", "reason", "node")
KIND_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # kind: (required, allowed)
    JobEventKind.ALLOCATED: ((), ("node",)),
    JobEventKind.STARTED: ((), ("node",)),
    JobEventKind.STEP: (("step", "step_time_s"), ("step", "tokens", "step_time_s", "data_wait_s", "node")),
    JobEventKind.CHECKPOINT_STARTED: ((), ("step",)),
    JobEventKind.CHECKPOINT_SAVED: (("step", "duration_s"), ("step", "duration_s", "bytes")),
    JobEventKind.RESTORED: (("step",), ("step", "duration_s")),
    JobEventKind.FAILED: ((), ("reason", "node")),
    JobEventKind.PREEMPTED: ((), ("reason",)),
    JobEventKind.RESUMED: ((), ()),
    JobEventKind.RELEASED: ((), ()),
    JobEventKind.COMPLETED: ((), ("step",)),
}
# Kinds that need the job to hold its GPUs (allocated, running, or a failed attempt not released).
NEEDS_ALLOCATION = {
    JobEventKind.STARTED,
    JobEventKind.STEP,
    JobEventKind.CHECKPOINT_STARTED,
    JobEventKind.CHECKPOINT_SAVED,
    JobEventKind.RESTORED,
    JobEventKind.FAILED,
    JobEventKind.PREEMPTED,
    JobEventKind.COMPLETED,
}
NEXT_STATE = {
    JobEventKind.ALLOCATED: JobState.ALLOCATED,
    JobEventKind.RESUMED: JobState.ALLOCATED,
    JobEventKind.STARTED: JobState.RUNNING,
    JobEventKind.STEP: JobState.RUNNING,
    JobEventKind.CHECKPOINT_STARTED: JobState.RUNNING,
    JobEventKind.CHECKPOINT_SAVED: JobState.RUNNING,
    JobEventKind.RESTORED: JobState.RUNNING,
    JobEventKind.FAILED: JobState.FAILED,
    JobEventKind.PREEMPTED: JobState.PREEMPTED,
    JobEventKind.COMPLETED: JobState.COMPLETED,
    JobEventKind.RELEASED: JobState.RELEASED,
}


def next_state(state: str, kind: str) -> str:
    """The job's state after an event of this kind (a release after completion or preemption
    keeps the state that says how the job ended)."""
    if kind == JobEventKind.RELEASED and state in (JobState.COMPLETED, JobState.PREEMPTED):
        return state
    return NEXT_STATE[kind]


_decoder = msgspec.json.Decoder(JobEventBatchIn)
_PATH = re.compile(r"at `\$\.events\[(\d+)\](?:\.(\w+))?`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def _event_error(index: int, event_id: str | None, field: str | None, message: str) -> IngestError:
    who = f"events[{index}]" + (f" (id {event_id!r})" if event_id else "")
    where = f"{who}.{field}" if field else who
    error = IngestError(400, f"{where}: {message}", item=index, field=field)
    return error


def parse_job_events(body: bytes) -> list[JobEventIn]:
    """Decode and check a batch's shape; raise IngestError (400/413) naming the event and field."""
    if len(body) > settings.INGEST_MAX_BYTES:
        raise IngestError(413, f"Body is {len(body)} bytes; the limit is {settings.INGEST_MAX_BYTES} bytes.")
    if not body.strip():
        raise IngestError(400, 'Empty body: send a JSON object {"events": [...]}.')
    try:
        batch = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc), body) from None
    except msgspec.DecodeError as exc:
        raise IngestError(400, f"Malformed JSON: {exc}") from None
    events = batch.events
    if not events:
        raise IngestError(400, "The batch has no events.", field="events")
    if len(events) > settings.INGEST_MAX_ITEMS:
        raise IngestError(413, f"The batch has {len(events)} events; at most {settings.INGEST_MAX_ITEMS} per request.")
    for index, event in enumerate(events):
        required, allowed = KIND_FIELDS[event.kind]
        for name in OPTIONAL_FIELDS:
            value = getattr(event, name)
            if value is None and name in required:
                raise _event_error(index, event.id, name, f"a {event.kind} event needs {name}.")
            if value is not None and name not in allowed:
                raise _event_error(index, event.id, name, f"a {event.kind} event takes no {name}.")
        if event.kind == JobEventKind.STEP and (event.data_wait_s or 0) > event.step_time_s:  # type: ignore[operator]
            raise _event_error(
                index,
                event.id,
                "data_wait_s",
                f"{event.data_wait_s} s of data wait is longer than the step ({event.step_time_s} s).",
            )
    return events


def _validation_error(message: str, body: bytes) -> IngestError:
    """msgspec's message, with the event's index, id and field pulled out of its path."""
    match = _PATH.search(message)
    if match is None:
        return IngestError(400, f"Invalid batch: {message}")
    index = int(match[1])
    field = match[2]
    if field is None:
        for pattern in (_UNKNOWN, _MISSING):
            if found := pattern.search(message):
                field = found[1]
    event_id = None
    try:  # the id of the event at fault, read leniently from the raw body for the message
        raw = msgspec.json.decode(body)
        candidate = raw["events"][index].get("id")
        event_id = candidate if isinstance(candidate, str) and len(candidate) <= 100 else None
    except Exception:
        pass
    detail = _PATH.sub("", message).strip().rstrip("-").strip()
    return _event_error(index, event_id, field, detail or message)


@dataclass
class StoredBatch:
    written: int
    repeated: int
    job: Job


def check_job_events(job: Job, events: list[JobEventIn], *, now: datetime | None = None) -> list[JobEventIn]:
    """Check a batch against the job's stored state; return the events not stored before.

    1. Events whose id is already stored, or repeated in this batch, are left out (a retry).
    2. The rest must be in time order, none before the job's last stored event, and inside the
       ingest window.
    3. Each must make sense in the state the events before it leave the job in: a step needs GPUs
       held, and a step number may only go back through a restore.
    Raises IngestError (400) naming the event and field; reads only.
    """
    now = now or timezone.now()
    newest = now + timedelta(seconds=settings.INGEST_MAX_FUTURE_SECONDS)
    oldest = now - timedelta(seconds=settings.INGEST_MAX_AGE_SECONDS)
    seen: dict[str, int] = {}
    fresh: list[tuple[int, JobEventIn]] = []
    for index, event in enumerate(events):
        if event.id in seen:
            if events[seen[event.id]] != event:
                raise _event_error(
                    index, event.id, "id", f"the id is used by events[{seen[event.id]}] with other content."
                )
            continue
        seen[event.id] = index
        fresh.append((index, event))
    stored = _stored_ids(job.pk, list(seen))
    fresh = [(i, e) for i, e in fresh if e.id not in stored]

    state = job.state
    last_ts = job.last_event_at
    last_step = job.last_step
    saved: set[int] = set()  # checkpoint steps saved earlier in this batch
    for index, event in fresh:
        if event.ts > newest:
            raise _event_error(
                index,
                event.id,
                "ts",
                f"{event.ts.isoformat()} is more than {settings.INGEST_MAX_FUTURE_SECONDS} s in the future "
                "(check the trainer's clock).",
            )
        if event.ts < oldest:
            raise _event_error(
                index,
                event.id,
                "ts",
                f"{event.ts.isoformat()} is older than the {settings.INGEST_MAX_AGE_SECONDS} s accepted.",
            )
        if last_ts is not None and event.ts < last_ts:
            raise _event_error(
                index,
                event.id,
                "ts",
                f"{event.ts.isoformat()} is before the job's previous event ({last_ts.isoformat()}); "
                "send a job's events in time order.",
            )
        if event.kind in NEEDS_ALLOCATION and state not in HOLDING_STATES:
            raise _event_error(
                index,
                event.id,
                "kind",
                f"a {event.kind} event while the job is {state}: send allocated (or resumed) first.",
            )
        if event.kind in (JobEventKind.ALLOCATED, JobEventKind.RESUMED) and state == JobState.COMPLETED:
            raise _event_error(index, event.id, "kind", "the job has completed; register a new job to run it again.")
        if event.kind == JobEventKind.STEP:
            if last_step is not None and event.step < last_step:  # type: ignore[operator]
                raise _event_error(
                    index,
                    event.id,
                    "step",
                    f"step {event.step} is behind step {last_step} without a restore in between "
                    "(send a restored event with the checkpoint's step first).",
                )
            last_step = event.step
        elif event.kind == JobEventKind.CHECKPOINT_SAVED:
            if event.step > (last_step or 0):  # type: ignore[operator]
                raise _event_error(
                    index,
                    event.id,
                    "step",
                    f"a checkpoint of step {event.step}, but the job has reached step {last_step or 0}.",
                )
            saved.add(event.step)  # type: ignore[arg-type]
        elif event.kind == JobEventKind.RESTORED:
            if event.step and event.step not in saved and event.step not in _saved_steps(job.pk, event.step):
                raise _event_error(
                    index,
                    event.id,
                    "step",
                    f"no checkpoint of step {event.step} was saved for this job; restore from a saved "
                    "checkpoint's step, or 0 for a fresh start.",
                )
            last_step = event.step
        state = next_state(state, event.kind)
        last_ts = event.ts
    return [e for _, e in fresh]


def _saved_steps(job_id: int, step: int) -> set[int]:
    """{step} when the job has a stored checkpoint of that step, else the empty set."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM fleet_jobevent WHERE job_id = %s AND kind = %s AND step = %s LIMIT 1",
            [job_id, JobEventKind.CHECKPOINT_SAVED, step],
        )
        return {step} if cursor.fetchone() else set()


def _stored_ids(job_id: int, ids: list[str]) -> set[str]:
    if job_id is None or not ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_id FROM fleet_jobevent WHERE job_id = %s AND event_id = ANY(%s)",
            [job_id, ids],
        )
        return {row[0] for row in cursor.fetchall()}


def record_job_events(job_id: int, events: list[JobEventIn], *, now: datetime | None = None) -> StoredBatch:
    """Validate and store one batch of a job's events, atomically; return what was written.

    The job's row is locked for the batch, so two batches of one job are checked and written one
    after the other (the order check reads what the other wrote). Raises IngestError.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        fresh = check_job_events(job, events, now=now)
        written = store_job_events(job, fresh) if fresh else 0
    return StoredBatch(written=written, repeated=len(events) - len(fresh), job=job)


_COLUMNS = (
    "job_id",
    "event_id",
    "seq",
    "ts",
    "kind",
    "step",
    "tokens",
    "step_time_s",
    "data_wait_s",
    "duration_s",
    "bytes",
    "reason",
    "node",
)
_TYPES = [
    "int8",
    "text",
    "int8",
    "timestamptz",
    "text",
    "int8",
    "int8",
    "float8",
    "float8",
    "float8",
    "int8",
    "text",
    "text",
]


def store_job_events(job: Job, events: list[JobEventIn]) -> int:
    """Write checked events of one job (in the caller's transaction, the job row locked) and bring
    the job's current facts up to date; return the rows written.

    1. COPY into a temporary table, 2. INSERT ... ON CONFLICT DO NOTHING (a racing retry), 3. the
    job's state, last step and last checkpoint, 4. accounts dirty, 5. live pushes on commit.
    """
    columns = ", ".join(_COLUMNS)
    with connection.cursor() as cursor:
        raw = cursor.cursor
        raw.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS goodput_jobevent_in AS SELECT {columns} FROM fleet_jobevent WITH NO DATA"
        )
        raw.execute("TRUNCATE goodput_jobevent_in")
        with raw.copy(f"COPY goodput_jobevent_in ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(_TYPES)
            for offset, e in enumerate(events):
                copy.write_row(
                    (
                        job.pk,
                        e.id,
                        job.events_seen + offset,
                        e.ts,
                        e.kind,
                        e.step,
                        e.tokens,
                        e.step_time_s,
                        e.data_wait_s,
                        e.duration_s,
                        e.bytes,
                        e.reason or "",
                        e.node or "",
                    )
                )
        raw.execute(
            f"INSERT INTO fleet_jobevent ({columns}) SELECT {columns} FROM goodput_jobevent_in "
            "ON CONFLICT (job_id, event_id) DO NOTHING"
        )
        written = raw.rowcount
    apply_events(job, events)
    job.events_seen += len(events)
    job.accounts_dirty_at = timezone.now()
    job.save(
        update_fields=[
            "state",
            "first_allocated_at",
            "allocated_since",
            "progress_since",
            "ended_at",
            "last_event_at",
            "last_step",
            "last_step_at",
            "last_step_time_s",
            "last_checkpoint_at",
            "last_checkpoint_step",
            "failures",
            "events_seen",
            "accounts_dirty_at",
        ]
    )
    counters.increment("goodput_training_events_stored_total", written)
    transaction.on_commit(lambda: live.request_push(f"job.{job.pk}", "training"))
    return written


def apply_events(job: Job, events: list[Any]) -> None:
    """Move the job's current facts along a time-ordered list of events (no save)."""
    for e in events:
        kind = e.kind
        if kind in (JobEventKind.ALLOCATED, JobEventKind.RESUMED):
            if job.state not in HOLDING_STATES:
                job.allocated_since = e.ts
            job.first_allocated_at = job.first_allocated_at or e.ts
            job.progress_since = e.ts
            job.ended_at = None
        elif kind in (JobEventKind.STARTED, JobEventKind.RESTORED):
            job.progress_since = e.ts
            if kind == JobEventKind.RESTORED:
                job.last_step = e.step
        elif kind == JobEventKind.STEP:
            job.last_step, job.last_step_at, job.last_step_time_s = e.step, e.ts, e.step_time_s
        elif kind == JobEventKind.CHECKPOINT_SAVED:
            job.last_checkpoint_at, job.last_checkpoint_step = e.ts, e.step
        elif kind == JobEventKind.FAILED:
            job.failures += 1
        if kind in (JobEventKind.PREEMPTED, JobEventKind.RELEASED, JobEventKind.COMPLETED):
            job.allocated_since = None
            job.ended_at = e.ts
        job.state = next_state(job.state, kind)
        job.last_event_at = e.ts
