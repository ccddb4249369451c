"""The materialised hourly accounts: stored events in, JobAccount rows out, equal to the pure
accounting; groups in one query; late events reclassify old hours; unchanged rows are not rewritten."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from fleet.models import Job, JobAccount, JobEvent, Site
from fleet.training import accounts as goodput_accounts
from fleet.training.events import JobEventIn, record_job_events
from fleet.training.goodput import CATEGORIES, account, job_spans

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 7, 30, tzinfo=UTC)
H7, H8, H9 = (datetime(2026, 11, 30, h, tzinfo=UTC) for h in (7, 8, 9))
_ids = iter(range(10**9))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def e(kind: str, t: float, **fields: Any) -> JobEventIn:
    return JobEventIn(id=f"e{next(_ids)}", ts=at(t), kind=kind, **fields)  # type: ignore[arg-type]


def store(job: Job, events: list[JobEventIn], now: float) -> None:
    record_job_events(job.pk, events, now=at(now))


def rows(job: Job) -> dict[datetime, dict[str, Any]]:
    fields = [f"{c}_s" for c in CATEGORIES]
    return {
        r["hour"]: {k: v for k, v in r.items() if k != "hour" and v}
        for r in JobAccount.objects.filter(job=job).values("hour", "allocated_s", *fields, "steps", "tokens")
    }


def first_hours(job: Job) -> list[JobEventIn]:
    # 07:30 allocated; step 1 covers [07:30, 08:10]; its save [08:10, 08:15]; step 2 covers
    # [08:15, 09:15] and is not saved yet.
    return [
        e("allocated", 0),
        e("started", 0),
        e("step", 2400, step=1, step_time_s=2400, tokens=1000),
        e("checkpoint_saved", 2700, step=1, duration_s=300),
        e("step", 6300, step=2, step_time_s=3600, tokens=2000),
    ]


def test_refresh_writes_hourly_rows_that_add_up_to_the_jobs_accounting(job: Job) -> None:
    store(job, first_hours(job), now=6600)
    assert goodput_accounts.refresh_job_accounts(now=at(6600)) == 1  # 09:20
    g = job.gang_size  # 16 GPUs
    assert rows(job) == {
        # [07:30, 08:00] productive (step 1, saved)
        H7: {"allocated_s": 1800 * g, "productive_s": 1800 * g},
        # [08:00, 08:10] productive, [08:10, 08:15] save, [08:15, 09:00] step 2, at risk; step 1 ends here
        H8: {
            "allocated_s": 3600 * g,
            "productive_s": 600 * g,
            "checkpoint_save_s": 300 * g,
            "at_risk_s": 2700 * g,
            "steps": 1,
            "tokens": 1000,
        },
        # [09:00, 09:15] at risk, [09:15, 09:20] a short gap: idle
        H9: {"allocated_s": 1200 * g, "at_risk_s": 900 * g, "idle_s": 300 * g, "steps": 1, "tokens": 2000},
    }
    expected = account(job_spans(JobEvent.objects.filter(job=job).order_by("ts", "seq"), now=at(6600)), gang_size=g)
    totals = goodput_accounts.accounts_between(H7, at(7200), group_by="job")[job.pk]
    assert totals.by_category() == expected.by_category()
    assert totals.allocated_s == expected.allocated_s == 6600 * g
    assert (totals.steps, totals.tokens) == (2, 3000)
    job.refresh_from_db()
    assert job.accounts_dirty_at is None


def test_a_late_failure_reclassifies_hours_already_accounted(job: Job) -> None:
    store(job, first_hours(job), now=6600)
    goodput_accounts.refresh_job_accounts(now=at(6600))
    store(job, [e("failed", 6600, reason="XID 79")], now=6600)
    goodput_accounts.refresh_job_accounts(now=at(6700))
    g = job.gang_size
    after = rows(job)
    # Step 2 was at risk in hours 8 and 9; the failure loses it. The failed attempt's GPUs are
    # still held: [09:20, 09:21:40] waits to restart, part of the disruption.
    assert after[H8]["disruption_s"] == 2700 * g and "at_risk_s" not in after[H8]
    assert after[H9] == {
        "allocated_s": 1300 * g,
        "disruption_s": (900 + 100) * g,
        "idle_s": 300 * g,
        "steps": 1,
        "tokens": 2000,
    }
    assert after[H7] == {"allocated_s": 1800 * g, "productive_s": 1800 * g}


def _xmins(job: Job) -> dict[datetime, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT hour, xmin::text FROM fleet_jobaccount WHERE job_id = %s", [job.pk])
        return {hour: int(xmin) for hour, xmin in cursor.fetchall()}


def test_rows_that_did_not_change_are_not_rewritten(job: Job) -> None:
    store(job, first_hours(job), now=6600)
    goodput_accounts.refresh_job_accounts(now=at(6600))
    before = _xmins(job)
    # Ten more minutes of an open allocation change hour 9 only.
    assert goodput_accounts.refresh_job_accounts([job.pk], now=at(7200)) == 1
    after = _xmins(job)
    assert after[H7] == before[H7] and after[H8] == before[H8]
    assert after[H9] != before[H9]
    assert rows(job)[H9]["idle_s"] == 900 * job.gang_size  # [09:15, 09:30]


def test_a_holding_job_without_events_is_recomputed_at_most_once_a_minute(job: Job) -> None:
    store(job, first_hours(job), now=6600)
    assert goodput_accounts.refresh_job_accounts(now=at(6600)) == 1  # dirty
    assert goodput_accounts.refresh_job_accounts(now=at(6630)) == 0  # clean, refreshed 30 s ago
    assert JobAccount.objects.get(job=job, hour=H9).allocated_s == 1200 * job.gang_size
    assert goodput_accounts.refresh_job_accounts(now=at(6661)) == 1  # a minute on: the hour grew
    assert JobAccount.objects.get(job=job, hour=H9).allocated_s == 1261 * job.gang_size
    # New events are picked up at once, whatever the minute says.
    store(job, [e("step", 6662, step=3, step_time_s=1)], now=6662)
    assert goodput_accounts.refresh_job_accounts(now=at(6665)) == 1


def test_events_stored_during_a_refresh_keep_the_job_dirty(job: Job) -> None:
    store(job, first_hours(job), now=6600)
    job.refresh_from_db()
    read = job.accounts_dirty_at
    store(job, [e("step", 6610, step=3, step_time_s=10)], now=6610)  # lands after the read
    goodput_accounts.refresh_job(job.pk, gang_size=job.gang_size, dirty_at=read, now=at(6610))
    job.refresh_from_db()
    assert job.accounts_dirty_at is not None and job.accounts_dirty_at != read


def test_accounts_are_summed_per_team_cluster_and_site(site_a: Site, site_b: Site) -> None:
    def run(site: Site, team: str, cluster: str, gang: int, name: str, completed_at: float) -> Job:
        job = Job.objects.create(
            site=site, cluster=cluster, name=name, team=team, gang_size=gang, scheduler="slurm", scheduler_id=name
        )
        # Allocated at 07:30, one step over the whole time, completed: all productive.
        store(
            job,
            [
                e("allocated", 0),
                e("step", completed_at, step=1, step_time_s=completed_at),
                e("completed", completed_at),
            ],
            now=completed_at,
        )
        return job

    a = run(site_a, "foundation", "c1", 8, "a", 600)  # 600 s x 8 = 4800
    b = run(site_a, "foundation", "c2", 4, "b", 900)  # 900 x 4 = 3600
    c = run(site_b, "speech", "c1", 2, "c", 1200)  # 1200 x 2 = 2400
    assert goodput_accounts.refresh_job_accounts(now=at(3600)) == 3
    window = (H7, H9)
    by_team = goodput_accounts.accounts_between(*window, group_by="team")
    assert {k: v.productive_s for k, v in by_team.items()} == {"foundation": 8400, "speech": 2400}
    assert by_team["foundation"].allocated_s == 8400 and by_team["foundation"].goodput == 1
    by_cluster = goodput_accounts.accounts_between(*window, group_by="cluster")
    assert {k: v.allocated_s for k, v in by_cluster.items()} == {
        (site_a.pk, "c1"): 4800,
        (site_a.pk, "c2"): 3600,
        (site_b.pk, "c1"): 2400,
    }
    by_site = goodput_accounts.accounts_between(*window, group_by="site")
    assert {k: v.allocated_s for k, v in by_site.items()} == {site_a.pk: 8400, site_b.pk: 2400}
    assert goodput_accounts.accounts_between(*window)[None].allocated_s == 10800
    assert goodput_accounts.accounts_between(*window, group_by="job")[c.pk].steps == 1
    # Windows select whole hours: nothing from 08:00 on.
    assert goodput_accounts.accounts_between(H8, H9) == {None: goodput_accounts.Account()}
    assert {a.pk, b.pk} <= set(goodput_accounts.accounts_between(*window, group_by="job"))
    series = goodput_accounts.accounts_by_hour(H7, H9, site_id=site_a.pk)
    assert list(series) == [H7] and series[H7].allocated_s == 8400
    with pytest.raises(ValueError, match="group_by"):
        goodput_accounts.accounts_between(*window, group_by="rack")


def _dirty_jobs(site: Site, names: list[str]) -> list[Job]:
    """Jobs allocated at 07:30 that completed at 07:40 (so they no longer hold GPUs): dirty once."""
    jobs = []
    for name in names:
        job = Job.objects.create(
            site=site, cluster="c1", name=name, team="t", gang_size=1, scheduler="slurm", scheduler_id=name
        )
        store(job, [e("allocated", 0), e("step", 600, step=1, step_time_s=600), e("completed", 600)], now=600)
        jobs.append(job)
    return jobs


def test_a_run_stops_at_its_budget_and_the_next_run_goes_on_with_the_oldest(site_a: Site) -> None:
    a, b, c = _dirty_jobs(site_a, ["a", "b", "c"])
    # A budget of 0: each run refreshes one job (at least one always is), never-refreshed first.
    assert goodput_accounts.refresh_job_accounts(now=at(700), budget_s=0) == 1
    assert set(JobAccount.objects.values_list("job_id", flat=True)) == {a.pk}
    assert goodput_accounts.refresh_job_accounts(now=at(701), budget_s=0) == 1
    assert set(JobAccount.objects.values_list("job_id", flat=True)) == {a.pk, b.pk}
    # New events make a dirty again, but c, never refreshed, is older: it goes first.
    store(a, [e("released", 650)], now=702)
    assert goodput_accounts.refresh_job_accounts(now=at(702), budget_s=0) == 1
    assert set(JobAccount.objects.values_list("job_id", flat=True)) == {a.pk, b.pk, c.pk}
    assert Job.objects.get(pk=a.pk).accounts_dirty_at is not None
    assert goodput_accounts.refresh_job_accounts(now=at(703), budget_s=0) == 1
    assert Job.objects.filter(accounts_dirty_at__isnull=False).count() == 0
    # Without a budget every due job is refreshed in one run.
    for job in (a, b, c):
        store(job, [e("released", 660)], now=704)
    assert goodput_accounts.refresh_job_accounts(now=at(704), budget_s=None) == 3


def test_a_job_that_fails_to_refresh_does_not_stop_the_others_and_is_backed_off(
    site_a: Site, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = _dirty_jobs(site_a, ["a", "b", "c"])
    real = goodput_accounts.refresh_job
    calls: list[int] = []

    def flaky(job_id: int, **kwargs: Any) -> bool:
        calls.append(job_id)
        if job_id == b.pk:
            raise ValueError("corrupt events")
        return real(job_id, **kwargs)

    monkeypatch.setattr(goodput_accounts, "refresh_job", flaky)
    assert goodput_accounts.refresh_job_accounts(now=at(700)) == 2
    assert set(JobAccount.objects.values_list("job_id", flat=True)) == {a.pk, c.pk}
    assert f"refreshing job {b.pk} failed" in caplog.text
    # Still dirty, but backed off: not tried again for a minute (the next runs, 15 s apart).
    calls.clear()
    assert goodput_accounts.refresh_job_accounts(now=at(715)) == 0
    assert goodput_accounts.refresh_job_accounts(now=at(745)) == 0
    assert b.pk not in calls
    assert Job.objects.get(pk=b.pk).accounts_dirty_at is not None
    # A minute on it is tried again; a second failure doubles the wait to 2 minutes.
    assert goodput_accounts.refresh_job_accounts(now=at(760)) == 0 and calls == [b.pk]
    calls.clear()
    assert goodput_accounts.refresh_job_accounts(now=at(870)) == 0 and calls == []  # 110 s < 120 s
    monkeypatch.setattr(goodput_accounts, "refresh_job", real)
    assert goodput_accounts.refresh_job_accounts(now=at(880)) == 1  # 120 s on, and it works now
    assert set(JobAccount.objects.values_list("job_id", flat=True)) == {a.pk, b.pk, c.pk}


def test_the_last_n_hours_are_n_hourly_rows(job: Job) -> None:
    # Allocated 07:30, still holding at 10:20: hours 7, 8, 9 and 10 have rows.
    store(job, [e("allocated", 0)], now=10_200)
    goodput_accounts.refresh_job_accounts(now=at(10_200))
    now = at(10_200)  # 10:20
    start, end = goodput_accounts.last_hours_window(now, 3)
    assert (start, end) == (H8, datetime(2026, 11, 30, 11, tzinfo=UTC))  # floor(10:20) - 2 h, 11:00
    assert list(goodput_accounts.accounts_by_hour(start, end, job_id=job.pk)) == [H8, H9, H9 + timedelta(hours=1)]
    # Hours that start in [start, end): with the unaligned start now - 3 h = 07:20, hour 7 (it starts
    # at 07:00, before 07:20) is left out: 3 hours, not 4.
    since = now - timedelta(hours=3)
    assert list(goodput_accounts.accounts_by_hour(since, now, job_id=job.pk)) == [H8, H9, H9 + timedelta(hours=1)]
    g = job.gang_size
    # 08:00-10:20 allocated: (3600 + 3600 + 1200) s x gang.
    assert goodput_accounts.accounts_between(since, now)[None].allocated_s == (3600 + 3600 + 1200) * g
