"""Issue 23's quota cases through the real API, each compared with the decision Kueue would make.

Every case runs on a 16-GPU pool (one cohort), requests with POST /reservations/ and approves with
POST /reservations/{id}/approve/. What the console decided is read back from the responses and
the database, and must equal KUEUE[case]: the decision a Kueue ClusterQueue in one cohort would
make for the same quotas and workloads, with the sentence of Kueue's documentation that says so
(kueue.sigs.k8s.io: concepts/cluster_queue, "Borrowing limit", "Lending limit", "Preemption").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from console import roles
from fleet.capacity.models import ReclaimPolicy
from fleet.choices import PriorityTier
from fleet.models import Pool, Reservation, ReservationState, Site
from incidents.models import Incident
from tests.conftest import _client_for, _make_user
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, quota, team

pytestmark = pytest.mark.django_db

API = "/api/v1/capacity/reservations/"
PRE, OD, RES = PriorityTier.PREEMPTIBLE, PriorityTier.ON_DEMAND, PriorityTier.RESERVED

# case: (Kueue's decision, why: Kueue's documentation in one line)
KUEUE: dict[str, tuple[str, str]] = {
    "within-nominal-while-another-borrows": (
        "admit",
        "A workload is admitted when it fits the ClusterQueue's nominalQuota and the cohort's unused quota; "
        "alpha borrows 1 of beta's 10, beta asks 1 of its 9 left.",
    ),
    "borrow-with-empty-borrowing-limit": (
        "admit",
        "borrowingLimit: if empty, the ClusterQueue can borrow up to the sum of the nominal quotas of all "
        "the ClusterQueues in the cohort.",
    ),
    "borrow-past-zero-borrowing-limit": (
        "pending: fits 4",
        "borrowingLimit 0: the ClusterQueue may not use more than its nominalQuota.",
    ),
    "borrow-past-lending-limit": (
        "pending: fits 10",
        "lendingLimit: the maximum amount of this ClusterQueue's unused nominal quota that others in the "
        "cohort can borrow; beta lends 4, so alpha tops at 6 + 4.",
    ),
    "borrow-within-lending-limit": ("admit", "alpha's 6 plus the 4 beta lends."),
    "preemptible-counts-against-quota": (
        "pending: fits 0",
        "Every admitted workload uses its ClusterQueue's quota, whatever its priority: alpha's 10 preemptible "
        "GPUs fill nominal 6 + borrowingLimit 4.",
    ),
    "team-without-quota": (
        "pending: no quota",
        "A workload can only be admitted through a ClusterQueue; gamma has none on this pool.",
    ),
    "request-over-quota-at-once": (
        "pending: fits 16",
        "alpha (nominal 8, borrowingLimit 16) can hold 8 + beta's 8 unused; a 40-GPU workload waits.",
    ),
    "reclaim-never": (
        "pending: fits 2",
        "reclaimWithinCohort Never: a pending workload never preempts workloads of other ClusterQueues.",
    ),
    "reclaim-any": (
        "admit after preempting [pre-new, od-new]",
        "reclaimWithinCohort Any: a workload that fits its nominal quota preempts borrowing workloads of the "
        "cohort, lowest priority first, then the most recently admitted, only as many as it needs (listed in "
        "the order they were admitted).",
    ),
    "reclaim-lower-priority-blocked": (
        "pending: fits 2",
        "reclaimWithinCohort LowerPriority: only borrowing workloads of lower priority than the pending one "
        "are preempted; alpha's are of higher priority.",
    ),
    "reclaim-lower-priority": (
        "admit after preempting [od-low]",
        "reclaimWithinCohort LowerPriority: alpha's on-demand priority 0 is lower than beta's reserved request.",
    ),
}


@pytest.fixture
def pool(site_a: Site) -> Pool:
    add_nodes(site_a, 2)  # 16 GPUs, installed and energised
    return make_pool(site_a)


class Scenario:
    """A pool, its quotas and two Operators driving the API; ``ask`` has one request and the other
    approve (separation of duties: nobody approves their own)."""

    def __init__(self, pool: Pool, client: Client, approver: Client) -> None:
        self.pool, self.client, self.approver, self.names = pool, client, approver, {}

    def ask(self, name: str, team: str, gpus: int, *, tier: str = RES, priority: int = 0) -> dict[str, Any]:
        body = {
            "team": team,
            "pool": self.pool.pk,
            "gpus": gpus,
            "start": days_ahead(1).isoformat(),
            "end": days_ahead(5).isoformat(),
            "tier": tier,
            "priority": priority,
        }
        created = self.client.post(API, body, content_type="application/json")
        if created.status_code == 409:
            return {"decision": "pending", **created.json()}
        assert created.status_code == 201, created.json()
        pk = created.json()["id"]
        self.names[pk] = name
        approved = self.approver.post(f"{API}{pk}/approve/", content_type="application/json")
        if approved.status_code == 409:
            return {"decision": "pending", "id": pk, **approved.json()}
        assert approved.status_code == 200, approved.json()
        return {"decision": "admit", "id": pk}

    def outcome(self, result: dict[str, Any]) -> str:
        """The console's decision in KUEUE's words."""
        if result["decision"] == "pending":
            return "pending: no quota" if "has no quota" in result["gpus"] else f"pending: fits {result['fits']}"
        preempted = Reservation.objects.filter(preempted_by_id=result["id"]).order_by("pk")
        if preempted:
            return f"admit after preempting [{', '.join(self.names[r.pk] for r in preempted)}]"
        return "admit"


def _within_nominal(s: Scenario) -> str:
    quota(s.pool, "alpha", 6, 4)
    quota(s.pool, "beta", 10)
    assert s.ask("alpha-7", "alpha", 7)["decision"] == "admit"  # borrows 1
    return s.outcome(s.ask("beta-1", "beta", 1))


def _empty_borrowing(s: Scenario) -> str:
    quota(s.pool, "alpha", 4, None)
    quota(s.pool, "beta", 12)
    return s.outcome(s.ask("alpha-16", "alpha", 16))


def _zero_borrowing(s: Scenario) -> str:
    quota(s.pool, "alpha", 4, 0)
    quota(s.pool, "beta", 12)
    return s.outcome(s.ask("alpha-5", "alpha", 5))


def _lending(gpus: int) -> Callable[[Scenario], str]:
    def run(s: Scenario) -> str:
        quota(s.pool, "alpha", 6)
        quota(s.pool, "beta", 10, lending=4)
        return s.outcome(s.ask("alpha", "alpha", gpus))

    return run


def _preemptible_counted(s: Scenario) -> str:
    quota(s.pool, "alpha", 6, 4)
    quota(s.pool, "beta", 10)
    assert s.ask("spot-11", "alpha", 11, tier=PRE)["decision"] == "pending"  # over 6 + 4, preemptible too
    assert s.ask("spot-10", "alpha", 10, tier=PRE)["decision"] == "admit"
    return s.outcome(s.ask("firm-1", "alpha", 1))


def _no_quota(s: Scenario) -> str:
    quota(s.pool, "alpha", 6, 4)
    team("gamma")
    return s.outcome(s.ask("gamma-16", "gamma", 16, tier=PRE))


def _over_quota_at_once(s: Scenario) -> str:
    quota(s.pool, "alpha", 8, 16)
    quota(s.pool, "beta", 8)
    result = s.ask("alpha-40", "alpha", 40)
    assert "id" not in result and not Reservation.objects.exists()  # refused when requested, nothing stored
    assert result["gpus"].startswith(f"alpha may hold at most 16 more GPUs on {s.pool} between ")
    assert "nominal 8, borrowing limit 16, holding 0 at its peak, others' unused 8" in result["gpus"]
    return s.outcome(result)


def _borrowers(s: Scenario, policy: str, alpha_tier: str = OD) -> None:
    """alpha (nominal 6) holds 14 of the 16 GPUs, 8 of them borrowed from beta (nominal 10)."""
    Pool.objects.filter(pk=s.pool.pk).update(reclaim_within_cohort=policy)
    s.pool.refresh_from_db()
    quota(s.pool, "alpha", 6)
    quota(s.pool, "beta", 10)
    if alpha_tier == OD:
        for name, gpus, tier in [("res", 6, RES), ("od-old", 4, OD), ("pre-new", 2, PRE), ("od-new", 2, OD)]:
            assert s.ask(name, "alpha", gpus, tier=tier)["decision"] == "admit"
    else:
        assert s.ask("res", "alpha", 6, tier=RES)["decision"] == "admit"
        assert s.ask("od-high", "alpha", 8, tier=OD, priority=5)["decision"] == "admit"


def _reclaim_never(s: Scenario) -> str:
    _borrowers(s, ReclaimPolicy.NEVER)
    return s.outcome(s.ask("beta-6", "beta", 6))


def _reclaim_any(s: Scenario) -> str:
    _borrowers(s, ReclaimPolicy.ANY)
    return s.outcome(s.ask("beta-6", "beta", 6))


def _reclaim_lower_blocked(s: Scenario) -> str:
    _borrowers(s, ReclaimPolicy.LOWER_PRIORITY, alpha_tier="high")
    return s.outcome(s.ask("beta-6", "beta", 6, tier=OD, priority=1))


def _reclaim_lower(s: Scenario) -> str:
    Pool.objects.filter(pk=s.pool.pk).update(reclaim_within_cohort=ReclaimPolicy.LOWER_PRIORITY)
    s.pool.refresh_from_db()
    quota(s.pool, "alpha", 6)
    quota(s.pool, "beta", 10)
    assert s.ask("res", "alpha", 6)["decision"] == "admit"
    assert s.ask("od-low", "alpha", 8, tier=OD)["decision"] == "admit"
    return s.outcome(s.ask("beta-6", "beta", 6, tier=RES))


CASES: dict[str, Callable[[Scenario], str]] = {
    "within-nominal-while-another-borrows": _within_nominal,
    "borrow-with-empty-borrowing-limit": _empty_borrowing,
    "borrow-past-zero-borrowing-limit": _zero_borrowing,
    "borrow-past-lending-limit": _lending(11),
    "borrow-within-lending-limit": _lending(10),
    "preemptible-counts-against-quota": _preemptible_counted,
    "team-without-quota": _no_quota,
    "request-over-quota-at-once": _over_quota_at_once,
    "reclaim-never": _reclaim_never,
    "reclaim-any": _reclaim_any,
    "reclaim-lower-priority-blocked": _reclaim_lower_blocked,
    "reclaim-lower-priority": _reclaim_lower,
}


def test_every_case_has_kueues_decision() -> None:
    assert set(CASES) == set(KUEUE)


@pytest.fixture
def other_operator_client() -> Client:
    return _client_for(_make_user("otto", roles.OPERATOR))


@pytest.mark.parametrize("case", list(CASES))
def test_the_console_decides_as_kueue(
    case: str, pool: Pool, operator_client: Client, other_operator_client: Client
) -> None:
    assert CASES[case](Scenario(pool, operator_client, other_operator_client)) == KUEUE[case][0]


def test_a_reclaim_records_the_reason_audits_and_opens_one_sev4_incident_per_borrower(
    pool: Pool, operator_client: Client, other_operator_client: Client
) -> None:
    s = Scenario(pool, operator_client, other_operator_client)
    _borrowers(s, ReclaimPolicy.ANY)
    result = s.ask("beta-6", "beta", 6)
    victims = list(Reservation.objects.filter(state=ReservationState.PREEMPTED).order_by("pk"))
    assert [s.names[r.pk] for r in victims] == ["pre-new", "od-new"]
    for r in victims:
        assert r.preempted_by_id == result["id"] and r.preempted_at is not None
        assert f"beta reclaims its nominal quota on {pool} for reservation #{result['id']}" in r.preempted_reason
        assert LogEntry.objects.filter(object_id=str(r.pk), change_message=r.preempted_reason).exists()
        shown = operator_client.get(f"{API}{r.pk}/").json()
        assert shown["state"] == "preempted" and shown["preempted_reason"] == r.preempted_reason
    # The reserved and the older on-demand reservations keep their GPUs.
    assert set(Reservation.objects.filter(team="alpha").exclude(state="preempted").values_list("gpus", flat=True)) == {
        6,
        4,
    }
    (incident,) = Incident.objects.filter(category="capacity")
    assert incident.severity == "SEV4" and incident.labels["team"] == "alpha"
    assert all(f"#{r.pk}" in incident.findings.get().description for r in victims)
    # A preempted reservation holds nothing and cannot be cancelled.
    refused = operator_client.post(f"{API}{victims[0].pk}/cancel/", content_type="application/json")
    assert refused.status_code == 409


def test_a_refused_form_request_names_what_would_fit_and_stores_nothing(pool: Pool, operator_client: Client) -> None:
    quota(pool, "alpha", 8, 16)
    quota(pool, "beta", 8)
    form = {
        "action": "request",
        "team": "alpha",
        "pool": pool.pk,
        "gpus": 40,
        "start": days_ahead(1).strftime("%Y-%m-%dT%H:%M"),
        "end": days_ahead(2).strftime("%Y-%m-%dT%H:%M"),
        "tier": RES,
        "priority": 0,
    }
    response = operator_client.post("/capacity/reservations/", form)
    assert response.status_code == 409
    assert "alpha may hold at most 16 more GPUs" in response.content.decode()
    assert not Reservation.objects.exists()
