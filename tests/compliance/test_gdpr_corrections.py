"""A data-subject request cannot be rewritten after the fact (issue 37, item 9): its ``kind`` and
``received_on`` are fixed once logged, on the API (400 naming the field), the page and the admin;
a mistake is corrected by a new request linked to the old one, shown both ways in the register
(the page and the API) and in the pack (pack.json, its CSV and its PDF), and audited."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from datetime import date, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pypdf import PdfReader

from compliance.choices import RequestKind, RequestStatus
from compliance.models import AuditEntry, CompliancePack, SubjectRequest
from compliance.services import gdpr
from compliance.services import pack as pack_service
from compliance.services.status import compliance_status

pytestmark = pytest.mark.django_db

REQUESTS = "/api/v1/compliance/processing/requests/"


def _today() -> date:
    return timezone.localdate()


@pytest.fixture
def overdue_erasure() -> SubjectRequest:
    """An erasure received 40 days ago and still open: overdue."""
    return SubjectRequest.objects.create(
        kind=RequestKind.ERASURE, subject_reference="DSR-40", received_on=_today() - timedelta(days=40)
    )


def _patch(client: Client, request: SubjectRequest, body: dict[str, Any]) -> Any:
    return client.patch(f"{REQUESTS}{request.pk}/", body, content_type="application/json")


def _as_stored(request: SubjectRequest) -> tuple[str, date, bool]:
    stored = SubjectRequest.objects.get(pk=request.pk)
    return stored.kind, stored.received_on, stored.is_overdue(_today())


# --- fixed at creation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"received_on": str(date.today())},
        {"kind": RequestKind.ACCESS},
        {"kind": RequestKind.ACCESS, "received_on": str(date.today()), "notes": "in time now"},
    ],
    ids=["received_on", "kind", "both"],
)
def test_the_api_refuses_to_rewrite_kind_or_received_on_with_a_400_naming_each(
    officer_client: Client, overdue_erasure: SubjectRequest, body: dict[str, Any]
) -> None:
    """The finding as reported: received_on moved to today turned the overdue erasure into one in
    time, and an erasure could become an access request. Refused, not silently dropped."""
    response = _patch(officer_client, overdue_erasure, body)
    assert response.status_code == 400
    assert set(response.json()) == {k for k in body if k in ("kind", "received_on")}
    assert all("Fixed once the request is logged" in v[0] for v in response.json().values())
    assert _as_stored(overdue_erasure) == (RequestKind.ERASURE, _today() - timedelta(days=40), True)
    assert SubjectRequest.objects.get().notes == ""  # nothing of the body was written


def test_the_same_kind_and_date_sent_again_change_nothing_and_pass(
    officer_client: Client, overdue_erasure: SubjectRequest
) -> None:
    body = {"kind": "erasure", "received_on": str(overdue_erasure.received_on), "notes": "called back"}
    response = _patch(officer_client, overdue_erasure, body)
    assert response.status_code == 200 and response.json()["notes"] == "called back"


def test_the_page_has_no_way_to_rewrite_them(officer_client: Client, overdue_erasure: SubjectRequest) -> None:
    url = reverse("compliance:processing")
    extra = {"kind": RequestKind.ACCESS, "received_on": str(_today())}
    officer_client.post(url, {"action": "status", "request": overdue_erasure.pk, "status": "in_progress", **extra})
    officer_client.post(
        url,
        {
            "action": "extension",
            "request": overdue_erasure.pk,
            "extension_reason": "r",
            "extension_notified_on": str(_today()),  # past the first month: refused anyway
            **extra,
        },
    )
    assert _as_stored(overdue_erasure) == (RequestKind.ERASURE, _today() - timedelta(days=40), True)
    assert SubjectRequest.objects.count() == 1


def test_the_admin_shows_them_read_only(admin_client: Client, overdue_erasure: SubjectRequest) -> None:
    url = f"/admin/compliance/subjectrequest/{overdue_erasure.pk}/change/"
    html = admin_client.get(url).content.decode()
    assert 'name="kind"' not in html and 'name="received_on"' not in html and 'name="corrects"' not in html
    response = admin_client.post(
        url,
        {
            "kind": RequestKind.ACCESS,
            "received_on": str(_today()),
            "subject_reference": "DSR-40",
            "status": "open",
            "extension_reason": "",
            "extension_notified_on": "",
            "closed_on": "",
            "notes": "seen",
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    assert _as_stored(overdue_erasure) == (RequestKind.ERASURE, _today() - timedelta(days=40), True)
    assert SubjectRequest.objects.get().notes == "seen"
    # Nor may the admin set "corrected" by hand: only a correction does.
    refused = admin_client.post(url, {"subject_reference": "DSR-40", "status": "corrected", "notes": "", "_save": "1"})
    assert refused.status_code == 200 and "Set by a correction only" in refused.content.decode()


# --- a correction is a new request, linked both ways ---------------------------------------------


def _correction(original: SubjectRequest, **overrides: Any) -> dict[str, Any]:
    body = {
        "kind": RequestKind.ERASURE,
        "subject_reference": original.subject_reference,
        "received_on": str(original.received_on),
        "corrects": original.pk,
        "correction_reason": "Logged as access; the e-mail asks for erasure.",
    }
    return {**body, **overrides}


@pytest.fixture
def access_by_mistake() -> SubjectRequest:
    return SubjectRequest.objects.create(
        kind=RequestKind.ACCESS, subject_reference="DSR-9", received_on=_today() - timedelta(days=10)
    )


def test_a_correction_over_the_api_is_a_new_request_linked_both_ways_and_audited(
    officer_client: Client, access_by_mistake: SubjectRequest
) -> None:
    created = officer_client.post(REQUESTS, _correction(access_by_mistake), content_type="application/json")
    assert created.status_code == 201, created.json()
    new = created.json()
    assert (new["kind"], new["corrects"], new["corrected_by"], new["status"]) == (
        "erasure",
        access_by_mistake.pk,
        None,
        "open",
    )
    assert new["due_on"] == str(access_by_mistake.due_on)  # the same receipt, the same deadline
    old = officer_client.get(f"{REQUESTS}{access_by_mistake.pk}/").json()
    assert (old["kind"], old["corrected_by"], old["status"], old["closed_on"]) == (
        "access",
        new["id"],
        "corrected",
        str(_today()),
    )
    assert (old["overdue"], old["late"]) == (False, False)  # closed unanswered, carried on by the correction
    entry = AuditEntry.objects.filter(model="subjectrequest", object_id=str(access_by_mistake.pk)).latest("pk")
    assert (entry.before["status"], entry.after["status"], entry.after["corrected_by"]) == (
        "open",
        "corrected",
        new["id"],
    )
    assert entry.message.startswith(f"Corrected by #{new['id']} (Erasure (Art. 17), received ")
    assert AuditEntry.objects.filter(model="subjectrequest", object_id=str(new["id"]), action="create").exists()


def test_the_links_are_fixed_once_logged(officer_client: Client, access_by_mistake: SubjectRequest) -> None:
    new = officer_client.post(REQUESTS, _correction(access_by_mistake), content_type="application/json").json()
    other = SubjectRequest.objects.create(kind="access", subject_reference="x", received_on=_today())
    unlinked = _patch(officer_client, SubjectRequest.objects.get(pk=new["id"]), {"corrects": other.pk})
    assert unlinked.status_code == 400 and set(unlinked.json()) == {"corrects"}
    reason = _patch(officer_client, SubjectRequest.objects.get(pk=new["id"]), {"correction_reason": "other"})
    assert reason.status_code == 400 and set(reason.json()) == {"correction_reason"}
    back = _patch(officer_client, access_by_mistake, {"corrected_by": None})
    assert back.status_code == 400 and set(back.json()) == {"corrected_by"}  # read-only: the server sets it


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"received_on": str(date.today())}, "received_on"),  # later than the original: more time
        ({"correction_reason": ""}, "correction_reason"),
        ({"corrects": None}, "correction_reason"),  # a reason without what it corrects
    ],
    ids=["later-date", "no-reason", "no-original"],
)
def test_a_bad_correction_is_a_400_naming_the_field_and_writes_nothing(
    officer_client: Client, access_by_mistake: SubjectRequest, overrides: dict[str, Any], field: str
) -> None:
    response = officer_client.post(
        REQUESTS, _correction(access_by_mistake, **overrides), content_type="application/json"
    )
    assert response.status_code == 400 and field in response.json(), response.json()
    assert SubjectRequest.objects.count() == 1
    assert SubjectRequest.objects.get().status == RequestStatus.OPEN


def test_a_request_is_corrected_once_and_a_correction_may_move_the_date_earlier(
    officer_client: Client, access_by_mistake: SubjectRequest
) -> None:
    earlier = str(access_by_mistake.received_on - timedelta(days=3))
    first = officer_client.post(
        REQUESTS, _correction(access_by_mistake, received_on=earlier), content_type="application/json"
    )
    assert first.status_code == 201 and first.json()["received_on"] == earlier
    again = officer_client.post(REQUESTS, _correction(access_by_mistake), content_type="application/json")
    assert again.status_code == 400 and f"by #{first.json()['id']}" in again.json()["corrects"][0]


def test_corrected_is_set_by_a_correction_only_and_stays(
    officer_client: Client, access_by_mistake: SubjectRequest, overdue_erasure: SubjectRequest
) -> None:
    by_hand = _patch(officer_client, overdue_erasure, {"status": "corrected"})
    assert by_hand.status_code == 400 and "Set by a correction only" in by_hand.json()["status"][0]
    officer_client.post(REQUESTS, _correction(access_by_mistake), content_type="application/json")
    reopened = _patch(officer_client, access_by_mistake, {"status": "open"})
    assert reopened.status_code == 400 and "stays closed" in reopened.json()["status"][0]
    page = officer_client.post(
        reverse("compliance:processing"), {"action": "status", "request": access_by_mistake.pk, "status": "open"}
    )
    assert page.status_code == 400
    assert SubjectRequest.objects.get(pk=access_by_mistake.pk).status == RequestStatus.CORRECTED


def test_a_correction_keeps_an_overdue_request_overdue(officer_client: Client, overdue_erasure: SubjectRequest) -> None:
    """What the rewrite did cannot be done by a correction: the date cannot move later, so the
    correction is as overdue as the request it corrects."""
    later = officer_client.post(
        REQUESTS, _correction(overdue_erasure, received_on=str(_today())), content_type="application/json"
    )
    assert later.status_code == 400 and "received_on" in later.json()
    body = _correction(overdue_erasure, kind=RequestKind.RESTRICTION)
    assert officer_client.post(REQUESTS, body, content_type="application/json").status_code == 201
    assert compliance_status()["overdue_requests"] == 1
    assert [r.kind for r in SubjectRequest.objects.overdue(_today())] == [RequestKind.RESTRICTION]
    assert not SubjectRequest.objects.late().exists()  # the corrected one is not "answered late" either


def test_the_page_logs_a_correction_and_shows_the_link_both_ways(
    officer_client: Client, access_by_mistake: SubjectRequest
) -> None:
    url = reverse("compliance:processing")
    page = officer_client.get(url).content.decode()
    assert f'data-correct="{access_by_mistake.pk}"' in page
    response = officer_client.post(
        url,
        {
            "action": "correct",
            "request": access_by_mistake.pk,
            "kind": RequestKind.ERASURE,
            "received_on": str(access_by_mistake.received_on),
            "correction_reason": "It asks for erasure.",
        },
    )
    assert response.status_code == 302
    new = SubjectRequest.objects.get(corrects=access_by_mistake)
    assert (new.kind, new.subject_reference, new.received_on) == ("erasure", "DSR-9", access_by_mistake.received_on)
    html = officer_client.get(url).content.decode()
    assert f'data-field="corrects">corrects #{access_by_mistake.pk}<' in html
    assert f'data-field="corrected-by">corrected by #{new.pk}<' in html
    assert "It asks for erasure." in html
    assert f'data-correct="{access_by_mistake.pk}"' not in html  # corrected once

    later = officer_client.post(
        url,
        {
            "action": "correct",
            "request": new.pk,
            "kind": RequestKind.ERASURE,
            "received_on": str(_today()),
            "correction_reason": "r",
        },
    )
    assert later.status_code == 400 and "received_on: Cannot be later" in later.content.decode()


def test_the_pack_shows_the_link_both_ways(access_by_mistake: SubjectRequest) -> None:
    new = gdpr.log_request(
        today=_today(),
        corrects=access_by_mistake,
        correction_reason="It asks for erasure.",
        kind=RequestKind.ERASURE,
        subject_reference="DSR-9",
        received_on=access_by_mistake.received_on,
    )
    pack = CompliancePack.objects.create(period_start=_today() - timedelta(days=1), period_end=_today())
    archive = zipfile.ZipFile(io.BytesIO(pack_service.build_pack(pack)))
    rows = {r["id"]: r for r in json.loads(archive.read("pack.json"))["subject_requests"]}
    assert (rows[access_by_mistake.pk]["corrected_by"], rows[access_by_mistake.pk]["corrects"]) == (new.pk, None)
    assert (rows[new.pk]["corrects"], rows[new.pk]["corrected_by"]) == (access_by_mistake.pk, None)
    assert rows[new.pk]["correction_reason"] == "It asks for erasure."
    assert rows[access_by_mistake.pk]["status"] == "corrected"
    sheet = {r["id"]: r for r in csv.DictReader(io.StringIO(archive.read("subject_requests.csv").decode()))}
    assert (sheet[str(access_by_mistake.pk)]["corrected_by"], sheet[str(new.pk)]["corrects"]) == (
        str(new.pk),
        str(access_by_mistake.pk),
    )
    text = " ".join(page.extract_text() for page in PdfReader(io.BytesIO(archive.read("pack.pdf"))).pages)
    text = " ".join(text.split())
    assert f"corrected by #{new.pk}" in text and f"corrects #{access_by_mistake.pk}" in text
