"""A team's page (/capacity/teams/<id>/): its members, its quota on each pool, its reservations
requested or holding GPUs, and its scheduler queues' figures beside its quota, read from the same
functions as the capacity page's queue panel and quota table (fleet.scheduler.read), so the
wait beside a quota is one number on both pages; the live push and the plan API carry that
number for the pages' quota cells."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from fleet.models import Pool, SchedulerQueue, Site, Team
from fleet.scheduler import read as scheduler_read
from fleet.scheduler.read import pool_queues
from tests.fleet.capacity import make_pool, quota, reserve, team
from tests.fleet.scheduler.support import KUEUE, minute_ago, push
from tests.fleet.scheduler.test_pool_queues import earlier, scrape

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(site_a: Site) -> Pool:
    return make_pool(site_a)


@pytest.fixture
def queues(client, token_a, pool: Pool) -> None:  # type: ignore[no-untyped-def]
    """Kueue's fixture pushed twice, two minutes apart (well inside the hour the waits are read
    over), team-a-h100 mapped to team-a and team-b-h100 to team-b on the pool."""
    assert push(client, token_a, scrape(KUEUE, minute_ago(3), earlier)).status_code == 202
    assert push(client, token_a, scrape(KUEUE, minute_ago(1))).status_code == 202
    for name, owner in (("team-a-h100", "team-a"), ("team-b-h100", "team-b")):
        SchedulerQueue.objects.filter(scheduler="kueue", name=name).update(pool=pool, team=team(owner))


def _page(client: Client, owner: str) -> str:
    response = client.get(f"/capacity/teams/{Team.objects.get(name=owner).pk}/")
    assert response.status_code == 200
    return response.content.decode()


def _wait_cell(html: str, owner: str, pool: Pool) -> tuple[str, str]:
    """(title, text) of the queue wait cell in the team's quota row on the pool."""
    row = re.search(rf'<tr data-team="{owner}" data-pool="{pool.pk}">(.*?)</tr>', html, re.S)
    assert row, html
    cell = re.search(r'<td class="num" data-value="queue_wait" title="([^"]*)">([^<]*)</td>', row[1])
    assert cell, row[1]
    return cell[1], cell[2]


def test_a_teams_page_shows_its_members_quotas_and_live_reservations(pool: Pool, viewer_client: Client) -> None:
    alpha = team("alpha")
    alpha.members.add(User.objects.create_user("ada"), User.objects.create_user("bob"))
    quota(pool, "alpha", 16, borrowing=8, lending=4)
    quota(make_pool(pool.site, model="NVIDIA H200", name="h200"), "beta", 8)  # another team's
    now = timezone.now()
    active = reserve(pool, "alpha", 6, now - timedelta(hours=1), now + timedelta(days=1), state="active")
    requested = reserve(pool, "alpha", 2, now + timedelta(days=2), now + timedelta(days=3), state="requested")
    cancelled = reserve(pool, "alpha", 3, now + timedelta(days=2), now + timedelta(days=3), state="cancelled")
    over = reserve(pool, "alpha", 1, now - timedelta(days=3), now - timedelta(days=2), state="approved")
    html = _page(viewer_client, "alpha")
    assert '<span class="mono">ada</span>, <span class="mono">bob</span>' in html
    row = re.search(rf'<tr data-team="alpha" data-pool="{pool.pk}">(.*?)</tr>', html, re.S)
    assert row
    cells = dict(re.findall(r'data-value="(\w+)">([^<]*)', row[1]))
    assert cells == {"nominal": "16", "borrowing_limit": "8", "lending_limit": "4", "used": "6"}
    assert "h200" not in html  # beta's quota is not alpha's
    shown = {int(pk) for pk in re.findall(r'<tr data-reservation="(\d+)"', html)}
    assert shown == {active.pk, requested.pk} and not shown & {cancelled.pk, over.pk}
    assert "No scheduler queue is mapped to alpha" in html and "Queue wait p95 1 h" not in html


def test_a_team_that_does_not_exist_is_not_found(viewer_client: Client) -> None:
    assert viewer_client.get("/capacity/teams/999999/").status_code == 404


def test_the_team_pages_p95_wait_is_the_capacity_pages_quota_table_figure(queues, pool: Pool, viewer_client) -> None:
    quota(pool, "team-b", 16)
    quota(pool, "team-a", 8)
    wait = next(q for q in pool_queues([pool.pk])[pool.pk]["queues"] if q["name"] == "team-b-h100")["wait_1h"]
    assert wait and wait["p95"] is not None
    on_team_page = _wait_cell(_page(viewer_client, "team-b"), "team-b", pool)
    on_capacity_page = _wait_cell(viewer_client.get("/capacity/").content.decode(), "team-b", pool)
    assert on_team_page == on_capacity_page
    assert on_team_page[1] == scheduler_read.duration(wait["p95"])
    assert on_team_page[0].startswith("team-b-h100: p95 admission wait")


def test_the_team_page_shows_its_own_queues_with_the_panels_figures(queues, pool: Pool, viewer_client) -> None:
    quota(pool, "team-b", 16)
    html = _page(viewer_client, "team-b")
    figures = {q["name"]: q for q in pool_queues([pool.pk])[pool.pk]["queues"]}
    mine, theirs = figures["team-b-h100"], figures["team-a-h100"]
    row = re.search(rf'<tr data-queue="{mine["id"]}"[^>]*>(.*?)</tr>', html, re.S)
    assert row and "team-b-h100" in row[1]
    cells = dict(re.findall(r'data-value="(\w+)">([^<]*)', row[1]))
    w1, w24 = mine["wait_1h"] or {}, mine["wait_24h"] or {}
    assert cells == {
        "pending": f"{mine['pending']:.0f}",
        "inadmissible": f"{mine['inadmissible']:.0f}",
        "wait_1h": f"{scheduler_read.duration(w1.get('p50'))} / {scheduler_read.duration(w1.get('p95'))}",
        "wait_24h": f"{scheduler_read.duration(w24.get('p50'))} / {scheduler_read.duration(w24.get('p95'))}",
        "evicted": f"{mine['evicted']:.0f}",
        "preempted": f"{mine['preempted']:.0f}",
    }
    assert f'data-queue="{theirs["id"]}"' not in html  # team-a's queue is on its own page
    assert "data-scheduler-live" in html and "js/scheduler_queues.js" in html and 'id="live-status"' in html


def test_team_names_link_to_their_pages_from_the_capacity_and_people_pages(
    queues, pool: Pool, viewer_client, admin_client
) -> None:
    quota(pool, "team-b", 16)
    team_b = Team.objects.get(name="team-b")
    team_b.members.add(User.objects.create_user("carol"))
    link = f'<a href="/capacity/teams/{team_b.pk}/">team-b</a>'
    assert link in viewer_client.get("/capacity/").content.decode()
    people = admin_client.get("/accounts/people/").content.decode()
    row = re.search(r'<tr data-person="carol"[^>]*>(.*?)</tr>', people, re.S)
    assert row and link in row[1]


def test_the_live_push_and_the_plan_api_carry_the_wait_beside_each_quota(client, token_a, queues, pool, viewer_client):  # type: ignore[no-untyped-def]
    expected = scheduler_read.quota_waits(pool_queues([pool.pk]))
    assert {(w["pool"], w["team"]) for w in expected} == {(pool.pk, "team-a"), (pool.pk, "team-b")}
    notes = scheduler_read.quota_notes(pool_queues([pool.pk]))
    assert all(w["text"] == notes[(w["pool"], w["team"])]["text"] for w in expected)
    payload, watermark = scheduler_read.build_scheduler_delta("scheduler", None)
    assert payload is not None and payload["quota_waits"] == expected
    body = viewer_client.get("/api/v1/capacity/plan", {"months": "1"}).json()
    assert body["quota_waits"] == expected
    # A pool whose figures did not move pushes nothing, its quota cells included.
    assert scheduler_read.build_scheduler_delta("scheduler", watermark) == (None, watermark)
