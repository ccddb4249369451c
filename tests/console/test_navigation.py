"""The navigation bar's groups as each role gets them, the current page marked (it and its group,
nothing else), and the bar's markup: no inline script (the Content-Security-Policy forbids it)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from console.context_processors import NAV_GROUPS, current_url

pytestmark = pytest.mark.django_db

ALL_ROLES_GROUPS = {
    "Fleet": ["/fleet/", "/fleet/targets/", "/fabric/", "/storage/", "/power/"],
    "Workloads": ["/training/", "/serving/"],
    "Capacity": ["/capacity/", "/scheduler/queues/", "/cost/"],
    "Incidents": ["/incidents/", "/incidents/metrics/", "/incidents/silences/", "/incidents/maintenance/"],
}


def bar(client: Client, path: str = "/") -> dict[str, list[str]]:
    """The bar's groups and their links on ``path``, read from the page as a browser gets it."""
    html = client.get(path).content.decode()
    nav = html[html.index('<nav class="nav"') : html.index("</nav>")]
    groups = {}
    for group in re.findall(r'<li class="nav-group[^"]*">(.*?)</ul>', nav, flags=re.S):
        label = re.search(r'class="nav-group-button"[^>]*>([^<]+)<', group)[1]  # type: ignore[index]
        groups[label] = re.findall(r'<a href="([^"]+)"', group)
    return groups


def marked(client: Client, path: str) -> tuple[list[str], list[str]]:
    """(the links marked aria-current, the groups marked active) on ``path``."""
    html = client.get(path).content.decode()
    nav = html[html.index('<nav class="nav"') : html.index("</nav>")]
    links = re.findall(r'<a href="([^"]+)" class="active" aria-current="page">', nav)
    groups = re.findall(r'<li class="nav-group active">\s*<button[^>]*>([^<]+)<', nav)
    return links, groups


def test_a_viewer_gets_the_four_task_groups_and_no_governance(viewer_client: Client) -> None:
    assert bar(viewer_client) == ALL_ROLES_GROUPS


def test_an_admin_gets_governance_too(admin_client: Client) -> None:
    assert bar(admin_client) == {**ALL_ROLES_GROUPS, "Governance": ["/compliance/", "/recovery/", "/accounts/people/"]}


def test_an_operator_sees_recovery_but_not_compliance_or_people(operator_client: Client) -> None:
    governance = bar(operator_client).get("Governance", [])
    assert "/compliance/" not in governance and "/accounts/people/" not in governance


@pytest.mark.parametrize(
    ("path", "link", "group"),
    [
        ("/", "/", None),
        ("/fleet/", "/fleet/", "Fleet"),
        ("/fleet/targets/", "/fleet/targets/", "Fleet"),
        ("/incidents/metrics/", "/incidents/metrics/", "Incidents"),
        ("/incidents/", "/incidents/", "Incidents"),
        ("/scheduler/queues/", "/scheduler/queues/", "Capacity"),
    ],
)
def test_the_current_page_and_its_group_are_marked_and_nothing_else(
    viewer_client: Client, path: str, link: str, group: str | None
) -> None:
    assert marked(viewer_client, path) == ([link], [group] if group else [])


def test_a_page_below_a_link_marks_the_longest_link_that_begins_it() -> None:
    urls = ["/", "/fleet/", "/fleet/targets/", "/incidents/", "/incidents/metrics/"]
    assert current_url("/fleet/gpus/GPU-1/", urls) == "/fleet/"
    assert current_url("/fleet/targets/", urls) == "/fleet/targets/"
    assert current_url("/incidents/12/", urls) == "/incidents/"
    assert current_url("/", urls) == "/"
    assert current_url("/accounts/tokens/", urls) is None  # not in the bar: nothing marked


def test_each_group_names_a_page_once_and_the_bar_has_no_inline_script(admin_client: Client) -> None:
    names = [link.url_name for _, links in NAV_GROUPS for link in links]
    assert len(names) == len(set(names))
    html = admin_client.get("/").content.decode()
    # Every script is a file of our own; a JSON data block (json_script) runs nothing.
    scripts = [tag for tag in re.findall(r"<script\b[^>]*>", html) if 'type="application/json"' not in tag]
    assert scripts and all('src="/static/' in tag for tag in scripts), scripts
    assert re.search(r"<script src=\"/static/js/nav\.[^\"]*js\" defer>", html), scripts
