"""Fixtures for the compliance tests: an officer, one model version and its register.

The figures below are fixed so that tests can compare against hand-computed documents (the
training-content summary above all): change one and every expected document changes with it.
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from compliance.choices import (
    LawfulBasis,
    Modality,
    SizeUnit,
    SourceCategory,
    UserDataOrigin,
    WeightsClassification,
)
from compliance.models.register import CrawledDomain, Dataset, GpaiModel, Lineage
from console import roles
from fleet.models import Job, Site
from tests.compliance.audit_support import as_role, db_roles, superuser  # noqa: F401  (fixtures)
from tests.conftest import _make_user

# Per domain i in 1..40: "www.site{i:02d}.example", (41 - i) MB.
CRAWLED_DOMAIN_COUNT = 40


@pytest.fixture
def officer_user(db: None) -> User:
    """The compliance officer "cora" (the same name the authorization matrix gives her)."""
    return _make_user("cora", roles.COMPLIANCE_OFFICER)


@pytest.fixture
def officer_client(officer_user: User) -> Client:
    """A browser session signed in as the compliance officer (``viewer_client`` and
    ``operator_client`` come from tests/conftest.py)."""
    client = Client()
    client.force_login(officer_user)
    return client


@pytest.fixture
def gpai_model(db: None) -> GpaiModel:
    """Goodput-LM 1.0, provider Goodput Labs B.V. (ai-office@goodput.example), no authorised
    representative, no base model (neither registered nor external), placed on the market
    2026-02-01, modalities text + image + audio (content types: text "Web pages, news articles
    and stories", image "Photographs", audio "Recorded talks"), 3e24 training FLOP (below 1e25: no
    systemic risk), weights at s3://goodput-weights/goodput-lm/1.0 classified trade secret, export
    control checked 10 days ago (not overdue), signed the Code of Practice, not continuously
    trained.

    Blank on purpose (the summary shows "to be provided"): authorised_representative (and whether
    the provider is established in the Union), trained_from_scratch, other_characteristics.
    Optional answers left blank (the summary shows "none"): every "Additional comments",
    other_processing.
    """
    return GpaiModel.objects.create(
        name="Goodput-LM",
        version="1.0",
        provider_name="Goodput Labs B.V.",
        provider_contact="ai-office@goodput.example",
        placed_on_market=date(2026, 2, 1),
        modalities=[Modality.TEXT, Modality.IMAGE, Modality.AUDIO],
        content_types_text="Web pages, news articles and stories",
        content_types_image="Photographs",
        content_types_audio="Recorded talks",
        linguistic_characteristics="The 24 official EU languages; English about 45 %",
        training_compute_flop=Decimal("3e24"),
        weights_location="s3://goodput-weights/goodput-lm/1.0",
        weights_classification=WeightsClassification.TRADE_SECRET,
        export_control_notes="Classified EAR99; no licence needed for EU customers.",
        export_control_checked_on=timezone.localdate() - timedelta(days=10),
        signed_code_of_practice=True,
        continuously_trained=False,
        tdm_opt_out_measures="robots.txt and TDMRep reservations honoured at crawl time, re-checked before training.",
        illegal_content_measures="CSAM hash matching and a terrorist-content classifier; flagged documents dropped.",
    )


@pytest.fixture
def training_jobs(site_a: Site) -> dict[str, Job]:
    """Two fleet jobs at site ams-1: "goodput-lm-pretrain" (512 GPUs) and "goodput-lm-sft" (64)."""
    return {
        name: Job.objects.create(
            site=site_a, name=name, team="foundation", gang_size=gang, scheduler="slurm", scheduler_id=name
        )
        for name, gang in (("goodput-lm-pretrain", 512), ("goodput-lm-sft", 64))
    }


# name: (category, modality, size, unit, other fields)
_DATASETS: dict[str, tuple[str, str, int | None, str, dict]] = {
    "open-web-corpus": (
        SourceCategory.PUBLIC,
        Modality.TEXT,
        600_000_000_000,
        SizeUnit.TOKENS,
        {
            "description": "Filtered web text released by a research consortium",
            "licence": "ODC-By 1.0",
            "personal_data": True,
            "lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS,
            "tdm_opt_outs": "Documents from sources with a TDM reservation removed",
            "collected_until": date(2025, 6, 30),
        },
    ),
    "tiny-stories": (
        SourceCategory.PUBLIC,
        Modality.TEXT,
        10_000_000_000,
        SizeUnit.TOKENS,
        {
            "description": "Short children's stories",
            "licence": "CDLA-Sharing-1.0",
            "personal_data": False,
            "collected_until": date(2024, 5, 31),
        },
    ),
    "newswire-archive": (
        SourceCategory.LICENSED,
        Modality.TEXT,
        150_000_000_000,
        SizeUnit.TOKENS,
        {
            "description": "News articles 1995-2025",
            "licence": "Licence agreement with Newswire Ltd (2025)",
            "personal_data": True,
            "lawful_basis": LawfulBasis.CONTRACT,
            "collected_until": date(2025, 9, 30),
        },
    ),
    "stock-photos": (
        SourceCategory.THIRD_PARTY,
        Modality.IMAGE,
        250_000_000,
        SizeUnit.IMAGES,
        {
            "description": "Captioned stock photographs",
            "licence": "Bought from a data broker; terms of sale 2025",
            "personal_data": True,
            "special_categories": "biometric data (faces)",
            "lawful_basis": LawfulBasis.CONSENT,
            "collected_until": date(2025, 3, 31),
        },
    ),
    "crawled-web": (
        SourceCategory.CRAWLED,
        Modality.TEXT,
        2_000_000_000_000,
        SizeUnit.TOKENS,
        {
            "description": "Public web pages in the 24 EU languages",
            "personal_data": True,
            "lawful_basis": LawfulBasis.LEGITIMATE_INTERESTS,
            "tdm_opt_outs": "robots.txt and TDMRep honoured",
            "collected_until": date(2025, 12, 31),
            "crawler_names": "GoodputBot/2.1",
            "crawl_purpose": "Training general-purpose language models",
            "crawler_behaviour": "Honours robots.txt; does not pass paywalls or captchas",
            "crawl_started": date(2025, 1, 1),
            "crawl_ended": date(2025, 12, 31),
        },
    ),
    "assistant-chats": (
        SourceCategory.USER_DATA,
        Modality.TEXT,
        40_000_000_000,
        SizeUnit.TOKENS,
        {
            "description": "Conversations with Goodput Assistant",
            "personal_data": True,
            "lawful_basis": LawfulBasis.CONSENT,
            "user_data_origin": UserDataOrigin.MODEL,
            "user_data_source": "Opted-in conversations with Goodput Assistant",
            "collected_until": date(2025, 11, 30),
        },
    ),
    "synthetic-math": (
        SourceCategory.SYNTHETIC,
        Modality.TEXT,
        200_000_000_000,
        SizeUnit.TOKENS,
        {
            "description": "Worked maths problems",
            "personal_data": False,
            "generated_by": "Goodput-LM 0.9",
            "collected_until": date(2025, 10, 31),
        },
    ),
    "podcast-audio": (
        SourceCategory.OTHER,
        Modality.AUDIO,
        5_000,
        SizeUnit.HOURS,
        {"description": "Recorded talks donated by partners"},
    ),
}
_SFT_DATASETS = frozenset({"assistant-chats", "synthetic-math"})


@pytest.fixture
def register_datasets(gpai_model: GpaiModel, training_jobs: dict[str, Job]) -> dict[str, Dataset]:
    """Eight datasets covering all seven source categories, each linked to ``gpai_model`` by one
    lineage row (job "goodput-lm-sft" for assistant-chats and synthetic-math, job
    "goodput-lm-pretrain" for the other six). Keyed by name:

    ==================  ===========  ======  ==========================  ===============
    name                category     modal.  size                        collected until
    ==================  ===========  ======  ==========================  ===============
    open-web-corpus     2.1 public   text    600,000,000,000 tokens      2025-06-30
    tiny-stories        2.1 public   text    10,000,000,000 tokens       2024-05-31
    newswire-archive    2.2.1        text    150,000,000,000 tokens      2025-09-30
    stock-photos        2.2.2        image   250,000,000 images          2025-03-31
    crawled-web         2.3          text    2,000,000,000,000 tokens    2025-12-31
    assistant-chats     2.4          text    40,000,000,000 tokens       2025-11-30
    synthetic-math      2.5          text    200,000,000,000 tokens      2025-10-31
    podcast-audio       2.6 other    audio   5,000 hours                 (blank)
    ==================  ===========  ======  ==========================  ===============

    Per modality: text 3,000,000,000,000 tokens (range "1 billion - 10 trillion"), image
    250,000,000 images ("1 million - 1 billion"), audio 5,000 hours ("< 10,000 hours"), no video,
    no other. Latest date of collection: 12/2025. Public text is 610 billion tokens:
    open-web-corpus is 98.4 % of it (a large public dataset, listed), tiny-stories 1.6 % (below
    3 %, not listed).

    crawled-web: crawler GoodputBot/2.1, 2025-01-01 to 2025-12-31, 40 domains (see
    ``crawled_dataset``). assistant-chats is user data from interactions with the model;
    synthetic-math was generated by Goodput-LM 0.9 (a model on the market); stock-photos is not
    publicly known (2.2.2 describes it rather than naming it). podcast-audio leaves licence,
    personal_data, lawful_basis and collected_until blank. Licences, lawful bases and the rest:
    _DATASETS above (the register's; the public summary carries neither licences nor bytes).
    """
    datasets = {}
    for name, (category, modality, size, unit, extra) in _DATASETS.items():
        dataset = Dataset.objects.create(
            name=name, source_category=category, modality=modality, size=Decimal(size), size_unit=unit, **extra
        )
        job = training_jobs["goodput-lm-sft" if name in _SFT_DATASETS else "goodput-lm-pretrain"]
        Lineage.objects.create(model=gpai_model, dataset=dataset, job=job)
        datasets[name] = dataset
    CrawledDomain.objects.bulk_create(
        CrawledDomain(dataset=datasets["crawled-web"], domain=f"www.site{i:02d}.example", bytes=(41 - i) * 1_000_000)
        for i in range(1, CRAWLED_DOMAIN_COUNT + 1)
    )
    return datasets


@pytest.fixture
def crawled_dataset(register_datasets: dict[str, Dataset]) -> Dataset:
    """The "crawled-web" dataset, 40 domains: www.site01.example .. www.site40.example holding 40 MB down
    to 1 MB (site i: (41 - i) * 1,000,000 bytes; 820,000,000 bytes in all). The top 10 % is
    site01-site04 (40, 39, 38, 37 MB); the SME cut (top 5 %, at most 1,000) is site01-site02."""
    return register_datasets["crawled-web"]
