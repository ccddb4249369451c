"""fleet.capacity.quotas: Kueue's admission arithmetic, one rule per test, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleet.capacity.quotas import Admission, Held, Quota, Request, available, decide, peak, usage
from fleet.choices import PriorityTier

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PRE, OD, RES = PriorityTier.PREEMPTIBLE, PriorityTier.ON_DEMAND, PriorityTier.RESERVED


def day(n: float) -> datetime:
    return T0 + timedelta(days=n)


def held(id: int, team: str, gpus: int, start: float = 0, end: float = 10, tier: str = RES, **kw: object) -> Held:
    return Held(id, team, gpus, day(start), day(end), tier, kw.get("priority", 0), kw.get("admitted_at"))  # type: ignore[arg-type]


def ask(team: str, gpus: int, start: float = 1, end: float = 2, tier: str = RES, priority: int = 0) -> Request:
    return Request(team, gpus, day(start), day(end), tier, priority, pool="s/p")


ISSUE = {"alpha": Quota(6, 4), "beta": Quota(10)}  # issue 23: a 16-GPU pool


# --- usage over a window ----------------------------------------------------------------------------


def test_usage_is_each_teams_peak_inside_the_window() -> None:
    rows = [held(1, "a", 4, 0, 3), held(2, "a", 3, 2, 5), held(3, "a", 9, 6, 8), held(4, "b", 2, 0, 10)]
    assert peak(rows[:3], day(0), day(5)) == 7  # 4 and 3 overlap on day 2
    assert peak(rows[:3], day(3), day(5)) == 3  # the first has ended: [start, end) windows
    assert usage(rows, day(0), day(5)) == {"a": 7, "b": 2}


def test_back_to_back_reservations_do_not_add_up() -> None:
    assert peak([held(1, "a", 5, 0, 1), held(2, "a", 5, 1, 2)], day(0), day(2)) == 5


# --- available quota (Kueue's available()) -----------------------------------------------------------


def test_a_team_within_its_nominal_quota_is_admitted_while_another_borrows() -> None:
    # Issue 23 item 1: alpha holds 7 (borrowing 1); beta asks 1 with 8 GPUs idle.
    decision = decide(ask("beta", 1), ISSUE, [held(1, "alpha", 7)], "Never")
    assert decision.admission == Admission.NOMINAL and decision.fits == 9


def test_borrowing_is_capped_by_the_borrowing_limit() -> None:
    assert available("alpha", ISSUE, {}) == 10  # nominal 6 + borrowingLimit 4
    decision = decide(ask("alpha", 11), ISSUE, [], "Never")
    assert decision.admission == Admission.REFUSED and decision.fits == 10
    assert "alpha may hold at most 10 more GPUs on s/p" in decision.reason and "borrowing limit 4" in decision.reason


def test_borrowing_uses_only_what_the_others_leave_unused() -> None:
    assert available("alpha", ISSUE, {"beta": 8}) == 8  # its 6 and beta's 2 unused
    decision = decide(ask("alpha", 8), ISSUE, [held(1, "beta", 8)], "Never")
    assert decision.admission == Admission.BORROWING and decision.borrowed == 2


def test_an_empty_borrowing_limit_borrows_all_the_cohort_leaves_unused() -> None:
    quotas = {"alpha": Quota(6, None), "beta": Quota(10)}
    assert available("alpha", quotas, {}) == 16
    assert available("alpha", quotas, {"beta": 3}) == 13


def test_a_lending_limit_keeps_the_rest_of_the_nominal_quota_for_its_team() -> None:
    quotas = {"alpha": Quota(6), "beta": Quota(10, lending_limit=4)}  # beta guarantees itself 6
    assert available("alpha", quotas, {}) == 10
    assert available("beta", quotas, {"alpha": 10}) == 6  # alpha took all beta lends; beta keeps 6
    assert decide(ask("alpha", 11), quotas, [], "Never").admission == Admission.REFUSED


def test_a_team_without_quota_is_refused_naming_those_with_one() -> None:
    decision = decide(ask("gamma", 1), ISSUE, [], "Any")
    assert decision.admission == Admission.REFUSED and "gamma has no quota" in decision.reason
    assert "alpha, beta" in decision.reason


def test_preemptible_use_counts_against_the_quota() -> None:
    decision = decide(ask("alpha", 1), ISSUE, [held(1, "alpha", 10, tier=PRE)], "Any")
    assert decision.admission == Admission.REFUSED and decision.fits == 0


# --- reclaimWithinCohort -------------------------------------------------------------------------------


BORROWED = [
    held(1, "alpha", 6, tier=RES, admitted_at=day(-9)),
    held(2, "alpha", 4, tier=OD, admitted_at=day(-8)),
    held(3, "alpha", 2, tier=PRE, admitted_at=day(-7)),
    held(4, "alpha", 2, tier=OD, admitted_at=day(-6)),
]  # alpha holds 14 of 16: 8 borrowed of beta's 10
OPEN = {"alpha": Quota(6), "beta": Quota(10)}


def test_never_leaves_the_lender_waiting_and_says_why() -> None:
    decision = decide(ask("beta", 6), OPEN, BORROWED, "Never")
    assert decision.admission == Admission.REFUSED and decision.fits == 2
    assert "reclaimWithinCohort is Never" in decision.reason


def test_any_preempts_preemptible_first_then_the_newest_on_demand_only_as_many_as_needed() -> None:
    decision = decide(ask("beta", 6), OPEN, BORROWED, "Any")
    assert decision.admission == Admission.RECLAIM
    assert [h.id for h in decision.preempt] == [3, 4]  # 2 free + 2 + 2 = 6; #2 stays


def test_fill_back_returns_a_choice_that_a_later_one_made_unnecessary() -> None:
    rows = [held(1, "alpha", 6), held(2, "alpha", 1, tier=PRE, admitted_at=day(-1)), held(3, "alpha", 8, tier=OD)]
    decision = decide(ask("beta", 9), OPEN, rows, "Any")  # 1 free: needs 8 more
    assert [h.id for h in decision.preempt] == [3]  # #2 was taken first, then given back


def test_reserved_tier_reservations_are_never_preempted() -> None:
    rows = [held(1, "alpha", 14, tier=RES)]
    decision = decide(ask("beta", 6), OPEN, rows, "Any")
    assert decision.admission == Admission.REFUSED and "reserved-tier" in decision.reason


def test_lower_priority_preempts_only_lower_priority_borrowers() -> None:
    rows = [held(1, "alpha", 6), held(2, "alpha", 8, tier=OD, priority=5)]
    assert decide(ask("beta", 6, tier=OD, priority=1), OPEN, rows, "LowerPriority").admission == Admission.REFUSED
    reclaimed = decide(ask("beta", 6, tier=OD, priority=9), OPEN, rows, "LowerPriority")
    assert reclaimed.admission == Admission.RECLAIM and [h.id for h in reclaimed.preempt] == [2]
    by_tier = decide(ask("beta", 6, tier=RES), OPEN, rows, "LowerPriority")  # reserved outranks on-demand
    assert by_tier.admission == Admission.RECLAIM


def test_reclaim_only_covers_a_request_within_the_nominal_quota() -> None:
    decision = decide(ask("beta", 11), OPEN, BORROWED, "Any")
    assert decision.admission == Admission.REFUSED and decision.preempt == ()


def test_a_team_that_no_longer_borrows_is_left_alone() -> None:
    # alpha borrows 2, gamma 4: the cohort is full. Once #2 is preempted alpha is back within its
    # nominal quota, so its other reservations are skipped and gamma's borrowing pays the rest.
    quotas = {"alpha": Quota(6), "beta": Quota(6), "gamma": Quota(4)}
    rows = [
        held(1, "alpha", 4, tier=OD, admitted_at=day(-1)),
        held(2, "alpha", 2, tier=PRE, admitted_at=day(-1)),
        held(3, "alpha", 2, tier=PRE, admitted_at=day(-2)),
        held(4, "gamma", 4),
        held(5, "gamma", 4, tier=OD, admitted_at=day(-5)),
    ]
    assert [h.id for h in decide(ask("beta", 6), quotas, rows, "Any").preempt] == [2, 5]
    assert [h.id for h in decide(ask("beta", 2), quotas, rows, "Any").preempt] == [2]


def test_the_tightest_moment_of_the_window_decides_not_the_sum_of_peaks() -> None:
    # alpha holds 14 in its first days, beta 18 later: never 32 at once. gamma (nominal 8, no
    # borrowing) over the whole window: the tightest moment leaves 36 - 28 = 8.
    quotas = {"alpha": Quota(16), "beta": Quota(12), "gamma": Quota(8, 0)}
    rows = [
        held(1, "alpha", 4, 0, 3),
        held(2, "alpha", 10, 0, 3),
        held(3, "beta", 18, 3, 9),
        held(4, "alpha", 10, 3, 9),
    ]
    decision = decide(ask("gamma", 8, 0, 9), quotas, rows, "Never")
    assert decision.admission == Admission.NOMINAL and decision.fits == 8
    assert decide(ask("gamma", 8, 0, 2), quotas, rows, "Never").fits == 8  # 36 - 14 = 22, capped at nominal 8
