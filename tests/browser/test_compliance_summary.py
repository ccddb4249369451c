"""End to end: a compliance officer opens a model's training-content summary in headless Chromium,
sees the draft with its missing answers marked, publishes it, lands on version 1 with its hash,
and downloads the PDF. The pages are photographed on a desk and on a phone."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from compliance.choices import Modality, SizeUnit, SourceCategory
from compliance.models import AuditEntry, Dataset, GpaiModel, Lineage, SummaryVersion
from console import roles
from tests.browser.support import ARTIFACTS, launch, sign_in
from tests.conftest import _make_user
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

PHONE = {"width": 390, "height": 844}


def test_an_officer_publishes_a_summary_and_downloads_its_pdf(stack: Stack, tmp_path: Path) -> None:
    officer = _make_user("cora", roles.COMPLIANCE_OFFICER)
    model = GpaiModel.objects.create(
        name="Goodput-LM", version="1.0", provider_name="Goodput Labs B.V.", modalities=[Modality.TEXT]
    )
    web = Dataset.objects.create(
        name="open-web-corpus",
        source_category=SourceCategory.PUBLIC,
        modality=Modality.TEXT,
        size=Decimal(600 * 10**9),
        size_unit=SizeUnit.TOKENS,
    )
    Lineage.objects.create(model=model, dataset=web)
    path = f"/compliance/models/{model.pk}/summary/"

    # No ORM inside the Playwright block (see test_fleet_dashboard.py): the page is the witness.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page, log = sign_in(browser, stack, officer.username, path, "/api/")
            assert page.locator("#draft .tbp").count() > 0  # e.g. the contact: not in the register
            assert "1 billion to 10 trillion tokens" in page.locator("#draft").inner_text()  # 1.3, text
            assert page.locator("#no-versions").is_visible()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "compliance-summary-draft-1440.png"), full_page=True)

            with page.expect_navigation():
                page.click("#publish")
            assert page.url == f"{stack.base_url}{path}v1/"
            card = page.locator("#version-1")
            shown_hash = card.locator("[data-field=sha256]").inner_text()
            assert card.locator("[data-field=verified]").inner_text() == "hash verified"

            with page.expect_download() as download:
                card.locator("a[data-export=pdf]").click()
            pdf = tmp_path / "summary.pdf"
            download.value.save_as(pdf)
            suggested = download.value.suggested_filename
            page.screenshot(path=str(ARTIFACTS / "compliance-summary-v1-1440.png"), full_page=True)

            page.goto(stack.base_url + path)
            assert page.locator("#version-1 [data-field=sha256]").inner_text() == shown_hash
            page.set_viewport_size(PHONE)
            width = page.evaluate("document.documentElement.scrollWidth")
            page.screenshot(path=str(ARTIFACTS / "compliance-summary-390.png"), full_page=True)
            assert log.errors == []
        finally:
            browser.close()

    assert width <= PHONE["width"], f"the summary page is {width} px wide on a phone"
    version = SummaryVersion.objects.get(model=model)
    assert version.version == 1 and shown_hash == version.sha256 and version.verify()
    assert pdf.read_bytes().startswith(b"%PDF")
    assert suggested == "summary-Goodput-LM-1.0-v1.pdf"
    assert AuditEntry.objects.filter(message="Downloaded summary v1 as pdf", actor="cora").count() == 1
