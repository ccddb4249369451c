"""The People page in headless Chromium on a phone: an Admin adds a person with a generated
password (shown once), changes their role and deactivates them; the new person signs in with that
password and, once deactivated, no longer can."""

from __future__ import annotations

import pytest

from console import roles
from tests.browser.support import launch, sign_in
from tests.conftest import _make_user
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

PHONE = {"width": 390, "height": 844}


def test_an_admin_adds_a_person_on_a_phone_and_deactivates_them(stack: Stack) -> None:
    _make_user("ada", roles.ADMIN, is_staff=True)

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the pages are the witnesses.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, "ada", "/accounts/people/", "/api/")
            page.set_viewport_size(PHONE)
            page.fill("#person-form [name=username]", "nina")
            page.select_option("#person-form [name=role]", roles.OPERATOR)
            with page.expect_navigation():
                page.click("#person-form button[type=submit]")
            password = page.inner_text("#new-password").strip()
            assert len(password) >= 16
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            row = page.locator('tr[data-person="nina"]')
            assert row.locator('[data-field="role"]').inner_text() == roles.OPERATOR

            newcomer = browser.new_page()
            newcomer.goto(f"{stack.base_url}/accounts/login/")
            newcomer.fill("#id_username", "nina")
            newcomer.fill("#id_password", password)
            with newcomer.expect_navigation():
                newcomer.click("form button[type=submit]")
            assert newcomer.url == stack.base_url + "/"

            page.select_option('tr[data-person="nina"] select[name=role]', roles.VIEWER)
            with page.expect_navigation():
                page.click('tr[data-person="nina"] [data-action="role"]')
            assert page.locator('tr[data-person="nina"] [data-field="role"]').inner_text() == roles.VIEWER
            with page.expect_navigation():
                page.click('tr[data-person="nina"] [data-action="deactivate"]')
            assert page.locator('tr[data-person="nina"] [data-field="status"]').inner_text() == "inactive"
            assert "Deactivated nina" in page.inner_text(".messages")

            newcomer.goto(f"{stack.base_url}/")  # the session ended with the deactivation
            assert newcomer.url.startswith(stack.base_url + "/accounts/login/")
            assert not log.errors, log.errors
        finally:
            browser.close()
