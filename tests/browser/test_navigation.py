"""The navigation bar (issue 38, item 6c), in headless Chromium on the real stack, for an Admin and
a Viewer: on a desk (1,440 px) the bar holds one row, its groups open on a click and every page of
the bar is reached in two clicks (group, then link) from every other; on a phone (390 px) it folds
behind a Menu button whose menu reaches every page in two clicks (menu, then link). The current
page is marked (aria-current) and its group with it; the keyboard alone opens a group and follows
a link. Screenshots of both go to test-artifacts/."""

from __future__ import annotations

from typing import Any

import pytest

from console import roles
from fleet.models import Site
from tests.browser.support import ARTIFACTS, launch, sign_in
from tests.conftest import _make_user
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

DESK = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
# The bar's pages, as its links name them (console.context_processors.NAV_GROUPS).
BAR = """() => [...document.querySelectorAll('.nav a')].map(a => ({
    href: a.getAttribute('href'),
    group: a.closest('.nav-group')?.querySelector('.nav-group-button').getAttribute('aria-controls') ?? null,
}))"""
ROW = """() => {
    const rect = e => e.getBoundingClientRect();
    const items = [...document.querySelectorAll('.nav-groups > li'), document.querySelector('.userbox')];
    return {tops: items.map(e => Math.round(rect(e).top)), bottoms: items.map(e => Math.round(rect(e).bottom)),
            bar: Math.round(rect(document.querySelector('.topbar')).height),
            right: Math.max(...items.map(e => rect(e).right)), width: document.documentElement.scrollWidth};
}"""
VISIBLE = "e => !!(e.offsetWidth || e.offsetHeight) && getComputedStyle(e).visibility !== 'hidden'"


def _bar(page: Any) -> list[dict[str, Any]]:
    return page.evaluate(BAR)  # type: ignore[no-any-return]


def _current(page: Any) -> list[str]:
    return page.evaluate(  # type: ignore[no-any-return]
        "[...document.querySelectorAll('.nav [aria-current=page]')].map(a => a.getAttribute('href'))"
    )


def _visible(page: Any, href: str) -> bool:
    return page.eval_on_selector(f".nav a[href='{href}']", VISIBLE)  # type: ignore[no-any-return]


def _go_desk(page: Any, base_url: str, link: dict[str, Any]) -> None:
    """Two clicks: the link's group (if it has one: the overview is one click), then the link."""
    if link["group"]:
        page.click(f".nav-group-button[aria-controls='{link['group']}']")
        assert _visible(page, link["href"]), f"{link['href']} is not shown once its group is open"
    with page.expect_navigation():
        page.click(f".nav a[href='{link['href']}']")
    assert page.url == base_url + link["href"], page.url


def _go_phone(page: Any, base_url: str, link: dict[str, Any]) -> None:
    """Two clicks: the Menu button, then the link."""
    assert not _visible(page, link["href"]), "the phone's bar shows its links before the menu opens"
    page.click(".menu-toggle")
    assert page.get_attribute(".menu-toggle", "aria-expanded") == "true"
    assert _visible(page, link["href"]), f"{link['href']} is not in the opened menu"
    with page.expect_navigation():
        page.click(f".nav a[href='{link['href']}']")
    assert page.url == base_url + link["href"], page.url


def _check_marked(page: Any, href: str) -> None:
    assert _current(page) == [href], f"on {href} the bar marks {_current(page)}"
    group_active = page.evaluate(
        f"""(() => {{ const g = document.querySelector(".nav a[href='{href}']").closest('.nav-group');
                     return g === null || g.classList.contains('active'); }})()"""
    )
    assert group_active, f"{href}'s group is not marked"


def _walk(page: Any, base_url: str, viewport: dict[str, int], go: Any) -> list[str]:
    """From every page of the bar, to the next one (the last back to the first): every page is
    left and reached once, each in two clicks; returns the pages seen."""
    page.set_viewport_size(viewport)
    page.goto(base_url + "/", wait_until="load")
    links = _bar(page)
    order = [link["href"] for link in links]
    assert len(order) == len(set(order)), f"a page twice in the bar: {order}"
    page.goto(base_url + order[0], wait_until="load")
    for step in range(len(links)):
        target = links[(step + 1) % len(links)]
        here = order[step % len(order)]
        assert _bar(page) == links, f"the bar on {here} differs from the overview's"
        go(page, base_url, target)
        _check_marked(page, target["href"])
    return order


def _fits_one_row(page: Any, base_url: str) -> None:
    page.set_viewport_size(DESK)
    page.goto(base_url + "/", wait_until="load")
    row = page.evaluate(ROW)
    assert max(row["tops"]) < min(row["bottoms"]), f"the bar's items are not on one row: {row}"
    assert row["bar"] <= 60 and row["right"] <= DESK["width"] and row["width"] <= DESK["width"], row


def _folds_on_a_phone(page: Any, base_url: str) -> None:
    page.set_viewport_size(PHONE)
    page.goto(base_url + "/", wait_until="load")
    closed = page.evaluate(ROW)
    assert closed["bar"] <= 64 and closed["width"] <= PHONE["width"], closed
    assert page.is_visible(".menu-toggle") and not page.is_visible(".topbar-menu")
    page.click(".menu-toggle")
    assert page.is_visible(".topbar-menu") and page.is_visible(".userbox")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.keyboard.press("Escape")
    assert not page.is_visible(".topbar-menu") and page.get_attribute(".menu-toggle", "aria-expanded") == "false"


def _keyboard_alone(page: Any, base_url: str) -> None:
    """Tab to the Fleet group, open it with Enter, walk down to its second link, follow it; Escape
    closes a group and gives the focus back to its button."""
    page.set_viewport_size(DESK)
    page.goto(base_url + "/", wait_until="load")
    page.focus(".brand")
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == "Fleet":
            break
    assert page.evaluate("document.activeElement.classList.contains('nav-group-button')")
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.getAttribute('aria-expanded')") == "true"
    page.keyboard.press("Escape")
    assert page.evaluate("document.activeElement.getAttribute('aria-expanded')") == "false"
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    target = page.evaluate("document.activeElement.getAttribute('href')")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url == base_url + target == base_url + "/fleet/targets/"


def _screenshots(page: Any, base_url: str, who: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size(DESK)
    page.goto(base_url + "/incidents/metrics/", wait_until="load")
    page.click(".nav-group.active .nav-group-button")
    page.wait_for_timeout(300)  # the chevron's turn
    page.screenshot(path=str(ARTIFACTS / f"nav-{who}-1440.png"), clip={"x": 0, "y": 0, "width": 1440, "height": 320})
    page.set_viewport_size(PHONE)
    page.goto(base_url + "/incidents/metrics/", wait_until="load")
    page.screenshot(path=str(ARTIFACTS / f"nav-{who}-390-closed.png"))
    page.click(".menu-toggle")
    page.screenshot(path=str(ARTIFACTS / f"nav-{who}-390-open.png"))


def test_every_page_of_the_bar_is_two_clicks_from_every_other_on_a_desk_and_a_phone(stack: Stack, site_a: Site) -> None:
    users = {"admin": _make_user("ada", roles.ADMIN, is_staff=True), "viewer": _make_user("vera", roles.VIEWER)}
    seen: dict[str, list[str]] = {}

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the pages are the witnesses.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for who, user in users.items():
                page, log = sign_in(browser, stack, user.username, "/", "/api/")
                _fits_one_row(page, stack.base_url)
                _folds_on_a_phone(page, stack.base_url)
                seen[who] = _walk(page, stack.base_url, DESK, _go_desk)
                assert _walk(page, stack.base_url, PHONE, _go_phone) == seen[who]
                _keyboard_alone(page, stack.base_url)
                _screenshots(page, stack.base_url, who)
                assert not log.errors, log.errors
                page.close()
        finally:
            browser.close()

    # Roles still decide which pages the bar offers.
    governance = {"/compliance/", "/recovery/", "/accounts/people/"}
    assert governance <= set(seen["admin"]) and not governance & set(seen["viewer"])
    assert set(seen["viewer"]) == set(seen["admin"]) - governance
    assert {"/", "/fleet/", "/scheduler/queues/", "/incidents/metrics/", "/power/"} <= set(seen["viewer"])
