"""The job page's hangs and stalls in headless Chromium, on a desk window and on a phone: the
section shows its episodes, and nothing in it widens the page past the screen (its tables scroll
inside their cards)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.inventory.models import Node, NodeMount, Site
from tests.browser.support import ARTIFACTS, launch, sign_in
from tests.conftest import _make_user
from tests.fleet.correlation import test_job_episodes as seed
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

WIDTHS = {"desk": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


def test_the_hangs_and_stalls_fit_a_desk_window_and_a_phone(stack: Stack, site_a: Site) -> None:
    from playwright.sync_api import sync_playwright

    seed.set_now()
    job = seed.seed_flapped(site_a)
    # h-002's datasets disk saturates under the stall; its checkpoints are on NFS.
    node = Node.objects.get(hostname="h-002")
    datasets = NodeMount.objects.create(
        node=node, mountpoint="/mnt/datasets", fstype="xfs", device=f"/dev/{seed.DISK}", purpose="datasets"
    )
    checkpoints = NodeMount.objects.create(
        node=node, mountpoint="/mnt/checkpoints", fstype="nfs4", device="10.0.4.20:/ckpt", purpose="checkpoints"
    )
    seed._disk(site_a, "h-002", "io_time_seconds", 0.97, 30)
    seed._disk(site_a, "h-002", "read_bytes", 50e6, 30)
    seed._space(site_a, datasets, 6e11, 1e12, 30)
    seed._space(site_a, checkpoints, 5e10, 1e12, 30)
    _make_user("vera", "Viewer")
    path = f"/training/jobs/{job.pk}/"
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for name, viewport in WIDTHS.items():
                page, _ = sign_in(browser, stack, "vera", path, "/api/")
                page.set_viewport_size(viewport)
                page.wait_for_timeout(300)
                section = page.locator("#job-episodes")
                section.scroll_into_view_if_needed()
                assert section.locator("section.episode").count() == 2
                assert section.locator('[data-port="h-001 mlx5_0/1"]').is_visible()
                ARTIFACTS.mkdir(exist_ok=True)
                section.screenshot(path=str(ARTIFACTS / f"job-episodes-{name}.png"))
                page.screenshot(path=str(ARTIFACTS / f"job-page-{name}.png"), full_page=True)
                widths: Any = page.evaluate(
                    "() => [document.documentElement.scrollWidth, window.innerWidth,"
                    " document.querySelector('#job-episodes').getBoundingClientRect().right]"
                )
                scroll_width, inner_width, right = widths
                assert scroll_width <= inner_width, f"{name}: the page is {scroll_width} px wide in {inner_width}"
                assert right <= inner_width, f"{name}: the section ends at {right} px of {inner_width}"
                page.close()
        finally:
            browser.close()
