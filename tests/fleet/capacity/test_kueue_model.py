"""fleet.capacity.quotas decides as Kueue does: random small cohorts (2-3 teams, quotas with and
without borrowing and lending limits, workloads already admitted, one request) through the
product's pure functions and through an independent model written from Kueue's documentation
(tests/fleet/capacity/kueue_model.py), with reclaimWithinCohort Never, LowerPriority and Any.
The model is first held to the worked examples of Kueue's documentation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleet.capacity import quotas
from fleet.choices import PriorityTier
from tests.fleet.capacity.kueue_model import Queue, Workload, admit, fits, usage

START = datetime(2026, 3, 1, tzinfo=UTC)
END = START + timedelta(days=2)
KIND = {
    quotas.Admission.NOMINAL: "admit",
    quotas.Admission.BORROWING: "borrow",
    quotas.Admission.RECLAIM: "reclaim",
    quotas.Admission.REFUSED: "pending",
}


# --- the model against Kueue's documented examples -----------------------------------------------


def test_the_model_admits_what_kueues_borrowing_examples_admit() -> None:
    # concepts/cluster_queue, "BorrowingLimit": team-a 9 with borrowingLimit 1, team-b 12 idle.
    cohort = {"a": Queue(9, borrowing_limit=1), "b": Queue(12)}
    assert fits("a", 10, cohort, {}) and not fits("a", 11, cohort, {})
    # "If the borrowingLimit field is empty ... team-b-cq can use up to 12+9."
    assert fits("b", 21, cohort, {}) and not fits("b", 22, cohort, {})


def test_the_model_keeps_what_a_lending_limit_keeps() -> None:
    # concepts/cluster_queue, "LendingLimit": team-b 12 lends at most 1, so team-a tops at 9 + 1.
    cohort = {"a": Queue(9), "b": Queue(12, lending_limit=1)}
    assert fits("a", 10, cohort, {}) and not fits("a", 11, cohort, {})
    assert fits("b", 12, cohort, {"a": 9})  # team-b's own 11 are never lent, and it may use a's idle


def test_the_model_reclaims_only_within_nominal_and_gives_back_what_it_does_not_need() -> None:
    cohort = {"a": Queue(8), "b": Queue(8)}
    running = [Workload(1, "b", 4, admitted=1), Workload(2, "b", 4, admitted=2), Workload(3, "b", 4, admitted=3)]
    # b borrows 4 of a's 8; a asks 6: 4 are free, 2 must come back. The newest (3) goes first.
    assert admit(Workload(9, "a", 6), cohort, running, "Any").preempted == {3}
    assert admit(Workload(9, "a", 6), cohort, running).kind == "pending"  # Never
    assert admit(Workload(9, "a", 9), cohort, running, "Any").kind == "pending"  # past its nominal


# --- the product against the model ------------------------------------------------------------------


TEAMS = ("alpha", "beta", "gamma")


@st.composite
def cohorts(draw: st.DrawFn, *, reclaiming: bool = False) -> tuple[dict[str, Queue], list[Workload], Workload, str]:
    """A cohort, its admitted workloads, a pending one and the policy. ``reclaiming``: the others
    have borrowed from the pending one's team, which asks within its nominal quota, with a
    policy that may preempt (the cases where Kueue reclaims, rare by chance)."""
    names = TEAMS[: draw(st.integers(2, 3))]
    queues = {}
    for name in names:
        nominal = draw(st.integers(0, 8))
        queues[name] = Queue(
            nominal,
            borrowing_limit=draw(st.none() | st.integers(0, 6)),
            lending_limit=draw(st.none() | st.integers(0, nominal)),
        )
    # Workloads already admitted: each asked in turn and kept only if Kueue admitted it then, so
    # the cohort is in a state Kueue could be in.
    asking = draw(st.sampled_from(names))
    others = [n for n in names if n != asking] if reclaiming else list(names)
    admitted: list[Workload] = []
    for i in range(draw(st.integers(0, 8))):
        w = Workload(i + 1, draw(st.sampled_from(others)), draw(st.integers(1, 4)), draw(st.integers(0, 3)), i + 1)
        if fits(w.queue, w.gpus, queues, usage(admitted)):
            admitted.append(w)
    most = max(1, queues[asking].nominal) if reclaiming else 8
    pending = Workload(100, asking, draw(st.integers(1, most)), draw(st.integers(0, 3)))
    policy = draw(st.sampled_from(["LowerPriority", "Any"] if reclaiming else ["Never", "LowerPriority", "Any"]))
    return queues, admitted, pending, policy


def _product(queues: dict[str, Queue], admitted: list[Workload], pending: Workload, policy: str) -> quotas.Decision:
    tier = PriorityTier.ON_DEMAND  # one tier: priority alone orders, and none is the never-preempted tier
    held = [
        quotas.Held(w.id, w.queue, w.gpus, START, END, tier, w.priority, START + timedelta(minutes=w.admitted))
        for w in admitted
    ]
    team_quotas = {name: quotas.Quota(q.nominal, q.borrowing_limit, q.lending_limit) for name, q in queues.items()}
    request = quotas.Request(pending.queue, pending.gpus, START, END, tier, pending.priority)
    return quotas.decide(request, team_quotas, held, policy)


Case = tuple[dict[str, Queue], list[Workload], Workload, str]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cohorts())
def test_the_consoles_decision_is_kueues(case: Case) -> None:
    _same_decision(*case)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cohorts(reclaiming=True))
def test_the_consoles_reclaim_is_kueues(case: Case) -> None:
    _same_decision(*case)


def _same_decision(queues: dict[str, Queue], admitted: list[Workload], pending: Workload, policy: str) -> None:
    kueue = admit(pending, queues, admitted, policy)
    event(f"{policy}: {kueue.kind}")
    console = _product(queues, admitted, pending, policy)
    assert (KIND[console.admission], frozenset(v.id for v in console.preempt)) == (kueue.kind, kueue.preempted)
    if console.admission == quotas.Admission.REFUSED:
        # What it says would fit is the most Kueue would admit now without preempting.
        assert fits(pending.queue, console.fits, queues, usage(admitted))
        assert not fits(pending.queue, console.fits + 1, queues, usage(admitted))
