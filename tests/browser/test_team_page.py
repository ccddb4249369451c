"""A team's page in headless Chromium on a closed network, on a desk and on a phone (the checks of
test_every_page.py, for this page alone), and its queue figures kept live: a Kueue scrape with new
admissions redraws the wait beside the team's quota on its page and on the capacity page, and its
queue's pending workloads, over the `scheduler` topic, without a reload; the cells then read what
the server computes (fleet.scheduler.read.quota_notes)."""

from __future__ import annotations

import re

import pytest
import requests
from django.contrib.auth.models import User
from django.urls import reverse

from fleet.models import GpuState, Pool, Site, Team
from fleet.scheduler import read as scheduler_read
from fleet.scheduler.read import pool_queues
from tests.browser.support import launch, wait_for, wait_until
from tests.browser.test_every_page import (
    DESK,
    GPU_UUID,
    PHONE,
    _capacity_data,
    _post_samples,
    _same_origin_only,
    _scheduler_data,
    _sign_in,
    _visit,
)
from tests.fleet.scheduler.support import KUEUE as KUEUE_FIXTURE
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

WAIT_CELL = 'tr[data-team="qa"] [data-value="queue_wait"]'
PENDING_CELL = '#team-queues [data-value="pending"]'


def _later_scrape() -> str:
    """Kueue's fixture with 20 more of team-a-h100's workloads admitted after 320-640 s, and 42 of
    its workloads pending."""

    def more(match: re.Match[str]) -> str:
        line, value = match[1], float(match[2])
        le = re.search(r'[{,]le="([^"]+)"', line)
        bucket = "_bucket" in line and le is not None and (le[1] == "+Inf" or float(le[1]) >= 640)
        if bucket or line.startswith("kueue_admission_wait_time_seconds_count"):
            value += 20
        elif line.startswith("kueue_admission_wait_time_seconds_sum"):
            value += 20 * 500
        elif line.startswith("kueue_pending_workloads") and 'status="active"' in line:
            value = 42
        return f"{line} {value:g}"

    return re.sub(r'^(\S*cluster_queue="team-a-h100"\S*) (\S+)$', more, KUEUE_FIXTURE, flags=re.M)


def _push(stack: Stack, token: str, body: str) -> None:
    response = requests.post(
        stack.base_url + "/api/v1/ingest/prometheus",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4"},
        timeout=10,
    )
    assert response.status_code == 202, response.text


def test_the_team_page_is_finished_on_desk_and_phone_and_its_waits_follow_the_scheduler(
    stack: Stack, admin_user: User, site_a: Site, token_a: str
) -> None:
    _post_samples(stack, token_a)
    wait_for(lambda: GpuState.objects.filter(gpu__uuid=GPU_UUID).exists(), "the worker to store the samples")
    _capacity_data(site_a)
    _scheduler_data(stack, token_a)  # team-a-h100 mapped to qa on the pool: one scrape, no wait yet
    qa = Team.objects.get(name="qa")
    qa.members.add(admin_user)
    pool = Pool.objects.get(name="every-page")
    path = reverse("capacity:team", kwargs={"pk": qa.pk})
    later = _later_scrape()
    assert later != KUEUE_FIXTURE

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the pages are the witnesses.
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for viewport in (DESK, PHONE):
                blocked: list[str] = []
                context = browser.new_context(viewport=viewport)
                _same_origin_only(context, stack.base_url, blocked)
                _sign_in(context, stack.base_url, admin_user.username)
                found = _visit(context, stack.base_url, path, viewport, blocked)
                problems += [f"[{viewport['width']}] {p}" for p in found]
                context.close()

            context = browser.new_context(viewport=DESK)
            _sign_in(context, stack.base_url, admin_user.username)
            team_page, capacity_page = context.new_page(), context.new_page()
            team_page.goto(stack.base_url + path)
            capacity_page.goto(stack.base_url + reverse("capacity:plan"))
            wait_until(team_page, "document.getElementById('live-status').classList.contains('on')")
            capacity_cell = f'#quota-table tr[data-pool="{pool.pk}"][data-team="qa"] td[data-value="queue_wait"]'
            before = {"team": team_page.inner_text(WAIT_CELL), "capacity": capacity_page.inner_text(capacity_cell)}
            assert before["team"] == before["capacity"] == "–", before  # one scrape: no admission seen yet
            _push(stack, token_a, later)
            wait_until(team_page, f"document.querySelector('{PENDING_CELL}').textContent === '42'")
            wait_until(team_page, f"document.querySelector('{WAIT_CELL}').textContent !== '–'")
            wait_until(capacity_page, f"document.querySelector('{capacity_cell}').textContent !== '–'")
            after = {
                "team": team_page.inner_text(WAIT_CELL),
                "capacity": capacity_page.inner_text(capacity_cell),
                "title": team_page.get_attribute(WAIT_CELL, "title"),
            }
            context.close()
        finally:
            browser.close()

    assert not problems, "\n".join(problems)
    note = scheduler_read.quota_notes(pool_queues([pool.pk]))[(pool.pk, "qa")]
    assert after == {"team": note["text"], "capacity": note["text"], "title": note["title"]}, (after, note)
