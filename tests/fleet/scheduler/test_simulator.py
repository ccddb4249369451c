"""The demo's Kueue (fleet.scheduler.simulator): its scrapes pass the real Prometheus door with no
Kueue series ignored, what it admits stays within the quotas and the pools' GPUs, its counters
never fall, its wait histogram has Kueue's bounds, one team waits tens of minutes while its pool
has idle GPUs, and a seed gives the same run."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from console.models import AgentToken
from fleet.capacity.quotas import available
from fleet.capacity.simulator import seed_capacity
from fleet.management.backfill import queue_values
from fleet.models import SchedulerQueue, SchedulerSample, Site
from fleet.scheduler.mappings import SCHEDULER_SERIES
from fleet.scheduler.read import admission_wait, wait_histogram
from fleet.scheduler.simulator import (
    PODS_READY,
    PREEMPTED,
    RECLAMATION,
    STARVING,
    WAIT_BOUNDS,
    KueueSimulator,
    seed_queues,
)
from fleet.telemetry.simulator import DEFAULT_SITES, build_fleet
from tests.fleet.scheduler.support import KUEUE, samples, stored

SEED = 7
THIRTY_MINUTES = 1800.0  # the admission-starvation detector's default p95 threshold (issue 25)


class Sender:
    """Posts Prometheus text as fleet.telemetry.simulator.Poster does (the site's agent token),
    through Django's test client."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.client, self.tokens = Client(), tokens
        self.answers: list[tuple[int, Any]] = []

    def send_text(self, site: str, url: str, text: str) -> Any:
        response = self.client.post(
            url, text, content_type="text/plain; version=0.0.4", HTTP_AUTHORIZATION=f"Bearer {self.tokens[site]}"
        )
        self.answers.append((response.status_code, json.loads(response.content) if response.content else None))
        return response


def _sim(seed: int = SEED, **options: Any) -> KueueSimulator:
    return KueueSimulator(build_fleet(DEFAULT_SITES, gpu_limit=None, seed=seed), seed=seed, **options)


def _sites() -> Sender:
    tokens = {}
    for spec in DEFAULT_SITES:
        site = Site.objects.create(name=spec.name, region=spec.region, contracted_power_kw=spec.contracted_power_kw)
        tokens[spec.name] = AgentToken.issue(site=site, name="simulator")[1]
    return Sender(tokens)


def _fixed() -> datetime:
    return datetime(2026, 12, 1, 6, 0, tzinfo=UTC)


def _run(sim: KueueSimulator, hours: float, start: datetime | None = None):  # type: ignore[no-untyped-def]
    """Step the simulator scrape by scrape, yielding each step's time."""
    start = start or _fixed()
    for k in range(int(hours * 3600 / sim.interval.total_seconds()) + 1):
        at = start + k * sim.interval
        sim.advance(at)
        yield at


def _counters(sim: KueueSimulator) -> dict[tuple[str, str, str], float]:
    out = {}
    for site in sim.sites:
        for name, labels, value in sim.samples(site):
            if name.endswith(("_total", "_bucket", "_sum", "_count")):
                out[(site, name, json.dumps(labels, sort_keys=True))] = value
    return out


def test_it_prints_only_kueue_names_the_door_maps_with_the_fixtures_labels() -> None:
    sim = _sim()
    sim.advance(_fixed())
    documented: dict[str, set[str]] = {}
    for name, labels, _ in samples(KUEUE):
        documented.setdefault(name, set()).update(labels)
    for site in sim.sites:
        for name, labels, _ in sim.samples(site):
            assert name in SCHEDULER_SERIES, name
            assert set(labels) == documented[name], (name, labels)
            if "resource" in labels:
                assert labels["resource"] == "nvidia.com/gpu" and labels["cohort"]


@pytest.mark.django_db
def test_each_sites_scrape_through_the_door_is_stored_whole_with_nothing_ignored() -> None:
    sender = _sites()
    sim = _sim()
    assert sim.tick(timezone.now(), sender) == 3
    # The first tick pushes the scrape one interval before too (a counter's increase needs two).
    assert len(sender.answers) == 6 and {status for status, _ in sender.answers} == {202}
    assert all(body["ignored"] == 0 and body["ignored_metrics"] == {} for _, body in sender.answers), sender.answers
    expected = sum(len(sim.samples(site)) for site in sim.sites)
    assert sum(body["scheduler_samples"] for _, body in sender.answers[-3:]) == expected
    queues = set(SchedulerQueue.objects.values_list("site__name", "name", "cohort"))
    assert queues == {(q.site, q.name, q.cohort) for q in sim.queues} and len(queues) == 10
    # Within the interval nothing is pushed again.
    assert sim.tick(timezone.now(), sender) == 0 and len(sender.answers) == 6


@pytest.mark.django_db
def test_the_historys_mapping_of_a_scrape_is_the_doors() -> None:
    sender = _sites()
    sim = _sim(stamped=True)
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    sim.advance(at)
    for site in sim.sites:
        assert sender.send_text(site, "/api/v1/ingest/prometheus", sim.exposition(site, at)).status_code == 202
    mapped = {
        ("kueue", queue, quantity, series): value
        for site in ("iad-2",)
        for queue, quantity, series, value in queue_values(site, sim.samples(site))
    }
    iad = {key: value for key, value in stored().items() if key[1].endswith(("-h200", "-a100"))}
    assert iad == mapped and len(mapped) == 4 * 31


@pytest.mark.django_db
def test_the_seeded_queues_are_mapped_to_their_pools_and_teams_and_the_door_adds_none() -> None:
    sender = _sites()
    seed_capacity(DEFAULT_SITES, seed=SEED, now=timezone.now())
    sim = _sim()
    assert seed_queues(sim) == 10 and seed_queues(sim) == 0
    sim.tick(timezone.now(), sender)
    assert SchedulerQueue.objects.count() == 10
    for queue in SchedulerQueue.objects.select_related("pool", "team", "site"):
        team, pool = queue.name.rsplit("-", 1)
        assert (queue.team.name, queue.pool.name, queue.pool.site_id) == (team, pool, queue.site_id)
        assert queue.cohort == f"{pool}-pool"


def test_usage_stays_within_quota_and_borrowing_and_the_pools_gpus_at_every_step() -> None:
    sim = _sim()
    borrowed = 0
    for _ in _run(sim, 8):
        for cohort in sim.cohorts:
            used = sum(q.usage for q in cohort.queues)
            assert used <= cohort.gpus and used <= sum(q.quota.nominal for q in cohort.queues)
            for q in cohort.queues:
                assert 0 <= q.usage <= q.quota.nominal + (q.quota.borrowing_limit or math.inf), q.name
                borrowed = max(borrowed, q.usage - q.quota.nominal)
    assert borrowed >= 16  # the cohorts lend: someone borrowed well beyond its nominal quota


def test_counters_never_fall_and_evictions_and_preemptions_happen_now_and_then() -> None:
    sim = _sim()
    before = None
    for _ in _run(sim, 8):
        now = _counters(sim)
        if before is not None:
            assert now.keys() == before.keys()
            fallen = {k: (before[k], v) for k, v in now.items() if v < before[k]}
            assert not fallen, fallen
        before = now
    preempted = sum(q.evicted[PREEMPTED] for q in sim.queues)
    reclaimed = sum(q.preempted[RECLAMATION] for q in sim.queues)
    timed_out = sum(q.evicted[PODS_READY] for q in sim.queues)
    admitted = sum(q.admitted_total for q in sim.queues)
    # Each reclaim's victim evicted Preempted; a few in a working day, against hundreds admitted.
    assert preempted == reclaimed and 2 <= preempted <= 40, preempted
    assert timed_out >= 1 and admitted > 500


def test_the_wait_histogram_has_kueues_bounds_and_is_cumulative() -> None:
    sim = _sim()
    list(_run(sim, 2))
    fixture_bounds = [
        labels["le"]
        for name, labels, _ in samples(KUEUE)
        if name == "kueue_admission_wait_time_seconds_bucket" and labels["cluster_queue"] == "team-a-h100"
    ]
    assert [f"{b:g}" for b in WAIT_BOUNDS] + ["+Inf"] == fixture_bounds and len(WAIT_BOUNDS) == 16
    for site in sim.sites:
        values = sim.samples(site)
        for q in (q for q in sim.queues if q.site == site):
            buckets = [
                (labels["le"], v)
                for name, labels, v in values
                if name.endswith("_bucket") and labels["cluster_queue"] == q.name
            ]
            assert [le for le, _ in buckets] == fixture_bounds
            counts = [v for _, v in buckets]
            assert counts == sorted(counts) and counts[-1] == q.admitted_total, q.name
            (count,) = [v for n, la, v in values if n.endswith("_count") and la["cluster_queue"] == q.name]
            (total,) = [v for n, la, v in values if n.endswith("_sum") and la["cluster_queue"] == q.name]
            assert count == counts[-1] and total >= 0
    assert sum(q.admitted_total for q in sim.queues) > 100


def _waits(sim: KueueSimulator) -> dict[str, dict[str, float]]:
    """Each ClusterQueue's bucket increases over the run, by its series text, for the console's
    percentile reading (fleet.scheduler.read)."""
    out: dict[str, dict[str, float]] = {}
    for site in sim.sites:
        for queue, quantity, series, value in queue_values(site, sim.samples(site)):
            if quantity == "admission_wait_bucket":
                out.setdefault(f"{site}/{queue}", {})[series] = value
    return out


def test_the_starving_team_waits_tens_of_minutes_while_its_pool_has_idle_gpus() -> None:
    sim = _sim()
    site, pool, team = STARVING
    cohort = next(c for c in sim.cohorts if (c.site, c.pool) == (site, pool))
    starving = next(q for q in cohort.queues if q.team == team)
    sim.advance(_fixed())
    before = _waits(sim)
    waiting_with_idle = steps = 0
    for _ in _run(sim, 2, _fixed() + sim.interval):
        steps += 1
        idle = cohort.gpus - sum(q.usage for q in cohort.queues)
        if starving.pending and idle >= min(w.gpus for w in starving.pending):
            waiting_with_idle += 1
            # Held back by its own quota (nominal + borrowing limit), not by the pool's GPUs.
            head = min(starving.pending, key=lambda w: (w.created, w.id))
            assert head.gpus > available(team, cohort.quotas, cohort.used())
    assert waiting_with_idle > 0.9 * steps
    after = _waits(sim)
    for key, buckets in after.items():
        increases = [(series, v - before[key].get(series, 0.0)) for series, v in buckets.items()]
        wait = admission_wait(wait_histogram(increases))
        if key == f"{site}/{starving.name}":
            assert wait.p95 is not None and 1800 < wait.p95 < 4 * 3600 and wait.p50 > 600, wait
        elif wait.p95 is not None:
            assert wait.p95 < THIRTY_MINUTES, (key, wait)


def test_a_seed_gives_the_same_run_and_another_seed_another() -> None:
    def run(seed: int) -> list[str]:
        sim = _sim(seed)
        texts = []
        for at in _run(sim, 1):
            if at.minute % 10 == 0 and at.second == 0:
                texts.append("".join(sim.exposition(site, at) for site in sim.sites))
        return texts

    first = run(SEED)
    assert first == run(SEED) and len(first) == 7
    assert first != run(SEED + 1)


def test_strict_fifo_keeps_the_queue_behind_a_blocked_head_active() -> None:
    sim = _sim()
    list(_run(sim, 1))
    site = STARVING[0]
    starving = next(q for q in sim.queues if (q.site, q.pool, q.team) == STARVING)
    pending = {
        labels["status"]: v
        for name, labels, v in sim.samples(site)
        if name == "kueue_pending_workloads" and labels["cluster_queue"] == starving.name
    }
    # The head failed its admission attempt; the sweep's others wait behind it untried.
    assert pending == {"inadmissible": 1, "active": len(starving.pending) - 1} and pending["active"] >= 2


@pytest.mark.django_db(transaction=True)
def test_simulate_runs_kueue_through_the_http_api_within_a_small_fleets_gpus(live_server) -> None:  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("simulate", url=live_server.url, gpus=24, ticks=1, interval=0.2, jobs=0, stdout=out, stderr=out)
    assert "rejected" not in out.getvalue(), out.getvalue()
    # 24 GPUs: ams-1's H100 pool only, its three teams' ClusterQueues mapped to it.
    queues = SchedulerQueue.objects.filter(scheduler="kueue").select_related("pool", "team")
    assert sorted((q.name, q.pool.name, q.team.name) for q in queues) == [
        ("batch-eval-h100", "h100", "batch-eval"),
        ("llm-pretrain-h100", "h100", "llm-pretrain"),
        ("research-h100", "h100", "research"),
    ]
    usage = SchedulerSample.objects.filter(quantity="resource_usage")
    assert usage.exists() and sum(s.value for s in usage.filter(ts=usage.latest("ts").ts)) <= 24
