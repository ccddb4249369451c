"""Custom time ranges on the training pages (issue 21, item 21): the goodput overview over from /
to in whole hours, and a job's charts over from / to (per minute up to a day, per hour beyond)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Job, JobAccount, JobEvent, Site

pytestmark = pytest.mark.django_db

OVERVIEW = "/api/v1/training/overview"


def z(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hour(now: datetime, back: int) -> datetime:
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=back)


@pytest.fixture
def accounts(site_a: Site) -> dict[str, Any]:
    """Job A (8 GPUs): productive 28,800 GPU-s in hour H-30 and 21,600 (+ 7,200 lost) in the
    current hour H; job B (4 GPUs): productive 3,600 and disruption 10,800 in hour H-2."""
    now = timezone.now()
    a = Job.objects.create(site=site_a, name="llama", team="foundation", gang_size=8, scheduler_id="a")
    b = Job.objects.create(site=site_a, name="mixtral", team="research", gang_size=4, scheduler_id="b")
    for job, back, parts in (
        (a, 30, {"productive_s": 28_800}),
        (a, 0, {"productive_s": 21_600, "data_stall_s": 3_600, "hang_s": 3_600}),
        (b, 2, {"productive_s": 3_600, "disruption_s": 10_800}),
    ):
        JobAccount.objects.create(job=job, hour=_hour(now, back), allocated_s=sum(parts.values()), **parts)
    return {"a": a, "b": b, "now": now}


def test_the_overview_over_a_custom_window_counts_the_hours_it_touches(
    viewer_client: Client, accounts: dict[str, Any]
) -> None:
    now = accounts["now"]
    # 02:10 to 02:40 of hour H-30 reads that whole hour, as the accounts are kept.
    start = _hour(now, 30) + timedelta(minutes=10)
    response = viewer_client.get(OVERVIEW, {"from": z(start), "to": z(start + timedelta(minutes=30))})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["range"], body["from"], body["to"]) == ("custom", z(start), z(start + timedelta(minutes=30)))
    assert (body["range_start"], body["range_end"]) == (_hour(now, 30).isoformat(), _hour(now, 29).isoformat())
    assert body["account"]["goodput"] == 1.0 and body["account"]["allocated_gpu_h"] == 8.0
    assert body["series"]["hours"] == [_hour(now, 30).isoformat()]
    assert body["top_jobs"] == []  # nothing lost in that hour
    # The tiles stay the last hour, 24 hours and 7 days, whatever the window.
    assert body["goodput"]["24h"]["allocated_gpu_h"] == 12.0

    # Hours H-3 to H-1: job B's disruption, and neither of job A's hours.
    body = viewer_client.get(OVERVIEW, {"from": z(_hour(now, 3)), "to": z(_hour(now, 1))}).json()
    assert body["account"]["allocated_gpu_h"] == 4.0 and body["account"]["goodput"] == 0.25
    assert [j["name"] for j in body["top_jobs"]] == ["mixtral"]
    assert body["series"]["gpu_h"]["disruption"] == [3.0]


@pytest.fixture
def stepped_job(site_a: Site) -> dict[str, Any]:
    """A job that reported a step every 30 s for the two hours from T (three hours ago, on the
    hour), with checkpoints at T + 35 min and T + 90 min."""
    now = timezone.now()
    t = _hour(now, 3)
    job = Job.objects.create(
        site=site_a, name="llama", team="foundation", gang_size=8, scheduler_id="s", first_allocated_at=t
    )
    events = [
        JobEvent(
            job=job,
            event_id=f"s{i}",
            seq=i,
            ts=t + timedelta(seconds=30 * i),
            kind="step",
            step=i + 1,
            tokens=1000,
            step_time_s=30.0,
        )
        for i in range(240)
    ]
    for n, minutes in enumerate((35, 90)):
        events.append(
            JobEvent(
                job=job,
                event_id=f"c{n}",
                seq=1000 + n,
                ts=t + timedelta(minutes=minutes),
                kind="checkpoint_saved",
                step=70 * (n + 1),
                duration_s=5.0,
            )
        )
    JobEvent.objects.bulk_create(events)
    return {"job": job, "t": t}


def test_a_jobs_charts_over_a_custom_window_show_only_that_window(
    viewer_client: Client, stepped_job: dict[str, Any]
) -> None:
    t = stepped_job["t"]
    start, end = t + timedelta(minutes=30), t + timedelta(minutes=40)
    url = f"/api/v1/training/jobs/{stepped_job['job'].pk}/snapshot"
    response = viewer_client.get(url, {"from": z(start), "to": z(end)})
    assert response.status_code == 200, response.content
    series = response.json()["series"]
    assert (series["range"], series["since"], series["until"]) == ("custom", start.isoformat(), end.isoformat())
    steps = series["steps"]
    assert steps["ts"] == [(start + timedelta(minutes=m)).isoformat() for m in range(10)]
    assert set(steps["steps"]) == {2} and set(steps["step_rate"]) == {round(2 / 60, 3)}
    assert set(steps["tokens_per_s"]) == {round(2000 / 60, 1)}
    markers = response.json()["markers"]["checkpoints"]
    assert [m["step"] for m in markers] == [70], "the checkpoint in the window, not the one after it"

    # The job's default window is its last 24 hours: every step.
    default = viewer_client.get(url).json()["series"]
    assert "range" not in default and len(default["steps"]["ts"]) == 120


def test_a_jobs_charts_over_days_are_per_hour(viewer_client: Client, stepped_job: dict[str, Any]) -> None:
    t = stepped_job["t"]
    url = f"/api/v1/training/jobs/{stepped_job['job'].pk}/snapshot"
    body = viewer_client.get(url, {"from": z(t - timedelta(days=2)), "to": z(t + timedelta(hours=3))}).json()
    steps = body["series"]["steps"]
    assert body["series"]["bucket_seconds"] == 3600
    assert steps["ts"] == [t.isoformat(), (t + timedelta(hours=1)).isoformat()]
    assert steps["steps"] == [120, 120] and steps["step_rate"] == [round(120 / 3600, 3)] * 2
