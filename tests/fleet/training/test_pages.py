"""The training pages and their read APIs: /training/, /training/jobs/<id>/, the overview and
job snapshot APIs (numbers against hand calculations), the live pushes, and the overview tile."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import Gpu, GpuRollup1m, Job, JobAccount, JobEvent, Node, Site
from fleet.telemetry import partitions
from fleet.training import goodput
from fleet.training import read as training_read
from fleet.training.accounts import refresh_job_accounts
from fleet.training.goodput import Account
from tests.fleet.training.conftest import post_events, register_job

pytestmark = pytest.mark.django_db

OVERVIEW = "/api/v1/training/overview"


def _hour(now: datetime, back: int) -> datetime:
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=back)


def _account(job: Job, hour: datetime, **gpu_s: float) -> JobAccount:
    """An hourly account row; allocated_s is the sum of the categories, as the refresh writes it."""
    return JobAccount.objects.create(job=job, hour=hour, allocated_s=sum(gpu_s.values()), **gpu_s)


@pytest.fixture
def accounts(site_a: Site) -> dict[str, Any]:
    """Two jobs' hourly accounts, written by hand (GPU-seconds):

    job A (8 GPUs, running): hour H (the current one): productive 21,600, data stall 3,600, hang 3,600
                             (28,800 allocated); hour H-30 (outside 24 h, inside 7 d): productive 28,800.
    job B (4 GPUs, failed):  hour H-2: productive 3,600, disruption 10,800 (14,400 allocated).

    Windows are whole hours ending with the current one: 1h = [H], 24h = [H-23, H], 7d = [H-167, H].
    """
    now = timezone.now()
    a = Job.objects.create(
        site=site_a, name="llama-70b", team="foundation", gang_size=8, scheduler_id="a", state="running"
    )
    b = Job.objects.create(site=site_a, name="mixtral", team="research", gang_size=4, scheduler_id="b", state="failed")
    _account(a, _hour(now, 0), productive_s=21_600, data_stall_s=3_600, hang_s=3_600)
    _account(a, _hour(now, 30), productive_s=28_800)
    _account(b, _hour(now, 2), productive_s=3_600, disruption_s=10_800)
    return {"a": a, "b": b, "now": now}


# --- the overview API -----------------------------------------------------------------------------


def test_the_overview_api_matches_a_hand_calculation(viewer_client: Client, accounts: dict[str, Any]) -> None:
    response = viewer_client.get(OVERVIEW, {"range": "24h"})
    assert response.status_code == 200, response.content
    body = response.json()
    g = body["goodput"]
    # Last hour: the current clock hour only, job A's hour H.
    assert g["1h"]["goodput"] == round(21_600 / 28_800, 4) == 0.75
    assert g["1h"]["lost_gpu_h"] == (3_600 + 3_600) / 3600 == 2.0
    # 24 h: A's H and B's H-2: (21,600 + 3,600) / (28,800 + 14,400).
    assert g["24h"]["goodput"] == round(25_200 / 43_200, 4) == 0.5833
    assert g["24h"]["allocated_gpu_h"] == 12.0
    assert g["24h"]["lost_gpu_h"] == (3_600 + 3_600 + 10_800) / 3600 == 5.0
    # 7 days: plus A's H-30: (25,200 + 28,800) / (43,200 + 28,800).
    assert g["7d"]["goodput"] == round(54_000 / 72_000, 4) == 0.75
    assert g["7d"]["allocated_gpu_h"] == 20.0

    by_category = {b["category"]: b for b in body["breakdown"]}
    assert by_category["productive"]["gpu_h"] == 7.0 and not by_category["productive"]["badput"]
    assert by_category["disruption"]["gpu_h"] == 3.0 and by_category["disruption"]["label"]
    assert by_category["data_stall"]["gpu_h"] == by_category["hang"]["gpu_h"] == 1.0
    assert by_category["disruption"]["share"] == round(10_800 / 43_200, 4)
    assert sum(b["gpu_h"] for b in body["breakdown"]) == 12.0

    now = accounts["now"]
    assert body["series"]["hours"] == [_hour(now, 2).isoformat(), _hour(now, 0).isoformat()]
    assert body["range_start"] == _hour(now, 23).isoformat() == g["24h"]["since"]
    assert g["1h"]["since"] == _hour(now, 0).isoformat() and g["7d"]["since"] == _hour(now, 167).isoformat()
    assert body["series"]["gpu_h"]["disruption"] == [3.0, 0.0]
    assert body["series"]["gpu_h"]["productive"] == [1.0, 6.0]

    # Top jobs by GPU-hours lost: B lost 3.0 (disruption), A 2.0 (a data stall and a hang of 1.0 each).
    top = body["top_jobs"]
    assert [(j["name"], j["lost_gpu_h"]) for j in top] == [("mixtral", 3.0), ("llama-70b", 2.0)]
    assert top[0]["top_cause"] == "disruption" and top[0]["goodput"] == 0.25
    assert top[0]["url"] == f"/training/jobs/{accounts['b'].pk}/"


def test_the_range_picks_the_window_of_the_breakdown_and_the_top_jobs(
    viewer_client: Client, accounts: dict[str, Any]
) -> None:
    hour = viewer_client.get(OVERVIEW, {"range": "1h"}).json()
    assert [j["name"] for j in hour["top_jobs"]] == ["llama-70b"]  # B's loss is two hours old
    assert hour["account"]["allocated_gpu_h"] == 8.0
    week = viewer_client.get(OVERVIEW, {"range": "7d"}).json()
    assert week["account"]["productive_gpu_h"] == (21_600 + 3_600 + 28_800) / 3600 == 15.0
    assert len(week["series"]["hours"]) == 3


@pytest.mark.parametrize("bad", ["2h", "", "7D", "24h;drop"])
def test_a_bad_range_is_a_400_naming_the_parameter(viewer_client: Client, bad: str) -> None:
    response = viewer_client.get(OVERVIEW, {"range": bad})
    assert response.status_code == 400
    assert "range" in response.json() and "1h" in response.json()["range"]


def test_running_jobs_carry_their_step_rate_over_the_last_five_minutes(
    viewer_client: Client, token_a: str, accounts: dict[str, Any]
) -> None:
    client = Client()
    job_id = register_job(client, token_a, gang_size=16).json()["id"]
    now = timezone.now()

    def at(seconds_ago: float) -> str:
        return (now - timedelta(seconds=seconds_ago)).isoformat()

    events = [
        {"id": "a", "ts": at(400), "kind": "allocated"},
        {"id": "s", "ts": at(390), "kind": "started"},
        # Outside the 5-minute window: not part of the rate.
        {"id": "st0", "ts": at(330), "kind": "step", "step": 40, "step_time_s": 2.0, "tokens": 9_999},
        {"id": "st1", "ts": at(130), "kind": "step", "step": 100, "step_time_s": 2.0, "tokens": 500},
        {"id": "st2", "ts": at(70), "kind": "step", "step": 160, "step_time_s": 2.0, "tokens": 600},
        {"id": "st3", "ts": at(10), "kind": "step", "step": 220, "step_time_s": 2.0, "tokens": 700},
    ]
    assert post_events(client, job_id, events, token_a).status_code == 200
    running = {j["id"]: j for j in viewer_client.get(OVERVIEW).json()["running"]}
    row = running[job_id]
    # 120 steps between the first and the last step event of the window, 120 s apart: 1 step/s.
    assert row["step_rate"] == 1.0
    # Tokens after the first event of the window: (600 + 700) / 120 s.
    assert row["tokens_per_s"] == round(1_300 / 120, 1) == 10.8
    assert row["steps_window"] == 3 and row["last_step"] == 220 and row["gang_size"] == 16
    assert 9 <= row["last_step_age_s"] <= 30
    # Job A holds GPUs but sent no step: listed, without a rate. Job B's failed attempt holds them too.
    assert running[accounts["a"].pk]["step_rate"] is None
    assert set(running) == {job_id, accounts["a"].pk, accounts["b"].pk}


def _jobs_with_accounts(site: Site, n: int, start: int) -> None:
    now = timezone.now()
    for i in range(start, start + n):
        job = Job.objects.create(
            site=site, name=f"job-{i}", team="t", gang_size=8, scheduler_id=f"q{i}", state="running"
        )
        _account(job, _hour(now, 1), productive_s=20_000, hang_s=8_800)
        _account(job, _hour(now, 3), productive_s=28_800)


def test_the_overview_api_costs_the_same_queries_for_2_jobs_and_for_40(
    viewer_client: Client, site_a: Site, django_assert_max_num_queries: Any
) -> None:
    _jobs_with_accounts(site_a, 2, 0)
    viewer_client.get(OVERVIEW)  # the session and permission caches warm up
    with CaptureQueriesContext(connection) as few:
        assert viewer_client.get(OVERVIEW).status_code == 200
    _jobs_with_accounts(site_a, 38, 2)
    with django_assert_max_num_queries(len(few.captured_queries)):
        body = viewer_client.get(OVERVIEW).json()
    assert len(body["running"]) == 40 and len(body["top_jobs"]) == 10
    assert body["goodput"]["24h"]["allocated_gpu_h"] == round(40 * 2 * 28_800 / 3600, 2)


# --- one job --------------------------------------------------------------------------------------


@pytest.fixture
def finished_job(token_a: str, site_a: Site) -> dict[str, Any]:
    """A 4-GPU job an hour ago (seconds from t0), every span written out:

      0-60     startup (allocated at 0, started at 60... its first step begins at 60)
      60-62    data stall (step 1: 10 s, the first 2 waiting for data)
      62-80    compute of steps 1 and 2, retained by the checkpoint of step 2
      80-90    checkpoint save (10 s, blocking)
      90-100   compute of step 3, lost to the failure at 100
      100-130  idle: failed, until the restart
      130-150  checkpoint restore (from step 2, 20 s)
      150-160  compute of step 4, retained by completion at 160

    Wall seconds: productive 8 + 10 + 10 = 28, startup 60, data stall 2, save 10, disruption 10,
    idle 30, restore 20: 160 allocated.
    """
    client = Client()
    node = Node.objects.create(site=site_a, hostname="gpu-a-301")
    gpus = [Gpu.objects.create(node=node, index=i, uuid=f"GPU-00000000-0000-4000-8000-00000000030{i}") for i in (0, 1)]
    job_id = register_job(client, token_a, gang_size=4, nodes=["gpu-a-301"], checkpoint_interval_s=1800).json()["id"]
    t0 = (timezone.now() - timedelta(hours=1)).replace(second=0, microsecond=0)

    def at(s: float) -> str:
        return (t0 + timedelta(seconds=s)).isoformat()

    events = [
        {"id": "e1", "ts": at(0), "kind": "allocated"},
        {"id": "e2", "ts": at(60), "kind": "started"},
        {"id": "e3", "ts": at(70), "kind": "step", "step": 1, "step_time_s": 10, "data_wait_s": 2, "tokens": 6000},
        {"id": "e4", "ts": at(80), "kind": "step", "step": 2, "step_time_s": 10, "tokens": 6000},
        {"id": "e5", "ts": at(90), "kind": "checkpoint_saved", "step": 2, "duration_s": 10, "bytes": 2_000_000_000},
        {"id": "e6", "ts": at(100), "kind": "step", "step": 3, "step_time_s": 10, "tokens": 6000},
        {"id": "e7", "ts": at(100), "kind": "failed", "reason": "NCCL watchdog timeout", "node": "gpu-a-301"},
        {"id": "e8", "ts": at(130), "kind": "started"},
        {"id": "e9", "ts": at(150), "kind": "restored", "step": 2, "duration_s": 20},
        {"id": "e10", "ts": at(160), "kind": "step", "step": 4, "step_time_s": 10, "tokens": 6000},
        {"id": "e11", "ts": at(160), "kind": "completed", "step": 4},
    ]
    response = post_events(client, job_id, events, token_a)
    assert response.status_code == 200, response.content
    # Each GPU's 1-minute rollups over the job's first three minutes.
    partitions.ensure_partitions(partitions.GPU_ROLLUP_1M, t0, t0 + timedelta(minutes=3))
    for minute, (util, power) in enumerate([(90.0, 600.0), (100.0, 700.0), (20.0, 150.0)]):
        for g, gpu in enumerate(gpus):
            GpuRollup1m.objects.create(
                gpu=gpu,
                bucket=t0 + timedelta(minutes=minute),
                samples=6,
                util_mean=util - 10 * g,
                power_mean=power,
            )
    return {"id": job_id, "t0": t0}


def test_the_job_snapshot_matches_a_hand_calculation(viewer_client: Client, finished_job: dict[str, Any]) -> None:
    response = viewer_client.get(f"/api/v1/training/jobs/{finished_job['id']}/snapshot")
    assert response.status_code == 200, response.content
    snap = response.json()
    acc = snap["account"]
    gang = 4
    assert acc["allocated_gpu_s"] == 160 * gang
    assert acc["gpu_s"] == {
        "productive": 28 * gang,
        "at_risk": 0,
        "startup": 60 * gang,
        "data_stall": 2 * gang,
        "checkpoint_save": 10 * gang,
        "checkpoint_restore": 20 * gang,
        "disruption": (10 + 30) * gang,  # step 3, and [100, 130] waiting to restart
        "hang": 0,
        "idle": 0,
    }
    assert acc["goodput"] == round(28 / 160, 4)
    assert acc["lost_gpu_h"] == round((160 - 28) * gang / 3600, 2)
    assert acc["steps"] == 4

    # The failure lost step 3's compute (10 s x 4 GPUs) and fell back to the checkpoint of step 2.
    [loss] = snap["losses"]
    assert (loss["kind"], loss["reason"], loss["lost_gpu_s"], loss["checkpoint_step"]) == (
        "failed",
        "NCCL watchdog timeout",
        40.0,
        2,
    )
    # What it cost: 10 s of progress, 30 s waiting to restart, no re-initialisation (the restore
    # began at the restart, 130 s), the 20 s restore: 60 s x 4 GPUs, as one figure with its parts.
    assert loss["cost_gpu_s"] == 60 * gang and loss["recovered"] is True
    assert (loss["waiting_gpu_h"], loss["reinit_gpu_h"], loss["restore_gpu_h"]) == (
        round(30 * gang / 3600, 2),
        0,
        round(20 * gang / 3600, 2),
    )
    assert snap["losses_total"]["cost_gpu_h"] == loss["cost_gpu_h"]

    # Every event but the steps, newest first.
    assert [e["kind"] for e in snap["timeline"]] == [
        "completed",
        "restored",
        "started",
        "failed",
        "checkpoint_saved",
        "started",
        "allocated",
    ]
    assert [m["step"] for m in snap["markers"]["checkpoints"]] == [2]
    assert [m["reason"] for m in snap["markers"]["failures"]] == ["NCCL watchdog timeout"]

    steps = snap["series"]["steps"]
    # Per minute (t0 is on a minute): steps 1-3 end in minute 1 (at 70, 80, 100 s), step 4 in
    # minute 2 (160 s); each completed one step (the first event counts one); 6,000 tokens each.
    t0 = finished_job["t0"]
    assert steps["ts"] == [(t0 + timedelta(minutes=1)).isoformat(), (t0 + timedelta(minutes=2)).isoformat()]
    assert steps["steps"] == [3, 1]
    assert steps["step_rate"] == [round(3 / 60, 3), round(1 / 60, 3)]
    assert steps["tokens_per_s"] == [18_000 / 60, 6_000 / 60]
    assert steps["data_wait_share"][0] == round((2 / 10 + 0 + 0) / 3, 3)

    gpus = snap["series"]["gpus"]
    assert gpus["ts"] == [(finished_job["t0"] + timedelta(minutes=m)).isoformat() for m in range(3)]
    assert gpus["util_mean"] == [85.0, 95.0, 15.0]  # (90 + 80) / 2, ...
    assert gpus["util_min"] == [80.0, 90.0, 10.0]
    assert gpus["power_kw"] == [1.2, 1.4, 0.3]  # two GPUs' mean power, summed
    assert snap["job"]["state"] == "completed" and snap["job"]["last_step"] == 4


def test_the_job_snapshot_carries_the_advisor_with_its_inputs(
    viewer_client: Client, finished_job: dict[str, Any]
) -> None:
    advice = viewer_client.get(f"/api/v1/training/jobs/{finished_job['id']}/snapshot").json()["advice"]
    assert advice["checkpoint_cost_s"] == 10.0 and advice["checkpoint_cost_source"] == "job"
    assert advice["current_interval_s"] == 1800.0 and advice["current_interval_source"] == "planned"
    # No accounted GPU-hours on the cluster: the assumed per-GPU MTBF, over the gang of 4.
    assert advice["mtbf_assumed"] is True
    job_mtbf_s = advice["gpu_mtbf_h"] * 3600 / 4
    assert advice["job_mtbf_s"] == pytest.approx(job_mtbf_s)
    assert advice["young_interval_s"] == pytest.approx(math.sqrt(2 * 10.0 * job_mtbf_s))
    assert advice["assumptions"] and all(isinstance(a, str) for a in advice["assumptions"])


def test_an_unknown_job_is_a_404(viewer_client: Client, db: None) -> None:
    assert viewer_client.get("/api/v1/training/jobs/999999/snapshot").status_code == 404
    assert viewer_client.get("/training/jobs/999999/").status_code == 404


# --- pages ----------------------------------------------------------------------------------------


def test_the_dashboard_without_jobs_says_how_to_send_events(viewer_client: Client, db: None) -> None:
    page = viewer_client.get("/training/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "No training jobs yet" in text and "/api/v1/training/jobs/" in text
    assert 'id="chart-stacked"' in text and "js/training.js" in text and "<script>" not in text
    body = viewer_client.get(OVERVIEW).json()
    assert body["goodput"]["24h"]["goodput"] is None and body["running"] == [] and body["top_jobs"] == []


def test_the_dashboard_with_jobs_renders_its_shell(viewer_client: Client, accounts: dict[str, Any]) -> None:
    text = viewer_client.get("/training/").content.decode()
    assert "No training jobs yet" not in text
    assert 'id="running-table"' in text and 'id="top-table"' in text and 'data-goodput="7d"' in text
    assert 'href="/training/"' in text and "Training</a>" in text  # in the navigation bar


def test_the_job_page_renders_for_a_viewer(viewer_client: Client, finished_job: dict[str, Any]) -> None:
    page = viewer_client.get(f"/training/jobs/{finished_job['id']}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "llama-70b-pretrain" in text and "4 GPUs" in text and "planned checkpoint interval 1800 s" in text
    assert f"/api/v1/training/jobs/{finished_job['id']}/snapshot" in text  # page config for training_job.js
    assert f"job.{finished_job['id']}" in text
    assert 'href="/fleet/nodes/gpu-a-301/"' in text


def test_the_pages_need_a_role(norole_client: Client, anon_client: Client, db: None) -> None:
    assert norole_client.get("/training/").status_code == 403
    assert norole_client.get(OVERVIEW).status_code == 403
    assert anon_client.get(OVERVIEW).status_code == 401


# --- live pushes and the overview tile ------------------------------------------------------------


def test_the_training_push_carries_goodput_and_running_jobs(accounts: dict[str, Any]) -> None:
    payload, watermark = training_read.build_training_delta("training", None)
    assert watermark is None  # the newest event of any job: none has sent one
    assert payload is not None and payload["type"] == "training.delta"
    assert payload["goodput"]["1h"]["goodput"] == 0.75
    assert {j["name"] for j in payload["running"]} == {"llama-70b", "mixtral"}


def test_the_job_push_sends_only_what_is_new_since_the_watermark(token_a: str, site_a: Site) -> None:
    client = Client()
    job_id = register_job(client, token_a).json()["id"]
    now = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=3)

    def at(s: float) -> str:
        return (now + timedelta(seconds=s)).isoformat()

    post_events(
        client,
        job_id,
        [
            {"id": "a", "ts": at(0), "kind": "allocated"},
            {"id": "s", "ts": at(1), "kind": "started"},
            {"id": "1", "ts": at(5), "kind": "step", "step": 1, "step_time_s": 2.0},
        ],
        token_a,
    )
    first, mark = training_read.build_job_delta(f"job.{job_id}", None)
    # No watermark: the newest non-step events again (the page drops the seqs it shows), complete
    # from the job's first event since fewer than RESYNC_EVENTS exist.
    assert first is not None and first["job"]["last_step"] == 1
    assert [(e["kind"], e["seq"]) for e in first["events"]] == [("allocated", 0), ("started", 1)]
    assert first["events_from_seq"] == 0 and first["watermark"] == 3
    assert mark["seq"] == 3
    post_events(
        client,
        job_id,
        [
            {"id": "2", "ts": at(65), "kind": "step", "step": 2, "step_time_s": 2.0, "tokens": 120},
            {"id": "c", "ts": at(70), "kind": "checkpoint_saved", "step": 2, "duration_s": 3.0},
        ],
        token_a,
    )
    second, mark2 = training_read.build_job_delta(f"job.{job_id}", mark)
    assert [e["kind"] for e in second["events"]] == ["checkpoint_saved"]
    assert second["events_from_seq"] == 3 and second["watermark"] == 5
    assert second["job"]["last_step"] == 2 and mark2["seq"] == 5
    # The step points from the previous push's minute on: the minute of step 1, then that of step 2.
    assert second["steps"]["ts"][-1] == (now + timedelta(seconds=60)).replace(second=0).isoformat()
    assert second["steps"]["steps"][-1] == 1 and second["steps"]["tokens_per_s"][-1] == 2.0
    third, _ = training_read.build_job_delta(f"job.{job_id}", mark2)
    assert third["events"] == []


def test_the_overview_tile_shows_goodput_and_the_biggest_cause(viewer_client: Client, accounts: dict[str, Any]) -> None:
    page = viewer_client.get("/").content.decode()
    assert "Training goodput →" in page
    assert "58.3<small>%" in page  # 25,200 / 43,200 over 24 h
    assert "Disruptions: progress lost, waiting to restart" in page and "3.0 GPU-h in 24 h" in page
    assert "5.0" in page  # GPU-hours lost over 24 h


def test_the_overview_tile_without_jobs(viewer_client: Client, db: None) -> None:
    page = viewer_client.get("/").content.decode()
    assert "No training jobs yet" in page


def test_minutes_without_steps_are_a_gap_in_the_step_series(job: Job) -> None:
    t0 = (timezone.now() - timedelta(hours=1)).replace(second=0, microsecond=0)
    for seq, (minute, step) in enumerate([(0, 1), (1, 2), (9, 3)]):  # a hang of 8 minutes
        JobEvent.objects.create(
            job=job,
            event_id=f"s{seq}",
            seq=seq,
            ts=t0 + timedelta(minutes=minute, seconds=30),
            kind="step",
            step=step,
            step_time_s=1.0,
        )
    series = training_read.step_series(job.pk, since=t0)
    # One None point a minute after the last one before the silence: Plotly breaks the line there.
    assert series["ts"] == [(t0 + timedelta(minutes=m)).isoformat() for m in (0, 1, 2, 9)]
    assert series["steps"] == [1, 1, None, 1]
    assert series["step_rate"][2] is None


# --- windows are whole clock hours ------------------------------------------------------------


def test_at_10_59_the_last_hour_is_exactly_one_bucket() -> None:
    """At 10:59:30: "1h" is the 10:00 bucket alone (not 09:00 too), "24h" the 24 buckets 11:00
    yesterday to 10:00 today, "7d" the 168 buckets from 11:00 seven days before."""
    now = datetime(2026, 11, 30, 10, 59, 30, tzinfo=UTC)
    ten = datetime(2026, 11, 30, 10, tzinfo=UTC)

    def acc(productive: float, disruption: float) -> Account:
        return Account.of({"productive": productive, "disruption": disruption})

    hourly = [
        (ten - timedelta(hours=24), acc(1_000, 0)),  # 10:00 yesterday: the 25th hour back, outside 24 h
        (ten - timedelta(hours=23), acc(2_000, 0)),  # 11:00 yesterday: the first of the 24
        (ten - timedelta(hours=1), acc(0, 3_600)),  # 09:00: outside "1h"
        (ten, acc(600, 600)),  # 10:00: the current hour, 59.5 minutes of it
    ]
    assert training_read.window_start("1h", now) == ten
    assert training_read.window_start("24h", now) == ten - timedelta(hours=23)
    assert training_read.window_start("7d", now) == ten - timedelta(hours=167)
    g = training_read.cluster_goodput(hourly, now=now)
    # 1h: 600 / (600 + 600) = 0.5; 1,200 GPU-s allocated; 600 GPU-s lost.
    assert g["1h"] == {
        "goodput": 0.5,
        "at_risk_share": 0.0,
        "lost_share": 0.5,
        "allocated_gpu_h": round(1_200 / 3600, 2),
        "productive_gpu_h": round(600 / 3600, 2),
        "at_risk_gpu_h": 0.0,
        "lost_gpu_h": round(600 / 3600, 2),
        "since": "2026-11-30T10:00:00+00:00",
    }
    # 24h: 11:00 yesterday + 09:00 + 10:00 = (2,000 + 600) / (2,000 + 3,600 + 1,200) = 2,600 / 6,800.
    assert g["24h"]["goodput"] == round(2_600 / 6_800, 4) == 0.3824
    assert g["24h"]["since"] == "2026-11-29T11:00:00+00:00"
    # 7d: all four: 3,600 / 7,800.
    assert g["7d"]["goodput"] == round(3_600 / 7_800, 4)


def test_the_overview_at_10_59_sums_one_hourly_bucket_for_1h(site_a: Site) -> None:
    now = datetime(2026, 11, 30, 10, 59, 30, tzinfo=UTC)
    job = Job.objects.create(site=site_a, name="j", team="t", gang_size=1, scheduler_id="w", state="completed")
    _account(job, datetime(2026, 11, 30, 9, tzinfo=UTC), productive_s=3_600)
    _account(job, datetime(2026, 11, 30, 10, tzinfo=UTC), productive_s=1_800, idle_s=1_770)
    snap = training_read.overview_snapshot(range_key="1h", now=now)
    assert snap["range_start"] == "2026-11-30T10:00:00+00:00"
    assert snap["series"]["hours"] == ["2026-11-30T10:00:00+00:00"]
    assert snap["account"]["allocated_gpu_h"] == round((1_800 + 1_770) / 3600, 2) == 0.99
    # The top jobs read the same single hour: 1,770 GPU-s idle lost.
    assert [(j["name"], j["lost_gpu_h"]) for j in snap["top_jobs"]] == [("j", round(1_770 / 3600, 2))]
    day = training_read.overview_snapshot(range_key="24h", now=now)
    assert day["account"]["allocated_gpu_h"] == round((3_600 + 3_570) / 3600, 2)


def test_the_dashboard_says_where_each_window_starts(viewer_client: Client, accounts: dict[str, Any]) -> None:
    page = viewer_client.get("/training/").content.decode()
    assert "Goodput, this hour" in page and 'data-since="1h"' in page and "the clock hour so far" in page
    tile = viewer_client.get("/").content.decode()
    start = _hour(accounts["now"], 23)
    assert f"since {start:%b} {start.day}, {start:%H}:00 UTC" in tile


# --- the live job push -----------------------------------------------------------------------


def _events(job: Job, kinds: list[str], *, first_seq: int, t0: datetime) -> None:
    JobEvent.objects.bulk_create(
        JobEvent(job=job, event_id=f"e{first_seq + i}", seq=first_seq + i, ts=t0 + timedelta(seconds=i), kind=k)
        for i, k in enumerate(kinds)
    )
    Job.objects.filter(pk=job.pk).update(events_seen=first_seq + len(kinds))


def test_a_push_after_the_watermark_expired_still_carries_a_restart(job: Job) -> None:
    """The cache forgot the topic's watermark (idle for an hour): the next push is built with none.
    It must still carry the restart and the restore stored meanwhile, and say from which seq its
    events are complete, so an open page can tell whether it missed any."""
    t0 = timezone.now() - timedelta(minutes=30)
    topic = f"job.{job.pk}"
    _events(job, ["allocated", "started", "step", "failed"], first_seq=0, t0=t0)
    _, mark = training_read.build_job_delta(topic, None)
    assert mark["seq"] == 4
    # An hour later, with the watermark gone: a restart and a restore arrive.
    _events(job, ["started", "restored", "step"], first_seq=4, t0=t0 + timedelta(minutes=10))
    payload, mark2 = training_read.build_job_delta(topic, None)
    assert payload is not None
    assert [(e["seq"], e["kind"]) for e in payload["events"]] == [
        (0, "allocated"),
        (1, "started"),
        (3, "failed"),
        (4, "started"),
        (5, "restored"),
    ]
    # All six non-step events fit: complete from seq 0, so no page is behind it.
    assert payload["events_from_seq"] == 0 and payload["watermark"] == mark2["seq"] == 7


def test_a_push_without_watermark_resends_only_the_newest_and_says_so(job: Job, monkeypatch: Any) -> None:
    monkeypatch.setattr(training_read, "RESYNC_EVENTS", 3)
    _events(job, ["allocated", "started", "failed", "started", "step", "failed", "started"], first_seq=0, t0=_t0())
    payload, _ = training_read.build_job_delta(f"job.{job.pk}", None)
    # The three newest non-step events by seq (5, 4 is a step, so 3, 5, 6), oldest first; complete from
    # seq 3 only: a page that knows less than seq 3 (knownSeq < 3) re-reads its snapshot.
    assert [e["seq"] for e in payload["events"]] == [3, 5, 6]
    assert payload["events_from_seq"] == 3


def _t0() -> datetime:
    return timezone.now() - timedelta(minutes=20)


def test_the_push_reads_events_after_the_watermark_by_seq(job: Job) -> None:
    _events(job, ["allocated", "started", "step", "checkpoint_saved"], first_seq=0, t0=_t0())
    with CaptureQueriesContext(connection) as queries:
        payload, _ = training_read.build_job_delta(f"job.{job.pk}", {"seq": 2, "minute": None})
    assert [e["seq"] for e in payload["events"]] == [3]
    [sql] = [" ".join(q["sql"].split()) for q in queries.captured_queries if "seq >" in q["sql"]]
    # The (job, seq) index: job_id equality, a seq range (seq >= 2 is seq > 1), ordered by seq.
    assert f"WHERE job_id = {job.pk} AND seq > 1 AND kind <> 'step' ORDER BY seq LIMIT 200" in sql


def test_a_push_with_more_events_than_its_limit_continues_where_it_stopped(job: Job, monkeypatch: Any) -> None:
    monkeypatch.setattr(training_read, "TIMELINE_LIMIT", 2)
    _events(job, ["allocated", "started", "step", "failed", "started"], first_seq=0, t0=_t0())
    topic = f"job.{job.pk}"
    first, mark = training_read.build_job_delta(topic, {"seq": 0, "minute": None})
    # Seqs 0 and 1 (the limit), then the watermark is 2, not events_seen (5): nothing is skipped.
    assert [e["seq"] for e in first["events"]] == [0, 1] and mark["seq"] == 2
    second, mark2 = training_read.build_job_delta(topic, mark)
    assert [e["seq"] for e in second["events"]] == [3, 4] and second["events_from_seq"] == 2
    assert mark2["seq"] == 5


# --- huge values and long jobs ---------------------------------------------------------------


def test_step_sums_past_the_bigint_range_are_not_a_500(viewer_client: Client, job: Job) -> None:
    """Two step events in one minute, each of 2**62 tokens, at steps -2**62 then 2**62: the tokens
    sum to 2**63 and the second event completed 2**63 steps, both past a bigint (2**63 - 1).
    Summed as bigint the query fails ("bigint out of range") and the page is a 500."""
    t0 = (timezone.now() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    JobEvent.objects.bulk_create(
        JobEvent(
            job=job,
            event_id=f"t{i}",
            seq=i,
            ts=t0 + timedelta(seconds=10 + 20 * i),
            kind="step",
            step=step,
            step_time_s=1.0,
            tokens=2**62,
        )
        for i, step in enumerate([-(2**62), 2**62])
    )
    Job.objects.filter(pk=job.pk).update(events_seen=2)
    series = training_read.step_series(job.pk, since=t0)
    assert series["tokens_per_s"] == [round(2 * 2**62 / 60, 1)]
    # The first event completes one step, the second 2**62 - (-2**62) = 2**63 (1 is lost in float8).
    assert series["steps"] == [int(float(1 + 2**63))] == [2**63]
    response = viewer_client.get(f"/api/v1/training/jobs/{job.pk}/snapshot")
    assert response.status_code == 200, response.content


def test_a_long_job_takes_its_account_from_the_hourly_rows(
    viewer_client: Client, finished_job: dict[str, Any], monkeypatch: Any
) -> None:
    """Over LONG_JOB_EVENTS (here 5; the job has 11) the account is the sum of its JobAccount rows,
    flagged as not exact: the same hand calculation as the exact snapshot, since the rows come
    from the same accounting."""
    refresh_job_accounts([finished_job["id"]])
    monkeypatch.setattr(training_read, "LONG_JOB_EVENTS", 5)
    snap = viewer_client.get(f"/api/v1/training/jobs/{finished_job['id']}/snapshot").json()
    acc = snap["account"]
    gang = 4
    assert acc["exact"] is False and acc["as_of"] is None  # refreshed, nothing waiting
    assert acc["allocated_gpu_s"] == 160 * gang
    assert acc["gpu_s"]["productive"] == 28 * gang and acc["gpu_s"]["disruption"] == (10 + 30) * gang
    assert acc["steps"] == 4
    # The losses stay exact, from the events.
    assert [loss["lost_gpu_s"] for loss in snap["losses"]] == [40.0]
    page = viewer_client.get(f"/training/jobs/{finished_job['id']}/").content.decode()
    assert 'data-stat="account_as_of"' in page and 'id="account-note"' in page


@pytest.mark.parametrize("long_job_events", [50_000, 5])
def test_the_job_snapshot_sweeps_the_events_once(
    viewer_client: Client, finished_job: dict[str, Any], monkeypatch: Any, long_job_events: int
) -> None:
    """Short (11 events <= 50,000): job_report's one sweep gives the account and the losses. Long
    (11 > 5): the account comes from the hourly rows, the losses from one sweep."""
    monkeypatch.setattr(training_read, "LONG_JOB_EVENTS", long_job_events)
    sweeps = []
    real = goodput.sweep

    def counting(*args: Any, **kwargs: Any) -> Any:
        sweeps.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(goodput, "sweep", counting)
    snap = viewer_client.get(f"/api/v1/training/jobs/{finished_job['id']}/snapshot").json()
    assert len(sweeps) == 1
    assert snap["account"]["exact"] is (long_job_events == 50_000)
    assert [loss["lost_gpu_s"] for loss in snap["losses"]] == [40.0]


# --- retained goodput and the share at risk ----------------------------------------------------


def test_a_running_job_that_has_not_checkpointed_reads_its_work_at_risk_not_a_bare_zero(
    viewer_client: Client, token_a: str
) -> None:
    """Work not yet checkpointed is neither retained nor lost: the headline shows retained goodput
    and the share at risk beside it, and the GPU-hours add up to the allocated ones."""
    response = register_job(viewer_client, token_a, gang_size=8, scheduler_id="default/at-risk")
    job_id = response.json()["id"]
    now = timezone.now().replace(microsecond=0)
    t0 = now - timedelta(minutes=20)
    events = [{"id": "a", "ts": t0.isoformat(), "kind": "allocated"}]
    events += [
        {
            "id": f"s{n}",
            "ts": (t0 + timedelta(seconds=10 * n)).isoformat(),
            "kind": "step",
            "step": n,
            "step_time_s": 10,
        }
        for n in range(1, 115)
    ]  # steps covering [0, 1140 s]: 19 minutes of compute, never checkpointed, then a 60 s tail
    assert post_events(viewer_client, job_id, events, token_a).status_code == 200
    acc = viewer_client.get(f"/api/v1/training/jobs/{job_id}/snapshot").json()["account"]
    assert acc["goodput"] == 0.0  # nothing retained yet...
    assert acc["at_risk_share"] == pytest.approx(1140 / 1200, abs=2e-3)  # ...and its work at risk, said beside it
    assert acc["goodput"] + acc["at_risk_share"] + acc["lost_share"] == pytest.approx(1.0, abs=3e-4)
    assert acc["productive_gpu_h"] + acc["at_risk_gpu_h"] + acc["lost_gpu_h"] == pytest.approx(
        acc["allocated_gpu_h"], abs=0.015
    )
    at_risk_row = next(b for b in acc["breakdown"] if b["category"] == "at_risk")
    assert at_risk_row["share"] == acc["at_risk_share"] and at_risk_row["gpu_h"] == acc["at_risk_gpu_h"]

    refresh_job_accounts([job_id], now=now)
    body = viewer_client.get(OVERVIEW, {"range": "24h"}).json()
    for key in ("1h", "24h", "7d"):
        g = body["goodput"][key]
        # The card: retained + at risk + lost = 1 (and in GPU-hours, = allocated): it reconciles.
        assert g["goodput"] + g["at_risk_share"] + g["lost_share"] == pytest.approx(1.0, abs=3e-4)
        assert g["productive_gpu_h"] + g["at_risk_gpu_h"] + g["lost_gpu_h"] == pytest.approx(
            g["allocated_gpu_h"], abs=0.015
        )
    assert body["goodput"]["24h"]["at_risk_share"] > 0.9
    shares = {b["category"]: b["share"] for b in body["breakdown"]}
    assert shares["productive"] == body["account"]["goodput"] and shares["at_risk"] == body["account"]["at_risk_share"]
    page = viewer_client.get("/training/").content.decode()
    assert 'data-at-risk-share="24h"' in page and "% retained" in page
    assert 'data-stat="at_risk_share"' in viewer_client.get(f"/training/jobs/{job_id}/").content.decode()
    tile = viewer_client.get("/").content.decode()
    assert "% at risk (not yet checkpointed)" in tile
