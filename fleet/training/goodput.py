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
  * disruption: from a ``failed`` event to the next ``started`` event (or the allocation's end): the
    gang held, waiting to restart, is part of what the failure cost;
  * between progress (including the tail after the last progress until a failure, a restart, the
    allocation's end or ``now``): hang when the gap is at least ``hang_after_s`` long, else idle.
    The default threshold is ``hang_threshold_s`` of the job's step times:
    max(10 x median step time, 300 s), the hang detector's rule.

What a disruption cost (``failure_losses``): each failure, preemption, lossy release or rollback is
one record, and its cost is the sum of four disjoint parts of the account: the progress it lost
(its share of disruption compute), the waiting to restart (the disruption gap after a failure),
the re-initialisation (start-up from the next ``started``, ``allocated`` or ``resumed`` to the
first progress) and the restore (the next ``restored``). Its recovery ends at the first progress
after it (a step, a save or a restore): from then on the cost no longer changes.

Time is handled in whole microseconds internally (timestamps carry microseconds), so the tiling
is exact: no two spans overlap and they sum to the allocated time to the microsecond.
"""

from __future__ import annotations

import bisect
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
    "disruption": "Disruptions: progress lost, waiting to restart",
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
_RESTORED = "checkpoint_restore"
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

    The cost, in GPU-seconds (``cost_gpu_s``), is the sum of four disjoint parts of the job's
    account, so the costs of a job's disruptions never count a second twice:
      * lost_gpu_s: the progress it threw away, compute since the retained checkpoint (its share
        of the disruption category);
      * waiting_gpu_s: the gang held from a failure to the restart's ``started`` event (or the
        release): the rest of the disruption category;
      * reinit_gpu_s: start-up from the restart (``started``, or the next allocation) to the first
        progress: part of the start-up category;
      * restore_gpu_s: loading the checkpoint it fell back to: part of the restore category.
    ``recovered`` says the job has made progress since (a step, a save or a restore): the cost is
    final. ``growing`` names the part still growing at ``now`` ("waiting" or "reinit") while the
    job holds its GPUs without progress, else None.

    since_checkpoint_gpu_s is gang size x (ts - the retained checkpoint's ts, or the failed
    attempt's start): every second since the checkpoint whatever it was spent on. It is not a cost
    (stalls, saves and hangs in that stretch keep their own causes) and the pages do not show it.
    """

    ts: datetime
    kind: str
    reason: str
    lost_gpu_s: float
    checkpoint_step: int | None
    checkpoint_ts: datetime | None
    since_checkpoint_gpu_s: float = 0.0
    waiting_gpu_s: float = 0.0
    reinit_gpu_s: float = 0.0
    restore_gpu_s: float = 0.0
    recovered: bool = False
    growing: str | None = None

    @property
    def cost_gpu_s(self) -> float:
        """Progress lost + waiting to restart + re-initialisation + restore."""
        return self.lost_gpu_s + self.waiting_gpu_s + self.reinit_gpu_s + self.restore_gpu_s


class _Sweep:
    """One pass over a job's rows; see the module docstring for the rules it applies."""

    def __init__(self, now_us: int) -> None:
        self.now = now_us
        self.painted: list[list[Any]] = []  # [start, end, priority, category or unit], sorted, disjoint
        # Gap phase changes in time order: (time, phase, the disruption record whose recovery the
        # phase belongs to, or None).
        self.markers: list[tuple[int, str, int | None]] = []
        self.windows: list[tuple[int, int]] = []
        self.open_at: int | None = None
        self.holding_at_now = False  # the last allocation is still open at ``now``
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

    def mark(self, t: int, phase: str, record: int | None = None) -> None:
        t = max(t, self.markers[-1][0]) if self.markers else t
        self.markers.append((t, phase, record))
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
                "recovered": False,
            }
        )
        return len(self.records) - 1

    def recovered(self) -> None:
        """Progress after a disruption: its recovery (and its cost) is complete."""
        if self.open_record is not None:
            self.records[self.open_record]["recovered"] = True
            self.open_record = None

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
                    # After a disruption, starting again is part of its recovery.
                    self.mark(ts, _STARTUP, self.open_record)
                continue
            if self.open_at is None:
                continue  # nothing happens to GPUs the job does not hold
            if kind == "step":
                begin = max(ts - _seconds_to_us(step_time), self.attempt_start)
                stall_end = min(max(ts - _seconds_to_us(step_time) + _seconds_to_us(data_wait), begin), ts)
                self.progress(begin, ts)
                self.recovered()
                self.paint(begin, stall_end, _STALL, "data_stall")
                if stall_end < ts:
                    unit = [None, None, step]
                    self.pending.append(unit)
                    self.paint(stall_end, ts, _COMPUTE, unit)
            elif kind == "checkpoint_saved":
                begin = max(ts - _seconds_to_us(duration), self.attempt_start)
                self.progress(begin, ts)
                self.recovered()
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
                record = self.restore(step, ts)
                # Charged to the disruption it recovers from (or the rollback it is): a unit-like
                # payload [category, record, None] that pieces() reads as its category.
                self.paint(begin, ts, _RESTORE, "checkpoint_restore" if record is None else [_RESTORED, record, None])
            elif kind == "failed":
                self.disrupt("failed", ts, reason, always=True)
                self.attempt_start = ts
                self.mark(ts, _FAILED, self.open_record)
            elif kind == "started":
                self.attempt_start = ts
                self.mark(ts, _STARTUP, self.open_record)
            elif kind in ("preempted", "released"):
                self.disrupt(kind, ts, reason, always=kind == "preempted")
                self.close(ts)
            elif kind == "completed":
                self.recovered()
                for _, _, units in self.lineage:
                    for u in units:
                        u[0] = "productive"
                for u in self.pending:
                    u[0] = "productive"
                self.lineage, self.pending = [], []
                self.close(ts)
        if self.open_at is not None:
            self.close(self.now)
            self.holding_at_now = True
        for _, _, units in self.lineage:
            for u in units:
                u[0] = u[0] or "productive"
        for u in self.pending:
            u[0] = u[0] or "at_risk"

    def restore(self, step: int | None, ts: int) -> int | None:
        """Move the lineage back to the checkpoint saved with this step; later work is lost.
        Returns the record the restore is charged to: the disruption it recovers from, or the
        rollback itself when it lost compute with none before it (None: neither)."""
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
        if record is not None:
            self.records[record]["recovered"] = True
        return record

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
                    add((a, cut, "startup" if phase == _STARTUP else "disruption"))
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


def _painted_us(segs: list[list[Any]], a: int, b: int) -> int:
    """Microseconds of [a, b) covered by painted segments (sorted, disjoint)."""
    covered = 0
    i = bisect.bisect_right(segs, a, key=lambda s: s[1])  # the first segment ending after a
    while i < len(segs) and segs[i][0] < b:
        covered += min(segs[i][1], b) - max(segs[i][0], a)
        i += 1
    return covered


def _recovery_us(state: _Sweep) -> tuple[list[int], list[int], list[str | None]]:
    """Per record: microseconds waiting to restart and re-initialising (the allocated gaps of its
    recovery phases: what pieces() files as disruption and start-up there), and the part still
    growing at ``now`` (the last phase of an allocation still open), if any. Markers with a record
    are few (one per failure and restart), and each looks up the painted list by bisection."""
    n = len(state.records)
    waiting, reinit = [0] * n, [0] * n
    growing: list[str | None] = [None] * n
    markers = state.markers
    for i, (t, phase, record) in enumerate(markers):
        if record is None or phase == _RUN:
            continue
        end = markers[i + 1][0] if i + 1 < len(markers) else state.now
        held = 0
        for w_start, w_end in state.windows:
            a, b = max(t, w_start), min(end, w_end)
            if b > a:
                held += b - a - _painted_us(state.painted, a, b)
        (waiting if phase == _FAILED else reinit)[record] += held
        if i + 1 == len(markers) and state.holding_at_now:
            growing[record] = "waiting" if phase == _FAILED else "reinit"
    return waiting, reinit, growing


def _losses(state: _Sweep, *, gang_size: int) -> list[FailureLoss]:
    n = len(state.records)
    lost, restored = [0] * n, [0] * n
    for s in state.painted:
        payload = s[3]
        if payload.__class__ is not str and payload[1] is not None:
            if payload[0] == _RESTORED:
                restored[payload[1]] += s[1] - s[0]
            else:
                lost[payload[1]] += s[1] - s[0]
    waiting, reinit, growing = _recovery_us(state)
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
                waiting_gpu_s=waiting[i] * gang_size / _US,
                reinit_gpu_s=reinit[i] * gang_size / _US,
                restore_gpu_s=restored[i] * gang_size / _US,
                recovered=r["recovered"],
                growing=growing[i],
            )
        )
    return out


def failure_losses(events: Iterable[Any], *, gang_size: int, now: datetime) -> list[FailureLoss]:
    """Per failure or preemption (and a release or rollback that lost compute): when, why, what it
    cost in GPU-seconds and its parts (FailureLoss), and the retained checkpoint it fell back to."""
    return failure_losses_of_rows(rows_of(events), gang_size=gang_size, now_us=to_us(now))


def failure_losses_of_rows(rows: Sequence[Row], *, gang_size: int, now_us: int) -> list[FailureLoss]:
    """failure_losses over the sweep's tuples (for callers that read rows themselves)."""
    return _losses(sweep(rows, now_us=now_us), gang_size=gang_size)


def unrecovered(losses: Sequence[FailureLoss]) -> list[FailureLoss]:
    """The disruptions the job has not recovered from yet: the trailing ones with no progress
    after them (a failure, and any further failure of its restart before a step, save or restore).
    Their costs together are what the job's current failure costs so far."""
    out: list[FailureLoss] = []
    for loss in reversed(losses):
        if loss.recovered:
            break
        out.append(loss)
    return out[::-1]


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


@dataclass(frozen=True)
class Stretch:
    """A stretch of a job priced from its own events (stretch_of): the account; compute_s, the
    GPU-seconds of step compute whatever became of it (retained, at risk or lost); and quiet_s,
    the wall seconds from the stretch's start to its first progress, failure or release (or its
    end): how long a job that stopped progressing at the start stayed without progress."""

    account: Account
    compute_s: float
    quiet_s: float


def compute_us(state: _Sweep, start_us: int, end_us: int) -> int:
    """Microseconds of [start, end) painted with step compute, whatever its fate."""
    total = 0
    for a, b, _, payload in state.painted:
        if payload.__class__ is not str and payload[0] != _RESTORED and b > start_us and a < end_us:
            total += min(b, end_us) - max(a, start_us)
    return total


def stretch_of(rows: Sequence[Row], *, gang_size: int, start_us: int, end_us: int) -> Stretch:
    """The account of [start, end) from only the events of that stretch (``rows`` may hold more:
    those with start < ts <= end are used), as if an allocation opened at ``start``.

    Exact, against the job's whole account clipped to the stretch, for what the stretch's own
    events decide: data_stall, checkpoint_save and checkpoint_restore, and compute_s (an interval
    never reaches before its event's ts, and every event whose interval reaches into the stretch
    has ts > start). Which compute is retained is decided by checkpoints inside the stretch only,
    so from the job's last checkpoint on, at_risk is the work not yet checkpointed. Start-up, hang,
    idle and waiting are not meaningful here. Cheap: the detectors price a fault over its episode
    without sweeping the job's whole history.
    """
    head: Row = ("allocated", start_us, None, None, None, None, "", None)
    inside: list[Row] = []
    for r in rows:
        if start_us < r[1] <= end_us:
            inside.append(r)
            if r[0] in ("allocated", "resumed"):
                # Open already in the stretch: the attempt starts here all the same.
                inside.append(("started", r[1], None, None, None, None, "", None))
    state = sweep([head, *inside], now_us=end_us)
    micros = dict.fromkeys(CATEGORIES, 0)
    with _collector_paused():
        for a, b, category in state.pieces(_seconds_to_us(HANG_MIN_S)):
            micros[category] += b - a
    quiet_until = end_us
    for t, phase, _ in state.markers[1:]:
        if phase != _STARTUP:
            quiet_until = t
            break
    if state.windows:
        quiet_until = min(quiet_until, state.windows[0][1])
    return Stretch(
        account=Account.of({c: us * gang_size / _US for c, us in micros.items()}),
        compute_s=compute_us(state, start_us, end_us) * gang_size / _US,
        quiet_s=max(quiet_until - start_us, 0) / _US,
    )
