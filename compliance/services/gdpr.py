"""GDPR records of processing (Art. 30) and data-subject requests (Arts. 12(3), 15-22)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from typing import Any

from django.db import transaction
from django.utils import timezone

from compliance.choices import OPEN_REQUEST_STATES, AuditAction, DataClass, LawfulBasis, RequestStatus
from compliance.models import DataAsset, SubjectRequest
from compliance.models.gdpr import one_month_after, received_on_error
from compliance.services import audit

# Fixed once a request is logged (issue 37): a mistake in them is a correction, a new request.
FIXED_AT_CREATION = ("kind", "received_on", "corrects", "correction_reason")
FIXED = (
    "Fixed once the request is logged: log a correction instead, a new request that corrects this one "
    "(the page's Correct, or POST with corrects and correction_reason)."
)

BALANCING_NOTE_REQUIRED = (
    "Legitimate interests (Art. 6(1)(f)) needs the balancing test: say why they are not overridden."
)


def balancing_note_error(lawful_basis: str, balancing_note: str) -> str | None:
    """The form's and the API's check (the database's constraint is the last line)."""
    if lawful_basis == LawfulBasis.LEGITIMATE_INTERESTS and not balancing_note.strip():
        return BALANCING_NOTE_REQUIRED
    return None


def request_errors(
    *,
    received_on: date | None,
    status: str,
    closed_on: date | None,
    extension_reason: str,
    extension_notified_on: date | None,
    today: date,
) -> dict[str, str]:
    """What is wrong with a data-subject request as it would be saved, by field (the form's and
    the API's check; the database's constraints are the last line):

    1. received: not in the future;
    2. an extension (Art. 12(3)): its reason and the date the data subject was told, both, told
       within the first month (on or after receipt, by the first due date) and not in the future;
    3. the completion date: only on a completed or refused request, on or after receipt, not in
       the future.
    """
    errors: dict[str, str] = {}
    if received_on is not None and (error := received_on_error(received_on, today)):
        return {"received_on": error}  # the other dates are judged against it: not yet
    reason = extension_reason.strip()
    if reason and extension_notified_on is None:
        errors["extension_notified_on"] = "An extension needs the date the data subject was told of it and why."
    elif extension_notified_on is not None and not reason:
        errors["extension_reason"] = "An extension needs its reason (Art. 12(3)): why two further months are needed."
    elif extension_notified_on is not None and received_on is not None:
        first_due = one_month_after(received_on)
        if extension_notified_on < received_on:
            errors["extension_notified_on"] = "Cannot be before the request was received."
        elif extension_notified_on > first_due:
            errors["extension_notified_on"] = (
                f"The data subject must be told within the first month, by {first_due:%Y-%m-%d} (Art. 12(3))."
            )
        elif extension_notified_on > today:
            errors["extension_notified_on"] = "Cannot be in the future."
    if closed_on is not None:
        if status in OPEN_REQUEST_STATES:
            errors["closed_on"] = "An open request has no completion date: complete or refuse it first."
        elif closed_on > today:
            errors["closed_on"] = "Cannot be in the future."
        elif received_on is not None and closed_on < received_on:
            errors["closed_on"] = "Cannot be before the request was received."
    return errors


def status_error(current: str | None, status: str) -> str | None:
    """Why a request cannot move from ``current`` (None: a new one) to ``status``: "corrected" is
    set by a correction only, and a corrected request stays so (its correction carries it on)."""
    if current == RequestStatus.CORRECTED and status != current:
        return "A corrected request stays closed: its correction carries it on."
    if status == RequestStatus.CORRECTED and current != status:
        return "Set by a correction only: log a correction of this request instead."
    return None


def correction_errors(corrects: SubjectRequest | None, *, received_on: date | None, reason: str) -> dict[str, str]:
    """What is wrong with a correction of ``corrects`` (the form's, the API's and log_request's
    check), by field:

    1. a correction names what it corrects and why: both or neither;
    2. a request is corrected once (a second correction corrects the first);
    3. its date of receipt is not later than the corrected one's: a later date would give the
       controller more time than the data subject was owed, which is what rewriting it did.
    """
    if corrects is None:
        return (
            {"correction_reason": "Only a correction has a reason: name the request it corrects."}
            if reason.strip()
            else {}
        )
    if not reason.strip():
        return {"correction_reason": "Say what was wrong with the request it corrects."}
    correction = corrects.correction
    if correction is not None:
        return {"corrects": f"Is corrected already, by #{correction.pk}: correct that one instead."}
    if received_on is not None and received_on > corrects.received_on:
        return {
            "received_on": f"Cannot be later than the corrected request's ({corrects.received_on:%Y-%m-%d}): "
            "the data subject is owed an answer from the date it was first received."
        }
    return {}


class RequestRefused(Exception):
    """A request log_request refuses (HTTP 400): ``errors`` by field, as correction_errors names them."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def log_request(
    *,
    today: date,
    assets: Iterable[DataAsset] = (),
    corrects: SubjectRequest | None = None,
    correction_reason: str = "",
    **values: Any,
) -> SubjectRequest:
    """Log a data-subject request (``values``: the model's fields, checked by request_errors). With
    ``corrects``, it is a correction of that request, in one transaction:

    1. lock the corrected request and check the correction (correction_errors: RequestRefused);
    2. create the new request, linked to it;
    3. close the corrected one as "corrected" today if it was still open (a closed one keeps its
       status and dates: it was answered as it was logged), and write its audit entry naming
       its correction and why (the new request's own creation is audited as every save is).
    """
    with transaction.atomic():
        if corrects is not None:
            corrects = SubjectRequest.objects.select_for_update().get(pk=corrects.pk)
        errors = correction_errors(corrects, received_on=values.get("received_on"), reason=correction_reason)
        if errors:
            raise RequestRefused(errors)
        request = SubjectRequest(**values, corrects=corrects, correction_reason=correction_reason.strip())
        request.save()
        request.assets.set(assets)
        if corrects is not None:
            before = {"status": corrects.status, "closed_on": corrects.closed_on, "corrected_by": None}
            if corrects.status in OPEN_REQUEST_STATES:
                corrects.status, corrects.closed_on = RequestStatus.CORRECTED, today
                # update(): one audit entry, below, that says why (a save would write a second)
                SubjectRequest.objects.filter(pk=corrects.pk).update(
                    status=corrects.status, closed_on=today, updated_at=timezone.now()
                )
            audit.record(
                AuditAction.UPDATE,
                obj=corrects,
                before=before,
                after={"status": corrects.status, "closed_on": corrects.closed_on, "corrected_by": request.pk},
                message=f"Corrected by #{request.pk} ({request.get_kind_display()}, received "
                f"{request.received_on:%Y-%m-%d}): {request.correction_reason}",
            )
    return request


def closing_date(status: str, *, given: date | None, current: date | None, today: date) -> date | None:
    """The completion date a request gets with ``status``: none while open; else the date given,
    else the one it already has, else today."""
    if status in OPEN_REQUEST_STATES:
        return None
    return given or current or today


def set_request_status(
    request: SubjectRequest, status: str, *, today: date, closed_on: date | None = None
) -> SubjectRequest:
    """Move a request to ``status``: a completed or refused one is closed on ``closed_on`` (by
    default the date it already has, else today); a reopened one is open again. The caller has
    checked the date (request_errors)."""
    current = request.closed_on if request.status not in OPEN_REQUEST_STATES else None
    request.status = status
    request.closed_on = closing_date(status, given=closed_on, current=current, today=today)
    request.save(update_fields=["status", "closed_on", "due_on", "updated_at"])
    return request


def extend_request(request: SubjectRequest, *, reason: str, notified_on: date) -> SubjectRequest:
    """Record the Art. 12(3) extension: two further months, told to the data subject on
    ``notified_on`` (checked by request_errors); the due date moves with it."""
    request.extension_reason = reason.strip()
    request.extension_notified_on = notified_on
    request.save(update_fields=["extension_reason", "extension_notified_on", "due_on", "updated_at"])
    return request


_CONTROLLER = "The platform operator (name and contact details in the organisation's privacy notice)"
_DPO = "The platform operator's data protection officer (contact details in the privacy notice)"
_SECURITY = (
    "Single sign-on with roles (viewers and operators cannot read compliance records), hashed API "
    "tokens, TLS in transit, encrypted database volumes, an append-only audit log."
)

# The console's own records of processing (ensure_console_assets). Names are the keys: an officer
# may edit the texts afterwards and a second call leaves them as they are.
CONSOLE_ASSETS: dict[str, dict[str, str]] = {
    "Console: GPU telemetry": {
        "data_class": DataClass.TELEMETRY,
        "purposes": "Operating the GPU fleet: health, utilisation, power and goodput dashboards, fault detection.",
        "data_subject_categories": "Platform staff and customers whose job names or hostnames appear in labels.",
        "personal_data_categories": "Job and host identifiers that may name a person or team; no content.",
        "erasure_time_limit": "Raw samples after RAW_RETENTION_DAYS; rollups after their own settings.",
        "lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS,
        "balancing_note": "Needed to run the service safely; pseudonymous identifiers only, short retention, "
        "no profiling of individuals.",
    },
    "Console: serving samples": {
        "data_class": DataClass.SERVING_SAMPLES,
        "purposes": "Latency SLOs and error budgets of inference endpoints.",
        "data_subject_categories": "None directly: endpoint-level metrics, no prompts or outputs.",
        "personal_data_categories": "Endpoint and model names; no request content.",
        "erasure_time_limit": "After RAW_RETENTION_DAYS (daily partitions dropped whole).",
        "lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS,
        "balancing_note": "Aggregated metrics without request content; the intrusion is negligible.",
    },
    "Console: incidents": {
        "data_class": DataClass.INCIDENTS,
        "purposes": "Incident response, postmortems and reliability reporting.",
        "data_subject_categories": "Platform staff (responders, commanders, note authors).",
        "personal_data_categories": "User names, notes written during incidents, timestamps of actions.",
        "erasure_time_limit": "Resolved incidents 730 days after resolution unless a legal hold applies.",
        "lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS,
        "balancing_note": "Staff expect incident records as part of their role; access is limited to the console's "
        "users and records are deleted after two years.",
    },
    "Console: audit log": {
        "data_class": DataClass.AUDIT,
        "purposes": "Accountability for changes to compliance records, users, roles and tokens.",
        "data_subject_categories": "Console users.",
        "personal_data_categories": "User names, remote addresses, before and after values of changed records.",
        "erasure_time_limit": "2555 days (seven years) unless a legal hold applies.",
        "lawful_basis": LawfulBasis.LEGAL_OBLIGATION,
        "balancing_note": "",
    },
}


def ensure_console_assets() -> list[DataAsset]:
    """Create the records of processing for the console's own data where missing; return those
    created (an existing record of the same name is left as its officer wrote it)."""
    created = []
    with transaction.atomic():
        for name, fields in CONSOLE_ASSETS.items():
            asset, made = DataAsset.objects.get_or_create(
                name=name,
                defaults={
                    **fields,
                    "controller": _CONTROLLER,
                    "data_protection_officer": _DPO,
                    "recipients": "The console's operators; no third parties.",
                    "third_country_transfers": "None.",
                    "security_measures": _SECURITY,
                },
            )
            if made:
                created.append(asset)
    return created
