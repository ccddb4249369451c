"""The register API: models, datasets, the crawler CSV and lineage, with their bad inputs."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from compliance.models.register import CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.services import register
from fleet.models import Job

pytestmark = pytest.mark.django_db

MODELS = "/api/v1/compliance/models/"
DATASETS = "/api/v1/compliance/datasets/"
LINEAGE = "/api/v1/compliance/lineage/"


def post(client: Client, url: str, body: dict, method: str = "post"):  # type: ignore[no-untyped-def]
    return getattr(client, method)(url, json.dumps(body), content_type="application/json")


def test_model_create_and_update_with_systemic_risk_flag(officer_client: Client) -> None:
    response = post(
        officer_client,
        MODELS,
        {"name": "Orca", "version": "2.0", "modalities": ["text", "image"], "training_compute_flop": "9e24"},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["modalities"] == ["text", "image"]
    assert body["systemic_risk"] is False
    assert body["training_compute_flop"] == "9000000000000000000000000"

    response = post(officer_client, f"{MODELS}{body['id']}/", {"training_compute_flop": "2e25"}, method="patch")
    assert response.status_code == 200, response.content
    assert response.json()["systemic_risk"] is True
    assert GpaiModel.objects.get(pk=body["id"]).training_compute_flop == Decimal("2e25")


def test_systemic_risk_only_above_ten_to_the_25(db: None) -> None:
    at, above = (GpaiModel(name="m", version=v, training_compute_flop=f) for v, f in (("a", 10**25), ("b", 10**25 + 1)))
    assert not at.systemic_risk
    assert above.systemic_risk
    assert not GpaiModel(name="m", version="c").systemic_risk  # compute unknown: no presumption


def test_export_control_due_and_overdue(officer_client: Client, gpai_model: GpaiModel) -> None:
    today = timezone.localdate()
    days = settings.EXPORT_CONTROL_REVIEW_DAYS
    body = officer_client.get(f"{MODELS}{gpai_model.pk}/").json()
    assert body["export_control_overdue"] is False
    assert body["export_control_due"] == (today - timedelta(days=10) + timedelta(days=days)).isoformat()

    stale = (today - timedelta(days=days + 1)).isoformat()
    body = post(
        officer_client, f"{MODELS}{gpai_model.pk}/", {"export_control_checked_on": stale}, method="patch"
    ).json()
    assert body["export_control_overdue"] is True
    body = post(officer_client, f"{MODELS}{gpai_model.pk}/", {"export_control_checked_on": None}, method="patch").json()
    assert body["export_control_overdue"] is True  # never checked
    assert body["export_control_due"] is None


def test_dataset_create_and_update(officer_client: Client) -> None:
    response = post(
        officer_client,
        DATASETS,
        {"name": "wiki", "source_category": "public", "modality": "text", "size": "1.5e9", "size_unit": "tokens"},
    )
    assert response.status_code == 201, response.content
    pk = response.json()["id"]
    response = post(
        officer_client, f"{DATASETS}{pk}/", {"licence": "CC BY-SA 4.0", "personal_data": True}, method="patch"
    )
    assert response.status_code == 200, response.content
    dataset = Dataset.objects.get(pk=pk)
    assert (dataset.size, dataset.licence, dataset.personal_data) == (Decimal(1_500_000_000), "CC BY-SA 4.0", True)


def test_dataset_size_without_unit_is_a_400_naming_size_unit(officer_client: Client) -> None:
    response = post(
        officer_client, DATASETS, {"name": "x", "source_category": "public", "modality": "text", "size": 10}
    )
    assert response.status_code == 400
    assert "size_unit" in response.json()
    assert not Dataset.objects.exists()


def test_dataset_update_cannot_drop_the_unit_of_a_size(officer_client: Client, register_datasets: dict) -> None:
    dataset = register_datasets["tiny-stories"]
    response = post(officer_client, f"{DATASETS}{dataset.pk}/", {"size_unit": ""}, method="patch")
    assert response.status_code == 400
    assert "size_unit" in response.json()
    dataset.refresh_from_db()
    assert dataset.size_unit == "tokens"


def test_unknown_source_category_is_a_400_naming_it(officer_client: Client) -> None:
    response = post(officer_client, DATASETS, {"name": "x", "source_category": "2.7", "modality": "text"})
    assert response.status_code == 400
    assert "source_category" in response.json()
    assert not Dataset.objects.exists()


GOOD_CSV = "domain,bytes\nnews.example.org,500\nBlog.Example.com,1500\n\n"


def test_crawler_csv_import_replaces_the_domains(officer_client: Client, crawled_dataset: Dataset) -> None:
    url = f"{DATASETS}{crawled_dataset.pk}/domains/"
    assert officer_client.get(url).json()["count"] == 40
    response = officer_client.post(url, GOOD_CSV, content_type="text/csv")
    assert response.status_code == 200, response.content
    assert response.json() == {"domains": 2}
    listed = officer_client.get(url).json()["results"]
    assert listed == [{"domain": "blog.example.com", "bytes": 1500}, {"domain": "news.example.org", "bytes": 500}]


def test_crawler_csv_as_a_multipart_file(officer_client: Client, crawled_dataset: Dataset) -> None:
    upload = SimpleUploadedFile("crawl.csv", GOOD_CSV.encode(), content_type="text/csv")
    response = officer_client.post(f"{DATASETS}{crawled_dataset.pk}/domains/", {"file": upload})
    assert response.status_code == 200, response.content
    assert set(crawled_dataset.domains.values_list("domain", flat=True)) == {"news.example.org", "blog.example.com"}


@pytest.mark.parametrize(
    ("bad_line", "why"),
    [
        ("lonely.example.org", "2 columns"),
        ("a.example.org,12.5", "whole number"),
        ("a.example.org,-3", "whole number"),
        ("not a domain,3", "not a domain"),
        ("news.example.org,7", "twice"),
    ],
)
def test_malformed_crawler_line_is_a_400_naming_it_and_nothing_is_written(
    officer_client: Client, crawled_dataset: Dataset, bad_line: str, why: str
) -> None:
    before = list(CrawledDomain.objects.values_list("dataset", "domain", "bytes"))
    text = f"domain,bytes\nnews.example.org,500\nblog.example.com,1500\n{bad_line}\nlast.example.org,1\n"
    response = officer_client.post(f"{DATASETS}{crawled_dataset.pk}/domains/", text, content_type="text/csv")
    assert response.status_code == 400
    body = response.json()
    assert body["line"] == 4
    assert body["csv"][0].startswith("Line 4:")
    assert why in body["csv"][0]
    assert list(CrawledDomain.objects.values_list("dataset", "domain", "bytes")) == before
    assert len(before) == 40


def test_crawler_csv_needs_its_header_and_a_crawled_dataset(officer_client: Client, register_datasets: dict) -> None:
    crawled = register_datasets["crawled-web"]
    response = officer_client.post(
        f"{DATASETS}{crawled.pk}/domains/", "host,size\na.example.org,1\n", content_type="text/csv"
    )
    assert (response.status_code, response.json()["line"]) == (400, 1)
    public = register_datasets["open-web-corpus"]
    response = officer_client.post(f"{DATASETS}{public.pk}/domains/", GOOD_CSV, content_type="text/csv")
    assert response.status_code == 400
    assert "source_category" in response.json()
    assert not public.domains.exists()


def test_lineage_via_api_is_idempotent_and_filters_by_model(
    officer_client: Client, officer_user, gpai_model: GpaiModel, register_datasets: dict, training_jobs: dict
) -> None:
    other = GpaiModel.objects.create(name="Goodput-LM", version="1.1", base_model=gpai_model)
    dataset = register_datasets["synthetic-math"]
    job = training_jobs["goodput-lm-sft"]
    body = {"model": other.pk, "dataset": dataset.pk, "job": job.pk}
    first = post(officer_client, LINEAGE, body)
    assert first.status_code == 201, first.content
    again = post(officer_client, LINEAGE, body)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    no_job = post(officer_client, LINEAGE, {"model": other.pk, "dataset": dataset.pk})
    assert no_job.status_code == 201
    assert post(officer_client, LINEAGE, {"model": other.pk, "dataset": dataset.pk, "job": None}).status_code == 200
    assert Lineage.objects.filter(model=other).count() == 2
    assert Lineage.objects.get(pk=first.json()["id"]).recorded_by == officer_user

    listed = officer_client.get(LINEAGE, {"model": other.pk}).json()
    assert listed["count"] == 2
    assert {row["job"] for row in listed["results"]} == {job.pk, None}
    assert officer_client.get(LINEAGE, {"model": gpai_model.pk}).json()["count"] == 8


def test_lineage_with_an_unknown_job_is_a_400(
    officer_client: Client, gpai_model: GpaiModel, register_datasets: dict
) -> None:
    missing = (Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 100
    response = post(
        officer_client,
        LINEAGE,
        {"model": gpai_model.pk, "dataset": register_datasets["tiny-stories"].pk, "job": missing},
    )
    assert response.status_code == 400
    assert "job" in response.json()


def test_record_lineage_service_is_idempotent(gpai_model: GpaiModel, register_datasets: dict) -> None:
    dataset = register_datasets["podcast-audio"]
    existing = Lineage.objects.get(model=gpai_model, dataset=dataset)
    row, created = register.record_lineage(gpai_model, dataset, job=existing.job)
    assert (row.pk, created) == (existing.pk, False)
    row, created = register.record_lineage(gpai_model, dataset)
    assert created
    assert register.record_lineage(gpai_model, dataset) == (row, False)


def test_dataset_in_use_cannot_be_deleted(officer_client: Client, register_datasets: dict) -> None:
    response = officer_client.delete(f"{DATASETS}{register_datasets['tiny-stories'].pk}/")
    assert response.status_code == 409
    assert Dataset.objects.filter(name="tiny-stories").exists()


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_get_403(request: pytest.FixtureRequest, persona: str, crawled_dataset: Dataset) -> None:
    client = request.getfixturevalue(persona)
    for url in (MODELS, DATASETS, LINEAGE, f"{DATASETS}{crawled_dataset.pk}/domains/"):
        assert client.get(url).status_code == 403, url
    assert post(client, DATASETS, {"name": "x", "source_category": "public", "modality": "text"}).status_code == 403
    assert client.post(f"{DATASETS}{crawled_dataset.pk}/domains/", GOOD_CSV, content_type="text/csv").status_code == 403
    assert crawled_dataset.domains.count() == 40


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (MODELS, {"name": "Orca", "version": "3", "content_types": "the old single field"}, "content_types"),
        (MODELS, {"name": "Orca", "version": "3", "systemic_risk": True}, "systemic_risk"),
        (
            DATASETS,
            {"name": "d", "source_category": "public", "modality": "text", "licence_terms": "x"},
            "licence_terms",
        ),
    ],
)
def test_a_field_the_register_api_would_drop_is_a_400_naming_it(
    officer_client: Client, url: str, body: dict, field: str
) -> None:
    response = post(officer_client, url, body)
    assert response.status_code == 400 and list(response.json()) == [field], response.content
    assert not GpaiModel.objects.filter(version="3").exists() and not Dataset.objects.filter(name="d").exists()


def test_the_templates_answers_go_through_the_register_api(officer_client: Client) -> None:
    body = {
        "name": "Orca",
        "version": "4",
        "modalities": ["text", "other"],
        "provider_established_in_union": True,
        "trained_from_scratch": True,
        "other_modality": "source code",
        "content_types_text": "News and fiction",
        "content_types_other": "Open-source repositories",
        "continuously_trained": False,
        "comments_crawled": "The crawler's user agent is published.",
    }
    response = post(officer_client, MODELS, body)
    assert response.status_code == 201, response.content
    model = GpaiModel.objects.get(version="4")
    assert (model.other_modality, model.content_types_other, model.continuously_trained) == (
        "source code",
        "Open-source repositories",
        False,
    )
    dataset = post(
        officer_client,
        DATASETS,
        {
            "name": "chats",
            "source_category": "user_data",
            "modality": "text",
            "user_data_origin": "other_services",
            "user_data_source": "Goodput Mail",
            "publicly_known": False,
        },
    )
    assert dataset.status_code == 201, dataset.content
    bad = post(
        officer_client,
        DATASETS,
        {"name": "c2", "source_category": "user_data", "modality": "text", "user_data_origin": "email"},
    )
    assert bad.status_code == 400 and list(bad.json()) == ["user_data_origin"]
