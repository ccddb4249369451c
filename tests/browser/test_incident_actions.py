"""End to end: an operator walks through the incident actions in headless Chromium, against the
real stack (uvicorn, a Celery worker, PostgreSQL, Redis): reopen a resolved incident, change its
severity, merge another into it, silence it from its labels after a preview, draft the
postmortem from the timeline, add an overdue action item, see the category's runbook, and
put a node in maintenance.
Everything goes through the pages' forms; the page's Content-Security-Policy allows no inline
script, so any handler the pages need must come from static files (a console error fails it).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from incidents.choices import IncidentState
from incidents.models import ActionItem, Finding, Incident, MaintenanceWindow, RunbookLink, Silence
from incidents.services.engine import Actor, raise_finding, resolve_incident
from tests.browser.support import launch, sign_in
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

RUNBOOK = "https://wiki.example/runbooks/gpu-health"


def _incident(fingerprint: str, hostname: str, severity: str) -> Incident:
    finding = raise_finding(
        fingerprint,
        {"site": "ams-1", "hostname": hostname, "detector": "critical-xid"},
        severity,
        f"XID 79 on {hostname}",
        source="detector:critical-xid",
        category="gpu-health",
    )
    return finding.incident


def test_an_operator_walks_through_the_incident_actions(stack: Stack, operator_user: User) -> None:
    main = _incident("xid:GPU-A", "gpu-a-001", "SEV3")
    other = _incident("xid:GPU-B", "gpu-a-002", "SEV2")
    resolve_incident(main, actor=Actor.person(operator_user), note="looked fine")
    RunbookLink.objects.create(category="gpu-health", url=RUNBOOK, title="GPU health runbook")
    yesterday = (timezone.localdate() - timedelta(days=1)).isoformat()

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, operator_user.username, f"/incidents/{main.pk}/", "/api/v1/incidents/")
            assert page.get_attribute("#runbook a", "href") == RUNBOOK

            # --- reopen ---------------------------------------------------------------------
            page.fill("#reopen-form input[name=note]", "fell off the bus again")
            with page.expect_navigation():
                page.click("#reopen-form button[value=reopen]")
            assert page.text_content(".page-head .state") == "Triggered"
            assert "Reopened by oscar: fell off the bus again" in page.text_content(".timeline")

            # --- change severity ------------------------------------------------------------
            page.select_option("#severity-form select[name=severity]", "SEV1")
            with page.expect_navigation():
                page.click("#severity-form button")
            assert page.text_content(".page-head .sev") == "SEV1"
            assert "Severity changed from SEV3 to SEV1 by oscar" in page.text_content(".timeline")

            # --- merge the other incident into this one, from the other's page ----------------
            page.goto(f"{stack.base_url}/incidents/{other.pk}/")
            page.fill("#merge-form input[name=into]", str(main.pk))
            with page.expect_navigation():
                page.click("#merge-form button")
            assert page.url == f"{stack.base_url}/incidents/{main.pk}/"
            timeline = page.text_content(".timeline")
            assert f"Incident #{other.pk} (XID 79 on gpu-a-002) merged into this one by oscar" in timeline
            assert f"[from #{other.pk}] Triggered (SEV2)" in timeline
            assert page.locator("text=XID 79 on gpu-a-002").count() >= 1  # its finding moved here
            page.goto(f"{stack.base_url}/incidents/{other.pk}/")
            assert page.text_content(".page-head .state") == "Resolved"
            assert page.get_attribute("#merged-banner a", "href") == f"/incidents/{main.pk}/"
            assert page.locator("#incident-more-actions").count() == 0

            # --- silence this incident: matchers from its labels, a preview, then the silence ----
            page.goto(f"{stack.base_url}/incidents/{main.pk}/")
            with page.expect_navigation():
                page.click("#silence-incident")
            matchers = page.input_value("input[name=matchers]")
            assert matchers == 'detector="critical-xid", site="ams-1"', matchers
            with page.expect_navigation():
                page.click("#silence-preview-button")
            preview = page.locator("#silence-preview tbody tr[data-fingerprint]")
            assert sorted(preview.evaluate_all("rows => rows.map(r => r.dataset.fingerprint)")) == [
                "xid:GPU-A",
                "xid:GPU-B",
            ]
            page.fill("input[name=comment]", "replacing the riser")
            with page.expect_navigation():
                page.click("#silence-create")
            assert page.url == f"{stack.base_url}/incidents/{main.pk}/"
            assert "Silenced detector='critical-xid', site='ams-1'" in page.text_content(".timeline")
            # the same silence again is refused on the form
            page.goto(f"{stack.base_url}/incidents/silences/?incident={main.pk}")
            page.fill("input[name=comment]", "again")
            with page.expect_navigation():
                page.click("#silence-create")
            assert "already silences these matchers" in page.text_content("body")

            # --- postmortem from the timeline ------------------------------------------------------
            page.goto(f"{stack.base_url}/incidents/{main.pk}/")
            with page.expect_navigation():
                page.click("#postmortem-draft-form button")
            drafted = page.input_value("textarea[name=pm_timeline]")
            assert "Reopened by oscar" in drafted and "Severity changed from SEV3 to SEV1" in drafted
            assert page.input_value("textarea[name=pm_summary]").startswith("SEV1 XID 79 on gpu-a-001.")

            # --- an action item due yesterday shows as overdue ---------------------------------------
            page.fill(".stack-form input[name=title]", "Add riser checks to burn-in")
            page.select_option(".stack-form select[name=owner]", "oscar")
            page.fill(".stack-form input[name=due_date]", yesterday)
            with page.expect_navigation():
                page.click(".stack-form button")
            row = page.locator("tr.overdue", has_text="Add riser checks to burn-in")
            assert row.count() == 1 and "overdue" in row.text_content()

            # --- a maintenance window for a node -------------------------------------------------------
            page.goto(f"{stack.base_url}/incidents/maintenance/")
            page.select_option("select[name=scope]", "node")
            page.fill("input[name=value]", "gpu-a-003")
            page.fill("input[name=comment]", "firmware upgrade")
            with page.expect_navigation():
                page.click("form.grid-form button")
            assert "gpu-a-003" in page.text_content("#maintenance-table")
            assert "firmware upgrade" in page.text_content("#maintenance-table")

            assert not log.errors, f"the browser reported errors: {log.errors}"
        finally:
            browser.close()

    main.refresh_from_db()
    other.refresh_from_db()
    assert main.state == IncidentState.TRIGGERED and main.severity == "SEV1"
    assert other.merged_into_id == main.pk and other.state == IncidentState.RESOLVED
    assert set(Finding.objects.filter(incident=main).values_list("fingerprint", flat=True)) == {
        "xid:GPU-A",
        "xid:GPU-B",
    }
    assert Silence.objects.count() == 1
    assert ActionItem.objects.get(incident=main).is_overdue
    assert "Reopened by oscar" in main.pm_timeline
    window = MaintenanceWindow.objects.get()
    assert (window.scope, window.value, window.created_by) == ("node", "gpu-a-003", operator_user)
    assert raise_finding("xid:GPU-C", {"site": "ams-1", "hostname": "gpu-a-003"}, "SEV1", "XID 79").incident is None
