"""The checkpoint advisor: Young/Daly from measured checkpoint cost and the cluster's failure rate,
with every assumption said in words."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleet.models import Job, JobAccount, JobEvent, Site
from fleet.training import advisor
from fleet.training.events import JobEventIn, record_job_events

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
_ids = iter(range(10**9))


def ago(hours: float) -> datetime:
    return NOW - timedelta(hours=hours)


def e(kind: str, ts: datetime, **fields: Any) -> JobEventIn:
    return JobEventIn(id=f"e{next(_ids)}", ts=ts, kind=kind, **fields)  # type: ignore[arg-type]


def make_job(site: Site, name: str, gang: int, *, cluster: str = "c1", interval: int | None = None) -> Job:
    return Job.objects.create(
        site=site,
        cluster=cluster,
        name=name,
        team="foundation",
        gang_size=gang,
        checkpoint_interval_s=interval,
        scheduler="slurm",
        scheduler_id=name,
    )


def run_with_saves(job: Job, durations: list[float], *, every_h: float = 1.0) -> None:
    """Allocated 10 h ago, then one save per `every_h` hours with these blocking times."""
    events = [e("allocated", ago(10))]
    for n, duration in enumerate(durations, start=1):
        saved_at = ago(10) + timedelta(hours=n * every_h)
        # The events door wants the step reached before its checkpoint.
        events.append(e("step", saved_at - timedelta(seconds=duration), step=n, step_time_s=1))
        events.append(e("checkpoint_saved", saved_at, step=n, duration_s=duration))
    record_job_events(job.pk, events, now=NOW)


def hold(job: Job, hours: int, *, end: datetime = NOW) -> None:
    """Accounted hours of the job, fully allocated, ending at `end`."""
    for h in range(1, hours + 1):
        JobAccount.objects.create(job=job, hour=end - timedelta(hours=h), allocated_s=job.gang_size * 3600.0)


def test_the_worked_example_gives_dalys_interval(site_a: Site, settings: Any) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 10_240  # per GPU, no failures observed
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [300, 360, 420])  # median: 6 minutes
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None

    delta = 360.0
    mtbf = 10_240 * 3600 / 1024  # 36,000 s: a 1,024-GPU job fails 1,024 times as often as one GPU
    young = math.sqrt(2 * delta * mtbf)  # sqrt(25,920,000) = 5,091.2 s
    daly = young * (1 + math.sqrt(delta / (2 * mtbf)) / 3 + delta / (18 * mtbf)) - delta  # about 4,854 s
    assert (advice.checkpoint_cost_s, advice.checkpoint_cost_source, advice.saves_observed) == (360, "job", 3)
    assert advice.job_mtbf_s == pytest.approx(36_000)
    assert advice.young_interval_s == pytest.approx(young)
    assert advice.daly_interval_s == pytest.approx(daly) and 4850 < daly < 4860
    assert advice.recommended_interval_s == advice.daly_interval_s

    # Waste at the planned 30 minutes: 360 / 1800 + 1800 / 72,000 = 0.2 + 0.025 = 0.225.
    assert advice.current_interval_source == "planned"
    assert advice.waste_current == pytest.approx(0.225)
    waste_daly = delta / daly + daly / (2 * mtbf)  # about 0.1416
    assert advice.waste_recommended == pytest.approx(waste_daly)
    # (0.225 - 0.1416) x 1,024 GPUs x 168 h: about 14,340 GPU-hours a week.
    assert advice.gpu_hours_saved_per_week == pytest.approx((0.225 - waste_daly) * 1024 * 168)
    assert 14_000 < advice.gpu_hours_saved_per_week < 14_700


def test_observed_failures_set_the_mtbf(site_a: Site) -> None:
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [360])
    other = make_job(site_a, "mixtral", 1024)
    record_job_events(
        other.pk,
        [
            e("allocated", ago(9)),
            e("step", ago(8.5), step=1, step_time_s=10),
            e("failed", ago(8), reason="XID 79"),  # counts (1)
            e("failed", ago(8) + timedelta(seconds=5), reason="XID 79"),  # the same attempt again: not counted
            e("started", ago(7)),
            e("step", ago(6.5), step=2, step_time_s=10),
            e("failed", ago(6), reason="NCCL timeout"),  # counts (2)
            e("started", ago(5.5)),
            e("failed", ago(5.4), reason="import error"),  # before the attempt's first step: not counted
            e("started", ago(5)),
            e("step", ago(4.8), step=3, step_time_s=10),
            e("failed", ago(4.5), reason="XID 48"),  # counts (3)
        ],
        now=NOW,
    )
    hold(other, 20)  # 20 h x 1,024 GPUs = 20,480 GPU-hours in the window
    # Neither counts: a failure 31 days ago, and one on another cluster.
    JobEvent.objects.create(job=other, event_id="old", seq=99, ts=NOW - timedelta(days=31), kind="failed")
    elsewhere = make_job(site_a, "elsewhere", 8, cluster="c2")
    JobEvent.objects.create(job=elsewhere, event_id="s", seq=0, ts=ago(2), kind="step", step=1)
    JobEvent.objects.create(job=elsewhere, event_id="f", seq=1, ts=ago(1), kind="failed")
    hold(other, 5, end=NOW - timedelta(days=31))  # hours outside the window do not count either

    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    # 3 failures over 20,480 GPU-hours: enough to stand alone, a per-GPU MTBF of 6,826.7 h.
    assert (advice.failures_observed, advice.cluster_gpu_hours) == (3, 20_480)
    assert advice.gpu_mtbf_h == pytest.approx(20_480 / 3) and not advice.mtbf_assumed
    assert advice.job_mtbf_s == pytest.approx(20_480 / 3 * 3600 / 1024)
    assert any(
        "3 failures (the first of each attempt" in note and "20,480 allocated" in note for note in advice.assumptions
    )
    # One more failure: 4 over 20,480 -> 5,120 h per GPU, a shorter MTBF and a shorter interval.
    record_job_events(other.pk, [e("started", ago(3)), e("step", ago(2.9), step=4), e("failed", ago(2.5))], now=NOW)
    shorter = advisor.advise_job(job, now=NOW)
    assert shorter is not None
    assert shorter.gpu_mtbf_h == pytest.approx(5_120)
    assert shorter.recommended_interval_s < advice.recommended_interval_s


def _failing(site: Site, name: str, gang: int, failures: int) -> Job:
    """A job with `failures` counted failures (each after a step of its own attempt) in the last day."""
    job = make_job(site, name, gang)
    events = [e("allocated", ago(20))]
    for n in range(failures):
        events += [e("started", ago(19 - n)), e("step", ago(18.9 - n), step=n + 1), e("failed", ago(18.5 - n))]
    record_job_events(job.pk, events, now=NOW)
    return job


def test_few_failures_are_blended_with_the_assumed_mtbf(site_a: Site, settings: Any) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 8_192
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [360])
    hold(_failing(site_a, "flaky", 1024, 2), 20)  # 2 failures over 20,480 GPU-hours
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    # Weight min(2 / 3, 20,480 / 1,000, 1) = 2/3. Rates: 2/3 x 2 / 20,480 + 1/3 x 1 / 8,192
    # = 1/15,360 + 1/24,576, so the MTBF is 1 / that = 9,452.3 h (observed alone: 10,240 h).
    blended = 1 / (2 / 3 * 2 / 20_480 + 1 / 3 / 8_192)
    assert advice.gpu_mtbf_h == pytest.approx(blended) and 9_452 < blended < 9_453
    assert advice.mtbf_assumed and advice.failures_observed == 2
    [note] = [n for n in advice.assumptions if "blended" in n]
    assert "only 2 failures" in note and "(67%)" in note and "8,192 GPU-hours" in note


def test_few_gpu_hours_are_blended_with_the_assumed_mtbf(site_a: Site, settings: Any) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 8_192
    job = make_job(site_a, "small", 100, interval=1800)
    run_with_saves(job, [60])
    hold(_failing(site_a, "flaky", 100, 4), 4)  # 4 failures over 4 h x 100 GPUs = 400 GPU-hours
    rate = advisor.cluster_failure_rate(site_a.pk, "c1", now=NOW)
    # Weight min(4 / 3, 400 / 1,000, 1) = 0.4: 0.4 x 4 / 400 + 0.6 / 8,192 per GPU-hour.
    assert (rate.failures, rate.gpu_hours, rate.observed_weight) == (4, 400, pytest.approx(0.4))
    assert rate.gpu_mtbf_h == pytest.approx(1 / (0.4 * 4 / 400 + 0.6 / 8_192))  # 242.6 h, not 100 h
    assert rate.assumed


def test_the_saving_is_never_negative_near_the_optimum(site_a: Site, settings: Any) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 10_240
    # The worked example's job (cost 360 s, job MTBF 36,000 s), planned at 5,000 s: between Daly's
    # 4,854 s and Young's 5,091 s, the model's minimum. Waste at 5,000 s: 360 / 5,000 + 5,000 / 72,000
    # = 0.072 + 0.06944 = 0.14144, below Daly's 0.14157.
    job = make_job(site_a, "llama-405b", 1024, interval=5000)
    run_with_saves(job, [360])
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    assert advice.waste_current == pytest.approx(0.072 + 5000 / 72_000)
    assert advice.waste_current < advice.waste_recommended
    assert advice.gpu_hours_saved_per_week == 0
    assert any("already near the optimum" in note for note in advice.assumptions)


def test_with_no_failures_it_assumes_metas_mtbf_and_says_so(site_a: Site) -> None:
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [360])
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    assert advice.mtbf_assumed and advice.failures_observed == 0
    assert advice.gpu_mtbf_h == pytest.approx(7.9 * 1024)
    assert advice.job_mtbf_s == pytest.approx(7.9 * 3600)  # Meta's 7.9 h at 1,024 GPUs
    [note] = [n for n in advice.assumptions if "assuming a per-GPU MTBF" in n]
    assert note.startswith("No failures observed on cluster c1 of ams-1")
    assert "GOODPUT_ASSUMED_GPU_MTBF_HOURS" in note


def test_without_saves_of_its_own_a_job_uses_the_clusters_checkpoint_cost(site_a: Site) -> None:
    job = make_job(site_a, "new", 64, interval=600)
    assert advisor.advise_job(job, now=NOW) is None  # nothing measured anywhere: no advice
    run_with_saves(make_job(site_a, "peer", 64), [120, 240])
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    assert (advice.checkpoint_cost_s, advice.checkpoint_cost_source) == (180, "cluster")  # median of 120, 240
    assert "no saves of its own" in advice.assumptions[0]


def test_without_a_planned_interval_the_current_one_is_the_median_gap_between_saves(site_a: Site) -> None:
    job = make_job(site_a, "unplanned", 256)
    events = [e("allocated", ago(10))]
    for n, hours in enumerate([1, 2, 3, 5], start=1):  # gaps of 1 h, 1 h, 2 h: median 1 h
        events.append(e("step", ago(10) + timedelta(hours=hours, seconds=-60), step=n, step_time_s=1))
        events.append(e("checkpoint_saved", ago(10) + timedelta(hours=hours), step=n, duration_s=60))
    record_job_events(job.pk, events, now=NOW)
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    assert (advice.current_interval_s, advice.current_interval_source) == (3600, "observed")
    mtbf = 7.9 * 1024 * 3600 / 256
    assert advice.waste_current == pytest.approx(60 / 3600 + 3600 / (2 * mtbf))


def test_the_formulas() -> None:
    assert advisor.young_interval_s(360, 36_000) == pytest.approx(math.sqrt(2 * 360 * 36_000))
    assert advisor.daly_interval_s(100, 40) == 40  # the checkpoint costs more than 2 MTBF: tau = M
    assert advisor.daly_interval_s(80, 40) == 40  # exactly 2M
    assert advisor.expected_waste_fraction(1800, 360, 36_000) == pytest.approx(0.225)
    # Daly's interval minimises the waste better than its neighbours.
    tau = advisor.daly_interval_s(360, 36_000)
    waste = advisor.expected_waste_fraction(tau, 360, 36_000)
    assert waste < advisor.expected_waste_fraction(tau * 0.8, 360, 36_000)
    assert waste < advisor.expected_waste_fraction(tau * 1.2, 360, 36_000)
    assert [advisor.gang_class(n) for n in (1, 8, 9, 64, 65, 512, 513, 4096, 4097)] == [
        "1-8 GPUs",
        "1-8 GPUs",
        "9-64 GPUs",
        "9-64 GPUs",
        "65-512 GPUs",
        "65-512 GPUs",
        "513-4096 GPUs",
        "513-4096 GPUs",
        ">4096 GPUs",
    ]


def test_a_cluster_gets_one_row_per_gang_size_class(site_a: Site, settings: Any) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 10_240
    small = make_job(site_a, "small", 8, interval=600)
    run_with_saves(small, [30, 30])
    big = make_job(site_a, "big", 1024, interval=1800)
    bigger = make_job(site_a, "bigger", 2048, interval=3600)
    run_with_saves(big, [300])
    run_with_saves(bigger, [420, 360])
    hold(big, 24)  # 24 x 1,024 = 24,576 GPU-hours in 30 days
    make_job(site_a, "never-ran", 100)  # not allocated: no row for 65-512

    rows = advisor.advise_cluster(site_a.pk, "c1", now=NOW)
    assert [(r.gang_class, r.jobs, r.gang_size) for r in rows] == [("1-8 GPUs", 1, 8), ("513-4096 GPUs", 2, 1536)]
    large = rows[1]
    assert large.checkpoint_cost_s == 360  # median of 300, 420, 360
    assert large.current_interval_s == 2700  # median of 1,800 and 3,600
    mtbf = 10_240 * 3600 / 1536
    daly = advisor.daly_interval_s(360, mtbf)
    assert large.recommended_interval_s == pytest.approx(daly)
    # The class held 24,576 GPU-hours in 30 days: 5,734.4 a week.
    expected = advisor.expected_waste_fraction(2700, 360, mtbf) - advisor.expected_waste_fraction(daly, 360, mtbf)
    assert large.gpu_hours_saved_per_week == pytest.approx(expected * 24_576 * 7 / 30)
    assert rows[0].checkpoint_cost_s == 30 and rows[0].gpu_hours_saved_per_week == 0  # held nothing accounted


def test_a_blended_mtbf_is_labelled_blended_with_the_observed_and_assumed_figures_beside_it(
    site_a: Site, settings: Any, viewer_client: Any
) -> None:
    """The page said "assumed per-GPU MTBF of 9,452 GPU-hours" where 9,452 is the blend; the
    assumed figure is 8,192. Each figure is labelled for what it is."""
    settings.ASSUMED_GPU_MTBF_HOURS = 8_192
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [360])
    hold(_failing(site_a, "flaky", 1024, 2), 20)  # 2 failures over 20,480 GPU-hours: weighted 2/3
    advice = viewer_client.get(f"/api/v1/training/jobs/{job.pk}/snapshot").json()["advice"]
    assert advice["gpu_mtbf_source"] == "blended"
    assert advice["observed_gpu_mtbf_h"] == pytest.approx(10_240) and advice["assumed_gpu_mtbf_h"] == 8_192
    text = advice["mtbf_explained"]
    assert text.startswith("blended per-GPU MTBF 9,452 GPU-hours")
    assert "observed 10,240 GPU-hours" in text and "weighted 67%" in text
    assert "assumed 8,192 GPU-hours weighted 33%" in text
    assert "assumed per-GPU MTBF of 9,452" not in text


def test_an_observed_or_assumed_mtbf_says_which(site_a: Site, settings: Any) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 8_192
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [360])
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None and advice.gpu_mtbf_source == "assumed"
    assert advice.mtbf_explained.startswith("assumed per-GPU MTBF 8,192 GPU-hours (0 failures")
    hold(_failing(site_a, "flaky", 1024, 3), 20)  # 3 failures over 20,480 GPU-hours: observed alone
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None and advice.gpu_mtbf_source == "observed"
    assert advice.mtbf_explained.startswith("observed per-GPU MTBF 6,827 GPU-hours = 20,480 GPU-hours / 3 failures")


def test_the_saving_says_it_is_for_dalys_interval_while_the_models_minimum_is_youngs(
    site_a: Site, settings: Any
) -> None:
    settings.ASSUMED_GPU_MTBF_HOURS = 10_240
    job = make_job(site_a, "llama-405b", 1024, interval=1800)
    run_with_saves(job, [300, 360, 420])
    advice = advisor.advise_job(job, now=NOW)
    assert advice is not None
    # Young's 5,091 s is the waste model's minimum; the saving is computed for Daly's 4,854 s.
    assert advice.saving_interval_s == advice.daly_interval_s == advice.recommended_interval_s
    assert advice.waste_young < advice.waste_recommended
    assert advice.waste_young == pytest.approx(advisor.expected_waste_fraction(advice.young_interval_s, 360, 36_000))
    text = advice.saving_explained
    assert text.startswith("Saving computed for Daly's interval 1.3 h (recommended), against the current 30.0 min.")
    assert "minimum is at Young's interval 1.4 h" in text
