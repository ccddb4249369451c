"""The training-content summary as built from the register (compliance.services.summary): the
fixture model of tests/compliance/conftest.py against a document written out by hand, the answers
the register leaves blank, the template's size ranges at their bounds, the 3 % cut of public
datasets and the cut of crawled domains."""

# ruff: noqa: E501  (the expected documents are written out line for line, as published)

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from compliance.choices import Modality, SizeUnit, SourceCategory
from compliance.models import CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.services import summary
from compliance.services.summary import TO_BE_PROVIDED, build_document, domain_cut, render_markdown

LAST_UPDATE = date(2026, 12, 1)

# Worked out by hand from the fixture (tests/compliance/conftest.py), not by the code under test:
# text = 600 + 10 + 150 + 2,000 + 40 + 200 billion tokens = 3 trillion (1 billion - 10 trillion);
# images 250 million (1 million - 1 billion); audio 5,000 h (< 10,000 h); latest collection
# crawled-web's 2025-12-31; public text 610 billion tokens, open-web-corpus 600/610 = 98.4 %
# (listed), tiny-stories 1.6 % (not); 40 domains, 10 % = 4: site01-04 (40, 39, 38, 37 MB).
EXPECTED_HEADER_AND_SECTION_1 = """\
# Public summary of training content: Goodput-LM 1.0

- **Version of the summary:** 1
- **Last update:** 2026-12-01

## 1. General information

### 1.1 Provider identification

- **Provider name:** Goodput Labs B.V.
- **Contact details:** ai-office@goodput.example
- **Authorised representative:** to be provided

### 1.2 Model identification

- **Versioned model name:** Goodput-LM 1.0
- **Model dependencies:** to be provided
- **Date placed on the Union market:** 2026-02-01

### 1.3 Modalities, overall training data size and other characteristics

| Modality | Used | Training data size |
|---|---|---|
| Text | yes | 1 billion – 10 trillion tokens |
| Image | yes | 1 million – 1 billion images |
| Audio | yes | < 10,000 hours |
| Video | no | not applicable |
| Other | no | not applicable |

- **Types of content:** Web pages, news articles, stories, photographs and recorded talks
- **Latest date of data collection:** 12/2025
- **Linguistic characteristics:** The 24 official EU languages; English about 45 %
- **Other characteristics:** to be provided
"""

EXPECTED_SECTION_2 = """\
## 2. List of data sources

### 2.1 Publicly available datasets

- **Used:** yes
- **Modalities:** Text
- **Large datasets (more than 3 % of the public data of a modality):**
  - open-web-corpus (text, 98.4 %)
- **Datasets:**
  - open-web-corpus (text, 600,000,000,000 tokens): Filtered web text released by a research consortium; licence or terms: ODC-By 1.0
  - tiny-stories (text, 10,000,000,000 tokens): Short children's stories; licence or terms: CDLA-Sharing-1.0

### 2.2.1 Private: licensed from rightsholders

- **Used:** yes
- **Modalities:** Text
- **Datasets:**
  - newswire-archive (text, 150,000,000,000 tokens): News articles 1995-2025; licence or terms: Licence agreement with Newswire Ltd (2025)

### 2.2.2 Private: obtained from other third parties

- **Used:** yes
- **Modalities:** Image
- **Datasets:**
  - stock-photos (image, 250,000,000 images): Captioned stock photographs; licence or terms: Bought from a data broker; terms of sale 2025

### 2.3 Crawled and scraped online

- **Used:** yes
- **Modalities:** Text
- **Crawler names:** GoodputBot/2.1
- **Purposes:** Training general-purpose language models
- **Behaviour (robots.txt, paywalls, captchas):** Honours robots.txt; does not pass paywalls or captchas
- **Collection period:** 2025-01-01 to 2025-12-31
- **Content description:** Public web pages in the 24 EU languages
- **Most relevant domain names:** top 10 % of 40 domains by bytes, rounded up: 4
- **Datasets:**
  - crawled-web (text, 2,000,000,000,000 tokens): Public web pages in the 24 EU languages; licence or terms: to be provided

| Domain | Bytes |
|---|---|
| www.site01.example | 40,000,000 |
| www.site02.example | 39,000,000 |
| www.site03.example | 38,000,000 |
| www.site04.example | 37,000,000 |

### 2.4 User data

- **Used:** yes
- **Modalities:** Text
- **Sources of user data:** Opted-in conversations with Goodput Assistant
- **Datasets:**
  - assistant-chats (text, 40,000,000,000 tokens): Conversations with Goodput Assistant; licence or terms: to be provided

### 2.5 Synthetic data

- **Used:** yes
- **Modalities:** Text
- **Generating models:** Goodput-LM 0.9
- **Datasets:**
  - synthetic-math (text, 200,000,000,000 tokens): Worked maths problems; licence or terms: to be provided

### 2.6 Other sources

- **Used:** yes
- **Modalities:** Audio
- **Datasets:**
  - podcast-audio (audio, 5,000 hours): Recorded talks donated by partners; licence or terms: to be provided
"""

EXPECTED_SECTION_3 = """\
## 3. Data processing aspects

### 3.1 Respect of reservations of rights from the text-and-data-mining exception

- **Signatory of the General-Purpose AI Code of Practice:** yes
- **Measures to respect opt-outs:** robots.txt and TDMRep reservations honoured at crawl time, re-checked before training.

### 3.2 Removal of illegal content

- **Measures:** CSAM hash matching and a terrorist-content classifier; flagged documents dropped.

### 3.3 Other information

- **Other information:** to be provided
"""


def _sections(text: str) -> list[str]:
    """The text cut before each "## " heading: header + 1, 2, 3."""
    parts, current = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("## ") and current:
            parts.append("".join(current).rstrip("\n") + "\n")
            current = []
        current.append(line)
    parts.append("".join(current))
    return parts


def test_the_fixture_models_summary_matches_the_hand_written_document_section_by_section(
    gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    text = render_markdown(build_document(gpai_model), version=1, last_update=LAST_UPDATE)
    got = _sections(text)
    expected = [
        *_sections(EXPECTED_HEADER_AND_SECTION_1),
        EXPECTED_SECTION_2,
        EXPECTED_SECTION_3,
    ]
    assert len(got) == len(expected) == 4
    for number, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"section {number or 'header'} differs"
    assert text == EXPECTED_HEADER_AND_SECTION_1 + "\n" + EXPECTED_SECTION_2 + "\n" + EXPECTED_SECTION_3


def test_the_document_holds_the_figures_as_data(gpai_model: GpaiModel, crawled_dataset: Dataset) -> None:
    document = build_document(gpai_model)
    assert document["general"]["modalities"] == [
        {"modality": "Text", "used": "yes", "size": "1 billion – 10 trillion tokens"},
        {"modality": "Image", "used": "yes", "size": "1 million – 1 billion images"},
        {"modality": "Audio", "used": "yes", "size": "< 10,000 hours"},
        {"modality": "Video", "used": "no", "size": "not applicable"},
        {"modality": "Other", "used": "no", "size": "not applicable"},
    ]
    assert document["sources"]["public"]["large_datasets"] == [
        {"name": "open-web-corpus", "modality": "Text", "share": "98.4 %"}
    ]
    assert document["sources"]["crawled"]["domains"] == [
        {"domain": "www.site01.example", "bytes": 40_000_000},
        {"domain": "www.site02.example", "bytes": 39_000_000},
        {"domain": "www.site03.example", "bytes": 38_000_000},
        {"domain": "www.site04.example", "bytes": 37_000_000},
    ]
    assert document["processing"] == {
        "code_of_practice": "yes",
        "tdm_opt_out_measures": gpai_model.tdm_opt_out_measures,
        "illegal_content_measures": gpai_model.illegal_content_measures,
        "other": "to be provided",
    }


@pytest.mark.django_db
def test_a_model_with_nothing_registered_reads_to_be_provided_everywhere_it_is_not_known() -> None:
    model = GpaiModel.objects.create(name="Bare", version="0.1")
    text = render_markdown(build_document(model), version=None, last_update=LAST_UPDATE)
    for line in (
        "- **Provider name:** to be provided",
        "- **Contact details:** to be provided",
        "- **Date placed on the Union market:** to be provided",
        "| Text | to be provided | to be provided |",
        "| Video | to be provided | to be provided |",
        "- **Latest date of data collection:** to be provided",
        "- **Types of content:** to be provided",
        "- **Signatory of the General-Purpose AI Code of Practice:** to be provided",
        "- **Measures to respect opt-outs:** to be provided",
        "- **Measures:** to be provided",
        "- **Version of the summary:** draft, not published",
    ):
        assert line in text.splitlines(), line
    # No lineage: whether a source was used is not known, so not "no".
    assert text.count("- **Used:** to be provided") == 7
    assert "- **Used:** no" not in text
    assert summary.TO_BE_PROVIDED == "to be provided"


@pytest.mark.django_db
def test_dependencies_name_a_registered_or_an_external_base_model() -> None:
    base = GpaiModel.objects.create(name="Base", version="2")
    tuned = GpaiModel.objects.create(name="Tuned", version="2.1", base_model=base)
    external = GpaiModel.objects.create(name="Other", version="1", base_model_external="Llama 3 8B")
    assert build_document(tuned)["general"]["model"]["dependencies"] == "Base 2 (registered)"
    assert build_document(external)["general"]["model"]["dependencies"] == "Llama 3 8B (external)"


def _model_with(*datasets: tuple[str, str, str, int | None, str]) -> GpaiModel:
    """A model trained on (name, category, modality, size, unit) datasets."""
    model = GpaiModel.objects.create(name="Sized", version="1")
    for name, category, modality, size, unit in datasets:
        dataset = Dataset.objects.create(
            name=name,
            source_category=category,
            modality=modality,
            size=None if size is None else Decimal(size),
            size_unit=unit,
        )
        Lineage.objects.create(model=model, dataset=dataset)
    return model


def _size_of(model: GpaiModel, modality: str) -> str:
    rows = build_document(model)["general"]["modalities"]
    return next(r["size"] for r in rows if r["modality"] == Modality(modality).label)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("modality", "unit", "amount", "expected"),
    [
        (Modality.TEXT, SizeUnit.TOKENS, 999_999_999, "< 1 billion tokens"),
        (Modality.TEXT, SizeUnit.TOKENS, 1_000_000_000, "1 billion – 10 trillion tokens"),
        (Modality.TEXT, SizeUnit.TOKENS, 10_000_000_000_000, "1 billion – 10 trillion tokens"),
        (Modality.TEXT, SizeUnit.TOKENS, 10_000_000_000_001, "> 10 trillion tokens"),
        (Modality.IMAGE, SizeUnit.IMAGES, 999_999, "< 1 million images"),
        (Modality.IMAGE, SizeUnit.IMAGES, 1_000_000, "1 million – 1 billion images"),
        (Modality.IMAGE, SizeUnit.IMAGES, 1_000_000_000, "1 million – 1 billion images"),
        (Modality.IMAGE, SizeUnit.IMAGES, 1_000_000_001, "> 1 billion images"),
        (Modality.AUDIO, SizeUnit.HOURS, 9_999, "< 10,000 hours"),
        (Modality.AUDIO, SizeUnit.HOURS, 10_000, "10,000 – 1 million hours"),
        (Modality.VIDEO, SizeUnit.HOURS, 1_000_000, "10,000 – 1 million hours"),
        (Modality.VIDEO, SizeUnit.HOURS, 1_000_001, "> 1 million hours"),
    ],
)
def test_size_ranges_at_their_bounds(modality: str, unit: str, amount: int, expected: str) -> None:
    # Two datasets, so the range is taken of the sum: amount - 1 + 1.
    model = _model_with(
        ("a", SourceCategory.PUBLIC, modality, amount - 1, unit), ("b", SourceCategory.OTHER, modality, 1, unit)
    )
    assert _size_of(model, modality) == expected


@pytest.mark.django_db
def test_a_size_missing_or_in_the_wrong_unit_makes_the_modality_to_be_provided() -> None:
    model = _model_with(
        ("text-ok", SourceCategory.PUBLIC, Modality.TEXT, 5_000_000_000, SizeUnit.TOKENS),
        ("text-bytes", SourceCategory.PUBLIC, Modality.TEXT, 10, SizeUnit.BYTES),
        ("image-ok", SourceCategory.LICENSED, Modality.IMAGE, 2_000_000, SizeUnit.IMAGES),
        ("image-unsized", SourceCategory.LICENSED, Modality.IMAGE, None, ""),
        ("video-ok", SourceCategory.OTHER, Modality.VIDEO, 20_000, SizeUnit.HOURS),
    )
    assert _size_of(model, Modality.TEXT) == TO_BE_PROVIDED  # not "1 billion – 10 trillion tokens"
    assert _size_of(model, Modality.IMAGE) == TO_BE_PROVIDED
    assert _size_of(model, Modality.VIDEO) == "10,000 – 1 million hours"
    # The public text cannot be shared out either: both datasets listed, shares to be provided.
    assert build_document(model)["sources"]["public"]["large_datasets"] == [
        {"name": "text-bytes", "modality": "Text", "share": TO_BE_PROVIDED},
        {"name": "text-ok", "modality": "Text", "share": TO_BE_PROVIDED},
    ]


@pytest.mark.django_db
def test_public_datasets_are_listed_above_three_percent_of_their_modality() -> None:
    # Public text 10,000 tokens: 9,400 (94 %), 301 (3.01 %: listed), 299 (2.99 %: not);
    # public images 100: 97 (97 %), 3 (exactly 3 %: not more than 3 %, not listed).
    model = _model_with(
        ("big", SourceCategory.PUBLIC, Modality.TEXT, 9_400, SizeUnit.TOKENS),
        ("just-over", SourceCategory.PUBLIC, Modality.TEXT, 301, SizeUnit.TOKENS),
        ("just-under", SourceCategory.PUBLIC, Modality.TEXT, 299, SizeUnit.TOKENS),
        ("pics", SourceCategory.PUBLIC, Modality.IMAGE, 97, SizeUnit.IMAGES),
        ("three", SourceCategory.PUBLIC, Modality.IMAGE, 3, SizeUnit.IMAGES),
        ("licensed-big", SourceCategory.LICENSED, Modality.TEXT, 10**6, SizeUnit.TOKENS),  # not public: no share
    )
    assert build_document(model)["sources"]["public"]["large_datasets"] == [
        {"name": "big", "modality": "Text", "share": "94.0 %"},
        {"name": "just-over", "modality": "Text", "share": "3.0 %"},
        {"name": "pics", "modality": "Image", "share": "97.0 %"},
    ]


@pytest.mark.parametrize(
    ("count", "sme", "listed"),
    [
        (0, False, 0),
        (1, False, 1),  # rounded up: any crawl lists at least one domain
        (10, False, 1),
        (11, False, 2),
        (40, False, 4),
        (40, True, 2),
        (41, True, 3),
        (19_999, False, 2_000),
        (19_999, True, 1_000),  # 5 % would be 1,000 (999.95 up)
        (30_000, True, 1_000),  # 5 % is 1,500: 1,000 is lower
    ],
)
def test_the_domain_cut_is_ten_percent_or_for_smes_five_percent_at_most_1000(
    count: int, sme: bool, listed: int
) -> None:
    assert domain_cut(count, sme=sme) == listed


def test_an_sme_lists_the_top_five_percent_of_crawled_domains(
    gpai_model: GpaiModel, crawled_dataset: Dataset, settings: pytest.FixtureRequest
) -> None:
    settings.COMPLIANCE_SME = True  # type: ignore[attr-defined]
    crawled = build_document(gpai_model)["sources"]["crawled"]
    assert [d["domain"] for d in crawled["domains"]] == ["www.site01.example", "www.site02.example"]
    assert crawled["domain_rule"] == (
        "top 5 % or 1,000 domains, whichever is lower (SME) of 40 domains by bytes, rounded up: 2"
    )


@pytest.mark.django_db
def test_domains_are_summed_over_crawled_datasets_and_ties_go_by_name() -> None:
    model = _model_with(
        ("crawl-a", SourceCategory.CRAWLED, Modality.TEXT, 1, SizeUnit.TOKENS),
        ("crawl-b", SourceCategory.CRAWLED, Modality.TEXT, 1, SizeUnit.TOKENS),
    )
    # No per-domain counts imported yet: the list is to be provided, not "0 domains".
    assert build_document(model)["sources"]["crawled"]["domain_rule"] == TO_BE_PROVIDED
    a, b = Dataset.objects.get(name="crawl-a"), Dataset.objects.get(name="crawl-b")
    # shared.example: 30 + 30 = 60 bytes, first; b.example and a.example tie at 50: by name.
    CrawledDomain.objects.bulk_create(
        [
            CrawledDomain(dataset=a, domain="shared.example", bytes=30),
            CrawledDomain(dataset=b, domain="shared.example", bytes=30),
            CrawledDomain(dataset=a, domain="b.example", bytes=50),
            CrawledDomain(dataset=b, domain="a.example", bytes=50),
            *(CrawledDomain(dataset=a, domain=f"small{i}.example", bytes=1) for i in range(17)),
        ]
    )
    crawled = build_document(model)["sources"]["crawled"]  # 20 domains: 10 % is 2
    assert crawled["domains"] == [
        {"domain": "shared.example", "bytes": 60},
        {"domain": "a.example", "bytes": 50},
    ]
    # Blank crawler answers are shown as such, never filled from the other dataset.
    assert crawled["crawlers"] == TO_BE_PROVIDED
    assert crawled["period"] == TO_BE_PROVIDED
