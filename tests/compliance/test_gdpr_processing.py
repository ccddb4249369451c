"""GDPR records of processing (Art. 30) and data-subject requests: the API, the page, the service."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance.choices import DataClass, LawfulBasis, RequestKind, RequestStatus
from compliance.models import DataAsset, SubjectRequest, one_month_after
from compliance.services import gdpr

RECORDS = "/api/v1/compliance/processing/records/"
REQUESTS = "/api/v1/compliance/processing/requests/"
ART30_REQUIRED = [
    "name",
    "data_class",
    "controller_contact",
    "purposes",
    "data_subject_categories",
    "personal_data_categories",
    "erasure_time_limit",
    "security_measures",
    "lawful_basis",
]


def _asset(**overrides: Any) -> dict[str, Any]:
    body = {
        "name": "Assistant conversations",
        "data_class": DataClass.TRAINING_CORPUS,
        "controller_contact": "dpo@goodput.example",
        "purposes": "Fine-tuning the assistant",
        "data_subject_categories": "Assistant users who opted in",
        "personal_data_categories": "Conversation text",
        "special_categories": "",
        "recipients": "None",
        "third_country_transfers": "None",
        "erasure_time_limit": "Two years after collection",
        "security_measures": "Encrypted at rest, access by role",
        "lawful_basis": LawfulBasis.CONSENT,
        "balancing_note": "",
    }
    return {**body, **overrides}


@pytest.fixture
def asset(db: None) -> DataAsset:
    return DataAsset.objects.create(**_asset())


def test_it_requires_every_art30_field(officer_client: Client) -> None:
    response = officer_client.post(RECORDS, {}, content_type="application/json")
    assert response.status_code == 400
    assert set(ART30_REQUIRED) <= set(response.json())
    assert not DataAsset.objects.exists()


def test_legitimate_interests_without_balancing_note_is_a_400_naming_it(officer_client: Client) -> None:
    body = _asset(lawful_basis=LawfulBasis.LEGITIMATE_INTERESTS, balancing_note="  ")
    response = officer_client.post(RECORDS, body, content_type="application/json")
    assert response.status_code == 400
    assert list(response.json()) == ["balancing_note"]
    assert not DataAsset.objects.exists()

    body["balancing_note"] = "Users expect it; opt-out offered; pseudonymised before training."
    response = officer_client.post(RECORDS, body, content_type="application/json")
    assert response.status_code == 201, response.json()
    assert DataAsset.objects.get().lawful_basis == LawfulBasis.LEGITIMATE_INTERESTS


def test_a_patch_to_legitimate_interests_needs_the_note_too(officer_client: Client, asset: DataAsset) -> None:
    response = officer_client.patch(
        f"{RECORDS}{asset.pk}/", {"lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "balancing_note" in response.json()
    asset.refresh_from_db()
    assert asset.lawful_basis == LawfulBasis.CONSENT


@pytest.mark.parametrize(
    ("received", "due"),
    [
        (date(2025, 1, 31), date(2025, 2, 28)),
        (date(2024, 1, 31), date(2024, 2, 29)),  # a leap year
        (date(2025, 12, 15), date(2026, 1, 15)),
        (date(2026, 3, 31), date(2026, 4, 30)),
    ],
)
def test_the_due_date_is_one_month_after_receipt(officer_client: Client, received: date, due: date) -> None:
    assert one_month_after(received) == due
    response = officer_client.post(
        REQUESTS,
        {"kind": RequestKind.ERASURE, "subject_reference": "ticket-881", "received_on": received.isoformat()},
        content_type="application/json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["due_on"] == due.isoformat()
    assert SubjectRequest.objects.get().due_on == due


def test_an_open_request_past_its_due_date_is_overdue(officer_client: Client) -> None:
    today = timezone.localdate()
    late = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="late", received_on=today - timedelta(days=40)
    )
    fresh = SubjectRequest.objects.create(kind=RequestKind.OBJECTION, subject_reference="fresh", received_on=today)
    SubjectRequest.objects.create(
        kind=RequestKind.ERASURE,
        subject_reference="done",
        received_on=today - timedelta(days=60),
        status=RequestStatus.COMPLETED,
    )
    rows = {r["subject_reference"]: r for r in officer_client.get(REQUESTS).json()["results"]}
    assert rows["late"]["overdue"] is True
    assert rows["fresh"]["overdue"] is False
    assert rows["done"]["overdue"] is False
    assert list(SubjectRequest.objects.overdue(today)) == [late]

    page = officer_client.get(reverse("compliance:processing"))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-request="{late.pk}" class="row-bad"' in html
    assert f'data-request="{fresh.pk}" class=""' in html


def test_completing_a_request_closes_it_and_reopening_clears_the_date(officer_client: Client) -> None:
    today = timezone.localdate()
    request = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="r1", received_on=today - timedelta(days=40)
    )
    response = officer_client.patch(
        f"{REQUESTS}{request.pk}/", {"status": RequestStatus.COMPLETED}, content_type="application/json"
    )
    assert response.status_code == 200
    assert response.json()["closed_on"] == today.isoformat()
    assert response.json()["overdue"] is False

    officer_client.post(
        reverse("compliance:processing"), {"action": "status", "request": request.pk, "status": RequestStatus.OPEN}
    )
    request.refresh_from_db()
    assert (request.status, request.closed_on) == (RequestStatus.OPEN, None)


def test_requests_cannot_be_deleted_through_the_api(officer_client: Client) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="keep", received_on=timezone.localdate()
    )
    assert officer_client.delete(f"{REQUESTS}{request.pk}/").status_code == 405
    assert SubjectRequest.objects.filter(pk=request.pk).exists()


def test_the_page_refuses_a_bad_record_on_the_field_and_writes_nothing(officer_client: Client) -> None:
    form = {f"asset-{k}": v for k, v in _asset(lawful_basis=LawfulBasis.LEGITIMATE_INTERESTS).items()}
    response = officer_client.post(reverse("compliance:processing"), {"action": "asset", **form})
    assert response.status_code == 400
    assert 'data-error-for="balancing_note"' in response.content.decode()
    assert not DataAsset.objects.exists()


def test_the_page_logs_a_request_with_its_due_date(officer_client: Client, asset: DataAsset) -> None:
    response = officer_client.post(
        reverse("compliance:processing"),
        {
            "action": "request",
            "request-kind": RequestKind.ERASURE,
            "request-subject_reference": "case-7",
            "request-received_on": "2025-01-31",
            "request-assets": [asset.pk],
        },
    )
    assert response.status_code == 302
    request = SubjectRequest.objects.get()
    assert request.due_on == date(2025, 2, 28)
    assert list(request.assets.all()) == [asset]


def test_the_console_records_are_added_once(officer_client: Client) -> None:
    created = gdpr.ensure_console_assets()
    assert {a.data_class for a in created} == {
        DataClass.TELEMETRY,
        DataClass.SERVING_SAMPLES,
        DataClass.INCIDENTS,
        DataClass.AUDIT,
    }
    assert gdpr.ensure_console_assets() == []
    officer_client.post(reverse("compliance:processing"), {"action": "console-assets"})
    assert DataAsset.objects.count() == 4
    for a in DataAsset.objects.filter(lawful_basis=LawfulBasis.LEGITIMATE_INTERESTS):
        assert a.balancing_note


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_get_403(request: pytest.FixtureRequest, persona: str, asset: DataAsset) -> None:
    client: Client = request.getfixturevalue(persona)
    assert client.get(reverse("compliance:processing")).status_code == 403
    assert client.post(reverse("compliance:processing"), {"action": "console-assets"}).status_code == 403
    assert client.get(RECORDS).status_code == 403
    assert client.get(f"{RECORDS}{asset.pk}/").status_code == 403
    assert client.post(REQUESTS, {}, content_type="application/json").status_code == 403
    assert DataAsset.objects.count() == 1
