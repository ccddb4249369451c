"""The scheduler detectors over Kueue and Slurm exporter series, pushed through the Prometheus door
or written by the queues' writer: admission starvation behind a quota or fragmentation (never in a
full pool), an eviction storm with a Kueue restart in the middle, drained Slurm capacity with its
GPU-hours, and a reservation held idle; each with the case that must not fire."""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta

import pytest

from fleet.capacity.models import Pool, Reservation, ReservationState, Team
from fleet.models import SchedulerQueue
from fleet.scheduler import detectors
from fleet.scheduler.detectors import QueueQuota, cohort_idle, quota_room, starvation_cause
from fleet.scheduler.store import QueuePoint, store_queue_points
from incidents.detectors import registered, run_detectors
from incidents.models import Finding, Incident
from tests.fleet.scheduler import support
from tests.fleet.scheduler.support import SLURM, push, samples, stamped

pytestmark = pytest.mark.django_db

SCHEDULER = [
    "scheduler-admission-starvation",
    "scheduler-eviction-storm",
    "scheduler-drained-capacity",
    "scheduler-reservation-unused",
]
# Kueue's admission wait bounds (pkg/metrics/metrics.go: 1, then 2.5 doubling to 40960 s).
BOUNDS = ["1", *(f"{2.5 * 2**i:g}" for i in range(15)), "+Inf"]
KUEUE_TYPES = {
    "kueue_admission_wait_time_seconds": "histogram",
    "kueue_pending_workloads": "gauge",
    "kueue_admitted_active_workloads": "gauge",
    "kueue_cluster_queue_nominal_quota": "gauge",
    "kueue_cluster_queue_resource_usage": "gauge",
    "kueue_cluster_queue_borrowing_limit": "gauge",
    "kueue_cluster_queue_lending_limit": "gauge",
    "kueue_evicted_workloads_total": "counter",
    "kueue_preempted_workloads_total": "counter",
}
_keys = itertools.count()


@pytest.fixture(autouse=True)
def _one_clock() -> None:
    """One clock per test: every time below counts from the minute the test began, so a minute
    that turns while a test pushes moves none of its expected figures."""
    global _start
    _start = support.minute_ago(0)


_start = support.minute_ago(0)


def minute_ago(minutes: int) -> datetime:
    return _start - timedelta(minutes=minutes)


def _now() -> datetime:
    return _start + timedelta(seconds=30)


@pytest.fixture
def pool(site_a) -> Pool:  # type: ignore[no-untyped-def]
    return Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="H100")


def _waits(cq: str, admitted_within: float, count: int) -> list[str]:
    """Cumulative buckets of ``count`` admissions, each waiting just under ``admitted_within`` s."""
    lines = [
        f'kueue_admission_wait_time_seconds_bucket{{cluster_queue="{cq}",le="{le}"}} '
        f"{count if le == '+Inf' or float(le) >= admitted_within else 0}"
        for le in BOUNDS
    ]
    return [*lines, f'kueue_admission_wait_time_seconds_count{{cluster_queue="{cq}"}} {count}']


def _quota(
    cq: str, *, nominal: float, usage: float, borrowing: float = math.inf, lending: float = math.inf
) -> list[str]:
    def text(v: float) -> str:
        return "+Inf" if math.isinf(v) else f"{v:g}"

    gpu = f'cluster_queue="{cq}",cohort="h100-pool",flavor="h100-reserved",resource="nvidia.com/gpu"'
    return [
        f"kueue_cluster_queue_nominal_quota{{{gpu}}} {text(nominal)}",
        f"kueue_cluster_queue_resource_usage{{{gpu}}} {text(usage)}",
        f"kueue_cluster_queue_borrowing_limit{{{gpu}}} {text(borrowing)}",
        f"kueue_cluster_queue_lending_limit{{{gpu}}} {text(lending)}",
    ]


def _pending(cq: str, active: int, inadmissible: int = 0) -> list[str]:
    return [
        f'kueue_pending_workloads{{cluster_queue="{cq}",status="active"}} {active}',
        f'kueue_pending_workloads{{cluster_queue="{cq}",status="inadmissible"}} {inadmissible}',
    ]


def _push(client, token: str, lines: list[str], at: datetime) -> None:  # type: ignore[no-untyped-def]
    response = push(client, token, stamped(lines, at, KUEUE_TYPES))
    assert response.status_code == 202, response.content


def _map(name: str, pool: Pool | None, team: str | None = None, scheduler: str = "kueue") -> SchedulerQueue:
    queue = SchedulerQueue.objects.get(scheduler=scheduler, name=name)
    queue.pool = pool
    queue.team = Team.objects.get_or_create(name=team)[0] if team else None
    queue.save()
    return queue


def _starving_pool(  # type: ignore[no-untyped-def]
    client, token: str, pool: Pool, *, wait: float, a: dict, b: dict, pending: tuple[int, int] = (5, 2)
) -> None:
    """team-a-h100 admits ten workloads in 5 min, each after about ``wait`` s, and has ``pending``
    (active, inadmissible) waiting; team-b-h100 shares the pool. ``a`` and ``b``: their GPU quotas and usage."""
    _push(client, token, _waits("team-a-h100", wait, 0), minute_ago(5))
    last = [*_waits("team-a-h100", wait, 10), *_pending("team-a-h100", *pending)]
    last += [*_quota("team-a-h100", **a), *_quota("team-b-h100", **b), *_pending("team-b-h100", 0)]
    _push(client, token, last, minute_ago(1))
    _map("team-a-h100", pool, "team-a")
    _map("team-b-h100", pool, "team-b")


def _firing(name: str) -> list[Finding]:
    return list(Finding.objects.filter(source=f"detector:{name}", status="firing").order_by("fingerprint"))


# --- the four are registered ---------------------------------------------------------------------


def test_the_four_scheduler_detectors_are_registered() -> None:
    assert set(SCHEDULER) <= set(registered())


# --- admission starvation ------------------------------------------------------------------------


def test_a_team_at_its_quota_while_the_pool_idles_starves_on_quota(client, token_a, pool) -> None:
    # team-a: 16 nominal + 8 borrowing, all 24 used; team-b lends nothing of its 16 idle GPUs.
    a = {"nominal": 16, "usage": 24, "borrowing": 8}
    b = {"nominal": 32, "usage": 8, "lending": 0}
    _starving_pool(client, token_a, pool, wait=3000, a=a, b=b)
    [spec] = detectors.scheduler_admission_starvation(_now())
    assert spec.fingerprint == "scheduler-admission-starvation:ams-1:kueue:team-a-h100"
    assert spec.labels == {
        "site": "ams-1",
        "scheduler": "kueue",
        "queue": "team-a-h100",
        "pool": "H100",
        "team": "team-a",
        "cause": "quota",
    }
    # Ten waits in (2560, 5120]: p95 is rank 9.5 of 10 there, 2560 + 2560 x 0.95 = 4992 s, 83 min.
    assert spec.impact["p95_seconds"] == pytest.approx(4992)
    assert spec.impact["idle_gpus"] == 16 and spec.impact["pending_workloads"] == 7
    assert "p95 admission wait 83 min over 30 min (limit 30 min)" in spec.summary
    assert "7 workloads waiting while 16 GPUs of the pool are idle; quota: it may take 0 of the 16" in spec.summary


def test_room_in_the_quota_and_idle_gpus_yet_waiting_is_fragmentation(client, token_a, pool) -> None:
    a = {"nominal": 32, "usage": 24}
    b = {"nominal": 16, "usage": 8}
    _starving_pool(client, token_a, pool, wait=3000, a=a, b=b)
    [spec] = detectors.scheduler_admission_starvation(_now())
    assert spec.labels["cause"] == "fragmentation"
    assert spec.impact["quota_room_gpus"] == 16 and spec.impact["idle_gpus"] == 16
    assert "fragmentation: its quota lets it take all 16 idle GPUs (using 24, nominal 32" in spec.summary


def test_waiting_in_a_genuinely_full_pool_raises_nothing(client, token_a, pool) -> None:
    # Every nominal GPU of the pool is in use: the team waits for capacity, not behind its quota.
    a = {"nominal": 16, "usage": 24, "borrowing": 8}
    b = {"nominal": 16, "usage": 8}
    _starving_pool(client, token_a, pool, wait=3000, a=a, b=b)
    assert detectors.scheduler_admission_starvation(_now()) == []


IDLE = {"a": {"nominal": 32, "usage": 8}, "b": {"nominal": 16, "usage": 0}}


def test_short_waits_raise_nothing(client, token_a, pool) -> None:
    _starving_pool(client, token_a, pool, wait=8, **IDLE)  # p95 under 10 s
    assert detectors.scheduler_admission_starvation(_now()) == []


def test_long_waits_with_nothing_left_waiting_raise_nothing(client, token_a, pool) -> None:
    _starving_pool(client, token_a, pool, wait=3000, pending=(0, 0), **IDLE)
    assert detectors.scheduler_admission_starvation(_now()) == []


def test_a_pool_sets_its_own_wait_limit(client, token_a, pool, settings) -> None:
    _starving_pool(client, token_a, pool, wait=3000, a={"nominal": 32, "usage": 24}, b={"nominal": 16, "usage": 8})
    settings.SCHEDULER_ADMISSION_WAIT_BY_POOL = {"ams-1/H100": 2 * 3600}
    assert detectors.scheduler_admission_starvation(_now()) == []
    settings.SCHEDULER_ADMISSION_WAIT_BY_POOL = {"ams-1/H100": 3600}
    assert len(detectors.scheduler_admission_starvation(_now())) == 1


def test_starvation_holds_while_nothing_is_admitted_and_clears_once_nothing_waits(client, token_a, pool) -> None:
    _starving_pool(client, token_a, pool, wait=3000, a={"nominal": 32, "usage": 24}, b={"nominal": 16, "usage": 8})
    now = _now()
    run_detectors(now=now, only=["scheduler-admission-starvation"])
    [finding] = _firing("scheduler-admission-starvation")
    # 40 minutes on: no admission in the last 30 (no wait to read) and three workloads still wait.
    later = now + timedelta(minutes=40)
    waiting = [QueuePoint("kueue", "team-a-h100", "pending_workloads", 'status="active"', later, 3)]
    store_queue_points(site_id=pool.site_id, batch_key="waiting", points=waiting)
    run_detectors(now=later, only=["scheduler-admission-starvation"])
    assert _firing("scheduler-admission-starvation") == [finding]
    moment = later + timedelta(seconds=1)
    drained = [QueuePoint("kueue", "team-a-h100", "pending_workloads", 'status="active"', moment, 0)]
    store_queue_points(site_id=pool.site_id, batch_key="none-waiting", points=drained)
    run_detectors(now=moment, only=["scheduler-admission-starvation"])
    assert _firing("scheduler-admission-starvation") == []


def test_the_quota_rules_follow_kueue_borrowing_and_lending() -> None:
    quotas = {
        "a": QueueQuota(nominal=16, usage=12, borrowing_limit=8),
        "b": QueueQuota(nominal=16, usage=12),
    }
    assert cohort_idle(quotas) == 8
    # a's own 4 unused, and 4 more borrowed of b's unused 4: every idle GPU.
    assert quota_room("a", quotas) == 8 and starvation_cause("a", quotas) == "fragmentation"
    quotas["b"] = QueueQuota(nominal=16, usage=12, lending_limit=1)
    assert quota_room("a", quotas) == 5 and starvation_cause("a", quotas) == "quota"
    quotas["a"] = QueueQuota(nominal=16, usage=22, borrowing_limit=6)  # at its borrowing limit
    quotas["b"] = QueueQuota(nominal=16, usage=2)
    assert cohort_idle(quotas) == 8 and quota_room("a", quotas) == 0 and starvation_cause("a", quotas) == "quota"
    quotas["b"] = QueueQuota(nominal=16, usage=10)
    assert cohort_idle(quotas) == 0 and starvation_cause("a", quotas) is None


# --- eviction storm ------------------------------------------------------------------------------


def _evictions(client, token: str, values: list[tuple[int, float]], preempted: float | None = None) -> None:  # type: ignore[no-untyped-def]
    """team-b-h100's Preempted evictions at (minutes ago, counter value); team-a-h100's preemptions
    (InCohortReclamation) rise by ``preempted`` over the same minutes."""
    for k, (minutes, value) in enumerate(values):
        lines = [
            f'kueue_evicted_workloads_total{{cluster_queue="team-b-h100",priority_class="batch",'
            f'reason="Preempted",underlying_cause=""}} {value}'
        ]
        if preempted is not None:
            rise = preempted * k / (len(values) - 1)
            lines += [
                'kueue_preempted_workloads_total{preempting_cluster_queue="team-a-h100",'
                f'reason="InCohortReclamation"}} {100 + rise}',
                f'kueue_preempted_workloads_total{{preempting_cluster_queue="other-pool",reason="InClusterQueue"}} {k}',
            ]
        _push(client, token, lines, minute_ago(minutes))


def test_an_eviction_storm_names_the_preempting_team_and_the_reason(client, token_a, pool) -> None:
    # 10 -> 12 -> (Kueue restarted) 1 -> 4: 2 + 1 + 3 = 6 in the window; the first value is older.
    _evictions(client, token_a, [(15, 10), (8, 12), (6, 1), (4, 4)], preempted=6)
    _map("team-a-h100", pool, "team-a")
    _map("team-b-h100", pool, "team-b")
    _map("other-pool", None)
    [spec] = detectors.scheduler_eviction_storm(_now())
    assert spec.fingerprint == "scheduler-eviction-storm:ams-1:kueue:team-b-h100"
    assert spec.labels["team"] == "team-b" and spec.labels["preempting_queues"] == "team-a-h100"
    assert spec.impact["evictions"] == 6 and spec.impact["by_reason"] == {"Preempted": 6}
    assert spec.impact["preempted_by"] == {"team-a-h100": {"team": "team-a", "by_reason": {"InCohortReclamation": 6}}}
    assert "6 workloads evicted in 10 min (limit 5): 6 Preempted" in spec.summary
    assert "preempted by team-a-h100 (team team-a): 6 InCohortReclamation" in spec.summary
    assert spec.started_at == minute_ago(8)


def test_a_counter_reset_does_not_read_as_a_storm(client, token_a, pool) -> None:
    # 10 -> 12 -> (restart) 0 -> 1: three evictions, though the values span 12.
    _evictions(client, token_a, [(15, 10), (8, 12), (6, 0), (4, 1)])
    assert detectors.scheduler_eviction_storm(_now()) == []


def test_evictions_before_the_window_do_not_count(client, token_a, pool) -> None:
    _evictions(client, token_a, [(40, 0), (30, 20), (20, 40), (5, 42)])
    assert detectors.scheduler_eviction_storm(_now()) == []


# --- drained capacity ----------------------------------------------------------------------------


def _slurm(drain: int, down: int) -> list[str]:
    """The exporter's fixture with these drained and down nodes (idle nodes make up the rest)."""
    counts = {
        name: value
        for name, _, value in samples(SLURM)
        if name.startswith(("slurm_nodes_", "slurm_gpus_")) and name != "slurm_gpus_utilization"
    }
    counts["slurm_nodes_idle"] += counts["slurm_nodes_drain"] + counts["slurm_nodes_down"] - drain - down
    counts |= {"slurm_nodes_drain": drain, "slurm_nodes_down": down}
    return [f"{name} {value:g}" for name, value in counts.items()]


def _push_slurm(client, token: str, minutes: range, drain: int, down: int) -> None:  # type: ignore[no-untyped-def]
    types = {line.split(" ")[0]: "gauge" for line in _slurm(drain, down)}
    for m in minutes:
        assert push(client, token, stamped(_slurm(drain, down), minute_ago(m), types)).status_code == 202


def test_drained_nodes_past_the_share_for_the_threshold_fire_with_gpu_hours(client, token_a, pool) -> None:
    _push_slurm(client, token_a, range(30, 20, -1), drain=3, down=1)  # 4 of 40: at the limit
    _push_slurm(client, token_a, range(20, -1, -1), drain=5, down=1)  # 6 of 40 for 20 min
    _map("", pool, scheduler="slurm")
    now = _now()
    [spec] = detectors.scheduler_drained_capacity(now)
    assert spec.fingerprint == "scheduler-drained-capacity:ams-1:slurm:(cluster)"
    assert spec.labels == {"site": "ams-1", "scheduler": "slurm", "queue": "", "pool": "H100"}
    assert spec.started_at == minute_ago(20)
    # 6 nodes x 8 GPUs (320 GPUs over 40 nodes) for 20.5 min: 16.4 GPU-hours.
    assert spec.impact["gpus_out"] == 48 and spec.impact["gpu_hours_unavailable"] == pytest.approx(16.4)
    assert "6 of 40 nodes (15%, limit 10%) drained or down for 20 min, 16.4 GPU-hours unavailable" in spec.summary


def test_the_fixtures_share_at_the_limit_raises_nothing(client, token_a) -> None:
    _push_slurm(client, token_a, range(30, -1, -1), drain=3, down=1)  # the fixture's 4 of 40: 10 %
    assert detectors.scheduler_drained_capacity(_now()) == []


def _slurm_points(site_id: int, minutes: range, drain: int, total: int = 40) -> None:
    points = []
    for m in minutes:
        ts = minute_ago(m)
        for state, value in (("drain", drain), ("down", 0), ("idle", total - drain)):
            points.append(QueuePoint("slurm", "", "nodes", f'state="{state}"', ts, value))
    store_queue_points(site_id=site_id, batch_key=f"slurm-{next(_keys)}", points=points)


def test_a_drain_shorter_than_the_threshold_raises_nothing(site_a) -> None:
    _slurm_points(site_a.pk, range(10, -1, -1), drain=20)
    assert detectors.scheduler_drained_capacity(_now()) == []


def test_a_drained_finding_holds_while_the_exporter_is_silent_and_clears_once_it_reports(site_a) -> None:
    _slurm_points(site_a.pk, range(20, -1, -1), drain=8)
    now = _now()
    run_detectors(now=now, only=["scheduler-drained-capacity"])
    [finding] = _firing("scheduler-drained-capacity")
    assert finding.impact["gpu_hours_unavailable"] == pytest.approx(8 * 8 * 20.5 / 60, abs=0.01)  # no GPU series: 8
    run_detectors(now=now + timedelta(minutes=10), only=["scheduler-drained-capacity"])  # nothing since
    assert _firing("scheduler-drained-capacity") == [finding]
    _slurm_points(site_a.pk, range(-9, -11, -1), drain=1)  # the nodes resumed
    run_detectors(now=now + timedelta(minutes=10), only=["scheduler-drained-capacity"])
    assert _firing("scheduler-drained-capacity") == []


def _push_cordons(client, token: str, minutes: range, cordoned: set[str]) -> None:  # type: ignore[no-untyped-def]
    """kube-state-metrics' fixture nodes (8 + 8 + 7 GPUs allocatable), ``cordoned`` cordoned."""
    lines = []
    for line in support.KSM.splitlines():
        if line.startswith("kube_node_status_allocatable"):
            lines.append(line)
        elif line.startswith("kube_node_spec_unschedulable"):
            node = line.split('"')[1]
            lines.append(f'kube_node_spec_unschedulable{{node="{node}"}} {int(node in cordoned)}')
    types = {"kube_node_spec_unschedulable": "gauge", "kube_node_status_allocatable": "gauge"}
    for m in minutes:
        assert push(client, token, stamped(lines, minute_ago(m), types)).status_code == 202


def _incident(category: str, labels: dict[str, str], state: str = "triggered") -> Incident:
    return Incident.objects.create(
        title=f"{category} on {labels.get('hostname') or labels.get('node')}",
        severity="SEV2",
        category=category,
        group_key=f"test:{next(_keys)}",
        labels=labels,
        started_at=minute_ago(30),
        state=state,
    )


def test_cordoned_kubernetes_nodes_past_the_share_fire_naming_them_and_their_open_incidents(
    client, token_a, pool
) -> None:  # type: ignore[no-untyped-def]
    _push_cordons(client, token_a, range(20, -1, -1), {"gpu-a-018"})  # 1 of 3 nodes for 20 min
    _map("", pool, scheduler="kubernetes")
    xid = _incident("gpu-health", {"site": "ams-1", "hostname": "gpu-a-018", "gpu": "GPU-18-0"})
    flap = _incident("fabric", {"site": "ams-1", "node": "gpu-a-018", "interface": "mlx5_0/1"})
    _incident("gpu-health", {"site": "ams-1", "hostname": "gpu-a-017"})  # not cordoned
    _incident("fabric", {"site": "ams-1", "node": "gpu-a-018"}, state="resolved")  # over
    _incident("gpu-health", {"site": "elsewhere", "hostname": "gpu-a-018"})  # another site's node
    _incident("serving", {"site": "ams-1", "hostname": "gpu-a-018"})  # not a node's fault
    now = _now()
    [spec] = detectors.scheduler_drained_capacity(now)
    assert spec.fingerprint == "scheduler-drained-capacity:ams-1:kubernetes:(cluster)"
    assert spec.labels == {"site": "ams-1", "scheduler": "kubernetes", "queue": "", "pool": "H100"}
    assert spec.started_at == minute_ago(20)
    assert "1 of 3 nodes (33%, limit 10%) cordoned for 20 min" in spec.summary, spec.summary
    assert "cordoned: gpu-a-018" in spec.summary
    assert f"#{xid.pk} {xid.title}" in spec.summary and f"#{flap.pk} {flap.title}" in spec.summary
    assert spec.impact["cordoned_nodes"] == ["gpu-a-018"]
    assert [i["id"] for i in spec.impact["incidents"]] == [xid.pk, flap.pk]
    per_node = (8 + 8 + 7) / 3  # the GPU nodes' allocatable GPUs, on average
    assert spec.impact["gpus_out"] == pytest.approx(per_node)
    assert spec.impact["gpu_hours_unavailable"] == pytest.approx(per_node * 20.5 / 60, abs=0.01)


def test_kubernetes_nodes_schedulable_or_cordoned_briefly_raise_nothing(client, token_a, pool) -> None:  # type: ignore[no-untyped-def]
    _push_cordons(client, token_a, range(20, 0, -1), set())
    _map("", pool, scheduler="kubernetes")
    assert detectors.scheduler_drained_capacity(_now()) == []
    _push_cordons(client, token_a, range(0, -1, -1), {"gpu-a-017", "gpu-a-018"})  # 2 of 3, since a minute
    assert detectors.scheduler_drained_capacity(_now()) == []


# --- reservation unused --------------------------------------------------------------------------


def _admitted(site_id: int, cq: str, values: list[tuple[int, float]]) -> None:
    points = [QueuePoint("kueue", cq, "admitted_active_workloads", "", minute_ago(m), v) for m, v in values]
    store_queue_points(site_id=site_id, batch_key=f"admitted-{next(_keys)}", points=points)


def _reservation(pool: Pool, team: str, *, started: timedelta, state: str = ReservationState.ACTIVE) -> Reservation:
    now = minute_ago(0)
    return Reservation.objects.create(
        team=Team.objects.get_or_create(name=team)[0],
        pool=pool,
        gpus=16,
        start=now - started,
        end=now + timedelta(days=1),
        state=state,
    )


def test_an_active_reservation_with_nothing_admitted_for_the_threshold_fires_with_idle_gpu_hours(site_a, pool) -> None:
    reservation = _reservation(pool, "team-a", started=timedelta(hours=4))
    _admitted(site_a.pk, "team-a-h100", [(300, 3), (180, 2)] + [(m, 0) for m in range(170, -1, -10)])
    _map("team-a-h100", pool, "team-a")
    now = _now()
    [spec] = detectors.scheduler_reservation_unused(now)
    assert spec.fingerprint == f"scheduler-reservation-unused:{reservation.pk}"
    assert spec.labels == {"site": "ams-1", "pool": "H100", "team": "team-a", "reservation": str(reservation.pk)}
    # Busy until the minute 180 ago (within the reservation): idle since 179 min ago, 16 GPUs.
    assert spec.started_at == minute_ago(179)
    assert spec.impact["idle_gpu_hours"] == pytest.approx(16 * 179.5 / 60, abs=0.01)
    assert "team-a holds 16 GPUs on ams-1/H100" in spec.summary and "47.9 GPU-hours idle" in spec.summary


def test_a_reservation_whose_team_admitted_work_lately_raises_nothing(site_a, pool) -> None:
    _reservation(pool, "team-a", started=timedelta(hours=4))
    _admitted(site_a.pk, "team-a-h100", [(m, 0) for m in range(230, 60, -10)] + [(60, 1), (30, 0), (1, 0)])
    _map("team-a-h100", pool, "team-a")
    assert detectors.scheduler_reservation_unused(_now()) == []


def test_a_reservation_not_yet_approved_or_without_reporting_queues_raises_nothing(site_a, pool) -> None:
    _reservation(pool, "team-a", started=timedelta(hours=4), state=ReservationState.REQUESTED)
    _admitted(site_a.pk, "team-a-h100", [(m, 0) for m in range(230, -1, -10)])
    _map("team-a-h100", pool, "team-a")
    assert detectors.scheduler_reservation_unused(_now()) == []
    _reservation(pool, "team-b", started=timedelta(hours=4))  # team-b has no queue on the pool
    assert detectors.scheduler_reservation_unused(_now()) == []


# --- the demo's Kueue ----------------------------------------------------------------------------


def test_the_demos_starving_team_is_found_waiting_behind_its_quota() -> None:
    """The simulated Kueue (fleet.scheduler.simulator) over its last 40 minutes, a scrape a minute:
    the team it starves is the one finding, and its cause is its quota."""
    from fleet.capacity.simulator import seed_capacity
    from fleet.management.backfill import queue_values
    from fleet.models import Site
    from fleet.scheduler.simulator import STARVING, KueueSimulator, seed_queues
    from fleet.telemetry.simulator import DEFAULT_SITES, build_fleet

    for spec in DEFAULT_SITES:
        Site.objects.create(name=spec.name, region=spec.region, contracted_power_kw=spec.contracted_power_kw)
    sim = KueueSimulator(build_fleet(DEFAULT_SITES, gpu_limit=None, seed=7), seed=7)
    seed_capacity(DEFAULT_SITES, seed=7, now=_now())
    seed_queues(sim)
    sites = dict(Site.objects.values_list("name", "pk"))
    for m in range(40, -1, -1):
        sim.advance(minute_ago(m))
        for site in sim.sites:
            points = [
                QueuePoint("kueue", queue, quantity, series, minute_ago(m), value)
                for queue, quantity, series, value in queue_values(site, sim.samples(site))
            ]
            store_queue_points(site_id=sites[site], batch_key=f"sim-{site}-{m}", points=points)
    specs = detectors.scheduler_admission_starvation(_now())
    site, pool, team = STARVING
    assert [(s.labels["site"], s.labels["pool"], s.labels["team"]) for s in specs] == [(site, pool, team)]
    # Its two-node evaluations take 16 GPUs; its quota leaves it 8 of the pool's 16 idle.
    assert specs[0].labels["cause"] == "quota", specs[0].summary
    assert specs[0].impact["quota_room_gpus"] < specs[0].impact["idle_gpus"]
