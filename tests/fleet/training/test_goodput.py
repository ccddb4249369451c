"""Goodput accounting on hand-built event sequences: every expected second is worked out by hand
in the test, and the parts always add up to the allocated time."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.training.goodput import (
    CATEGORIES,
    CATEGORY_LABELS,
    Account,
    Span,
    account,
    add_accounts,
    compute_us,
    failure_losses,
    hang_threshold_s,
    ideal_step_time_s,
    job_report,
    job_spans,
    rows_of,
    stretch_of,
    sweep,
    to_us,
    unrecovered,
)

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


@dataclass
class Ev:
    kind: str
    ts: datetime
    step: int | None = None
    step_time_s: float | None = None
    data_wait_s: float | None = None
    duration_s: float | None = None
    tokens: int | None = None
    reason: str = ""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(kind: str, t: float, **fields: Any) -> Ev:
    return Ev(kind, at(t), **fields)


def step(n: int, t: float, step_time: float = 10, **fields: Any) -> Ev:
    return ev("step", t, step=n, step_time_s=step_time, **fields)


def save(n: int, t: float, duration: float) -> Ev:
    return ev("checkpoint_saved", t, step=n, duration_s=duration)


def wall(events: list[Ev], now: float, **kwargs: Any) -> dict[str, float]:
    """Wall seconds per category (gang size 1), only the non-zero ones."""
    acc = account(job_spans(events, now=at(now), **kwargs), gang_size=1)
    return {c: s for c, s in acc.by_category().items() if s}


def assert_tiles(spans: list[Span]) -> None:
    for before, after in itertools.pairwise(spans):
        assert before.end <= after.start
    assert all(s.end > s.start and s.category in CATEGORIES for s in spans)


def test_a_clean_run_with_a_checkpoint_then_completion_is_startup_productive_save_idle() -> None:
    events = [
        ev("allocated", 0),
        ev("started", 30),
        step(1, 70),  # [60, 70]: start-up is [0, 60]
        step(2, 80),
        step(3, 90),
        save(3, 100, 10),  # [90, 100]: steps 1-3 are retained
        step(4, 110),
        step(5, 120),
        ev("completed", 130, step=5),  # steps 4-5 retained by completion; [120, 130] a short gap: idle
    ]
    spans = job_spans(events, now=at(500))
    assert [(s.start, s.end, s.category) for s in spans] == [
        (at(0), at(60), "startup"),
        (at(60), at(90), "productive"),
        (at(90), at(100), "checkpoint_save"),
        (at(100), at(120), "productive"),
        (at(120), at(130), "idle"),
    ]
    acc = account(spans, gang_size=8)
    # 8 GPUs: productive 50 s x 8 = 400, startup 60 x 8 = 480, save 10 x 8 = 80, idle 10 x 8 = 80.
    assert acc.by_category() == {
        "productive": 400,
        "at_risk": 0,
        "startup": 480,
        "data_stall": 0,
        "checkpoint_save": 80,
        "checkpoint_restore": 0,
        "disruption": 0,
        "hang": 0,
        "idle": 80,
    }
    assert acc.allocated_s == 1040  # 130 s allocated x 8
    assert acc.goodput == 400 / 1040


def test_a_failure_costs_progress_lost_waiting_re_initialisation_and_restore_and_grows_until_progress() -> None:
    events = [
        ev("allocated", 0),
        ev("started", 0),
        step(1, 10),
        save(1, 15, 5),
        step(2, 25),  # [15, 25] lost at the failure
        ev("failed", 30, reason="XID 79"),  # [25, 30] idle
    ]
    # Still holding its GPUs at 100 s, not restarted: the 70 s of waiting grow with the clock.
    [loss] = failure_losses(events, gang_size=8, now=at(100))
    assert (loss.lost_gpu_s, loss.waiting_gpu_s, loss.growing, loss.recovered) == (80, 70 * 8, "waiting", False)
    assert wall(events, now=100) == {"productive": 10, "checkpoint_save": 5, "disruption": 10 + 70, "idle": 5}
    # Restarted at 120 s: the waiting is fixed at 90 s, the re-initialisation grows until progress.
    events.append(ev("started", 120))
    [loss] = failure_losses(events, gang_size=8, now=at(150))
    assert (loss.waiting_gpu_s, loss.reinit_gpu_s, loss.growing) == (90 * 8, 30 * 8, "reinit")
    assert unrecovered(failure_losses(events, gang_size=8, now=at(150))) == [loss]
    # A restore that began at 160 s and a step: the recovery is over, the cost final.
    events += [ev("restored", 170, step=1, duration_s=10), step(2, 180)]
    [loss] = failure_losses(events, gang_size=8, now=at(1000))
    assert (loss.reinit_gpu_s, loss.restore_gpu_s, loss.growing, loss.recovered) == (40 * 8, 10 * 8, None, True)
    assert loss.cost_gpu_s == (10 + 90 + 40 + 10) * 8
    assert unrecovered(failure_losses(events, gang_size=8, now=at(1000))) == []


def test_a_steps_data_wait_is_a_data_loading_stall() -> None:
    events = [
        ev("allocated", 0),
        step(1, 10, data_wait_s=4),  # stall [0, 4], compute [4, 10]
        step(2, 20),  # compute [10, 20]
        save(2, 25, 5),
        ev("completed", 25),
    ]
    # productive 6 + 10 = 16, stall 4, save 5: 25 s in all.
    assert wall(events, now=100) == {"productive": 16, "data_stall": 4, "checkpoint_save": 5}


def test_a_long_gap_without_progress_is_a_hang_and_a_short_one_is_idle() -> None:
    events = [
        ev("allocated", 0),
        step(1, 2, step_time=2),
        step(2, 4, step_time=2),
        step(3, 6, step_time=2),
        step(4, 1006, step_time=2),  # covers [1004, 1006]: the gap [6, 1004] is 998 s >= 300 s
        save(4, 1010, 4),
    ]
    # Median step time 2 s: the threshold is max(10 x 2, 300) = 300 s. The tail [1010, 1110] is
    # 100 s: idle. Productive: 4 steps x 2 s = 8.
    assert wall(events, now=1110) == {"productive": 8, "checkpoint_save": 4, "hang": 998, "idle": 100}
    # With a 60 s threshold the 100 s tail is a hang too.
    assert wall(events, now=1110, hang_after_s=60) == {"productive": 8, "checkpoint_save": 4, "hang": 1098}


def test_a_failure_loses_the_progress_since_the_last_checkpoint() -> None:
    events = [
        ev("allocated", 0),
        ev("started", 0),
        step(1, 10),
        step(2, 20),
        step(3, 30),  # [0, 30]
        save(3, 35, 5),  # [30, 35] keeps steps 1-3
        step(4, 45),
        step(5, 55),  # [35, 55]: not yet saved
        ev("failed", 60, reason="XID 79"),  # [55, 60] a 5 s gap: idle; steps 4-5 (20 s) lost
        ev("started", 90),  # [60, 90] waiting to restart after the failure: disruption
        ev("restored", 100, step=3, duration_s=10),  # [90, 100]
        step(4, 110),  # [100, 110] not saved yet, the job still runs: at risk
    ]
    assert wall(events, now=110) == {
        "productive": 30,
        "checkpoint_save": 5,
        "disruption": 20 + 30,
        "idle": 5,
        "checkpoint_restore": 10,
        "at_risk": 10,
    }
    [loss] = failure_losses(events, gang_size=16, now=at(110))
    assert (loss.kind, loss.reason, loss.ts) == ("failed", "XID 79", at(60))
    assert loss.lost_gpu_s == 20 * 16  # gang size x the 20 s of compute since the checkpoint
    assert (loss.checkpoint_step, loss.checkpoint_ts) == (3, at(35))
    # What the failure cost: 20 s of progress, 30 s waiting to restart, no re-initialisation (the
    # restore began at the restart), a 10 s restore: 60 s x 16 GPUs, and it is over.
    assert (loss.waiting_gpu_s, loss.reinit_gpu_s, loss.restore_gpu_s) == (30 * 16, 0, 10 * 16)
    assert loss.cost_gpu_s == 60 * 16 and loss.recovered and loss.growing is None
    # The lost GPU-hours: gang x time since the retained checkpoint, (60 - 35) x 16 = 400.
    assert loss.since_checkpoint_gpu_s == 25 * 16
    spans, losses = job_report(events, gang_size=16, now=at(110))
    assert spans == job_spans(events, now=at(110)) and losses == [loss]


def test_a_second_failure_during_the_restart_loses_nothing_more() -> None:
    events = [
        ev("allocated", 0),
        step(1, 10),
        step(2, 20),
        save(2, 25, 5),
        step(3, 35),  # [25, 35]
        ev("failed", 40, reason="XID 79"),  # loses step 3 (10 s); [35, 40] idle
        ev("started", 60),  # [40, 60] waiting to restart: disruption
        ev("failed", 100, reason="NCCL timeout"),  # [60, 100] start-up that never made progress
        ev("started", 130),  # [100, 130] waiting again
        ev("restored", 140, step=2, duration_s=10),  # [130, 140]
        step(3, 150),
        save(3, 155, 5),
        ev("completed", 155),
    ]
    assert wall(events, now=200) == {
        "productive": 20 + 10,
        "checkpoint_save": 5 + 5,
        "disruption": 10 + 20 + 30,
        "idle": 5,
        "startup": 40,
        "checkpoint_restore": 10,
    }
    first, second = failure_losses(events, gang_size=4, now=at(200))
    # The first failure: step 3 lost, 20 s waiting, 40 s of a restart that failed in turn. The
    # second: 30 s waiting and the 10 s restore that ended the recovery of both.
    assert (first.lost_gpu_s, first.waiting_gpu_s, first.reinit_gpu_s, first.restore_gpu_s) == (40, 80, 160, 0)
    assert (second.lost_gpu_s, second.waiting_gpu_s, second.reinit_gpu_s, second.restore_gpu_s) == (0, 120, 0, 40)
    assert not first.recovered and second.recovered
    assert (first.reason, first.lost_gpu_s, first.checkpoint_step, first.checkpoint_ts) == ("XID 79", 40, 2, at(25))
    assert (second.reason, second.lost_gpu_s, second.checkpoint_step) == ("NCCL timeout", 0, 2)
    # Since the checkpoint at 25: (40 - 25) x 4 = 60 and (100 - 25) x 4 = 300. The second failure
    # lost no compute (lost_gpu_s 0) but 75 s of the gang's time since the checkpoint.
    assert (first.since_checkpoint_gpu_s, second.since_checkpoint_gpu_s) == (60, 300)


def test_preemption_ends_the_allocation_and_resume_starts_a_new_one() -> None:
    events = [
        ev("allocated", 0),
        step(1, 10),
        step(2, 20),
        save(2, 30, 10),  # [20, 30]
        step(3, 40),  # [30, 40] lost to the preemption
        ev("preempted", 45, reason="higher tier"),  # [40, 45] idle
        ev("resumed", 1000),  # [45, 1000] not allocated: no span
        ev("started", 1000),
        ev("restored", 1030, step=2, duration_s=10),  # start-up [1000, 1020], restore [1020, 1030]
        step(3, 1040),
        step(4, 1050),
        save(4, 1055, 5),  # tail [1055, 1100]: 45 s idle
    ]
    spans = job_spans(events, now=at(1100))
    assert not [s for s in spans if s.end > at(45) and s.start < at(1000)]
    assert wall(events, now=1100) == {
        "productive": 20 + 20,
        "checkpoint_save": 10 + 5,
        "disruption": 10,
        "idle": 5 + 45,
        "startup": 20,
        "checkpoint_restore": 10,
    }
    assert account(spans, gang_size=2).allocated_s == (45 + 100) * 2
    [loss] = failure_losses(events, gang_size=2, now=at(1100))
    assert (loss.kind, loss.reason, loss.lost_gpu_s, loss.checkpoint_step) == ("preempted", "higher tier", 20, 2)
    # Not allocated while preempted: no waiting; starting again and the restore are its cost.
    assert (loss.waiting_gpu_s, loss.reinit_gpu_s, loss.restore_gpu_s) == (0, 20 * 2, 10 * 2)


def test_a_restore_from_an_older_checkpoint_loses_the_newer_checkpoints_work() -> None:
    events = [
        ev("allocated", 0),
        step(1, 10),
        step(2, 20),  # [0, 20]
        save(2, 25, 5),
        step(3, 35),
        step(4, 45),  # [25, 45]
        save(4, 50, 5),  # a checkpoint that turns out unreadable
        step(5, 60),  # [50, 60]
        ev("failed", 60),
        ev("started", 70),  # [60, 70] waiting to restart
        ev("restored", 80, step=2, duration_s=10),  # back to step 2: steps 3-5 lost
        step(3, 90),
        step(4, 100),  # [80, 100] at risk
    ]
    assert wall(events, now=100) == {
        "productive": 20,
        "disruption": 20 + 10 + 10,  # steps 3-4 under the lost checkpoint, step 5, the wait
        "checkpoint_save": 10,
        "checkpoint_restore": 10,
        "at_risk": 20,
    }
    [loss] = failure_losses(events, gang_size=1, now=at(100))
    assert (loss.lost_gpu_s, loss.checkpoint_step, loss.checkpoint_ts) == (30, 2, at(25))


def test_a_job_that_never_checkpointed_loses_everything_on_failure() -> None:
    events = [
        ev("allocated", 0),
        ev("started", 0),
        step(1, 70),  # start-up [0, 60]
        step(2, 80),
        step(3, 90),
        step(4, 100),  # [60, 100]
        ev("failed", 100, reason="OOM"),
        ev("released", 130),  # [100, 130] held, failed, until the release: disruption
    ]
    assert wall(events, now=500) == {"startup": 60, "disruption": 40 + 30}
    assert account(job_spans(events, now=at(500)), gang_size=8).goodput == 0
    [loss] = failure_losses(events, gang_size=8, now=at(500))
    assert (loss.lost_gpu_s, loss.checkpoint_step, loss.checkpoint_ts) == (40 * 8, None, None)
    # No checkpoint retained: the time since the attempt started at 0 counts, (100 - 0) x 8 = 800,
    # start-up included (lost_gpu_s counts only the 40 s of compute).
    assert loss.since_checkpoint_gpu_s == 800
    # Released without a restart: the cost is fixed at the release, 40 s lost + 30 s waiting.
    assert loss.cost_gpu_s == (40 + 30) * 8 and loss.growing is None


def test_a_restore_from_step_zero_loses_the_whole_lineage() -> None:
    events = [
        ev("allocated", 0),
        step(1, 10),
        save(1, 15, 5),
        step(2, 25),
        save(2, 30, 5),
        ev("failed", 30),
        ev("started", 40),  # [30, 40] waiting to restart
        ev("restored", 40, step=0),  # nothing to restore: all 20 s of compute lost
        step(1, 50),  # [40, 50] at risk
    ]
    assert wall(events, now=50) == {"disruption": 20 + 10, "checkpoint_save": 10, "at_risk": 10}


def test_a_running_jobs_work_since_its_last_checkpoint_is_at_risk() -> None:
    events = [ev("allocated", 0), step(1, 10), step(2, 20), save(2, 25, 5), step(3, 35), step(4, 45)]
    # Steps 1-2 retained (20), save 5, steps 3-4 at risk (20), the tail [45, 50] idle.
    assert wall(events, now=50) == {"productive": 20, "checkpoint_save": 5, "at_risk": 20, "idle": 5}


def test_a_release_without_completion_loses_the_unsaved_work() -> None:
    events = [ev("allocated", 0), step(1, 10), save(1, 15, 5), step(2, 25), ev("released", 30)]
    assert wall(events, now=100) == {"productive": 10, "checkpoint_save": 5, "disruption": 10, "idle": 5}
    [loss] = failure_losses(events, gang_size=3, now=at(100))
    assert (loss.kind, loss.lost_gpu_s, loss.checkpoint_step) == ("released", 30, 1)


def test_a_window_that_cuts_a_job_counts_only_its_part() -> None:
    events = [
        ev("allocated", 0),
        ev("started", 30),
        step(1, 70),
        step(2, 80),
        step(3, 90),
        save(3, 100, 10),
        ev("completed", 100),
    ]
    spans = job_spans(events, now=at(500))
    acc = account(spans, gang_size=8, start=at(50), end=at(95))
    # [50, 60] start-up, [60, 90] productive, [90, 95] saving: 45 s x 8 GPUs.
    assert acc.startup_s == 80 and acc.productive_s == 240 and acc.checkpoint_save_s == 40
    assert acc.allocated_s == 360


def test_a_save_overlapping_a_step_wins_the_overlap() -> None:
    events = [ev("allocated", 0), step(1, 10), save(1, 12, 5), ev("completed", 12)]
    # The save [7, 12] takes [7, 10] from the step's compute [0, 10].
    spans = job_spans(events, now=at(20))
    assert [(s.start, s.end, s.category) for s in spans] == [
        (at(0), at(7), "productive"),
        (at(7), at(12), "checkpoint_save"),
    ]


def test_ideal_step_time_drops_outliers_above_median_plus_three_mad() -> None:
    # median 4, deviations 2, 2, 0, 0, 96 -> MAD 2; cutoff 4 + 6 = 10; mean of 2, 2, 4, 4 = 3.
    assert ideal_step_time_s([2, 2, 4, 4, 100]) == 3
    assert ideal_step_time_s([]) is None


def test_hang_threshold_is_ten_median_steps_or_five_minutes() -> None:
    assert hang_threshold_s([40, 40, 50]) == 400
    assert hang_threshold_s([2.0]) == 300
    assert hang_threshold_s([]) == 300


def test_accounts_add_up_per_group_and_every_category_has_a_label() -> None:
    a = Account.of({"productive": 100, "hang": 50})
    b = Account.of({"productive": 20, "idle": 30}, steps=3, tokens=400)
    total = add_accounts([a, b])
    assert (total.productive_s, total.hang_s, total.idle_s, total.allocated_s) == (120, 50, 30, 200)
    assert (total.steps, total.tokens) == (3, 400)
    assert total.goodput == 0.6
    assert (a + b) == total
    assert add_accounts([]).goodput is None
    assert set(CATEGORY_LABELS) == set(CATEGORIES)


def test_a_stall_over_part_of_an_earlier_step_leaves_that_step_the_rest() -> None:
    events = [
        ev("allocated", 0),
        step(1, 100, 10),  # compute [90, 100]
        save(1, 100, 0),  # an instant save: step 1 is retained
        step(2, 101, 11, data_wait_s=5),  # covers [90, 101]: stall [90, 95], compute [95, 101]
        ev("failed", 101, reason="XID 79"),
    ]
    # [0, 90] start-up. The stall wins [90, 95] from step 1's compute; step 1 keeps [95, 100]
    # (the earlier step keeps overlapping compute) and it is checkpointed: productive 5. Step 2's
    # compute is left with [100, 101], lost to the failure: disruption 1. 90 + 5 + 5 + 1 = 101.
    assert wall(events, now=101) == {"startup": 90, "data_stall": 5, "productive": 5, "disruption": 1}
    [loss] = failure_losses(events, gang_size=1, now=at(101))
    assert (loss.lost_gpu_s, loss.checkpoint_step, loss.since_checkpoint_gpu_s) == (1, 1, 1)


# --- any valid sequence tiles the allocated time ----------------------------------------------


@st.composite
def sequences(draw: Any) -> tuple[list[Ev], float]:
    """A random valid event history: time moves forward, events only while allocated."""
    events: list[Ev] = []
    t = 0.0
    holding = completed = False
    last_step = 0
    saved: list[int] = [0]
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0, 0.000001, 0.5, 1, 3.25, 10, 400]))
        if not holding:
            events.append(ev(draw(st.sampled_from(["allocated", "resumed"])), t))
            holding = True
            continue
        kind = draw(
            st.sampled_from(
                ["step", "step", "step", "checkpoint_saved", "restored", "failed", "started", "preempted", "released"]
                + (["completed"] if len(events) > 20 else [])
            )
        )
        if kind == "step":
            last_step += 1
            step_time = draw(st.sampled_from([0.25, 1, 5, 30]))
            events.append(step(last_step, t, step_time, data_wait_s=draw(st.sampled_from([0, 0.1, step_time]))))
        elif kind == "checkpoint_saved":
            saved.append(last_step)
            events.append(save(last_step, t, draw(st.sampled_from([0, 1, 20]))))
        elif kind == "restored":
            last_step = draw(st.sampled_from(saved))
            events.append(ev("restored", t, step=last_step, duration_s=draw(st.sampled_from([0, 2, 50]))))
        else:
            events.append(ev(kind, t))
            holding = kind not in ("preempted", "released", "completed")
            completed = kind == "completed"
        if completed:
            break
    return events, t + draw(st.sampled_from([0, 5, 1000]))


def allocated_wall_s(events: list[Ev], now: datetime) -> float:
    """Allocated seconds worked out from the allocation events alone."""
    total, opened = 0.0, None
    for e in events:
        if e.kind in ("allocated", "resumed") and opened is None:
            opened = e.ts
        elif e.kind in ("preempted", "released", "completed") and opened is not None:
            total += (e.ts - opened).total_seconds()
            opened = None
    if opened is not None:
        total += (now - opened).total_seconds()
    return total


@settings(max_examples=300, deadline=None)
@given(sequences())
def test_any_valid_sequence_tiles_the_allocated_time_exactly(case: tuple[list[Ev], float]) -> None:
    events, now_s = case
    now = at(now_s)
    spans = job_spans(events, now=now)
    assert_tiles(spans)
    acc = account(spans, gang_size=1)
    assert acc.allocated_s == sum(acc.by_category().values())
    assert round(acc.allocated_s, 6) == round(allocated_wall_s(events, now), 6)
    spanned = sum((s.end - s.start for s in spans), timedelta())
    assert spanned.total_seconds() == round(allocated_wall_s(events, now), 6)
    # Every second of lost compute is charged to a failure, preemption, release or rollback, and
    # every second of waiting to restart to a failure: the costs' parts are disjoint parts of the
    # account, never more than their categories.
    losses = failure_losses(events, gang_size=1, now=now)
    assert round(sum(loss.lost_gpu_s + loss.waiting_gpu_s for loss in losses), 6) == round(acc.disruption_s, 6)
    assert round(sum(loss.reinit_gpu_s for loss in losses), 6) <= round(acc.startup_s, 6)
    assert round(sum(loss.restore_gpu_s for loss in losses), 6) <= round(acc.checkpoint_restore_s, 6)
    # The account of a stretch from its own events alone agrees with the whole account clipped to
    # it wherever the stretch's events decide (what the detectors price a fault's episode with).
    rows = rows_of(events)
    state = sweep(rows, now_us=to_us(now))
    for start_s in (0.0, now_s / 3, now_s / 2, max(now_s - 5, 0.0)):
        part = stretch_of(rows, gang_size=1, start_us=to_us(at(start_s)), end_us=to_us(now))
        whole = account(spans, gang_size=1, start=at(start_s), end=now)
        for category in ("data_stall", "checkpoint_save", "checkpoint_restore"):
            assert round(part.account.seconds(category), 6) == round(whole.seconds(category), 6), (category, start_s)
        assert round(part.compute_s * 1_000_000) == compute_us(state, to_us(at(start_s)), to_us(now))


@st.composite
def checkpointed_runs(draw: Any) -> tuple[list[Ev], int]:
    """Steps (overlapping, with data waits) and saves in time order, then a failure: no restore,
    so every checkpoint survives in the lineage."""
    events: list[Ev] = [ev("allocated", 0)]
    t, last_step = 0, 0
    for _ in range(draw(st.integers(1, 25))):
        t += draw(st.integers(0, 12))
        if draw(st.booleans()) or last_step == 0:
            last_step += 1
            step_time = draw(st.integers(1, 15))
            events.append(step(last_step, t, step_time, data_wait_s=draw(st.integers(0, step_time))))
        else:
            events.append(save(last_step, t, draw(st.integers(0, 4))))
    t += draw(st.integers(0, 5))
    events.append(ev("failed", t))
    return events, t


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@settings(max_examples=300, deadline=None)
@given(checkpointed_runs())
def test_compute_of_a_checkpoint_that_survives_is_never_disruption(case: tuple[list[Ev], int]) -> None:
    events, now_s = case
    saved_up_to = max((e.step or 0 for e in events if e.kind == "checkpoint_saved"), default=0)
    secs = [(e.ts - T0).total_seconds() for e in events]
    # Compute of the checkpointed steps: [ts - step_time + data_wait, ts], clipped to the allocation.
    kept = _union(
        [
            (max(t - e.step_time_s + e.data_wait_s, 0), t)
            for e, t in zip(events, secs, strict=True)
            if e.kind == "step" and e.step <= saved_up_to
        ]
    )
    # Less whatever outranks compute: any step's data wait, any save.
    above = _union(
        [
            (max(t - e.step_time_s, 0), max(t - e.step_time_s + e.data_wait_s, 0))
            for e, t in zip(events, secs, strict=True)
            if e.kind == "step"
        ]
        + [(t - e.duration_s, t) for e, t in zip(events, secs, strict=True) if e.kind == "checkpoint_saved"]
    )
    spans = job_spans(events, now=at(now_s))
    for s in spans:
        if s.category == "productive":
            continue
        a, b = (s.start - T0).total_seconds(), (s.end - T0).total_seconds()
        for ka, kb in kept:
            lo, hi = max(a, ka), min(b, kb)
            if hi <= lo:
                continue
            # The overlap must lie wholly under a higher-priority interval.
            covered = sum(max(0.0, min(hi, ub) - max(lo, ua)) for ua, ub in above)
            assert covered == hi - lo, (s, (ka, kb), events)
