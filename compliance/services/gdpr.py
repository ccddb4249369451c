"""GDPR records of processing (Art. 30) and data-subject requests (Art. 12(3), 15, 17, 21)."""

from __future__ import annotations

from datetime import date

from django.db import transaction

from compliance.choices import OPEN_REQUEST_STATES, DataClass, LawfulBasis
from compliance.models import DataAsset, SubjectRequest

BALANCING_NOTE_REQUIRED = (
    "Legitimate interests (Art. 6(1)(f)) needs the balancing test: say why they are not overridden."
)


def balancing_note_error(lawful_basis: str, balancing_note: str) -> str | None:
    """The form's and the API's check (the database's constraint is the last line)."""
    if lawful_basis == LawfulBasis.LEGITIMATE_INTERESTS and not balancing_note.strip():
        return BALANCING_NOTE_REQUIRED
    return None


def set_request_status(request: SubjectRequest, status: str, *, today: date) -> SubjectRequest:
    """Move a request to ``status``; a completed or refused one is closed today, a reopened one
    is open again."""
    request.status = status
    request.closed_on = None if status in OPEN_REQUEST_STATES else (request.closed_on or today)
    request.save(update_fields=["status", "closed_on", "due_on", "updated_at"])
    return request


_CONTROLLER = "The platform operator's data protection officer (see the organisation's privacy notice)"
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
                    "controller_contact": _CONTROLLER,
                    "recipients": "The console's operators; no third parties.",
                    "third_country_transfers": "None.",
                    "security_measures": _SECURITY,
                },
            )
            if made:
                created.append(asset)
    return created
