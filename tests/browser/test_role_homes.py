"""Each role, in headless Chromium, opens its home and follows every link of the top bar and of
the overview's sections, and a compliance role every section link of the compliance home: each
lands on a page that loads, titled as it should be (no markup in the tab's title). A role that may
not open a page is not offered its link; the one it is sent to anyway (a Viewer typing the
compliance address) is the console's own 403 page naming the role it needs."""

from __future__ import annotations

from typing import Any

import pytest

from console import roles
from fleet.models import Site
from tests.browser.support import launch, sign_in
from tests.conftest import _make_user
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

COMPLIANCE_SECTIONS = {
    "/compliance/models/",
    "/compliance/datasets/",
    "/compliance/processing/",
    "/compliance/retention/",
    "/compliance/audit/",
    "/compliance/packs/",
}
# The links a role follows: the top bar's sections and its user box, the overview's section heads.
LINKS = (
    "[...document.querySelectorAll('.topbar a, .section-head a, .compliance-area')].map(a => a.getAttribute('href'))"
)


def _links(page: Any) -> list[str]:
    return sorted({h for h in page.evaluate(LINKS) if h and h.startswith("/")})


def _follow(page: Any, base_url: str, path: str) -> list[str]:
    """Open ``path``; what is wrong with it."""
    response = page.goto(base_url + path, wait_until="load")
    problems = [] if response is not None and response.ok else [f"{path}: HTTP {response and response.status}"]
    title = page.title()
    ours = not path.startswith(("/admin/", "/api/"))  # Django's admin and the API docs title their own
    if "<" in title or not title.strip() or (ours and not title.endswith(" · Goodput")):
        problems.append(f"{path}: the tab's title is {title!r}")
    return problems


def test_each_role_follows_every_link_of_its_home(stack: Stack, site_a: Site) -> None:
    users = {
        roles.VIEWER: _make_user("vera", roles.VIEWER),
        roles.OPERATOR: _make_user("oscar", roles.OPERATOR),
        roles.COMPLIANCE_OFFICER: _make_user("cora", roles.COMPLIANCE_OFFICER),
        roles.ADMIN: _make_user("ada", roles.ADMIN, is_staff=True),
    }
    problems: list[str] = []
    followed: dict[str, set[str]] = {}
    forbidden: dict[str, str] = {}

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the pages are the witnesses.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for role, user in users.items():
                page, log = sign_in(browser, stack, user.username, "/", "/api/")
                home_links = _links(page)
                assert "/fleet/" in home_links and "/power/" in home_links, f"{role}'s home: {home_links}"
                seen = set(home_links)
                if "/compliance/" in home_links:
                    problems += _follow(page, stack.base_url, "/compliance/")
                    areas = page.evaluate(
                        "[...document.querySelectorAll('.compliance-area')].map(a => a.getAttribute('href'))"
                    )
                    assert set(areas) == COMPLIANCE_SECTIONS, f"{role}: the compliance home links {areas}"
                    seen |= set(areas)
                else:
                    page.goto(stack.base_url + "/compliance/")
                    forbidden[role] = page.inner_text("#forbidden")
                    log.errors = [e for e in log.errors if "/compliance/" not in e]  # the 403, expected
                for path in sorted(seen):
                    problems += [f"[{role}] {p}" for p in _follow(page, stack.base_url, path)]
                followed[role] = seen
                problems += [f"[{role}] {e}" for e in log.errors]
                page.context.close()
        finally:
            browser.close()

    assert not problems, "\n".join(problems)
    for role in (roles.COMPLIANCE_OFFICER, roles.ADMIN):
        assert followed[role] > COMPLIANCE_SECTIONS
    assert set(forbidden) == {roles.VIEWER, roles.OPERATOR}
    for role, text in forbidden.items():
        assert "Compliance officer or Admin role" in text and f"with the role {role}" in text
    assert "/admin/" in followed[roles.ADMIN] and "/admin/" not in followed[roles.VIEWER]
