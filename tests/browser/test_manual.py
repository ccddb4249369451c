"""The manual at /docs/ (issue 38, item 5), in headless Chromium on the real stack: the bar's
Manual link opens it, its page list leads to another page, and on a desk (1,440 px) and a phone
(390 px) no page scrolls sideways (wide tables and code scroll inside the text). Screenshots of
both go to test-artifacts/."""

from __future__ import annotations

import pytest

from console import roles
from fleet.models import Site
from tests.browser.support import ARTIFACTS, launch, sign_in
from tests.conftest import _make_user
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

DESK = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
# The widest pages: the scaling table, the performance table and RESULT lines, the exporters' list.
WIDE_PAGES = ("/docs/scaling/", "/docs/performance/", "/docs/fleet/")


def test_the_manual_opens_from_the_bar_and_fits_a_desk_and_a_phone(stack: Stack, site_a: Site) -> None:
    viewer = _make_user("mona", roles.VIEWER)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, viewer.username, "/", "/api/")
            with page.expect_navigation():
                page.click(".userbox a:has-text('Manual')")
            assert page.url == stack.base_url + "/docs/"
            with page.expect_navigation():
                page.click(".manual-pages a[href='/docs/scaling/']")
            assert page.get_attribute(".manual-pages a[aria-current=page]", "href") == "/docs/scaling/"
            ARTIFACTS.mkdir(exist_ok=True)
            for viewport in (DESK, PHONE):
                page.set_viewport_size(viewport)
                for path in WIDE_PAGES:
                    page.goto(stack.base_url + path, wait_until="load")
                    width = page.evaluate("document.documentElement.scrollWidth")
                    assert width <= viewport["width"], f"{path} is {width} px wide at {viewport['width']} px"
                page.screenshot(path=str(ARTIFACTS / f"manual-{viewport['width']}.png"))
            assert not log.errors, log.errors
            page.close()
        finally:
            browser.close()
