"""The capacity page's scheduler queues (fleet.scheduler.read.pool_queues): each figure checked
against an independent reading of the expositions pushed through the Prometheus door (pending now,
admission wait percentiles worked out by hand from the buckets, evictions and preemptions per team
with a Kueue restart in between, GPUs allocated against reserved, Slurm's drained and down nodes),
then the plan API's ``queues`` part, the panel on the capacity page and the ``scheduler`` live topic."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console import live
from fleet.models import Pool, SchedulerCounterHour, SchedulerQueue, Site, TeamQuota
from fleet.scheduler import read as scheduler_read
from fleet.scheduler.read import pool_queues
from tests.fleet.capacity import days_ahead, make_pool, reserve, team
from tests.fleet.scheduler.support import KUEUE, SLURM, minute_ago, ms, push, samples

pytestmark = pytest.mark.django_db

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _family(name: str, types: dict[str, str]) -> str:
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in types:
            return name.removesuffix(suffix)
    raise AssertionError(name)


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def scrape(
    text: str, moment: datetime, value: Callable[[str, dict[str, str], float], float] = lambda n, lab, v: v
) -> str:
    """The fixture's samples at one moment (ms timestamps) under their TYPE lines, each value
    through ``value(name, labels, value)``."""
    types = dict(_TYPE.findall(text))
    by_family: dict[str, list[str]] = {}
    for name, labels, v in samples(text):
        rendered = "+Inf" if (new := value(name, labels, v)) == math.inf else repr(new)
        line = f"{name}{{{_labels(labels)}}} {rendered} {ms(moment)}" if labels else f"{name} {rendered} {ms(moment)}"
        by_family.setdefault(_family(name, types), []).append(line)
    out = []
    for family, lines in by_family.items():
        out += [f"# TYPE {family} {types[family]}", *lines]
    return "\n".join(out) + "\n"


def is_counter(name: str) -> bool:
    return name.endswith(COUNTER_SUFFIXES)


def earlier(name: str, labels: dict[str, str], value: float) -> float:
    """The scrape two minutes before the fixture's: every counter a third lower (rounded down),
    pending workloads one more of each status."""
    if is_counter(name):
        return float(math.floor(value * 2 / 3))
    if name == "kueue_pending_workloads":
        return value + 1
    return value


def prometheus_quantile(q: float, cumulative: dict[float, float]) -> float:
    """histogram_quantile by hand: the bucket holding rank q * total, linear inside it."""
    bounds = sorted(cumulative)
    rank = q * cumulative[math.inf]
    for i, bound in enumerate(bounds):
        if cumulative[bound] >= rank:
            if bound == math.inf:
                return bounds[-2]
            low = bounds[i - 1] if i else 0.0
            below = cumulative[bounds[i - 1]] if i else 0.0
            return low + (bound - low) * (rank - below) / (cumulative[bound] - below)
    raise AssertionError("no bucket")


@pytest.fixture
def pool(site_a: Site) -> Pool:
    return make_pool(site_a)


@pytest.fixture
def kueue(client, token_a, pool: Pool) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """The Kueue fixture pushed twice, two minutes apart (the first scrape's counters lower), both
    ClusterQueues mapped to the pool and to a team."""
    first, second = minute_ago(3), minute_ago(1)
    assert push(client, token_a, scrape(KUEUE, first, earlier)).status_code == 202
    assert push(client, token_a, scrape(KUEUE, second)).status_code == 202
    for name, owner in (("team-a-h100", "team-a"), ("team-b-h100", "team-b")):
        SchedulerQueue.objects.filter(scheduler="kueue", name=name).update(pool=pool, team=team(owner))
    after = samples(KUEUE)
    return {"before": [(n, lab, earlier(n, lab, v)) for n, lab, v in after], "after": after}


def _by_name(figures: dict, name: str) -> dict:
    return next(q for q in figures["queues"] if q["name"] == name)


def _increase(pushed: dict[str, list], metric: str, match: Callable[[dict[str, str]], bool]) -> float:
    """The sum over matching series of (after - before): no reset between the two scrapes."""
    before = {_labels(lab): v for n, lab, v in pushed["before"] if n == metric and match(lab)}
    after = {_labels(lab): v for n, lab, v in pushed["after"] if n == metric and match(lab)}
    return sum(after[k] - before[k] for k in after)


def test_pending_workloads_are_the_newest_minutes(kueue, pool: Pool) -> None:
    figures = pool_queues([pool.pk])[pool.pk]
    latest = {
        (lab["cluster_queue"], lab["status"]): v for n, lab, v in kueue["after"] if n == "kueue_pending_workloads"
    }
    b = _by_name(figures, "team-b-h100")
    assert (b["pending"], b["inadmissible"]) == (
        latest[("team-b-h100", "active")],
        latest[("team-b-h100", "inadmissible")],
    )
    assert (b["pending"], b["inadmissible"]) == (3, 4)  # not the earlier scrape's 4 and 5
    assert figures["pending"] == sum(v for (cq, s), v in latest.items() if s == "active")
    assert figures["inadmissible"] == sum(v for (cq, s), v in latest.items() if s == "inadmissible")


def test_admission_waits_equal_histogram_quantile_worked_out_by_hand(kueue, pool: Pool) -> None:
    figures = pool_queues([pool.pk])[pool.pk]
    for cq in ("team-a-h100", "team-b-h100"):
        cumulative = {}
        for n, lab, v in kueue["after"]:
            if n == "kueue_admission_wait_time_seconds_bucket" and lab["cluster_queue"] == cq:
                bound = math.inf if lab["le"] == "+Inf" else float(lab["le"])
                cumulative[bound] = v - next(v0 for n0, lab0, v0 in kueue["before"] if n0 == n and lab0 == lab)
        row = _by_name(figures, cq)
        for key in ("wait_1h", "wait_24h"):  # both scrapes fall in both windows
            assert row[key]["p50"] == pytest.approx(prometheus_quantile(0.5, cumulative))
            assert row[key]["p95"] == pytest.approx(prometheus_quantile(0.95, cumulative))
            assert row[key]["admissions"] == cumulative[math.inf]


def test_evictions_and_preemptions_are_counted_per_team_with_their_reasons(kueue, pool: Pool) -> None:
    figures = pool_queues([pool.pk])[pool.pk]
    evicted_b = _increase(kueue, "kueue_evicted_workloads_total", lambda lab: lab["cluster_queue"] == "team-b-h100")
    preempted_by_a = _increase(
        kueue, "kueue_preempted_workloads_total", lambda lab: lab["preempting_cluster_queue"] == "team-a-h100"
    )
    assert evicted_b == 1 + 2 and preempted_by_a == 2  # evicted 0 -> 1 and 3 -> 5; preempted 3 -> 5
    assert _by_name(figures, "team-b-h100")["evicted"] == evicted_b
    assert _by_name(figures, "team-a-h100")["preempted"] == preempted_by_a
    teams = {t["team"]: t for t in figures["teams"]}
    assert teams["team-b"]["evicted"] == evicted_b
    assert teams["team-b"]["evicted_reasons"] == {"PodsReadyTimeout": 1, "Preempted": 2}
    assert teams["team-a"]["preempted"] == preempted_by_a
    assert teams["team-a"]["preempted_reasons"] == {"InCohortReclamation": preempted_by_a}


def test_a_kueue_restart_in_evictions_counts_as_prometheus_increase_does(client, token_a, pool: Pool) -> None:
    values = [5, 8, 2, 6]  # Kueue restarts after the second scrape: the counter starts over from zero
    for i, v in enumerate(values):
        body = (
            "# TYPE kueue_evicted_workloads_total counter\n"
            f'kueue_evicted_workloads_total{{cluster_queue="team-c",reason="Preempted"}} {v} {ms(minute_ago(6 - i))}\n'
        )
        assert push(client, token_a, body).status_code == 202
    SchedulerQueue.objects.filter(name="team-c").update(pool=pool, team=team("team-c"))
    by_hand = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
    assert by_hand == 3 + 2 + 4
    figures = pool_queues([pool.pk])[pool.pk]
    assert _by_name(figures, "team-c")["evicted"] == by_hand
    assert figures["teams"] == [
        {
            "team": "team-c",
            "evicted": by_hand,
            "preempted": 0,
            "evicted_reasons": {"Preempted": by_hand},
            "preempted_reasons": {},
        }
    ]


def test_gpus_allocated_by_the_scheduler_stand_against_gpus_reserved_now(kueue, pool: Pool) -> None:
    reserve(pool, "team-a", 32, days_ahead(-1), days_ahead(5))
    reserve(pool, "team-b", 8, days_ahead(-1), days_ahead(5), tier="preemptible", state="active")
    reserve(pool, "team-b", 16, days_ahead(-1), days_ahead(5), state="requested")  # holds nothing yet
    reserve(pool, "team-a", 64, days_ahead(-9), days_ahead(-2))  # over
    reserve(pool, "team-a", 64, days_ahead(2), days_ahead(9))  # not yet
    usage = {
        lab["cluster_queue"]: v
        for n, lab, v in kueue["after"]
        if n == "kueue_cluster_queue_resource_usage" and lab["resource"] == "nvidia.com/gpu"
    }
    figures = pool_queues([pool.pk])[pool.pk]
    assert figures["gpus_allocated"] == sum(usage.values()) == 48  # cpu usage left out
    assert _by_name(figures, "team-a-h100")["gpus_allocated"] == usage["team-a-h100"]
    assert figures["gpus_reserved"] == 32 + 8


def test_slurm_drained_and_down_nodes_and_pending_jobs_belong_to_the_mapped_pool(client, token_a, pool: Pool) -> None:
    assert push(client, token_a, scrape(SLURM, minute_ago(1))).status_code == 202
    SchedulerQueue.objects.filter(scheduler="slurm", name__in=["", "h100"]).update(pool=pool)
    read = {(n, lab.get("partition")): v for n, lab, v in samples(SLURM)}
    figures = pool_queues([pool.pk])[pool.pk]
    assert figures["nodes_drained"] == read[("slurm_nodes_drain", None)] == 3
    assert figures["nodes_down"] == read[("slurm_nodes_down", None)] == 1
    assert figures["gpus_allocated"] == read[("slurm_gpus_alloc", None)]
    assert _by_name(figures, "h100")["pending"] == read[("slurm_partition_jobs_pending", "h100")]
    assert [q["name"] for q in figures["queues"]] == ["(cluster)", "h100"]  # the debug partition is not mapped


def test_a_scheduler_gone_quiet_shows_unknown_not_its_last_figure(client, token_a, pool: Pool) -> None:
    body = (
        "# TYPE kueue_pending_workloads gauge\n"
        f'kueue_pending_workloads{{cluster_queue="old",status="active"}} 9 {ms(minute_ago(30))}\n'
    )
    assert push(client, token_a, body).status_code == 202
    SchedulerQueue.objects.filter(name="old").update(pool=pool)
    figures = pool_queues([pool.pk])[pool.pk]
    assert _by_name(figures, "old")["pending"] is None and figures["pending"] == 0


def test_a_pool_without_queues_has_empty_figures_and_unmapped_queues_are_left_out(kueue, pool, site_a) -> None:
    other = make_pool(site_a, model="NVIDIA A100-SXM4-80GB", name="spare")
    SchedulerQueue.objects.filter(name="team-b-h100").update(pool=None)
    figures = pool_queues([pool.pk, other.pk])
    assert [q["name"] for q in figures[pool.pk]["queues"]] == ["team-a-h100"]
    assert figures[other.pk]["queues"] == [] and figures[other.pk]["gpus_allocated"] is None
    assert set(pool_queues()) == {pool.pk}  # all pools: those with a mapped queue


def test_the_statements_do_not_grow_with_the_queues(client, token_a, pool: Pool) -> None:
    def counted() -> int:
        with CaptureQueriesContext(connection) as ctx:
            pool_queues([pool.pk])
        return len(ctx.captured_queries)

    lines = ["# TYPE kueue_pending_workloads gauge"]
    lines += [
        f'kueue_pending_workloads{{cluster_queue="q{i}",status="active"}} {i} {ms(minute_ago(1))}' for i in range(2)
    ]
    assert push(client, token_a, "\n".join(lines) + "\n").status_code == 202
    SchedulerQueue.objects.update(pool=pool)
    counted()  # sums the day's settled hours
    few = counted()
    lines += [
        f'kueue_pending_workloads{{cluster_queue="q{i}",status="active"}} {i} {ms(minute_ago(1))}' for i in range(2, 40)
    ]
    assert push(client, token_a, "\n".join(lines) + "\n").status_code == 202
    SchedulerQueue.objects.update(pool=pool)
    assert counted() <= few + 4  # the new queues' hours summed: one statement in a transaction
    assert counted() == few <= 7


def test_the_plan_api_carries_each_pools_queues(kueue, pool: Pool, viewer_client) -> None:
    response = viewer_client.get("/api/v1/capacity/plan", {"months": "3"})
    assert response.status_code == 200
    body = response.json()
    assert [q["pool"] for q in body["queues"]] == [p["id"] for p in body["pools"]] == [pool.pk]
    part = body["queues"][0]
    expected = pool_queues([pool.pk])[pool.pk]
    assert part["gpus_allocated"] == expected["gpus_allocated"] == 48
    assert {q["name"]: q["inadmissible"] for q in part["queues"]} == {"team-a-h100": 0, "team-b-h100": 4}


def test_the_capacity_page_shows_the_queue_panel(kueue, pool: Pool, viewer_client) -> None:
    response = viewer_client.get("/capacity/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="pool-queues"' in html and f'data-pool="{pool.pk}"' in html
    row = re.search(r'<tr data-queue="\d+" class="row-warn">(.*?)</tr>', html, re.S)
    assert row and "team-b-h100" in row[1] and "team-b" in row[1]  # inadmissible workloads: flagged
    wait = _by_name(pool_queues([pool.pk])[pool.pk], "team-b-h100")["wait_1h"]
    assert f"{scheduler_read.duration(wait['p50'])} / {scheduler_read.duration(wait['p95'])}" in row[1]
    assert "js/scheduler_queues.js" in html


def test_the_panel_says_when_no_queue_is_mapped(pool: Pool, viewer_client) -> None:
    html = viewer_client.get("/capacity/").content.decode()
    assert 'id="pool-queues"' in html and "No scheduler queue is mapped to a pool yet" in html


def test_waits_read_as_seconds_minutes_or_hours() -> None:
    assert [scheduler_read.duration(s) for s in (None, 42, 210, 7560)] == ["–", "42 s", "3.5 min", "2.1 h"]


def test_the_live_push_carries_changes_only(client, token_a, kueue, pool: Pool) -> None:
    assert live.is_valid_topic("scheduler")
    payload, watermark = scheduler_read.build_scheduler_delta("scheduler", None)
    assert payload is not None and payload["type"] == "scheduler.delta"
    assert payload["pools"] == [pool_queues()[pool.pk]]
    assert scheduler_read.build_scheduler_delta("scheduler", watermark) == (None, watermark)
    body = (
        "# TYPE kueue_pending_workloads gauge\n"
        f'kueue_pending_workloads{{cluster_queue="team-b-h100",status="active"}} 11 {ms(minute_ago(0))}\n'
    )
    assert push(client, token_a, body).status_code == 202
    moved, _ = scheduler_read.build_scheduler_delta("scheduler", watermark)
    assert moved is not None and _by_name(moved["pools"][0], "team-b-h100")["pending"] == 11


def test_a_push_of_queue_series_asks_for_a_live_push_while_the_page_is_watched(
    client, token_a, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks
) -> None:
    cache.delete_many(["live:watch:any", "live:watch:scheduler"])
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(live, "request_push", lambda *topics: asked.append(topics))
    with django_capture_on_commit_callbacks(execute=True):
        assert push(client, token_a, scrape(KUEUE, minute_ago(2))).status_code == 202
    live.watch_topic("scheduler")
    with django_capture_on_commit_callbacks(execute=True):
        assert push(client, token_a, scrape(KUEUE, minute_ago(1))).status_code == 202
    assert asked == [(), ("scheduler",)]


def _evictions(client, token, points: list[tuple[int, float]], reason: str = "Preempted") -> None:  # type: ignore[no-untyped-def]
    for m, v in points:  # one scrape a push: an exposition holds a series once
        body = (
            "# TYPE kueue_evicted_workloads_total counter\n"
            f'kueue_evicted_workloads_total{{cluster_queue="team-d",reason="{reason}"}} {v} {ms(minute_ago(m))}\n'
        )
        response = push(client, token, body)
        assert response.status_code == 202, response.content


def test_a_day_reads_summed_hours_and_recent_minutes_as_the_minutes_alone_would(client, token_a, pool: Pool) -> None:
    # Minutes ago and value: scrapes in pairs a minute apart (a minute's increase starts from the
    # minute before), steady across the gaps; Kueue restarted 89 minutes ago.
    points = [(300, 0), (299, 2), (200, 2), (199, 5), (90, 5), (89, 1), (30, 1), (29, 4), (2, 4), (1, 6)]
    _evictions(client, token_a, points)
    SchedulerQueue.objects.filter(name="team-d").update(pool=pool, team=team("team-d"))
    values = [v for _, v in points]
    by_hand = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
    assert by_hand == 2 + 3 + 1 + 3 + 2
    queue = SchedulerQueue.objects.get(name="team-d").pk
    assert _by_name(pool_queues([pool.pk])[pool.pk], "team-d")["evicted"] == by_hand  # sums the settled hours
    assert SchedulerCounterHour.objects.filter(queue_id=queue, quantity="").count() >= 5
    summed = sum(SchedulerCounterHour.objects.filter(queue_id=queue).values_list("increase", flat=True))
    assert 0 < summed <= by_hand
    assert _by_name(pool_queues([pool.pk])[pool.pk], "team-d")["evicted"] == by_hand  # read from them


def test_a_late_value_in_a_summed_hour_is_summed_again(client, token_a, pool: Pool) -> None:
    _evictions(client, token_a, [(300, 0), (299, 2), (2, 2)])
    SchedulerQueue.objects.filter(name="team-d").update(pool=pool, team=team("team-d"))
    assert _by_name(pool_queues([pool.pk])[pool.pk], "team-d")["evicted"] == 2
    _evictions(client, token_a, [(240, 0), (239, 3)], reason="PodsReadyTimeout")  # a scrape that arrived late
    figures = pool_queues([pool.pk])[pool.pk]
    assert _by_name(figures, "team-d")["evicted"] == 2 + 3
    assert figures["teams"][0]["evicted_reasons"] == {"Preempted": 2, "PodsReadyTimeout": 3}


def test_a_day_is_the_current_clock_hour_and_the_23_before_it(client, token_a, pool: Pool) -> None:
    now = minute_ago(0) + timedelta(seconds=30)
    current = now.replace(minute=0)
    oldest = current - timedelta(hours=23)
    # One eviction in the minute before the day's first, one in the minute after it.
    into_day = int((now - oldest) / timedelta(minutes=1))
    before, inside = into_day + 2, into_day - 1
    _evictions(client, token_a, [(before + 1, 0), (before, 1), (inside + 1, 1), (inside, 2)])
    SchedulerQueue.objects.filter(name="team-d").update(pool=pool)
    assert _by_name(pool_queues([pool.pk], now=now)[pool.pk], "team-d")["evicted"] == 1


def test_a_figure_the_scheduler_does_not_report_reads_as_a_dash(client, token_a, pool: Pool, viewer_client) -> None:
    _evictions(client, token_a, [(2, 0), (1, 1)])
    SchedulerQueue.objects.filter(name="team-d").update(pool=pool)
    html = viewer_client.get("/capacity/").content.decode()
    assert '<td class="num" data-value="pending">–</td>' in html
    assert '<td class="num" data-value="evicted">1</td>' in html


# --- quota drift and each team's wait on the capacity page ------------------------------------------


def _quota(pool: Pool, owner: str, nominal: int, borrowing: int | None, lending: int | None) -> TeamQuota:
    return TeamQuota.objects.create(
        team=team(owner), pool=pool, nominal_gpus=nominal, borrowing_limit_gpus=borrowing, lending_limit_gpus=lending
    )


def test_the_panel_names_each_drifting_queue_with_the_fields_that_differ(kueue, pool: Pool, viewer_client) -> None:
    _quota(pool, "team-a", 30, 16, None)  # Kueue: nominal 32, borrowing 16, lending 8
    _quota(pool, "team-b", 16, None, None)  # Kueue: nominal 16, no limits: agrees
    html = viewer_client.get("/capacity/").content.decode()
    block = re.search(r'<div class="pool-queues-drift[^>]*>(.*?)</div>', html, re.S)
    assert block, "no drift block"
    text = " ".join(block[1].split())
    assert "team-a-h100" in text and "team-b-h100" not in text
    assert "nominal 32 in the scheduler, 30 here" in text
    assert "lending limit 8 in the scheduler, no limit here" in text
    assert "borrowing limit" not in text
    assert 'href="/scheduler/queues/#quota-drift"' in block[1]


def test_a_team_without_a_console_quota_is_drift_too(kueue, pool: Pool, viewer_client) -> None:
    _quota(pool, "team-a", 32, 16, 8)
    html = viewer_client.get("/capacity/").content.decode()
    block = re.search(r'<div class="pool-queues-drift[^>]*>(.*?)</div>', html, re.S)
    assert block and "team-b-h100" in block[1] and "no quota in the console" in block[1]
    assert "team-a-h100" not in block[1]


def test_the_panel_says_nothing_of_drift_when_the_quotas_agree(kueue, pool: Pool, viewer_client) -> None:
    _quota(pool, "team-a", 32, 16, 8)
    _quota(pool, "team-b", 16, None, None)
    assert "pool-queues-drift" not in viewer_client.get("/capacity/").content.decode()


def test_the_panel_reads_drift_in_statements_that_do_not_grow_with_the_queues(client, token_a, pool: Pool) -> None:
    def counted() -> int:
        with CaptureQueriesContext(connection) as ctx:
            scheduler_read.pool_section([pool])
        return len(ctx.captured_queries)

    def push_queues(n: int) -> None:
        lines = ["# TYPE kueue_cluster_queue_nominal_quota gauge"]
        lines += [
            f'kueue_cluster_queue_nominal_quota{{cluster_queue="q{i}",flavor="f",resource="nvidia.com/gpu"}} {i} '
            f"{ms(minute_ago(1))}"
            for i in range(n)
        ]
        assert push(client, token_a, "\n".join(lines) + "\n").status_code == 202
        for queue in SchedulerQueue.objects.all():
            SchedulerQueue.objects.filter(pk=queue.pk).update(pool=pool, team=team(f"team-{queue.name}"))

    push_queues(2)
    counted()  # sums the day's settled hours
    few = counted()
    push_queues(40)
    counted()
    assert counted() == few <= 7 + 3  # pool_queues' statements and quota_drift's three (every queue reports)


def test_each_teams_quota_shows_its_queue_wait_over_the_last_hour(kueue, pool: Pool, viewer_client) -> None:
    _quota(pool, "team-b", 16, None, None)
    _quota(pool, "team-c", 8, None, None)  # no queue mapped to team-c
    html = viewer_client.get("/capacity/").content.decode()
    assert "Queue wait p95 1 h" in html
    wait = _by_name(pool_queues([pool.pk])[pool.pk], "team-b-h100")["wait_1h"]
    row = re.search(rf'<tr data-team="team-b" data-pool="{pool.pk}">(.*?)</tr>', html, re.S)
    assert row
    cell = re.search(r'<td class="num" data-value="queue_wait" title="([^"]*)">([^<]*)</td>', row[1])
    assert cell and cell[2] == scheduler_read.duration(wait["p95"])
    assert cell[1].startswith("team-b-h100: p95 admission wait")
    other = re.search(rf'<tr data-team="team-c" data-pool="{pool.pk}">(.*?)</tr>', html, re.S)
    assert other and "no queue" in other[1]


def test_the_quota_table_has_no_wait_column_without_mapped_queues(pool: Pool, viewer_client) -> None:
    _quota(pool, "team-a", 8, None, None)
    html = viewer_client.get("/capacity/").content.decode()
    assert 'id="quota-table"' in html and "Queue wait p95 1 h" not in html


def test_a_team_with_several_queues_on_a_pool_shows_its_longest_wait() -> None:
    def queue(name: str, team: str | None, p95: float | None) -> dict:
        wait = None if p95 is None else {"p50": 1.0, "p95": p95, "admissions": 3.0}
        return {"name": name, "team": team, "wait_1h": wait, "wait_24h": wait, "pending": 2.0}

    figures = {
        7: {"queues": [queue("a-1", "team-a", None), queue("a-2", "team-a", 600.0), queue("a-3", "team-a", 60.0)]},
        8: {"queues": [queue("b-1", "team-b", None), queue("cluster", None, 30.0)]},
    }
    notes = scheduler_read.quota_notes(figures)
    assert set(notes) == {(7, "team-a"), (8, "team-b")}  # a queue with no team stands beside no quota
    assert notes[(7, "team-a")]["text"] == "10.0 min" and notes[(7, "team-a")]["title"].startswith("a-2:")
    assert notes[(8, "team-b")]["text"] == "–"
