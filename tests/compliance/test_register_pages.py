"""The register pages: lists with flags, create and edit forms that write nothing on a bad
submit, the lineage graph and form, and the crawler CSV upload."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from compliance.models.register import CrawledDomain, Dataset, GpaiModel, Lineage

pytestmark = pytest.mark.django_db


def _json_script(html: str, element_id: str) -> object:
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no json_script {element_id}"
    return json.loads(match.group(1))


def test_model_list_flags_systemic_risk_and_overdue_export_checks(
    officer_client: Client, gpai_model: GpaiModel
) -> None:
    GpaiModel.objects.create(
        name="Leviathan",
        version="3",
        training_compute_flop=10**26,
        export_control_checked_on=timezone.localdate() - timedelta(days=settings.EXPORT_CONTROL_REVIEW_DAYS + 1),
    )
    html = officer_client.get("/compliance/models/").content.decode()
    rows = dict(re.findall(r'<tr data-model="\d+">\s*<td><a [^>]*>([^<]+)</a>(.*?)</tr>', html, re.S))
    assert 'data-flag="systemic-risk"' in rows["Leviathan"]
    assert 'data-flag="export-overdue"' in rows["Leviathan"]
    assert "data-flag" not in rows["Goodput-LM"]


def test_model_create_form_and_bad_submit(officer_client: Client, gpai_model: GpaiModel) -> None:
    form = {"name": "Orca", "version": "2.0", "modalities": ["text", "audio"], "weights_classification": "internal"}
    response = officer_client.post("/compliance/models/", {**form, "training_compute_flop": "4e25"})
    orca = GpaiModel.objects.get(name="Orca")
    assert response.status_code == 302
    assert response["Location"] == f"/compliance/models/{orca.pk}/"
    assert (orca.modalities, orca.systemic_risk) == (["text", "audio"], True)

    # The same name and version again, and a negative compute: errors on the fields, nothing written.
    response = officer_client.post("/compliance/models/", {**form, "training_compute_flop": "-1"})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'data-error-for="training_compute_flop"' in html
    assert GpaiModel.objects.count() == 2


def test_model_edit_form(officer_client: Client, gpai_model: GpaiModel) -> None:
    url = f"/compliance/models/{gpai_model.pk}/"
    form = {"action": "edit", "name": "Goodput-LM", "version": "1.0", "weights_classification": "public"}
    response = officer_client.post(url, {**form, "placed_on_market": "not a date"})
    assert response.status_code == 400
    assert 'data-error-for="placed_on_market"' in response.content.decode()
    gpai_model.refresh_from_db()
    assert gpai_model.weights_classification == "trade_secret"
    assert officer_client.post(url, {**form, "placed_on_market": "2026-04-01"}).status_code == 302
    gpai_model.refresh_from_db()
    assert (gpai_model.weights_classification, str(gpai_model.placed_on_market)) == ("public", "2026-04-01")


def test_model_page_shows_the_lineage_graph_data(
    officer_client: Client, gpai_model: GpaiModel, register_datasets: dict
) -> None:
    html = officer_client.get(f"/compliance/models/{gpai_model.pk}/").content.decode()
    assert 'id="lineage-graph"' in html
    assert "js/compliance_register.js" in html
    graph = _json_script(html, "lineage-data")
    labels = graph["labels"]
    assert labels[0] == "Goodput-LM 1.0"
    assert graph["kinds"].count("dataset") == 8
    assert graph["kinds"].count("job") == 2
    # every dataset flows into the model; each job flows into its datasets
    into_model = {labels[s] for s, t in zip(graph["source"], graph["target"], strict=True) if t == 0}
    assert len(into_model) == 8
    sft = labels.index("job goodput-lm-sft")
    from_sft = sorted(labels[t] for s, t in zip(graph["source"], graph["target"], strict=True) if s == sft)
    assert from_sft == ["assistant-chats (2.4)", "synthetic-math (2.5)"]


def test_lineage_via_the_page_form_is_idempotent(officer_client: Client, officer_user, register_datasets: dict) -> None:
    model = GpaiModel.objects.create(name="Goodput-LM", version="1.1")
    url = f"/compliance/models/{model.pk}/"
    html = officer_client.get(url).content.decode()
    assert 'id="lineage-empty"' in html
    dataset = register_datasets["newswire-archive"]
    for _ in range(2):
        response = officer_client.post(url, {"action": "lineage", "dataset": dataset.pk, "job": ""})
        assert response.status_code == 302
    row = Lineage.objects.get(model=model)
    assert (row.dataset, row.job, row.recorded_by) == (dataset, None, officer_user)

    response = officer_client.post(url, {"action": "lineage", "dataset": ""})
    assert response.status_code == 400
    assert 'data-error-for="dataset"' in response.content.decode()
    assert Lineage.objects.filter(model=model).count() == 1


def test_dataset_create_form_names_size_unit(officer_client: Client) -> None:
    form = {"name": "wiki", "source_category": "public", "modality": "text", "size": "1000"}
    response = officer_client.post("/compliance/datasets/", form)
    assert response.status_code == 400
    assert 'data-error-for="size_unit"' in response.content.decode()
    assert not Dataset.objects.exists()
    response = officer_client.post("/compliance/datasets/", {**form, "size_unit": "tokens"})
    assert response.status_code == 302
    assert Dataset.objects.get(name="wiki").size == 1000


def test_dataset_edit_form_checks_the_crawl_period(officer_client: Client, crawled_dataset: Dataset) -> None:
    url = f"/compliance/datasets/{crawled_dataset.pk}/"
    form = {"action": "edit", "name": "crawled-web", "source_category": "crawled", "modality": "text"}
    response = officer_client.post(url, {**form, "crawl_started": "2025-06-01", "crawl_ended": "2025-01-01"})
    assert response.status_code == 400
    assert 'data-error-for="crawl_ended"' in response.content.decode()
    crawled_dataset.refresh_from_db()
    assert str(crawled_dataset.crawl_ended) == "2025-12-31"


def test_dataset_page_lists_top_50_domains_and_imports_csv(officer_client: Client, crawled_dataset: Dataset) -> None:
    url = f"/compliance/datasets/{crawled_dataset.pk}/"
    CrawledDomain.objects.bulk_create(
        CrawledDomain(dataset=crawled_dataset, domain=f"tail{i}.example", bytes=i) for i in range(20)
    )
    html = officer_client.get(url).content.decode()
    table = html[html.index('id="domains-table"') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 50  # the header row and the top 50
    assert table.index("www.site01.example") < table.index("www.site40.example")
    assert ">tail10.example<" in table
    assert ">tail9.example<" not in table

    bad = SimpleUploadedFile("c.csv", b"domain,bytes\nok.example.org,5\nbad.example.org,five\n")
    response = officer_client.post(url, {"action": "domains", "file": bad})
    assert response.status_code == 400
    assert re.search(r'data-error-for="file">Line 3:', response.content.decode())
    assert crawled_dataset.domains.count() == 60

    good = SimpleUploadedFile("c.csv", b"domain,bytes\nok.example.org,5\n")
    assert officer_client.post(url, {"action": "domains", "file": good}).status_code == 302
    assert list(crawled_dataset.domains.values_list("domain", "bytes")) == [("ok.example.org", 5)]


def test_model_page_links_the_summary_when_it_exists(officer_client: Client, gpai_model: GpaiModel) -> None:
    from django.urls import NoReverseMatch, reverse

    html = officer_client.get(f"/compliance/models/{gpai_model.pk}/").content.decode()
    try:
        url = reverse("compliance:summary", args=[gpai_model.pk])
    except NoReverseMatch:
        assert 'id="summary-link"' not in html
    else:
        assert f'href="{url}" id="summary-link"' in html


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_get_403_on_pages(
    request: pytest.FixtureRequest, persona: str, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    client = request.getfixturevalue(persona)
    pages = ["/compliance/models/", f"/compliance/models/{gpai_model.pk}/", "/compliance/datasets/"]
    for url in [*pages, f"/compliance/datasets/{crawled_dataset.pk}/"]:
        assert client.get(url).status_code == 403, url
    response = client.post(f"/compliance/models/{gpai_model.pk}/", {"action": "lineage", "dataset": crawled_dataset.pk})
    assert response.status_code == 403
    assert Lineage.objects.filter(model=gpai_model).count() == 8
