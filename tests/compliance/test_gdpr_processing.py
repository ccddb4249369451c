"""GDPR records of processing (Art. 30(1) as controller, 30(2) as processor) and data-subject
requests (Arts. 12(3), 15-22): the API, the page, the service."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import date, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from compliance.choices import DataClass, LawfulBasis, RequestKind, RequestStatus
from compliance.models import (
    AuditEntry,
    CompliancePack,
    DataAsset,
    ProcessorRecord,
    SubjectRequest,
    one_month_after,
)
from compliance.models.gdpr import due_date
from compliance.services import gdpr
from compliance.services import pack as pack_service
from compliance.services.status import compliance_status

RECORDS = "/api/v1/compliance/processing/records/"
REQUESTS = "/api/v1/compliance/processing/requests/"
ART30_REQUIRED = [
    "name",
    "data_class",
    "controller",
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
        "controller": "Goodput Labs B.V., Amsterdam, privacy@goodput.example",
        "joint_controller": "",
        "representative": "",
        "data_protection_officer": "dpo@goodput.example",
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


# --- every right (item 4) ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(RequestKind))
def test_every_data_subject_right_can_be_logged_through_the_api(officer_client: Client, kind: RequestKind) -> None:
    response = officer_client.post(
        REQUESTS,
        {"kind": kind.value, "subject_reference": f"DSR-{kind.value}", "received_on": "2025-03-10"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["due_on"] == "2025-04-10"
    assert SubjectRequest.objects.get().kind == kind


def test_the_kinds_are_the_rights_of_articles_15_to_22() -> None:
    assert [label for _, label in RequestKind.choices] == [
        "Access (Art. 15)",
        "Rectification (Art. 16)",
        "Erasure (Art. 17)",
        "Restriction of processing (Art. 18)",
        "Notification of recipients (Art. 19)",
        "Data portability (Art. 20)",
        "Objection (Art. 21)",
        "Automated decision-making (Art. 22)",
    ]


def test_the_page_logs_a_portability_request(officer_client: Client) -> None:
    response = officer_client.post(
        reverse("compliance:processing"),
        {
            "action": "request",
            "request-kind": RequestKind.PORTABILITY,
            "request-subject_reference": "case-20",
            "request-received_on": "2025-01-31",
        },
    )
    assert response.status_code == 302
    assert SubjectRequest.objects.get().kind == RequestKind.PORTABILITY


# --- the extension by two further months (item 5) ---------------------------------------------


@pytest.mark.parametrize(
    ("received", "due"),
    [
        (date(2025, 1, 31), date(2025, 4, 28)),  # 28 February, then two months from it
        (date(2025, 3, 15), date(2025, 6, 15)),
        (date(2025, 11, 30), date(2026, 2, 28)),  # across the year
    ],
)
def test_an_extension_moves_the_due_date_by_two_further_months(received: date, due: date) -> None:
    assert due_date(received, extended=True) == due
    assert due_date(received, extended=False) == one_month_after(received)


def test_an_extension_is_recorded_with_its_reason_and_the_date_the_subject_was_told(officer_client: Client) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="big", received_on=date(2025, 1, 31)
    )
    assert request.due_on == date(2025, 2, 28)
    body = {"extension_reason": "Twelve datasets to search", "extension_notified_on": "2025-02-20"}
    response = officer_client.patch(f"{REQUESTS}{request.pk}/", body, content_type="application/json")
    assert response.status_code == 200, response.json()
    assert (response.json()["due_on"], response.json()["extended"]) == ("2025-04-28", True)
    request.refresh_from_db()
    assert (request.due_on, request.extension_notified_on) == (date(2025, 4, 28), date(2025, 2, 20))
    # overdue is judged against the extended date
    assert not request.is_overdue(date(2025, 4, 28)) and request.is_overdue(date(2025, 4, 29))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"extension_reason": "Complex", "extension_notified_on": "2025-03-01"},
            "extension_notified_on",
        ),  # after 28 Feb
        (
            {"extension_reason": "Complex", "extension_notified_on": "2025-01-30"},
            "extension_notified_on",
        ),  # before receipt
        ({"extension_reason": "Complex"}, "extension_notified_on"),
        ({"extension_notified_on": "2025-02-10"}, "extension_reason"),
        ({"extension_reason": "   ", "extension_notified_on": "2025-02-10"}, "extension_reason"),
        ({"due_on": "2025-06-30"}, "due_on"),  # read-only: computed, never taken as sent
    ],
)
def test_a_bad_extension_is_a_400_naming_the_field_and_changes_nothing(
    officer_client: Client, body: dict[str, str], field: str
) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ERASURE, subject_reference="x", received_on=date(2025, 1, 31)
    )
    response = officer_client.patch(f"{REQUESTS}{request.pk}/", body, content_type="application/json")
    assert response.status_code == 400
    assert list(response.json()) == [field], response.json()
    request.refresh_from_db()
    assert (request.due_on, request.extension_notified_on, request.extension_reason) == (date(2025, 2, 28), None, "")


def test_an_extension_told_in_the_future_is_refused(officer_client: Client) -> None:
    today = timezone.localdate()
    request = SubjectRequest.objects.create(kind=RequestKind.ACCESS, subject_reference="f", received_on=today)
    body = {"extension_reason": "Complex", "extension_notified_on": (today + timedelta(days=1)).isoformat()}
    response = officer_client.patch(f"{REQUESTS}{request.pk}/", body, content_type="application/json")
    assert response.status_code == 400 and list(response.json()) == ["extension_notified_on"]


def test_the_page_records_an_extension_and_refuses_a_late_notice(officer_client: Client) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="p", received_on=date(2025, 1, 31)
    )
    url = reverse("compliance:processing")
    late = {
        "action": "extension",
        "request": request.pk,
        "extension_reason": "r",
        "extension_notified_on": "2025-03-03",
    }
    response = officer_client.post(url, late)
    assert response.status_code == 400
    assert "extension_notified_on: The data subject must be told within the first month, by 2025-02-28" in (
        response.content.decode()
    )
    response = officer_client.post(url, {**late, "extension_notified_on": "2025-02-27"})
    assert response.status_code == 302
    request.refresh_from_db()
    assert (request.due_on, request.extension_reason) == (date(2025, 4, 28), "r")
    assert "data-extended" in officer_client.get(url).content.decode()


# --- the completion date and the late flag (item 6) -------------------------------------------


def test_the_completion_date_can_be_given_and_a_late_answer_is_flagged(officer_client: Client) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="done", received_on=date(2025, 1, 10)
    )
    url = f"{REQUESTS}{request.pk}/"
    response = officer_client.patch(
        url, {"status": RequestStatus.COMPLETED, "closed_on": "2025-02-10"}, content_type="application/json"
    )
    assert response.status_code == 200, response.json()
    assert (response.json()["closed_on"], response.json()["late"]) == ("2025-02-10", False)  # on the due date
    response = officer_client.patch(url, {"closed_on": "2025-02-11"}, content_type="application/json")
    assert (response.json()["closed_on"], response.json()["late"]) == ("2025-02-11", True)  # corrected: a day late
    # a status change leaves a given date alone
    response = officer_client.patch(url, {"status": RequestStatus.REFUSED}, content_type="application/json")
    assert (response.json()["closed_on"], response.json()["late"]) == ("2025-02-11", True)
    page = officer_client.get(reverse("compliance:processing")).content.decode()
    assert f'data-request="{request.pk}" class="row-bad"' in page and "data-late" in page


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "completed", "closed_on": "9999-01-01"}, "closed_on"),
        ({"status": "completed", "closed_on": "2025-01-09"}, "closed_on"),  # before receipt
        ({"closed_on": "2025-01-20"}, "closed_on"),  # the request is open
        ({"status": "completed", "closed_on": "yesterday"}, "closed_on"),
    ],
)
def test_a_bad_completion_date_is_a_400_naming_it(officer_client: Client, body: dict[str, str], field: str) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="bad", received_on=date(2025, 1, 10)
    )
    response = officer_client.patch(f"{REQUESTS}{request.pk}/", body, content_type="application/json")
    assert response.status_code == 400 and list(response.json()) == [field], response.json()
    request.refresh_from_db()
    assert (request.status, request.closed_on) == (RequestStatus.OPEN, None)


def test_the_page_closes_a_request_on_a_given_date_and_refuses_a_future_one(officer_client: Client) -> None:
    request = SubjectRequest.objects.create(
        kind=RequestKind.ERASURE, subject_reference="pg", received_on=date(2025, 1, 10)
    )
    url = reverse("compliance:processing")
    future = (timezone.localdate() + timedelta(days=2)).isoformat()
    response = officer_client.post(
        url, {"action": "status", "request": request.pk, "status": "completed", "closed_on": future}
    )
    assert response.status_code == 400 and "closed_on: Cannot be in the future." in response.content.decode()
    request.refresh_from_db()
    assert request.closed_on is None
    response = officer_client.post(
        url, {"action": "status", "request": request.pk, "status": "completed", "closed_on": "2025-03-01"}
    )
    assert response.status_code == 302
    request.refresh_from_db()
    assert (request.status, request.closed_on, request.is_late()) == (RequestStatus.COMPLETED, date(2025, 3, 1), True)


@pytest.mark.django_db
def test_requests_of_a_period_are_the_open_ones_and_those_closed_in_it() -> None:
    def make(ref: str, received: date, closed: date | None) -> SubjectRequest:
        status = RequestStatus.OPEN if closed is None else RequestStatus.COMPLETED
        return SubjectRequest.objects.create(
            kind=RequestKind.ACCESS, subject_reference=ref, received_on=received, status=status, closed_on=closed
        )

    make("closed-before", date(2025, 11, 1), date(2025, 12, 31))
    make("closed-on-first-day", date(2025, 12, 1), date(2026, 1, 1))
    make("closed-in", date(2025, 12, 20), date(2026, 1, 15))
    make("received-and-closed-in", date(2026, 1, 5), date(2026, 1, 6))
    make("open", date(2025, 10, 1), None)
    make("received-after", date(2026, 2, 1), None)
    got = SubjectRequest.objects.of_period(date(2026, 1, 1), date(2026, 1, 31)).values_list(
        "subject_reference", flat=True
    )
    assert sorted(got) == ["closed-in", "closed-on-first-day", "open", "received-and-closed-in"]


# --- Art. 30: the controller's fields apart, processor records, no dropped fields (item 7) ----------


def test_the_controller_joint_controller_representative_and_dpo_are_each_their_own_field(
    officer_client: Client,
) -> None:
    body = _asset(
        joint_controller="Partner Research GmbH, Berlin, legal@partner.example",
        representative="EU Rep Ltd, Dublin",
        data_protection_officer="Dr. A. Officer, dpo@goodput.example",
    )
    response = officer_client.post(RECORDS, body, content_type="application/json")
    assert response.status_code == 201, response.json()
    asset = DataAsset.objects.get()
    assert (asset.controller, asset.joint_controller, asset.representative, asset.data_protection_officer) == (
        "Goodput Labs B.V., Amsterdam, privacy@goodput.example",
        "Partner Research GmbH, Berlin, legal@partner.example",
        "EU Rep Ltd, Dublin",
        "Dr. A. Officer, dpo@goodput.example",
    )
    assert response.json()["joint_controller"] == asset.joint_controller
    page = officer_client.get(reverse("compliance:processing")).content.decode()
    assert "Joint controller: Partner Research GmbH" in page and "DPO: Dr. A. Officer" in page


@pytest.mark.parametrize(
    ("url", "extra", "field"),
    [
        (RECORDS, {"joint_controler": "typo"}, "joint_controler"),
        (RECORDS, {"controller_contact": "the old name"}, "controller_contact"),
        (RECORDS, {"created_at": "2020-01-01T00:00:00Z"}, "created_at"),
        (REQUESTS, {"deadline": "2025-05-01"}, "deadline"),
        (REQUESTS, {"overdue": False}, "overdue"),
    ],
)
def test_a_field_the_api_would_drop_is_a_400_naming_it(
    officer_client: Client, url: str, extra: dict[str, Any], field: str
) -> None:
    body = _asset() if url == RECORDS else {"kind": "access", "subject_reference": "r", "received_on": "2025-01-01"}
    response = officer_client.post(url, {**body, **extra}, content_type="application/json")
    assert response.status_code == 400 and list(response.json()) == [field], response.json()
    assert not DataAsset.objects.exists() and not SubjectRequest.objects.exists()


def test_a_patch_with_an_unknown_field_changes_nothing(officer_client: Client, asset: DataAsset) -> None:
    response = officer_client.patch(
        f"{RECORDS}{asset.pk}/", {"purposes": "changed", "dpo": "x"}, content_type="application/json"
    )
    assert response.status_code == 400 and list(response.json()) == ["dpo"]
    asset.refresh_from_db()
    assert asset.purposes == "Fine-tuning the assistant"


PROCESSOR_RECORDS = "/api/v1/compliance/processing/processor-records/"


def _processor(**overrides: Any) -> dict[str, Any]:
    body = {
        "name": "Fine-tuning customer models",
        "processor": "Goodput Labs B.V., Amsterdam, privacy@goodput.example",
        "controllers": "Acme Bank N.V., Utrecht, privacy@acme.example",
        "representative": "",
        "data_protection_officer": "dpo@goodput.example",
        "processing_categories": "Storing customer corpora; running training jobs on them",
        "third_country_transfers": "None",
        "security_measures": "Per-tenant encryption keys; access by role",
    }
    return {**body, **overrides}


def test_processor_records_have_the_art_30_2_fields(officer_client: Client) -> None:
    response = officer_client.post(PROCESSOR_RECORDS, {}, content_type="application/json")
    assert response.status_code == 400
    assert set(response.json()) == {"name", "processor", "controllers", "processing_categories"}
    response = officer_client.post(PROCESSOR_RECORDS, _processor(), content_type="application/json")
    assert response.status_code == 201, response.json()
    record = ProcessorRecord.objects.get()
    assert record.controllers == "Acme Bank N.V., Utrecht, privacy@acme.example"
    response = officer_client.patch(
        f"{PROCESSOR_RECORDS}{record.pk}/", {"controller": "typo of controllers"}, content_type="application/json"
    )
    assert response.status_code == 400 and list(response.json()) == ["controller"]
    assert AuditEntry.objects.filter(model="processorrecord", object_id=str(record.pk)).exists()


def test_the_page_records_processing_as_processor(officer_client: Client) -> None:
    form = {f"processor-{k}": v for k, v in _processor().items()}
    response = officer_client.post(reverse("compliance:processing"), {"action": "processor", **form})
    assert response.status_code == 302
    page = officer_client.get(reverse("compliance:processing")).content.decode()
    assert f'data-processor-record="{ProcessorRecord.objects.get().pk}"' in page
    assert "Acme Bank N.V., Utrecht" in page
    bad = {**form, "processor-controllers": ""}
    response = officer_client.post(reverse("compliance:processing"), {"action": "processor", **bad})
    assert response.status_code == 400 and 'data-error-for="controllers"' in response.content.decode()


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_viewers_and_operators_cannot_read_processor_records(
    request: pytest.FixtureRequest, persona: str, db: None
) -> None:
    ProcessorRecord.objects.create(**_processor())
    client: Client = request.getfixturevalue(persona)
    assert client.get(PROCESSOR_RECORDS).status_code == 403
    assert client.post(PROCESSOR_RECORDS, _processor(name="x"), content_type="application/json").status_code == 403


def test_overdue_and_late_are_one_definition_on_the_home_the_page_the_api_and_the_pack(
    officer_client: Client,
) -> None:
    """One number, one definition: the querysets (home page, the page's tiles) and the row flags
    (the page's badges, the API, the pack) count the same requests."""
    today = timezone.localdate()

    def make(ref: str, days_ago: int, status: str = RequestStatus.OPEN, **fields: Any) -> None:
        SubjectRequest.objects.create(
            kind=RequestKind.ACCESS,
            subject_reference=ref,
            received_on=today - timedelta(days=days_ago),
            status=status,
            **fields,
        )

    make("overdue", 40)
    make("overdue-in-progress", 35, RequestStatus.IN_PROGRESS)
    make("extended", 40, extension_reason="complex", extension_notified_on=today - timedelta(days=30))
    make("fresh", 3)
    make("late", 70, RequestStatus.COMPLETED, closed_on=today - timedelta(days=1))
    make("in-time", 70, RequestStatus.REFUSED, closed_on=today - timedelta(days=60))
    rows = officer_client.get(REQUESTS).json()["results"]
    api = ({r["subject_reference"] for r in rows if r["overdue"]}, {r["subject_reference"] for r in rows if r["late"]})
    assert api == ({"overdue", "overdue-in-progress"}, {"late"})
    page = officer_client.get(reverse("compliance:processing"))
    assert (page.context["overdue_count"], page.context["late_count"]) == (2, 1)
    html = page.content.decode()
    assert (html.count("data-overdue>"), html.count("data-late>")) == (2, 1)
    assert compliance_status()["overdue_requests"] == 2
    assert compliance_status()["open_requests"] == page.context["open_count"] == 4
    pack = CompliancePack.objects.create(period_start=today - timedelta(days=1), period_end=today)
    doc = json.loads(zipfile.ZipFile(io.BytesIO(pack_service.build_pack(pack))).read("pack.json"))
    flags = doc["subject_requests"]
    assert (
        {r["subject_reference"] for r in flags if r["overdue"]},
        {r["subject_reference"] for r in flags if r["late"]},
    ) == api


def test_a_request_received_in_the_far_future_with_an_extension_is_a_400_not_a_500(officer_client: Client) -> None:
    body = {
        "kind": "access",
        "subject_reference": "far",
        "received_on": "9999-12-31",
        "extension_reason": "r",
        "extension_notified_on": "9999-12-31",
    }
    response = officer_client.post(REQUESTS, body, content_type="application/json")
    # Both dates are past the ten years ahead any client date may be (console.timebounds).
    assert response.status_code == 400 and sorted(response.json()) == ["extension_notified_on", "received_on"]
