"""The compliance pack's zip: its files, its manifest, its PDF and JSON, and the task that builds it.

Records are created directly (summaries and audit entries too), over a period in the past so
that entries the app writes now fall outside it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from pypdf import PdfReader

from compliance.choices import (
    DataClass,
    LawfulBasis,
    Modality,
    PackStatus,
    RequestKind,
    SizeUnit,
    SourceCategory,
)
from compliance.models import (
    AuditEntry,
    CompliancePack,
    CrawledDomain,
    DataAsset,
    Dataset,
    GpaiModel,
    LegalHold,
    Lineage,
    ProcessorRecord,
    RetentionPolicy,
    RetentionRun,
    SubjectRequest,
    SummaryVersion,
)
from compliance.pack.tasks import build_compliance_pack
from compliance.services import pack as pack_service

START, END = date(2026, 1, 1), date(2026, 1, 31)
EXPECTED_FILES = [
    "pack.json",
    "pack.pdf",
    "models.csv",
    "datasets.csv",
    "records_of_processing.csv",
    "processor_records.csv",
    "subject_requests.csv",
    "crawled_domains.csv",
    "retention_policies.csv",
    "retention_runs.csv",
    "legal_holds.csv",
    "recovery_register.csv",
    "restore_tests.csv",
    "audit.csv",
    "manifest.json",
]
SUMMARY_TEXT = """# Training-content summary: Aurora 2.0

## 1. General information
- Provider: Example AI

## 2. List of data sources
- Wikipedia dump (public)

## 3. Data processing aspects
- to be provided
"""


def local(day: date, at: time) -> datetime:
    return datetime.combine(day, at, tzinfo=timezone.get_current_timezone())


def audit_entry(at: datetime, message: str) -> AuditEntry:
    return AuditEntry.objects.create(
        at=at, actor="cora", action="update", app_label="compliance", model="gpaimodel", message=message
    )


def make_pack_records() -> dict[str, Any]:
    """A model with a published summary, a dataset, a record of processing, an overdue request,
    a policy with two runs, two legal holds, and audit entries on and just past the period's edges."""
    model = GpaiModel.objects.create(
        name="Aurora",
        version="2.0",
        provider_name="Example AI",
        modalities=[Modality.TEXT],
        training_compute_flop=Decimal("3e25"),
    )
    dataset = Dataset.objects.create(
        name="Wikipedia dump",
        source_category=SourceCategory.PUBLIC,
        modality=Modality.TEXT,
        size=Decimal("4000000000"),
        size_unit=SizeUnit.TOKENS,
    )
    Lineage.objects.create(model=model, dataset=dataset)
    summary = SummaryVersion.objects.create(
        model=model,
        version=1,
        document={"sections": ["1", "2", "3"]},
        text=SUMMARY_TEXT,
        sha256=hashlib.sha256(SUMMARY_TEXT.encode()).hexdigest(),
        last_update=date(2026, 1, 10),
    )
    DataAsset.objects.create(
        name="Training corpora",
        data_class=DataClass.TRAINING_CORPUS,
        controller="Example AI SE, Munich",
        data_protection_officer="dpo@example.com",
        purposes="Training general-purpose models",
        data_subject_categories="Authors of web pages",
        personal_data_categories="Names in text",
        erasure_time_limit="Until the model is retired",
        security_measures="Encrypted at rest",
        lawful_basis=LawfulBasis.LEGITIMATE_INTERESTS,
        balancing_note="Public web text; opt-outs honoured",
    )
    request = SubjectRequest.objects.create(kind=RequestKind.ERASURE, subject_reference="DSR-7", received_on=START)
    policy = RetentionPolicy.objects.create(data_class=DataClass.TELEMETRY, days=30)
    older = RetentionRun.objects.create(
        data_class=DataClass.TELEMETRY, policy=policy, cutoff=local(START, time(3)), affected=5,
        started_at=local(START, time(3)), finished_at=local(START, time(3)), triggered_by="beat",
    )  # fmt: skip
    latest = RetentionRun.objects.create(
        data_class=DataClass.TELEMETRY, policy=policy, cutoff=local(END, time(3)), affected=9, held=2,
        started_at=local(END, time(3)), finished_at=local(END, time(3)), triggered_by="beat",
    )  # fmt: skip
    active = LegalHold.objects.create(name="Litigation 42", data_class=DataClass.INCIDENTS, reason="court order")
    released = LegalHold.objects.create(
        name="Old hold",
        data_class=DataClass.AUDIT,
        reason="inquiry",
        released_at=local(END - timedelta(days=60), time(9)),
    )
    inside = [
        audit_entry(local(START, time(0, 0, 0)), "first instant"),
        audit_entry(local(END, time(23, 59, 59)), "last second"),
    ]
    outside = [
        audit_entry(local(START, time(0)) - timedelta(seconds=1), "the day before"),
        audit_entry(local(END + timedelta(days=1), time(0)), "the day after"),
    ]
    return {
        "model": model,
        "summary": summary,
        "request": request,
        "older_run": older,
        "latest_run": latest,
        "active_hold": active,
        "released_hold": released,
        "inside": inside,
        "outside": outside,
    }


@pytest.fixture
def records(db: None) -> dict[str, Any]:
    return make_pack_records()


def built_zip(content: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(content))


def build(progress: Any = None) -> bytes:
    pack = CompliancePack.objects.create(period_start=START, period_end=END)
    return pack_service.build_pack(pack, progress=progress)


def test_the_zip_holds_every_file_in_a_fixed_order_with_the_manifest_last(records: dict[str, Any]) -> None:
    archive = built_zip(build())
    assert archive.namelist() == EXPECTED_FILES
    assert archive.testzip() is None


def test_the_manifest_sums_match_every_file(records: dict[str, Any]) -> None:
    archive = built_zip(build())
    manifest = json.loads(archive.read("manifest.json"))
    listed = {f["name"]: f for f in manifest["files"]}
    assert list(listed) == EXPECTED_FILES[:-1]
    for name, entry in listed.items():
        data = archive.read(name)
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), name


def test_the_pdf_has_the_section_headings_the_model_and_its_summary_hash(records: dict[str, Any]) -> None:
    archive = built_zip(build())
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(archive.read("pack.pdf"))).pages)
    for heading in (
        "1. General-purpose models",
        "2. Datasets",
        "3. Records of processing (GDPR Art. 30)",
        "4. Retention policies and their last runs",
        "5. Legal holds",
        "6. Data-subject requests of the period",
        "7. Audit extract",
        "8. Recovery register",
    ):
        assert heading in text
    assert "Aurora 2.0" in text
    assert records["summary"].sha256 in text
    # The published text itself, verbatim: its own headings and lines.
    assert "3. Data processing aspects" in text
    assert "Wikipedia dump (public)" in text
    assert "Litigation 42" in text and "DSR-7" in text


def test_pack_json_holds_the_audit_extract_for_exactly_the_period(records: dict[str, Any]) -> None:
    doc = json.loads(built_zip(build()).read("pack.json"))
    assert doc["period"] == {"start": "2026-01-01", "end": "2026-01-31"}
    assert [e["id"] for e in doc["audit"]] == [e.pk for e in records["inside"]]
    assert [e["message"] for e in doc["audit"]] == ["first instant", "last second"]
    rows = list(csv.DictReader(io.StringIO(built_zip(build()).read("audit.csv").decode())))
    assert [int(r["id"]) for r in rows] == [e.pk for e in records["inside"]]


def test_pack_json_holds_models_summaries_retention_holds_and_open_requests(records: dict[str, Any]) -> None:
    doc = json.loads(built_zip(build()).read("pack.json"))
    [model] = doc["models"]
    assert (model["name"], model["version"], model["systemic_risk"]) == ("Aurora", "2.0", True)
    assert model["datasets"] == ["Wikipedia dump"]
    [summary] = model["summaries"]
    assert summary == {
        "version": 1,
        "last_update": "2026-01-10",
        "published_at": summary["published_at"],
        "sha256": records["summary"].sha256,
        "document": {"sections": ["1", "2", "3"]},
        "text": SUMMARY_TEXT,
    }
    [policy] = doc["retention_policies"]
    assert policy["enforced"] is True
    assert policy["last_run"]["id"] == records["latest_run"].pk
    assert (policy["last_run_affected"], policy["last_run_held"]) == (9, 2)
    assert [r["id"] for r in doc["retention_runs"]] == [records["older_run"].pk, records["latest_run"].pk]
    # The hold released before the period is left out; the active one is in.
    assert [h["name"] for h in doc["legal_holds"]] == ["Litigation 42"]
    [request] = doc["subject_requests"]
    assert (request["subject_reference"], request["due_on"], request["overdue"]) == ("DSR-7", "2026-02-01", True)
    [record] = doc["records_of_processing"]
    assert record["lawful_basis"] == LawfulBasis.LEGITIMATE_INTERESTS


def test_progress_is_reported_in_order_up_to_100(records: dict[str, Any]) -> None:
    seen: list[tuple[int, str]] = []
    build(progress=lambda percent, step: seen.append((percent, step)))
    percents = [p for p, _ in seen]
    assert percents == sorted(percents)
    assert percents[0] < 50 and percents[-1] == 100
    assert all(step for _, step in seen)


def test_the_task_stores_the_zip_and_marks_the_pack_done(records: dict[str, Any]) -> None:
    pack = CompliancePack.objects.create(period_start=START, period_end=END)
    assert build_compliance_pack(pack.pk) == PackStatus.DONE
    pack.refresh_from_db()
    content = b"".join(pack_service.zip_chunks(pack.pk))
    assert (pack.status, pack.progress, pack.step) == (PackStatus.DONE, 100, "Done")
    assert pack.sha256 == hashlib.sha256(content).hexdigest()
    assert pack.size == len(content)
    assert pack.finished_at is not None
    assert built_zip(content).namelist() == EXPECTED_FILES
    # A redelivered message finds the pack done and leaves it as it is.
    assert build_compliance_pack(pack.pk) == "skipped"


def test_a_failing_build_marks_the_pack_failed_with_the_error(
    records: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(pack: CompliancePack, out: Any, *, progress: Any = None) -> None:
        progress(5, "Reading")
        out.write(b"PK half a zip")
        raise ValueError("the PDF library fell over")

    monkeypatch.setattr("compliance.pack.tasks.write_pack", broken)
    pack = CompliancePack.objects.create(period_start=START, period_end=END)
    assert build_compliance_pack(pack.pk) == PackStatus.FAILED
    pack.refresh_from_db()
    assert pack.status == PackStatus.FAILED
    assert pack.error == "ValueError: the PDF library fell over"
    assert pack.finished_at is not None and not pack.chunks.exists()


def test_the_pdf_caps_the_audit_table_and_says_the_csv_holds_all(
    records: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pack_service, "PDF_AUDIT_ROWS", 1)
    archive = built_zip(build())
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(archive.read("pack.pdf"))).pages)
    assert "audit.csv holds all 2" in text
    assert "first instant" in text and "last second" not in text
    assert len(list(csv.DictReader(io.StringIO(archive.read("audit.csv").decode())))) == 2


def test_every_request_of_the_period_is_in_the_pack_closed_ones_too(records: dict[str, Any]) -> None:
    """Item 6: the requests before the controller during the period, with their completion dates,
    extensions and late flags; one closed before the period began is not of it."""
    late = SubjectRequest.objects.create(
        kind=RequestKind.ACCESS,
        subject_reference="DSR-late",
        received_on=date(2025, 11, 20),
        status="completed",
        closed_on=date(2026, 1, 5),
        extension_reason="Twelve systems to search",
        extension_notified_on=date(2025, 12, 1),
    )
    SubjectRequest.objects.create(
        kind=RequestKind.RECTIFICATION,
        subject_reference="DSR-before",
        received_on=date(2025, 11, 1),
        status="completed",
        closed_on=date(2025, 12, 1),
    )
    archive = built_zip(build())
    doc = json.loads(archive.read("pack.json"))
    requests = {r["subject_reference"]: r for r in doc["subject_requests"]}
    assert set(requests) == {"DSR-7", "DSR-late"}
    assert requests["DSR-late"] | {"id": 0, "assets": []} == {
        "id": 0,
        "kind": "access",
        "subject_reference": "DSR-late",
        "received_on": "2025-11-20",
        "due_on": "2026-02-20",  # 20 December + two months: extended, and answered in time
        "extended": True,
        "extension_notified_on": "2025-12-01",
        "extension_reason": "Twelve systems to search",
        "overdue": False,
        "status": "completed",
        "closed_on": "2026-01-05",
        "late": False,
        "assets": [],
        "corrects": None,
        "corrected_by": None,
        "correction_reason": "",
    }
    assert late.due_on == date(2026, 2, 20)
    rows = list(csv.DictReader(io.StringIO(archive.read("subject_requests.csv").decode())))
    assert {r["subject_reference"]: (r["closed_on"], r["late"]) for r in rows} == {
        "DSR-7": ("", "no"),
        "DSR-late": ("2026-01-05", "no"),
    }
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(archive.read("pack.pdf"))).pages)
    assert "DSR-late" in text and "DSR-before" not in text


def test_the_pack_keeps_what_the_public_summary_leaves_out_and_the_processor_records(
    records: dict[str, Any],
) -> None:
    """Items 7 and 9: licences and per-domain bytes stay in the pack (the internal register), and
    the records as processor sit beside those as controller."""
    crawl = Dataset.objects.create(
        name="web-crawl", source_category=SourceCategory.CRAWLED, modality=Modality.TEXT, licence="Mixed; see terms"
    )
    CrawledDomain.objects.create(dataset=crawl, domain="news.example", bytes=123_456)
    ProcessorRecord.objects.create(
        name="Customer fine-tuning",
        processor="Example AI SE",
        controllers="Acme Bank N.V.",
        processing_categories="Training on customer corpora",
    )
    archive = built_zip(build())
    domains = list(csv.DictReader(io.StringIO(archive.read("crawled_domains.csv").decode())))
    assert domains == [{"dataset": "web-crawl", "domain": "news.example", "bytes": "123456"}]
    datasets = {r["name"]: r for r in csv.DictReader(io.StringIO(archive.read("datasets.csv").decode()))}
    assert datasets["web-crawl"]["licence"] == "Mixed; see terms"
    [processor] = json.loads(archive.read("pack.json"))["processor_records"]
    assert (processor["name"], processor["controllers"]) == ("Customer fine-tuning", "Acme Bank N.V.")
    [controller] = json.loads(archive.read("pack.json"))["records_of_processing"]
    assert (controller["controller"], controller["data_protection_officer"]) == (
        "Example AI SE, Munich",
        "dpo@example.com",
    )
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(archive.read("pack.pdf"))).pages)
    assert "Records as processor (Art. 30(2))" in text and "Customer fine-tuning" in text
