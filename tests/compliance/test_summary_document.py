"""The training-content summary as built from the register (compliance.services.summary): the
fixture model of tests/compliance/conftest.py against a document written out by hand, question by
question of the AI Office's template; the headings and questions word for word; "not applicable"
where the template allows it; sizes in the template's ranges or another unit; the 3 % cut of
public datasets and the cut of crawled domains; what the public summary leaves out (licences,
per-domain bytes); and free text that cannot become markup."""

# ruff: noqa: E501  (the expected documents are written out line for line, as published)

from __future__ import annotations

import io
import json
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from markdown_it import MarkdownIt
from pypdf import PdfReader

from compliance.choices import Modality, SizeUnit, SourceCategory, UserDataOrigin
from compliance.models import CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.services import summary
from compliance.services.pdf import render_pdf
from compliance.services.summary import (
    HEADINGS,
    NO_COMMENT,
    NOT_APPLICABLE,
    QUESTIONS,
    TO_BE_PROVIDED,
    build_document,
    domain_cut,
    render_markdown,
)

LAST_UPDATE = date(2026, 12, 1)

# Worked out by hand from the fixture (tests/compliance/conftest.py), not by the code under test:
# text = 600 + 10 + 150 + 2,000 + 40 + 200 billion tokens = 3 trillion (1 billion to 10 trillion);
# images 250 million (1 million to 1 billion); audio 5,000 h (less than 10 000 h); latest
# collection crawled-web's 2025-12-31; public text 610 billion tokens, open-web-corpus 600/610 =
# 98.4 % (listed), tiny-stories 1.6 % (described, not listed); 40 domains, 10 % = 4: site01-04
# (names only); stock-photos is not publicly known (described); assistant-chats answers 2.4's
# first question only; Goodput-LM 0.9 is on the market.

EXPECTED_HEADER_AND_SECTION_1 = """\
# Public Summary of Training Content for Goodput-LM 1.0

- **Version of the Summary:** 1
- **Last update:** 2026-12-01

## 1. General information

### 1.1. Provider identification

- **Provider name and contact details:** Goodput Labs B.V.; ai-office@goodput.example
- **Authorised representative name and contact details:** to be provided

### 1.2. Model identification

- **Versioned model name(s):** Goodput-LM 1.0
- **Model dependencies:** to be provided
- **Date of placement of the model on the Union market:** 2026-02-01

### 1.3. Modalities, overall training data size and other characteristics

- **Text**
  - **Present in the training data:** yes
  - **Training data size:** 1 billion to 10 trillion tokens
  - **Alternatively, specify the approximate size in a different measurement unit:** not applicable
  - **Types of content:** Web pages, news articles and stories
- **Image**
  - **Present in the training data:** yes
  - **Training data size:** 1 million to 1 billion images
  - **Alternatively, specify the approximate size in a different measurement unit:** not applicable
  - **Types of content:** Photographs
- **Audio**
  - **Present in the training data:** yes
  - **Training data size:** Less than 10 000 hours
  - **Alternatively, specify the approximate size in a different measurement unit:** not applicable
  - **Types of content:** Recorded talks
- **Video**
  - **Present in the training data:** no
  - **Training data size:** not applicable
  - **Alternatively, specify the approximate size in a different measurement unit:** not applicable
  - **Types of content:** not applicable
- **Other**
  - **Present in the training data:** no
  - **Specify the modality:** not applicable
  - **Approximate size and unit of measurement:** not applicable
  - **Types of content:** not applicable
- **Latest date of data acquisition/collection for model training:** 12/2025
- **Is the model continuously trained on new data after this date?** no
- **Description of the linguistic characteristics of the overall training data:** The 24 official EU languages; English about 45 %
- **Other relevant characteristics of the overall training data:** to be provided
- **Additional comments (optional):** none
"""

EXPECTED_SECTION_2 = """\
## 2. List of data sources

### 2.1. Publicly available datasets

- **Have you used publicly available datasets to train the model?** yes
- **If yes, specify the modality(ies) of the content covered by the datasets concerned:** Text
- **List of large publicly available datasets:**
  - open-web-corpus (text)
- **General description of other publicly available datasets not listed above:** Short children's stories
- **Additional comments (optional):** none

### 2.2. Private non-publicly available datasets obtained from third parties

#### 2.2.1. Datasets commercially licensed by rightsholders or their representatives

- **Have you concluded transactional commercial licensing agreement(s) with rightsholder(s) or with their representatives?** yes
- **If yes, specify the modality(ies) of the content covered by the datasets concerned:** Text

#### 2.2.2. Private datasets obtained from other third parties

- **Have you obtained private datasets from third parties that are not licensed as described in Section 2.2.1, such as data obtained from providers of private databases, or data intermediaries?** yes
- **If yes, specify the modality(ies) of the content covered by the datasets concerned:** Image
- **If publicly known, list private datasets obtained from other third parties:** not applicable
- **General description of non-publicly known private datasets obtained from third parties:** Captioned stock photographs
- **Additional comments (optional):** none

### 2.3. Data crawled and scraped from online sources

- **Were crawlers used by the provider or on behalf of?** yes
- **If yes, specify crawler name(s)/identifier(s):** GoodputBot/2.1
- **Purposes of the crawler(s):** Training general-purpose language models
- **General description of crawler behaviour:** Honours robots.txt; does not pass paywalls or captchas
- **Period of data collection:** From 01/2025 to 12/2025
- **Comprehensive description of the type of content and online sources crawled:** Public web pages in the 24 EU languages
- **Type of modality covered:** Text
- **Summary of the most relevant domain names crawled:** the top 10 % of 40 domains by size of content, rounded up: 4
  - www.site01.example
  - www.site02.example
  - www.site03.example
  - www.site04.example
- **Additional comments (optional):** none

### 2.4. User data

- **Was data from user interactions with the AI model (e.g. user input and prompts) used to train the model?** yes
- **Was data collected from user interactions with the provider’s other services or products used to train the model?** no
- **If yes, provide a general description of the provider’s services or products that were used to collect the user data:** not applicable
- **Type of modality covered:** Text
- **Additional comments (optional):** none

### 2.5. Synthetic data

- **Was synthetic AI-generated data created by the provider or on their behalf to train the model?** yes
- **If yes, modality of the synthetic data:** Text
- **If yes, specify the general-purpose AI model(s) used to generate the synthetic data if available on the market:** Goodput-LM 0.9
- **Information about other AI models, including provider’s own AI model(s) not available on the market, used to generate synthetic data to train the model to which this Summary applies:** not applicable
- **Additional comments (optional):** none

### 2.6. Other sources of data

- **Have data sources other than those described in Sections 2.1 to 2.5 been used to train the model?** yes
- **If yes, provide a narrative description of these data sources and the data:** Recorded talks donated by partners
- **Additional comments (optional):** none
"""

EXPECTED_SECTION_3 = """\
## 3. Data processing aspects

### 3.1. Respect of reservation of rights from text and data mining exception or limitation

- **Are you a Signatory to the Code of Practice for general-purpose AI models that includes commitments to respect reservations of rights from the TDM exception or limitation?** yes
- **Describe the measures implemented before model training to respect reservations of rights from the TDM exception or limitation before and during data collection, including the opt-out protocols and solutions honoured by the provider or, as applicable, by third parties from which datasets have been obtained:** robots.txt and TDMRep reservations honoured at crawl time, re-checked before training.
- **Additional comments (optional):** none

### 3.2. Removal of illegal content

- **General description of measures taken:** CSAM hash matching and a terrorist-content classifier; flagged documents dropped.

### 3.3. Other information (optional)

- **Other relevant information about data processing (optional):** none
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


def test_the_headings_are_the_templates_in_its_order_and_numbering(
    gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    text = render_markdown(build_document(gpai_model), version=1, last_update=LAST_UPDATE)
    headings = [
        line.lstrip("#").strip()
        for line in text.splitlines()
        if line.startswith("## ") or line.startswith("### ") or line.startswith("#### ")
    ]
    assert headings == [
        "1. General information",
        "1.1. Provider identification",
        "1.2. Model identification",
        "1.3. Modalities, overall training data size and other characteristics",
        "2. List of data sources",
        "2.1. Publicly available datasets",
        "2.2. Private non-publicly available datasets obtained from third parties",
        "2.2.1. Datasets commercially licensed by rightsholders or their representatives",
        "2.2.2. Private datasets obtained from other third parties",
        "2.3. Data crawled and scraped from online sources",
        "2.4. User data",
        "2.5. Synthetic data",
        "2.6. Other sources of data",
        "3. Data processing aspects",
        "3.1. Respect of reservation of rights from text and data mining exception or limitation",
        "3.2. Removal of illegal content",
        "3.3. Other information (optional)",
    ]
    assert headings == list(HEADINGS.values())
    # 2.2.1 and 2.2.2 sit under 2.2, one level down.
    assert "#### 2.2.1. Datasets commercially licensed" in text and "#### 2.2.2. Private datasets obtained" in text


@pytest.mark.django_db
def test_every_question_of_the_template_is_asked_and_answered_even_for_a_bare_model() -> None:
    model = GpaiModel.objects.create(name="Bare", version="0.1")
    text = render_markdown(build_document(model), version=None, last_update=LAST_UPDATE)
    asked = {line.split("**")[1] for line in text.splitlines() if line.lstrip().startswith("- **")}
    assert set(QUESTIONS.values()) - {QUESTIONS["large_datasets"], QUESTIONS["publicly_known"]} <= asked
    for line in text.splitlines():
        if line.lstrip().startswith("- **") and line.rstrip().endswith("**") and "**" not in line.split("**", 2)[2]:
            # a question with nothing after it: only the modality labels (whose answers follow)
            assert line.strip("- *") in {m.label for m in Modality}, line
    # 2.1's and 2.2.2's lists are asked too, answered on their own line when there is nothing to list.
    assert f"- **{QUESTIONS['large_datasets']}** {TO_BE_PROVIDED}" in text
    assert f"- **{QUESTIONS['publicly_known']}** {TO_BE_PROVIDED}" in text


@pytest.mark.django_db
def test_a_model_with_nothing_registered_reads_to_be_provided_everywhere_it_is_not_known() -> None:
    model = GpaiModel.objects.create(name="Bare", version="0.1")
    text = render_markdown(build_document(model), version=None, last_update=LAST_UPDATE)
    for line in (
        "- **Provider name and contact details:** to be provided",
        "- **Authorised representative name and contact details:** to be provided",
        "- **Model dependencies:** to be provided",
        "- **Date of placement of the model on the Union market:** to be provided",
        "  - **Present in the training data:** to be provided",
        "  - **Training data size:** to be provided",
        "- **Latest date of data acquisition/collection for model training:** to be provided",
        "- **Is the model continuously trained on new data after this date?** to be provided",
        f"- **{QUESTIONS['code_of_practice']}** to be provided",
        f"- **{QUESTIONS['tdm_measures']}** to be provided",
        "- **General description of measures taken:** to be provided",
        "- **Version of the Summary:** draft, not published",
        # optional questions: nothing to add is an answer, not a gap
        "- **Additional comments (optional):** none",
        "- **Other relevant information about data processing (optional):** none",
    ):
        assert line in text.splitlines(), line
    # No lineage: whether a source was used is not known, so not "no".
    for key in ("public_used", "licensed_used", "third_party_used", "crawled_used", "from_model", "synthetic_used"):
        assert f"- **{QUESTIONS[key]}** to be provided" in text, key
    assert "** no\n" not in text
    assert summary.TO_BE_PROVIDED == "to be provided" and NO_COMMENT == "none"


@pytest.mark.django_db
def test_not_applicable_where_the_register_says_why() -> None:
    """Item 8: an EU provider needs no authorised representative; a model trained from scratch has no
    dependencies; a modality or source not used answers its follow-up questions "not applicable"."""
    model = GpaiModel.objects.create(
        name="Scratch", version="1", provider_established_in_union=True, trained_from_scratch=True
    )
    Lineage.objects.create(
        model=model,
        dataset=Dataset.objects.create(
            name="only-public",
            source_category=SourceCategory.PUBLIC,
            modality=Modality.TEXT,
            size=1,
            size_unit="tokens",
        ),
    )
    document = build_document(model)
    assert (
        document["general"]["provider"]["authorised_representative"]
        == "not applicable (provider established in the Union)"
    )
    assert document["general"]["model"]["dependencies"] == "not applicable (trained from scratch)"
    text = render_markdown(document, version=1, last_update=LAST_UPDATE)
    assert "(external)" not in text and "None (trained from scratch)" not in text
    assert f"- **{QUESTIONS['crawled_used']}** no" in text
    for key in ("crawlers", "purposes", "behaviour", "period", "content", "domains", "market_models", "services"):
        assert f"- **{QUESTIONS[key]}** {NOT_APPLICABLE}" in text, key
    # A representative named all the same is printed; a provider outside the Union without one is a gap.
    model.authorised_representative = "EU Rep GmbH, Berlin"
    assert build_document(model)["general"]["provider"]["authorised_representative"] == "EU Rep GmbH, Berlin"
    model.authorised_representative, model.provider_established_in_union = "", False
    assert build_document(model)["general"]["provider"]["authorised_representative"] == TO_BE_PROVIDED


@pytest.mark.django_db
def test_dependencies_name_a_registered_or_an_external_base_model() -> None:
    base = GpaiModel.objects.create(name="Base", version="2")
    tuned = GpaiModel.objects.create(name="Tuned", version="2.1", base_model=base)
    external = GpaiModel.objects.create(name="Other", version="1", base_model_external="Llama 3 8B")
    assert build_document(tuned)["general"]["model"]["dependencies"] == "Base 2"
    assert build_document(external)["general"]["model"]["dependencies"] == "Llama 3 8B"


@pytest.mark.parametrize("body", [{"base_model_external": "Llama 3 8B"}, {"base_model": "BASE"}])
def test_trained_from_scratch_with_a_base_model_is_a_400_naming_the_field(
    officer_client: Client, body: dict[str, Any]
) -> None:
    base = GpaiModel.objects.create(name="Base", version="2")
    body = {k: base.pk if v == "BASE" else v for k, v in body.items()}
    response = officer_client.post(
        "/api/v1/compliance/models/",
        {"name": "Scratch", "version": "1", "trained_from_scratch": True, **body},
        content_type="application/json",
    )
    assert response.status_code == 400 and list(response.json()) == ["trained_from_scratch"]
    assert not GpaiModel.objects.filter(name="Scratch").exists()


def _model_with(*datasets: tuple[str, str, str, int | None, str], **fields: Any) -> GpaiModel:
    """A model trained on (name, category, modality, size, unit) datasets."""
    model = GpaiModel.objects.create(name="Sized", version="1", **fields)
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


def _row(model: GpaiModel, modality: str) -> dict[str, str]:
    rows = build_document(model)["general"]["modalities"]
    return next(r for r in rows if r["modality"] == Modality(modality).label)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("modality", "unit", "amount", "expected"),
    [
        (Modality.TEXT, SizeUnit.TOKENS, 999_999_999, "Less than 1 billion tokens"),
        (Modality.TEXT, SizeUnit.TOKENS, 1_000_000_000, "1 billion to 10 trillion tokens"),
        (Modality.TEXT, SizeUnit.TOKENS, 10_000_000_000_000, "1 billion to 10 trillion tokens"),
        (Modality.TEXT, SizeUnit.TOKENS, 10_000_000_000_001, "More than 10 trillion tokens"),
        (Modality.IMAGE, SizeUnit.IMAGES, 999_999, "Less than 1 million images"),
        (Modality.IMAGE, SizeUnit.IMAGES, 1_000_000, "1 million to 1 billion images"),
        (Modality.IMAGE, SizeUnit.IMAGES, 1_000_000_000, "1 million to 1 billion images"),
        (Modality.IMAGE, SizeUnit.IMAGES, 1_000_000_001, "More than 1 billion images"),
        (Modality.AUDIO, SizeUnit.HOURS, 9_999, "Less than 10 000 hours"),
        (Modality.AUDIO, SizeUnit.HOURS, 10_000, "10 000 to 1 million hours"),
        (Modality.VIDEO, SizeUnit.HOURS, 1_000_000, "10 000 to 1 million hours"),
        (Modality.VIDEO, SizeUnit.HOURS, 1_000_001, "More than 1 million hours"),
    ],
)
def test_size_ranges_at_their_bounds(modality: str, unit: str, amount: int, expected: str) -> None:
    # Two datasets, so the range is taken of the sum: amount - 1 + 1.
    model = _model_with(
        ("a", SourceCategory.PUBLIC, modality, amount - 1, unit), ("b", SourceCategory.OTHER, modality, 1, unit)
    )
    assert (_row(model, modality)["size"], _row(model, modality)["other_unit"]) == (expected, NOT_APPLICABLE)


@pytest.mark.django_db
def test_a_size_in_another_unit_is_given_in_that_unit_and_a_missing_size_is_to_be_provided() -> None:
    """Item 8: the template allows "the approximate size in a different measurement unit": a size in
    bytes is that answer (the range, which bytes cannot place, is "not applicable"); only a missing
    size is "to be provided"."""
    model = _model_with(
        ("text-bytes", SourceCategory.PUBLIC, Modality.TEXT, 12_000_000_000_000, SizeUnit.BYTES),
        ("image-ok", SourceCategory.LICENSED, Modality.IMAGE, 2_000_000, SizeUnit.IMAGES),
        ("image-unsized", SourceCategory.LICENSED, Modality.IMAGE, None, ""),
        ("video-mixed-hours", SourceCategory.OTHER, Modality.VIDEO, 20_000, SizeUnit.HOURS),
        ("video-mixed-items", SourceCategory.OTHER, Modality.VIDEO, 300, SizeUnit.ITEMS),
        ("other-items", SourceCategory.SYNTHETIC, Modality.OTHER, 7_500, SizeUnit.ITEMS),
        other_modality="3D meshes",
    )
    assert _row(model, Modality.TEXT) | {"content_types": ""} == {
        "modality": "Text",
        "present": "yes",
        "size": NOT_APPLICABLE,
        "other_unit": "12,000,000,000,000 bytes",
        "content_types": "",
    }
    assert (_row(model, Modality.IMAGE)["size"], _row(model, Modality.IMAGE)["other_unit"]) == (TO_BE_PROVIDED,) * 2
    # Mixed units: no single range, each unit's total.
    assert _row(model, Modality.VIDEO)["other_unit"] == "20,000 hours and 300 items"
    assert _row(model, Modality.VIDEO)["size"] == NOT_APPLICABLE
    other = _row(model, Modality.OTHER)
    assert (other["which"], other["size"]) == ("3D meshes", "7,500 items")
    text = render_markdown(build_document(model), version=1, last_update=LAST_UPDATE)
    assert f"  - **{QUESTIONS['other_unit']}** 12,000,000,000,000 bytes" in text
    assert f"- **{QUESTIONS['synthetic_modalities']}** Other (3D meshes)" in text


@pytest.mark.django_db
def test_types_of_content_and_continuous_training_are_answered_per_model() -> None:
    model = _model_with(
        ("t", SourceCategory.PUBLIC, Modality.TEXT, 5, SizeUnit.TOKENS),
        ("i", SourceCategory.PUBLIC, Modality.IMAGE, 5, SizeUnit.IMAGES),
        content_types_text="Fiction and news",
        content_types_video="never shown: video is not used",
        continuously_trained=True,
    )
    assert _row(model, Modality.TEXT)["content_types"] == "Fiction and news"
    assert _row(model, Modality.IMAGE)["content_types"] == TO_BE_PROVIDED
    assert _row(model, Modality.VIDEO)["content_types"] == NOT_APPLICABLE
    assert build_document(model)["general"]["continuously_trained"] == "yes"


@pytest.mark.django_db
def test_third_party_data_lists_the_publicly_known_and_describes_the_rest() -> None:
    model = _model_with()
    for name, known, description in (
        ("LAION-Aesthetics", True, "Aesthetic image subset"),
        ("broker-photos", False, "Photographs bought from a broker"),
        ("archive-scans", False, "Scanned magazines"),
    ):
        Lineage.objects.create(
            model=model,
            dataset=Dataset.objects.create(
                name=name,
                source_category=SourceCategory.THIRD_PARTY,
                modality=Modality.IMAGE,
                publicly_known=known,
                description=description,
            ),
        )
    third = build_document(model)["sources"]["third_party"]
    assert third["publicly_known"] == ["LAION-Aesthetics"]
    assert third["not_publicly_known"] == "Scanned magazines; Photographs bought from a broker"
    text = render_markdown(build_document(model), version=1, last_update=LAST_UPDATE)
    assert f"- **{QUESTIONS['publicly_known']}**\n  - LAION-Aesthetics\n" in text
    assert "broker-photos" not in text and "archive-scans" not in text


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("origins", "from_model", "from_other", "services"),
    [
        ([UserDataOrigin.MODEL], "yes", "no", NOT_APPLICABLE),
        ([UserDataOrigin.OTHER_SERVICES], "no", "yes", "Goodput Mail"),
        ([UserDataOrigin.MODEL, UserDataOrigin.OTHER_SERVICES], "yes", "yes", "Goodput Mail"),
        ([""], TO_BE_PROVIDED, TO_BE_PROVIDED, TO_BE_PROVIDED),  # a dataset that does not say which
    ],
)
def test_user_data_answers_both_questions_of_the_template(
    origins: list[str], from_model: str, from_other: str, services: str
) -> None:
    model = _model_with()
    for i, origin in enumerate(origins):
        Lineage.objects.create(
            model=model,
            dataset=Dataset.objects.create(
                name=f"user-{i}",
                source_category=SourceCategory.USER_DATA,
                modality=Modality.TEXT,
                user_data_origin=origin,
                user_data_source="Goodput Mail" if origin == UserDataOrigin.OTHER_SERVICES else "",
            ),
        )
    user = build_document(model)["sources"]["user_data"]
    assert (user["from_model"], user["from_other_services"], user["services"]) == (from_model, from_other, services)


@pytest.mark.django_db
def test_synthetic_data_separates_models_on_the_market_from_others() -> None:
    model = _model_with()
    for name, market, other in (
        ("s1", "Llama 3.1 70B", ""),
        ("s2", "", "our-internal-teacher"),
        ("s3", "Llama 3.1 70B", ""),
    ):
        Lineage.objects.create(
            model=model,
            dataset=Dataset.objects.create(
                name=name,
                source_category=SourceCategory.SYNTHETIC,
                modality=Modality.TEXT,
                generated_by=market,
                generated_by_other=other,
            ),
        )
    synthetic = build_document(model)["sources"]["synthetic"]
    assert (synthetic["market_models"], synthetic["other_models"]) == ("Llama 3.1 70B", "our-internal-teacher")
    Lineage.objects.create(
        model=model,
        dataset=Dataset.objects.create(name="s4", source_category=SourceCategory.SYNTHETIC, modality=Modality.TEXT),
    )
    synthetic = build_document(model)["sources"]["synthetic"]  # s4 names neither: both lists incomplete
    assert synthetic["market_models"] == "Llama 3.1 70B; to be provided"
    assert synthetic["other_models"] == "our-internal-teacher; to be provided"


@pytest.mark.django_db
def test_public_datasets_are_listed_above_three_percent_of_their_modality_by_name_only() -> None:
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
    public = build_document(model)["sources"]["public"]
    assert [(d["name"], d["modality"]) for d in public["large_datasets"]] == [
        ("big", "Text"),
        ("just-over", "Text"),
        ("pics", "Image"),
    ]
    text = render_markdown(build_document(model), version=1, last_update=LAST_UPDATE)
    assert "  - big (text)\n  - just-over (text)\n  - pics (image)\n" in text
    assert "94" not in text  # the template asks for the names, not their shares


@pytest.mark.django_db
def test_public_datasets_of_unknown_size_are_all_listed_with_their_share_to_be_provided() -> None:
    model = _model_with(
        ("text-ok", SourceCategory.PUBLIC, Modality.TEXT, 5_000_000_000, SizeUnit.TOKENS),
        ("text-unsized", SourceCategory.PUBLIC, Modality.TEXT, None, ""),
    )
    public = build_document(model)["sources"]["public"]
    assert [(d["name"], d["share"]) for d in public["large_datasets"]] == [
        ("text-ok", TO_BE_PROVIDED),
        ("text-unsized", TO_BE_PROVIDED),
    ]
    assert public["other_datasets"] == NOT_APPLICABLE  # none left over to describe


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
    assert crawled["domains"] == ["www.site01.example", "www.site02.example"]
    assert crawled["domain_rule"] == (
        "the top 5 % or 1,000 domains, whichever is lower (SME) of 40 domains by size of content, rounded up: 2"
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
    assert crawled["domains"] == ["shared.example", "a.example"]
    # Blank crawler answers are shown as such, never filled from the other dataset.
    assert crawled["crawlers"] == TO_BE_PROVIDED
    assert crawled["period"] == TO_BE_PROVIDED


def test_licences_and_domain_bytes_stay_out_of_the_public_summary_but_in_the_register(
    officer_client: Client, gpai_model: GpaiModel, crawled_dataset: Dataset
) -> None:
    """Item 9: the template asks for neither, and a provider may hold them as trade secrets."""
    version = summary.publish(gpai_model, user=None)
    published = version.text + json.dumps(version.document)
    for secret in (
        "ODC-By 1.0",
        "Licence agreement with Newswire Ltd",
        "terms of sale",
        "40,000,000",
        "40000000",
        "licence",
        '"bytes"',
    ):
        assert secret not in published, secret
    # The register keeps them: the dataset page and its API.
    page = officer_client.get(f"/compliance/datasets/{crawled_dataset.pk}/").content.decode()
    assert "www.site01.example" in page and "40,000,000" in page
    newswire = Dataset.objects.get(name="newswire-archive")
    assert officer_client.get(f"/api/v1/compliance/datasets/{newswire.pk}/").json()["licence"] == (
        "Licence agreement with Newswire Ltd (2025)"
    )


HOSTILE_NAME = "Evil <img src=x onerror=alert(1)> [click](javascript:alert(1)) ![i](http://x/t.png) `code` **bold** <script>x</script> &lt;"


@pytest.mark.django_db
def test_free_text_cannot_become_html_links_or_markup_in_the_markdown() -> None:
    """Item 10: a Markdown renderer (CommonMark, with raw HTML on) shows the text as typed: no tag,
    no link, no image, no emphasis."""
    model = GpaiModel.objects.create(
        name=HOSTILE_NAME,
        version="1",
        provider_name="Acme [home](javascript:alert(2))",
        modalities=[Modality.TEXT],
        content_types_text="<iframe src=//evil></iframe> | cell |",
    )
    text = render_markdown(build_document(model), version=1, last_update=LAST_UPDATE)
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    for forbidden in ("<img", "<script", "<iframe", "href=", "<code>", "<strong>Evil", "<em>"):
        assert forbidden not in html.replace("<strong>Versioned", ""), forbidden
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "[click](javascript:alert(1))" in html
    assert "&amp;lt;" in html  # an entity typed is shown as typed, not decoded
    assert "<table" not in html


@pytest.mark.django_db
def test_the_page_and_the_pdf_show_free_text_as_typed(officer_client: Client) -> None:
    model = GpaiModel.objects.create(name=HOSTILE_NAME, version="1", provider_name="Acme_Labs *Ltd*")
    page = officer_client.get(f"/compliance/models/{model.pk}/summary/").content.decode()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert 'Acme_Labs *Ltd*; <span class="tbp">to be provided</span>' in page  # escapes resolved for reading
    text = render_markdown(build_document(model), version=1, last_update=LAST_UPDATE)
    pdf = render_pdf(text, title="t")
    assert b"/URI" not in pdf and b"javascript" not in pdf.lower()  # no link annotation
    shown = "".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf)).pages)
    assert "[click](javascript:alert(1))" in shown.replace("\n", " ")
    assert "Acme_Labs *Ltd*" in shown
