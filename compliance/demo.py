"""Compliance records for `make demo`, so an officer's pages show the register, a summary to
publish, records of processing, requests, retention and holds from the first start.

A general-purpose model trained on six datasets across the template's source categories (one
crawled, with per-domain byte counts), lineage from a simulated training job when one exists, the
console's own records of processing, two data-subject requests (one overdue), an attestation for
inference content and a legal hold. Some answers are left blank on purpose: the summary shows
them as "to be provided". Idempotent: everything is keyed by name, and a second start adds
nothing and leaves what an officer changed alone.
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from django.db import transaction

from compliance.choices import (
    DataClass,
    LawfulBasis,
    Modality,
    RequestKind,
    SizeUnit,
    SourceCategory,
    WeightsClassification,
)
from compliance.models import Dataset, GpaiModel, LegalHold, Lineage, RetentionPolicy, SubjectRequest
from compliance.services import gdpr, register

MODEL = ("goodput-demo-7b", "1.0")

DATASETS: dict[str, dict[str, object]] = {
    "demo-web-crawl-2026": {
        "source_category": SourceCategory.CRAWLED,
        "modality": Modality.TEXT,
        "size": Decimal("1800000000000"),
        "size_unit": SizeUnit.TOKENS,
        "description": "Public web pages in 14 languages",
        "personal_data": True,
        "lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS,
        "tdm_opt_outs": "robots.txt and the TDM Reservation Protocol honoured at crawl time",
        "crawler_names": "GoodputBot/2.1",
        "crawl_purpose": "Pre-training corpus",
        "crawler_behaviour": "Respects robots.txt; no paywalled or captcha-protected pages",
        "crawl_started": date(2025, 9, 1),
        "crawl_ended": date(2026, 3, 31),
        "collected_until": date(2026, 3, 31),
    },
    "demo-open-books": {
        "source_category": SourceCategory.PUBLIC,
        "modality": Modality.TEXT,
        "size": Decimal("210000000000"),
        "size_unit": SizeUnit.TOKENS,
        "licence": "Public domain",
        "personal_data": False,
        "collected_until": date(2025, 12, 31),
    },
    "demo-licensed-news": {
        "source_category": SourceCategory.LICENSED,
        "modality": Modality.TEXT,
        "size": Decimal("48000000000"),
        "size_unit": SizeUnit.TOKENS,
        "licence": "Licence agreement with a news agency, 2026-2028",
        "personal_data": True,
        "lawful_basis": LawfulBasis.CONTRACT,
    },
    "demo-support-chats": {
        "source_category": SourceCategory.USER_DATA,
        "modality": Modality.TEXT,
        "size": Decimal("900000000"),
        "size_unit": SizeUnit.TOKENS,
        "user_data_source": "Opted-in conversations with the hosted assistant",
        "personal_data": True,
        "lawful_basis": LawfulBasis.CONSENT,
    },
    "demo-synthetic-math": {
        "source_category": SourceCategory.SYNTHETIC,
        "modality": Modality.TEXT,
        "size": Decimal("12000000000"),
        "size_unit": SizeUnit.TOKENS,
        "generated_by": "goodput-demo-70b-instruct",
        "personal_data": False,
    },
    "demo-image-captions": {
        "source_category": SourceCategory.PUBLIC,
        "modality": Modality.IMAGE,
        "size": Decimal("4200000"),
        "size_unit": SizeUnit.IMAGES,
        "licence": "CC BY 4.0",
    },
}

# Bytes per domain of the crawl: a long tail, so the summary's top-10 % cut has something to cut.
DOMAINS = [(f"site{i:02d}.example", 9_000_000_000 // (i + 1)) for i in range(40)]


def seed_compliance(*, today: date) -> dict[str, int]:
    """Write the demo's compliance records where missing; returns what was added, by kind."""
    from django.utils import timezone

    from compliance.demo_recovery import seed_recovery
    from fleet.models import Job

    added = {"models": 0, "datasets": 0, "lineage": 0, "records": 0, "requests": 0, "policies": 0, "holds": 0}
    with transaction.atomic():
        model, created = GpaiModel.objects.get_or_create(
            name=MODEL[0],
            version=MODEL[1],
            defaults={
                "provider_name": "Goodput Labs",
                "provider_contact": "ai-compliance@goodput.example",
                "placed_on_market": today - timedelta(days=30),
                "modalities": [Modality.TEXT, Modality.IMAGE],
                "training_compute_flop": Decimal("3.2e23"),
                "weights_location": "s3://models/goodput-demo-7b/1.0 (eu-west-1)",
                "weights_classification": WeightsClassification.TRADE_SECRET,
                "export_control_notes": "Below the thresholds of the current EU dual-use list",
                "export_control_checked_on": today - timedelta(days=200),
                "signed_code_of_practice": True,
                "tdm_opt_out_measures": "Crawler honours robots.txt and TDMRep; opt-outs re-checked before each crawl",
                # left blank on purpose: the summary shows "to be provided"
            },
        )
        added["models"] += created
        job = Job.objects.order_by("pk").first()
        for name, fields in DATASETS.items():
            dataset, created = Dataset.objects.get_or_create(name=name, defaults=fields)
            added["datasets"] += created
            if created and dataset.source_category == SourceCategory.CRAWLED:
                register.import_domains(dataset, "domain,bytes\n" + "".join(f"{d},{b}\n" for d, b in DOMAINS))
            added["lineage"] += _ensure_lineage(model, dataset, job if name == "demo-web-crawl-2026" else None)
        added["records"] += len(gdpr.ensure_console_assets())
        for kind, reference, days_ago in (
            (RequestKind.ERASURE, "DSR-2026-0141", 40),
            (RequestKind.ACCESS, "DSR-2026-0157", 5),
        ):
            _, created = SubjectRequest.objects.get_or_create(
                subject_reference=reference, defaults={"kind": kind, "received_on": today - timedelta(days=days_ago)}
            )
            added["requests"] += created
        _, created = RetentionPolicy.objects.get_or_create(
            data_class=DataClass.INFERENCE_CONTENT,
            tenant="",
            defaults={
                "days": 30,
                "owner": "Serving platform lead",
                "review_due": today + timedelta(days=20),
                "notes": "Prompts and outputs kept 30 days for abuse monitoring; zero retention on request",
            },
        )
        added["policies"] += created
        _, created = LegalHold.objects.get_or_create(
            name="Litigation hold: 2026 fabric outage",
            defaults={"data_class": DataClass.INCIDENTS, "reason": "Counsel's request of the demo's week"},
        )
        added["holds"] += created
        # The recovery register: the datasets above, checkpoints, weights and the console's database.
        added["backup reports"] = seed_recovery(now=timezone.now())
    return added


def _ensure_lineage(model: GpaiModel, dataset: Dataset, job: object) -> int:
    """One lineage row per dataset of the demo model, on every start; 1 when this call added it.

    The first start may run before the simulator has registered a job: the row is then recorded
    without one, and a later start names the job on that row instead of adding a second row (each
    restart used to add one). A row an officer recorded by hand is left as it is.
    """
    rows = Lineage.objects.filter(model=model, dataset=dataset)
    if job is not None and not rows.filter(job=job).exists():
        unnamed = rows.filter(job__isnull=True, recorded_by__isnull=True).first()
        if unnamed is not None:
            unnamed.job = job
            unnamed.save(update_fields=["job"])
            return 0
    if rows.exists():
        return 0
    _, created = register.record_lineage(model, dataset, job=job)
    return int(created)
