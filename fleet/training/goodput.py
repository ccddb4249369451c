"""Goodput accounting: pure functions over one job's time-ordered events (no database).

Events are any objects with ``kind, ts, step, step_time_s, data_wait_s, duration_s, tokens`` (and
``reason`` for failure_losses): JobEvent rows, or the events door's JobEventIn. They must be in the
order they were stored (ts, then arrival). ``job_spans`` turns them into disjoint, sorted spans of
wall-clock time that tile the job's allocated time exactly; ``account`` turns spans into GPU-seconds
per category (gang size x wall seconds), whose parts add up to the allocated total exactly.

Semantics
---------
Allocation. It opens at ``allocated`` or ``resumed`` (when not already open) and closes at
``preempted``, ``released`` or ``completed``; an allocation still open runs to ``now``. Only
allocated time appears in the spans; events after ``now`` are ignored.

What covers time, highest priority first where intervals overlap:
  1. checkpoint_save: a ``checkpoint_saved`` event covers [ts - duration_s, ts] (the synchronous part);
  2. checkpoint_restore: a ``restored`` event covers [ts - duration_s, ts];
  3. data_stall: a ``step`` covers [ts - step_time_s, ts]; its first data_wait_s seconds wait for
     input (a node waiting for data holds the whole gang in synchronous training, so a stall wins
     over another node's overlapping compute);
  4. compute: the rest of the step. Where two steps' compute overlaps, the earlier step keeps it.
  Progress intervals never reach back before the current attempt (the allocation's start, or the
  latest ``started`` or ``failed`` event).

What compute becomes, by what happens to it afterwards:
  * productive: covered by a checkpoint still in the lineage at ``now``, or by completion. A
    ``checkpoint_saved`` of step s covers the not-yet-checkpointed compute of steps <= s;
  * disruption: a ``failed`` or ``preempted`` event, or a ``released`` without completion, loses all
    compute not yet checkpointed. ``restored`` from step r moves the lineage back to the latest
    checkpoint of the lineage saved with step r: compute covered by the lineage's later checkpoints,
    and compute not yet checkpointed, is lost. A restore from a step no checkpoint of the lineage
    saved (step 0, or another run's checkpoint) loses the whole lineage: a job that never
    checkpointed loses everything on failure;
  * at_risk: compute after the lineage's last checkpoint while the job still holds its GPUs.

Allocated time covered by none of the above:
  * startup: from the allocation's start, or a ``started`` event, to the attempt's first progress
    (step, save or restore);
  * idle: from a ``failed`` event to the next ``started`` event (or the allocation's end);
  * between progress (including the tail after the last progress until a failure, a restart, the
    allocation's end or ``now``): hang when the gap is at least ``hang_after_s`` long, else idle.
    The default threshold is ``hang_threshold_s`` of the job's step times:
    max(10 x median step time, 300 s), the hang detector's rule.

Time is handled in whole microseconds internally (timestamps carry microseconds), so the tiling
is exact: no two spans overlap and they sum to the allocated time to the microsecond.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

CATEGORIES = (
    "productive",
    "at_risk",
    "startup",
    "data_stall",
    "checkpoint_save",
    "checkpoint_restore",
    "disruption",
    "hang",
    "idle",
)
CATEGORY_LABELS = {
    "productive": "Productive (retained)",
    "at_risk": "Not yet checkpointed",
    "startup": "Start-up and initialisation",
    "data_stall": "Data-loading stall",
    "checkpoint_save": "Checkpoint save",
    "checkpoint_restore": "Checkpoint restore",
    "disruption": "Progress lost to disruptions",
    "hang": "Hang (allocated, no progress)",
    "idle": "Idle and other",
}
BADPUT_CATEGORIES = tuple(c for c in CATEGORIES if c not in ("productive", "at_risk"))

HANG_MIN_S = 300.0
HANG_STEP_MULTIPLE = 10.0

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = 1_000_000
_ONE_US = timedelta(microseconds=1)

# Painting priorities (higher wins where intervals overlap).
_SAVE, _RESTORE, _STALL, _COMPUTE = 4, 3, 2, 1
# Gap phases.
_STARTUP, _FAILED, _RUN = "startup", "failed", "run"


def to_us(ts: datetime) -> int:
    """A timestamp as whole microseconds since the epoch (exact)."""
    return (ts - EPOCH) // _ONE_US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def _seconds_to_us(seconds: float | None) -> int:
    return round(seconds * _US) if seconds else 0


@dataclass(frozen=True)
class Span:
    """Wall-clock time [start, end) of one job, in one category."""

    start: datetime
    end: datetime
    category: str

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / _ONE_US / _US


@dataclass(frozen=True)
class Account:
    """GPU-seconds per category; allocated_s is their sum (build with ``Account.of``)."""

    productive_s: float = 0.0
    at_risk_s: float = 0.0
    startup_s: float = 0.0
    data_stall_s: float = 0.0
    checkpoint_save_s: float = 0.0
    checkpoint_restore_s: float = 0.0
    disruption_s: float = 0.0
    hang_s: float = 0.0
    idle_s: float = 0.0
    allocated_s: float = 0.0
    steps: int = 0
    tokens: int = 0

    @classmethod
    def of(cls, seconds: dict[str, float], *, steps: int = 0, tokens: int = 0) -> Account:
        """An account from GPU-seconds per category (missing ones are 0); allocated_s is their sum."""
        values = {f"{c}_s": float(seconds.get(c, 0.0)) for c in CATEGORIES}
        return cls(**values, allocated_s=sum(values.values()), steps=steps, tokens=tokens)

    def seconds(self, category: str) -> float:
        return getattr(self, f"{category}_s")  # type: ignore[no-any-return]

    def by_category(self) -> dict[str, float]:
        """GPU-seconds per category, in CATEGORIES order."""
        return {c: self.seconds(c) for c in CATEGORIES}

    @property
    def goodput(self) -> float | None:
        """Retained productive GPU-time / allocated GPU-time; None when nothing was allocated."""
        return self.productive_s / self.allocated_s if self.allocated_s else None

    @property
    def badput_s(self) -> float:
        return sum(self.seconds(c) for c in BADPUT_CATEGORIES)

    def __add__(self, other: Account) -> Account:
        return add_accounts([self, other])


EMPTY_ACCOUNT = Account()


def add_accounts(accounts: Iterable[Account]) -> Account:
    """The sum of accounts (a team's, a cluster's, a site's); allocated_s stays the sum of the parts."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    steps = tokens = 0
    for a in accounts:
        for c in CATEGORIES:
            totals[c] += a.seconds(c)
        steps += a.steps
        tokens += a.tokens
    return Account.of(totals, steps=steps, tokens=tokens)


merge = add_accounts


def ideal_step_time_s(step_times: Iterable[float]) -> float | None:
    """A healthy step time: the mean of step times at or below median + 3 x MAD (REFERENCE.md)."""
    times = [t for t in step_times if t is not None]
    if not times:
        return None
    median = statistics.median(times)
    mad = statistics.median(abs(t - median) for t in times)
    healthy = [t for t in times if t <= median + 3 * mad]
    return sum(healthy) / len(healthy)


def hang_threshold_s(step_times: Iterable[float]) -> float:
    """Seconds without progress that count as a hang: max(10 x median step time, 300 s)."""
    times = [t for t in step_times if t is not None]
    if not times:
        return HANG_MIN_S
    return max(HANG_STEP_MULTIPLE * statistics.median(times), HANG_MIN_S)


# --- the sweep ------------------------------------------------------------------------------------

# An event as the sweep reads it: (kind, ts_us, step, step_time_s, data_wait_s, duration_s, reason, tokens).
Row = tuple[str, int, int | None, float | None, float | None, float | None, str, int | None]


def rows_of(events: Iterable[Any]) -> list[Row]:
    """The sweep's tuples from event objects."""
    return [
        (
            str(e.kind),
            to_us(e.ts),
            e.step,
            e.step_time_s,
            e.data_wait_s,
            e.duration_s,
            getattr(e, "reason", None) or "",
            e.tokens,
        )
        for e in events
    ]


@dataclass
class FailureLoss:
    """What one disruption cost, and the checkpoint it fell back to.

    kind is failed or preempted; also released (ended without completing) or restored (a rollback
    with no failure before it) when those lost compute.

    Two measures of the loss, in GPU-seconds:
      * since_checkpoint_gpu_s: the issue's "lost GPU-hours" of a failure: gang size x (ts - the
        retained checkpoint's ts, or the failed attempt's start when no checkpoint is retained).
        It counts every second since the checkpoint, whatever it was spent on (start-up, stalls,
        saves, compute), and two failures after one checkpoint both count the time before the first,
        so these do not add up with the account's categories;
      * lost_gpu_s: the compute this disruption threw away, the disjoint share of the account's
        disruption category: the losses' lost_gpu_s add up to the job's disruption GPU-seconds.
    """

    ts: datetime
    kind: str
    reason: str
    lost_gpu_s: float
    checkpoint_step: int | None
    checkpoint_ts: datetime | None
    since_checkpoint_gpu_s: float = 0.0


class _Sweep:
    """One pass over a job's rows; see the module docstring for the rules it applies."""

    def __init__(self, now_us: int) -> None:
        self.now = now_us
        self.painted: list[list[Any]] = []  # [start, end, priority, category or unit], sorted, disjoint
        self.markers: list[tuple[int, str]] = []  # gap phase changes, in time order
        self.windows: list[tuple[int, int]] = []
        self.open_at: int | None = None
        self.attempt_start = 0
        self.phase = _STARTUP
        # A unit is one step's compute: [category or None, loss record index or None, step].
        self.lineage: list[tuple[int | None, int, list[list[Any]]]] = []  # (step, ts, units) per checkpoint
        self.pending: list[list[Any]] = []
        self.records: list[dict[str, Any]] = []
        self.open_record: int | None = None  # the disruption a following restore is charged to

    # painting -----------------------------------------------------------------------------------
    def paint(self, a: int, b: int, priority: int, payload: Any) -> None:
        """Lay [a, b) over what is painted; higher priority wins, the earlier interval wins a tie.

        Every painted interval ends at or before its event's ts, so only a short suffix of the
        list can overlap the new interval.
        """
        if b <= a:
            return
        segs = self.painted
        i = len(segs)
        while i and segs[i - 1][1] > a:
            i -= 1
        if i == len(segs):
            if segs and segs[-1][1] == a and segs[-1][2] == priority and segs[-1][3] is payload:
                segs[-1][1] = b
            else:
                segs.append([a, b, priority, payload])
            return
        tail = segs[i:]
        del segs[i:]
        cursor = a  # [a, cursor) of the new interval is decided
        for s in tail:
            if s[2] >= priority:
                # It keeps its time; the new interval fills what it leaves, up to b.
                if s[0] > cursor and cursor < b:
                    segs.append([cursor, min(s[0], b), priority, payload])
                segs.append(s)
                cursor = max(cursor, s[1])
                continue
            # Lower priority: it keeps only what lies outside [a, b), before and after.
            if s[0] < a:
                segs.append([s[0], a, s[2], s[3]])
            if s[1] > b:
                if cursor < b:
                    segs.append([cursor, b, priority, payload])
                    cursor = b
                segs.append([max(s[0], b), s[1], s[2], s[3]])
        if cursor < b:
            segs.append([cursor, b, priority, payload])

    def mark(self, t: int, phase: str) -> None:
        t = max(t, self.markers[-1][0]) if self.markers else t
        self.markers.append((t, phase))
        self.phase = phase

    def progress(self, a: int, b: int) -> None:
        """Note progress over [a, b]: the attempt is running, and a gap ends here."""
        if self.phase != _RUN:
            self.mark(a, _RUN)
        elif a == b:
            self.mark(b, _RUN)  # an instant of progress still splits the gap around it

    # fates --------------------------------------------------------------------------------------
    def lose(self, units: Iterable[list[Any]], record: int | None) -> None:
        for u in units:
            u[0] = "disruption"
            u[1] = record

    def record(self, kind: str, ts: int, reason: str) -> int:
        checkpoint = self.lineage[-1] if self.lineage else None
        self.records.append(
            {
                "ts": ts,
                "kind": kind,
                "reason": reason,
                "step": checkpoint[0] if checkpoint else None,
                "checkpoint_ts": checkpoint[1] if checkpoint else None,
                "attempt_start": self.attempt_start,
            }
        )
        return len(self.records) - 1

    def disrupt(self, kind: str, ts: int, reason: str, *, always: bool) -> None:
        """A failure, preemption or release: compute not yet checkpointed is lost."""
        if not always and not self.pending:
            return
        index = self.record(kind, ts, reason)
        self.lose(self.pending, index)
        self.pending = []
        self.open_record = index

    def close(self, ts: int) -> None:
        assert self.open_at is not None
        self.windows.append((self.open_at, ts))
        self.open_at = None

    # the pass -----------------------------------------------------------------------------------
    def run(self, rows: Sequence[Row]) -> None:
        for kind, ts, step, step_time, data_wait, duration, reason, _tokens in rows:
            if ts > self.now:
                break
            if kind in ("allocated", "resumed"):
                if self.open_at is None:
                    self.open_at = self.attempt_start = ts
                    self.mark(ts, _STARTUP)
                continue
            if self.open_at is None:
                continue  # nothing happens to GPUs the job does not hold
            if kind == "step":
                begin = max(ts - _seconds_to_us(step_time), self.attempt_start)
                stall_end = min(max(ts - _seconds_to_us(step_time) + _seconds_to_us(data_wait), begin), ts)
                self.progress(begin, ts)
                self.open_record = None
                self.paint(begin, stall_end, _STALL, "data_stall")
                if stall_end < ts:
                    unit = [None, None, step]
                    self.pending.append(unit)
                    self.paint(stall_end, ts, _COMPUTE, unit)
            elif kind == "checkpoint_saved":
                begin = max(ts - _seconds_to_us(duration), self.attempt_start)
                self.progress(begin, ts)
                self.open_record = None
                self.paint(begin, ts, _SAVE, "checkpoint_save")
                covered = [u for u in self.pending if step is None or u[2] is None or u[2] <= step]
                if len(covered) != len(self.pending):
                    kept = {id(u) for u in covered}
                    self.pending = [u for u in self.pending if id(u) not in kept]
                else:
                    self.pending = []
                self.lineage.append((step, ts, covered))
            elif kind == "restored":
                begin = max(ts - _seconds_to_us(duration), self.attempt_start)
                self.progress(begin, ts)
                self.paint(begin, ts, _RESTORE, "checkpoint_restore")
                self.restore(step, ts)
            elif kind == "failed":
                self.disrupt("failed", ts, reason, always=True)
                self.attempt_start = ts
                self.mark(ts, _FAILED)
            elif kind == "started":
                self.attempt_start = ts
                self.mark(ts, _STARTUP)
            elif kind in ("preempted", "released"):
                self.disrupt(kind, ts, reason, always=kind == "preempted")
                self.close(ts)
            elif kind == "completed":
                for _, _, units in self.lineage:
                    for u in units:
                        u[0] = "productive"
                for u in self.pending:
                    u[0] = "productive"
                self.lineage, self.pending = [], []
                self.close(ts)
        if self.open_at is not None:
            self.close(self.now)
        for _, _, units in self.lineage:
            for u in units:
                u[0] = u[0] or "productive"
        for u in self.pending:
            u[0] = u[0] or "at_risk"

    def restore(self, step: int | None, ts: int) -> None:
        """Move the lineage back to the checkpoint saved with this step; later work is lost."""
        keep = 0
        for index in range(len(self.lineage) - 1, -1, -1):
            if self.lineage[index][0] == step:
                keep = index + 1
                break
        lost = [u for _, _, units in self.lineage[keep:] for u in units] + self.pending
        record = self.open_record
        if record is None and lost:
            record = self.record("restored", ts, f"restored from step {step}")
            self.open_record = record
        if record is not None:
            target = self.lineage[keep - 1] if keep else None
            self.records[record]["step"] = target[0] if target else None
            self.records[record]["checkpoint_ts"] = target[1] if target else None
        self.lose(lost, record)
        self.lineage = self.lineage[:keep]
        self.pending = []

    # output -------------------------------------------------------------------------------------
    def pieces(self, hang_us: int) -> list[tuple[int, int, str]]:
        """Disjoint, sorted (start, end, category) tiling the allocated windows (not merged).

        Written for speed: a job of 20,000 events has some 60,000 pieces.
        """
        out: list[tuple[int, int, str]] = []
        add = out.append
        markers = self.markers
        count = len(markers)
        m = 0
        phase = _STARTUP

        def gap(a: int, b: int) -> None:
            nonlocal m, phase
            while a < b:
                while m < count and markers[m][0] <= a:
                    phase = markers[m][1]
                    m += 1
                cut = markers[m][0] if m < count and markers[m][0] < b else b
                if phase == _RUN:
                    add((a, cut, "hang" if cut - a >= hang_us else "idle"))
                else:
                    add((a, cut, "startup" if phase == _STARTUP else "idle"))
                a = cut

        segs = self.painted
        n = len(segs)
        p = 0
        for w_start, w_end in self.windows:
            cursor = w_start
            while p < n:
                s = segs[p]
                a = s[0]
                if a >= w_end:
                    break
                p += 1
                b = s[1]
                a = max(a, w_start)
                b = min(b, w_end)
                if a > cursor:
                    gap(cursor, a)
                if b > a:
                    payload = s[3]
                    add((a, b, payload if payload.__class__ is str else payload[0]))
                    cursor = b
            gap(cursor, w_end)
        return out

    def spans(self, hang_us: int) -> list[tuple[int, int, str]]:
        """The pieces, with neighbours of one category merged."""
        out: list[tuple[int, int, str]] = []
        for piece in self.pieces(hang_us):
            if out:
                last = out[-1]
                if last[1] == piece[0] and last[2] == piece[2]:
                    out[-1] = (last[0], piece[1], last[2])
                    continue
            out.append(piece)
        return out


def _hang_us(rows: Sequence[Row], now_us: int, hang_after_s: float | None) -> int:
    if hang_after_s is None:
        hang_after_s = hang_threshold_s(r[3] for r in rows if r[0] == "step" and r[1] <= now_us)
    return _seconds_to_us(hang_after_s)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the sweep makes tens of thousands of small lists (no
    cycles among them), and the collections they trigger would more than double its time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def sweep(rows: Sequence[Row], *, now_us: int) -> _Sweep:
    """Run the accounting pass over the sweep's tuples (for callers that read rows themselves)."""
    state = _Sweep(now_us)
    with _collector_paused():
        state.run(rows)
    return state


def raw_spans(
    rows: Sequence[Row], *, now_us: int, hang_after_s: float | None = None, merged: bool = True
) -> list[tuple[int, int, str]]:
    """job_spans over tuples, in microseconds (unmerged neighbours when merged=False): the fast path
    of the accounts refresh."""
    state = sweep(rows, now_us=now_us)
    hang_us = _hang_us(rows, now_us, hang_after_s)
    with _collector_paused():
        return state.spans(hang_us) if merged else state.pieces(hang_us)


def job_spans(events: Iterable[Any], *, now: datetime, hang_after_s: float | None = None) -> list[Span]:
    """Disjoint, sorted spans tiling the job's allocated time up to ``now`` (module docstring)."""
    rows = rows_of(events)
    return [
        Span(from_us(a), from_us(b), c) for a, b, c in raw_spans(rows, now_us=to_us(now), hang_after_s=hang_after_s)
    ]


def account(
    spans: Iterable[Span], *, gang_size: int, start: datetime | None = None, end: datetime | None = None
) -> Account:
    """GPU-seconds per category of spans clipped to [start, end); allocated_s is their sum."""
    lo = to_us(start) if start is not None else None
    hi = to_us(end) if end is not None else None
    micros = dict.fromkeys(CATEGORIES, 0)
    for span in spans:
        a, b = to_us(span.start), to_us(span.end)
        if lo is not None:
            a = max(a, lo)
        if hi is not None:
            b = min(b, hi)
        if b > a:
            micros[span.category] += b - a
    return Account.of({c: us * gang_size / _US for c, us in micros.items()})


def _losses(state: _Sweep, *, gang_size: int) -> list[FailureLoss]:
    lost = [0] * len(state.records)
    for s in state.painted:
        payload = s[3]
        if not isinstance(payload, str) and payload[1] is not None:
            lost[payload[1]] += s[1] - s[0]
    out = []
    for i, r in enumerate(state.records):
        since = r["checkpoint_ts"] if r["checkpoint_ts"] is not None else r["attempt_start"]
        out.append(
            FailureLoss(
                ts=from_us(r["ts"]),
                kind=r["kind"],
                reason=r["reason"],
                lost_gpu_s=lost[i] * gang_size / _US,
                checkpoint_step=r["step"],
                checkpoint_ts=from_us(r["checkpoint_ts"]) if r["checkpoint_ts"] is not None else None,
                since_checkpoint_gpu_s=max(r["ts"] - since, 0) * gang_size / _US,
            )
        )
    return out


def failure_losses(events: Iterable[Any], *, gang_size: int, now: datetime) -> list[FailureLoss]:
    """Per failure or preemption (and a release or rollback that lost compute): when, why, the
    GPU-seconds it cost (FailureLoss says which two measures), and the retained checkpoint it fell back to."""
    state = sweep(rows_of(events), now_us=to_us(now))
    return _losses(state, gang_size=gang_size)


def job_report(
    events: Iterable[Any], *, gang_size: int, now: datetime, hang_after_s: float | None = None
) -> tuple[list[Span], list[FailureLoss]]:
    """job_spans and failure_losses of one job from a single sweep (the job page needs both)."""
    rows = rows_of(events)
    now_us = to_us(now)
    state = sweep(rows, now_us=now_us)
    hang_us = _hang_us(rows, now_us, hang_after_s)
    with _collector_paused():
        spans = [Span(from_us(a), from_us(b), c) for a, b, c in state.spans(hang_us)]
    return spans, _losses(state, gang_size=gang_size)
