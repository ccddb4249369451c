"""The public summary of training content (EU AI Act Art. 53(1)(d), the AI Office's template of
July 2025), sections 1-3, built from the register: the template's headings, numbering and
questions word for word (HEADINGS, QUESTIONS), each answered.

1. ``build_document(model)`` reads the model and the datasets its lineage names and returns a
   JSON-safe dict, section by section. Every answer the register leaves blank is exactly
   ``TO_BE_PROVIDED``: nothing is guessed (a dataset without a size makes that modality's size
   "to be provided" rather than a range computed from the others). Where the template allows it,
   an answer is ``NOT_APPLICABLE``, from a fact the register holds (a modality or source not used,
   a provider established in the Union, a model trained from scratch); an optional question left
   blank is ``NO_COMMENT``. What the template does not ask and a provider may hold as a trade
   secret (licence terms, each crawled domain's byte count) stays out: the register and the
   compliance pack keep it.
2. ``render_markdown(document, version=..., last_update=...)`` writes it as the Markdown subset of
   compliance.services.pdf, every piece of free text escaped (compliance.services.markdown). That
   text is what is published, hashed, exported and diffed, so it is deterministic: the same
   document, version and date always give the same bytes.
3. ``publish(model, user=...)`` freezes the current draft as the next SummaryVersion (the database
   refuses any later change to it). The draft itself is never stored.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from compliance.choices import AuditAction, Modality, SizeUnit, SourceCategory, UserDataOrigin
from compliance.models import CrawledDomain, Dataset, GpaiModel, SummaryPdf, SummaryVersion
from compliance.services import markdown
from compliance.services.audit import record
from compliance.services.pdf import render_pdf

TO_BE_PROVIDED = "to be provided"
NOT_APPLICABLE = "not applicable"
# An optional question ("Additional comments (optional)", 3.3) the provider chose not to answer.
NO_COMMENT = "none"
YES, NO = "yes", "no"

# 2.1: a public dataset is "large", and listed by name, above this share of the public data of
# its modality.
LARGE_PUBLIC_SHARE = Decimal("0.03")
# 2.3: the share of crawled domains (by size of content) to list; SMEs list the lower of a smaller
# share or a fixed count. The count is rounded UP, so a crawl with any domains lists at least one.
DOMAIN_SHARE = Decimal("0.10")
SME_DOMAIN_SHARE = Decimal("0.05")
SME_DOMAIN_MAX = 1000


@dataclass(frozen=True)
class SizeRanges:
    """The template's three size ranges for one modality: below ``low``, ``low`` to ``high``
    (both bounds inclusive), above ``high``."""

    unit: str
    low: int
    high: int
    below: str
    between: str
    above: str

    def label(self, amount: Decimal) -> str:
        if amount < self.low:
            return self.below
        if amount > self.high:
            return self.above
        return self.between


# The template's own wording of each range.
_HOURS = SizeRanges(
    SizeUnit.HOURS,
    10_000,
    1_000_000,
    "Less than 10 000 hours",
    "10 000 to 1 million hours",
    "More than 1 million hours",
)
RANGES: dict[str, SizeRanges] = {
    Modality.TEXT: SizeRanges(
        SizeUnit.TOKENS,
        10**9,
        10 * 10**12,
        "Less than 1 billion tokens",
        "1 billion to 10 trillion tokens",
        "More than 10 trillion tokens",
    ),
    Modality.IMAGE: SizeRanges(
        SizeUnit.IMAGES,
        10**6,
        10**9,
        "Less than 1 million images",
        "1 million to 1 billion images",
        "More than 1 billion images",
    ),
    Modality.AUDIO: _HOURS,
    Modality.VIDEO: _HOURS,
}

# The template's questions, word for word, by the key the document answers them under.
QUESTIONS: dict[str, str] = {
    "version": "Version of the Summary:",
    "last_update": "Last update:",
    # 1.1
    "provider": "Provider name and contact details:",
    "authorised_representative": "Authorised representative name and contact details:",
    # 1.2
    "versioned_name": "Versioned model name(s):",
    "dependencies": "Model dependencies:",
    "placed_on_market": "Date of placement of the model on the Union market:",
    # 1.3, per modality
    "modality_present": "Present in the training data:",
    "size": "Training data size:",
    "other_unit": "Alternatively, specify the approximate size in a different measurement unit:",
    "content_types": "Types of content:",
    "other_modality": "Specify the modality:",
    "other_size": "Approximate size and unit of measurement:",
    # 1.3, overall
    "latest_collection": "Latest date of data acquisition/collection for model training:",
    "continuously_trained": "Is the model continuously trained on new data after this date?",
    "linguistic": "Description of the linguistic characteristics of the overall training data:",
    "other_characteristics": "Other relevant characteristics of the overall training data:",
    "comments": "Additional comments (optional):",
    # 2.1
    "public_used": "Have you used publicly available datasets to train the model?",
    "modalities": "If yes, specify the modality(ies) of the content covered by the datasets concerned:",
    "large_datasets": "List of large publicly available datasets:",
    "other_public": "General description of other publicly available datasets not listed above:",
    # 2.2.1, 2.2.2
    "licensed_used": "Have you concluded transactional commercial licensing agreement(s) with rightsholder(s) or "
    "with their representatives?",
    "third_party_used": "Have you obtained private datasets from third parties that are not licensed as described "
    "in Section 2.2.1, such as data obtained from providers of private databases, or data intermediaries?",
    "publicly_known": "If publicly known, list private datasets obtained from other third parties:",
    "not_publicly_known": "General description of non-publicly known private datasets obtained from third parties:",
    # 2.3
    "crawled_used": "Were crawlers used by the provider or on behalf of?",
    "crawlers": "If yes, specify crawler name(s)/identifier(s):",
    "purposes": "Purposes of the crawler(s):",
    "behaviour": "General description of crawler behaviour:",
    "period": "Period of data collection:",
    "content": "Comprehensive description of the type of content and online sources crawled:",
    "modality_covered": "Type of modality covered:",
    "domains": "Summary of the most relevant domain names crawled:",
    # 2.4
    "from_model": "Was data from user interactions with the AI model (e.g. user input and prompts) used to train "
    "the model?",
    "from_other_services": "Was data collected from user interactions with the provider’s other services or "
    "products used to train the model?",
    "services": "If yes, provide a general description of the provider’s services or products that were used to "
    "collect the user data:",
    # 2.5
    "synthetic_used": "Was synthetic AI-generated data created by the provider or on their behalf to train the model?",
    "synthetic_modalities": "If yes, modality of the synthetic data:",
    "market_models": "If yes, specify the general-purpose AI model(s) used to generate the synthetic data if "
    "available on the market:",
    "other_models": "Information about other AI models, including provider’s own AI model(s) not available on the "
    "market, used to generate synthetic data to train the model to which this Summary applies:",
    # 2.6
    "other_used": "Have data sources other than those described in Sections 2.1 to 2.5 been used to train the model?",
    "other_description": "If yes, provide a narrative description of these data sources and the data:",
    # 3.1-3.3
    "code_of_practice": "Are you a Signatory to the Code of Practice for general-purpose AI models that includes "
    "commitments to respect reservations of rights from the TDM exception or limitation?",
    "tdm_measures": "Describe the measures implemented before model training to respect reservations of rights "
    "from the TDM exception or limitation before and during data collection, including the opt-out protocols and "
    "solutions honoured by the provider or, as applicable, by third parties from which datasets have been obtained:",
    "illegal_content": "General description of measures taken:",
    "other_processing": "Other relevant information about data processing (optional):",
}

# The template's headings, word for word and numbered as it numbers them.
HEADINGS: dict[str, str] = {
    "1": "1. General information",
    "1.1": "1.1. Provider identification",
    "1.2": "1.2. Model identification",
    "1.3": "1.3. Modalities, overall training data size and other characteristics",
    "2": "2. List of data sources",
    "2.1": "2.1. Publicly available datasets",
    "2.2": "2.2. Private non-publicly available datasets obtained from third parties",
    "2.2.1": "2.2.1. Datasets commercially licensed by rightsholders or their representatives",
    "2.2.2": "2.2.2. Private datasets obtained from other third parties",
    "2.3": "2.3. Data crawled and scraped from online sources",
    "2.4": "2.4. User data",
    "2.5": "2.5. Synthetic data",
    "2.6": "2.6. Other sources of data",
    "3": "3. Data processing aspects",
    "3.1": "3.1. Respect of reservation of rights from text and data mining exception or limitation",
    "3.2": "3.2. Removal of illegal content",
    "3.3": "3.3. Other information (optional)",
}


class SummaryUnchanged(Exception):
    """Publishing a draft identical to the latest version (HTTP 409): no duplicate versions."""


def _inline(text: str) -> str:
    """Free text as it may stand in one line of the published Markdown: line breaks folded (a
    heading or bullet cannot be forged into the hashed text) and every character Markdown or HTML
    would read as markup escaped (compliance.services.markdown)."""
    return markdown.escape(text)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _answer(value: Any) -> str:
    """A register field as an answer: blank is "to be provided", a date is ISO."""
    if _blank(value):
        return TO_BE_PROVIDED
    if isinstance(value, bool):
        return YES if value else NO
    if isinstance(value, date):
        return value.isoformat()
    return _inline(str(value))


def _optional(value: str) -> str:
    """An optional question: blank means the provider has nothing to add, not a missing answer."""
    return NO_COMMENT if _blank(value) else _inline(value)


def _amount(value: Decimal) -> str:
    """1234567.00 -> "1,234,567" (sizes are whole numbers in practice; a fraction is kept)."""
    return f"{value:,.0f}" if value == value.to_integral_value() else f"{value:,}"


def _totals(datasets: list[Dataset]) -> str:
    """The datasets' sizes summed per unit, in the order the units are declared: "12 bytes",
    or "5,000 tokens and 12 bytes"."""
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for d in datasets:
        if d.size is not None:
            totals[d.size_unit] += d.size
    return " and ".join(f"{_amount(totals[u])} {u}" for u in SizeUnit.values if u in totals)


def _modality_sizes(modality: str, datasets: list[Dataset]) -> tuple[str, str]:
    """(range, size in another unit) of one used modality, summed over its datasets.

    - every dataset counted in the template's unit (tokens, images, hours): the range, and no
      other unit ("not applicable");
    - any counted in another unit (bytes, items): no range can be chosen honestly, so the range is
      "not applicable" and the totals go in the template's "different measurement unit";
    - any dataset without a size: neither is known ("to be provided"), nothing is guessed.
    "Other" has no ranges: its totals are the answer (the second value).
    """
    if not datasets or any(d.size is None for d in datasets):
        return TO_BE_PROVIDED, TO_BE_PROVIDED
    ranges = RANGES.get(modality)
    if ranges is None:
        return NOT_APPLICABLE, _totals(datasets)
    if all(d.size_unit == ranges.unit for d in datasets):
        total = sum((d.size for d in datasets if d.size is not None), Decimal(0))
        return ranges.label(total), NOT_APPLICABLE
    return NOT_APPLICABLE, _totals(datasets)


def _month(day: date) -> str:
    return day.strftime("%m/%Y")


def _dependencies(model: GpaiModel) -> str:
    """1.2: the model(s) this one modifies; "not applicable" for a model trained from scratch."""
    if model.base_model is not None:
        return _inline(str(model.base_model))
    if model.base_model_external.strip():
        return _inline(model.base_model_external)
    if model.trained_from_scratch:
        return f"{NOT_APPLICABLE} (trained from scratch)"
    return TO_BE_PROVIDED


def _representative(model: GpaiModel) -> str:
    """1.1: an authorised representative is needed only by a provider established outside the
    Union (Art. 54)."""
    if model.authorised_representative.strip():
        return _inline(model.authorised_representative)
    if model.provider_established_in_union:
        return f"{NOT_APPLICABLE} (provider established in the Union)"
    return TO_BE_PROVIDED


def _provider(model: GpaiModel) -> str:
    if _blank(model.provider_name) and _blank(model.provider_contact):
        return TO_BE_PROVIDED
    return f"{_answer(model.provider_name)}; {_answer(model.provider_contact)}"


def _general(model: GpaiModel, datasets: list[Dataset]) -> dict[str, Any]:
    by_modality: dict[str, list[Dataset]] = defaultdict(list)
    for d in datasets:
        by_modality[d.modality].append(d)
    known = bool(model.modalities) or bool(datasets)  # otherwise "not used" would be a guess
    modalities = []
    for modality in Modality:
        used = modality in model.modalities or modality in by_modality
        if not known:
            present, size, other_unit, content = TO_BE_PROVIDED, TO_BE_PROVIDED, TO_BE_PROVIDED, TO_BE_PROVIDED
        elif not used:
            present, size, other_unit, content = NO, NOT_APPLICABLE, NOT_APPLICABLE, NOT_APPLICABLE
        else:
            present = YES
            size, other_unit = _modality_sizes(modality, by_modality[modality])
            content = _answer(getattr(model, f"content_types_{modality.value}"))
        row = {"modality": modality.label, "present": present, "content_types": content}
        if modality == Modality.OTHER:
            row["which"] = _answer(model.other_modality) if used else (NOT_APPLICABLE if known else TO_BE_PROVIDED)
            row["size"] = other_unit
        else:
            row["size"], row["other_unit"] = size, other_unit
        modalities.append(row)
    collected = [d.collected_until for d in datasets if d.collected_until is not None]
    return {
        "provider": {"name_and_contact": _provider(model), "authorised_representative": _representative(model)},
        "model": {
            "versioned_name": _inline(str(model)),
            "dependencies": _dependencies(model),
            "placed_on_market": _answer(model.placed_on_market),
        },
        "modalities": modalities,
        "latest_collection": _month(max(collected)) if collected else TO_BE_PROVIDED,
        "continuously_trained": _answer(model.continuously_trained),
        "linguistic_characteristics": _answer(model.linguistic_characteristics),
        "other_characteristics": _answer(model.other_characteristics),
        "comments": _optional(model.comments_general),
    }


def _modalities(group: list[Dataset], model: GpaiModel) -> str:
    """The modalities of ``group`` in the template's order; "Other" says which when known."""
    labels = []
    for m in Modality:
        if any(d.modality == m for d in group):
            other = m == Modality.OTHER and model.other_modality.strip()
            labels.append(f"{m.label} ({_inline(model.other_modality)})" if other else m.label)
    return ", ".join(labels)


def _described(datasets: list[Dataset]) -> str:
    """The datasets' content descriptions, distinct, in name order (blank: "to be provided")."""
    return "; ".join(dict.fromkeys(_answer(d.description) for d in datasets)) if datasets else NOT_APPLICABLE


def _large_public(datasets: list[Dataset]) -> tuple[list[dict[str, str]], list[Dataset]]:
    """2.1: (the large public datasets, the others). Large is above 3 % of the public data of its
    modality. A modality where a public dataset's size is unknown (or the units differ) cannot be
    shared out: all its datasets are listed, each marked "to be provided", and none is "other".
    The shares themselves are not published (the template asks for the names)."""
    by_modality: dict[str, list[Dataset]] = defaultdict(list)
    for d in datasets:
        by_modality[d.modality].append(d)
    large: list[dict[str, str]] = []
    rest: list[Dataset] = []
    for modality in Modality:
        group = by_modality.get(modality, [])
        if any(d.size is None for d in group) or len({d.size_unit for d in group}) > 1:
            large += [{"name": _inline(d.name), "modality": modality.label, "share": TO_BE_PROVIDED} for d in group]
            continue
        total = sum((d.size for d in group if d.size is not None), Decimal(0))
        for d in group:
            if total and d.size is not None and d.size / total > LARGE_PUBLIC_SHARE:
                large.append({"name": _inline(d.name), "modality": modality.label, "share": "more than 3 %"})
            else:
                rest.append(d)
    return large, rest


def domain_cut(count: int, *, sme: bool) -> int:
    """How many of ``count`` domains the summary lists: 10 % rounded up; for an SME 5 % rounded up,
    at most 1,000 (the template: "top 5 % or 1,000 domains, whichever is lower")."""
    if sme:
        return min(math.ceil(count * SME_DOMAIN_SHARE), SME_DOMAIN_MAX)
    return math.ceil(count * DOMAIN_SHARE)


def _joined(values: list[Any]) -> str:
    """Each dataset's answer (blank: "to be provided"), distinct, in dataset order."""
    return "; ".join(dict.fromkeys(_answer(v) for v in values)) if values else TO_BE_PROVIDED


def _crawled(datasets: list[Dataset]) -> dict[str, Any]:
    """2.3 for the crawled datasets. The domains are ranked by the bytes the crawler's CSV gave,
    but only their names are published: the byte counts stay in the register and the pack."""
    starts = [d.crawl_started for d in datasets]
    ends = [d.crawl_ended for d in datasets]
    if datasets and None not in starts and None not in ends:
        period = f"From {_month(min(starts))} to {_month(max(ends))}"  # type: ignore[type-var]
    else:
        period = TO_BE_PROVIDED
    # One row per domain over all the crawled datasets: bytes summed, largest first, ties by name.
    rows = (
        CrawledDomain.objects.filter(dataset__in=datasets)
        .values("domain")
        .annotate(total=Sum("bytes"))
        .order_by("-total", "domain")
    )
    names = [r["domain"] for r in rows]
    sme = settings.COMPLIANCE_SME
    listed = domain_cut(len(names), sme=sme)
    rule = "top 5 % or 1,000 domains, whichever is lower (SME)" if sme else "top 10 %"
    return {
        "crawlers": _joined([d.crawler_names for d in datasets]),
        "purposes": _joined([d.crawl_purpose for d in datasets]),
        "behaviour": _joined([d.crawler_behaviour for d in datasets]),
        "period": period,
        "content": _joined([d.description for d in datasets]),
        # No per-domain counts imported yet: the list is missing, not empty.
        "domain_rule": f"the {rule} of {len(names)} domains by size of content, rounded up: {listed}"
        if names
        else TO_BE_PROVIDED,
        "domains": [_inline(n) for n in names[:listed]],
    }


def _yes_no(group: list[Dataset], lineage_known: bool) -> str:
    """Whether a source category was used: with no lineage at all the register has not answered;
    with some, absence means "no"."""
    if group:
        return YES
    return NO if lineage_known else TO_BE_PROVIDED


def _if_used(used: str, answer: Any) -> Any:
    """An "If yes, ..." question: answered when used, "not applicable" when not, unknown when
    usage is."""
    if used == YES:
        return answer
    return NOT_APPLICABLE if used == NO else TO_BE_PROVIDED


def _user_data(group: list[Dataset], lineage_known: bool, model: GpaiModel) -> dict[str, str]:
    """2.4's two questions: user data from interactions with the model, and from the provider's
    other services or products. A user-data dataset that does not say which makes both unsure."""
    unsure = any(not d.user_data_origin for d in group)

    def asked(origin: str) -> str:
        if any(d.user_data_origin == origin for d in group):
            return YES
        if unsure or not lineage_known:
            return TO_BE_PROVIDED
        return NO

    other = asked(UserDataOrigin.OTHER_SERVICES)
    services = [d.user_data_source for d in group if d.user_data_origin == UserDataOrigin.OTHER_SERVICES]
    return {
        "from_model": asked(UserDataOrigin.MODEL),
        "from_other_services": other,
        "services": _if_used(other, _joined(services)),
        "modalities": _if_used(_yes_no(group, lineage_known), _modalities(group, model)),
        "comments": _optional(model.comments_user_data),
    }


def _generating_models(values: list[str], unanswered: bool) -> str:
    """One of 2.5's two lists of generating models: those named, plus "to be provided" while a
    synthetic dataset names neither kind; "not applicable" when every dataset answered and none
    named one of this kind."""
    named = list(dict.fromkeys(_inline(v) for v in values if v.strip()))
    if unanswered:
        named.append(TO_BE_PROVIDED)
    return "; ".join(named) if named else NOT_APPLICABLE


def _sources(datasets: list[Dataset], model: GpaiModel) -> dict[str, Any]:
    by_category: dict[str, list[Dataset]] = defaultdict(list)
    for d in datasets:
        by_category[d.source_category].append(d)
    known = bool(datasets)

    def base(category: str, comments: str | None = None) -> dict[str, Any]:
        group = by_category.get(category, [])
        used = _yes_no(group, known)
        section = {"used": used, "modalities": _if_used(used, _modalities(group, model))}
        if comments is not None:
            section["comments"] = _optional(comments)
        return section

    public = base(SourceCategory.PUBLIC, model.comments_public)
    large, rest = _large_public(by_category.get(SourceCategory.PUBLIC, []))
    public["large_datasets"] = large
    public["other_datasets"] = _if_used(public["used"], _described(rest))

    third = base(SourceCategory.THIRD_PARTY, model.comments_third_party)
    group = by_category.get(SourceCategory.THIRD_PARTY, [])
    third["publicly_known"] = [_inline(d.name) for d in group if d.publicly_known]
    third["not_publicly_known"] = _if_used(third["used"], _described([d for d in group if not d.publicly_known]))

    crawled = base(SourceCategory.CRAWLED, model.comments_crawled)
    group = by_category.get(SourceCategory.CRAWLED, [])
    details = _crawled(group) if group else {}
    for key in ("crawlers", "purposes", "behaviour", "period", "content", "domain_rule"):
        crawled[key] = _if_used(crawled["used"], details.get(key))
    crawled["domains"] = details.get("domains", [])

    synthetic = base(SourceCategory.SYNTHETIC, model.comments_synthetic)
    group = by_category.get(SourceCategory.SYNTHETIC, [])
    unanswered = any(_blank(d.generated_by) and _blank(d.generated_by_other) for d in group)
    synthetic["market_models"] = _if_used(
        synthetic["used"], _generating_models([d.generated_by for d in group], unanswered)
    )
    synthetic["other_models"] = _if_used(
        synthetic["used"], _generating_models([d.generated_by_other for d in group], unanswered)
    )

    other = base(SourceCategory.OTHER, model.comments_other_sources)
    other.pop("modalities")  # 2.6 asks for a narrative, not modalities
    other["description"] = _if_used(other["used"], _described(by_category.get(SourceCategory.OTHER, [])))

    return {
        "public": public,
        "licensed": base(SourceCategory.LICENSED),
        "third_party": third,
        "crawled": crawled,
        "user_data": _user_data(by_category.get(SourceCategory.USER_DATA, []), known, model),
        "synthetic": synthetic,
        "other": other,
    }


def build_document(model: GpaiModel) -> dict[str, Any]:
    """Sections 1-3 of the template for ``model``, from the register (JSON-safe: it is stored as
    published and compared with the next draft). Licence terms and per-domain byte counts are not
    in it: the template does not ask for them and a provider may hold them as trade secrets."""
    datasets = list(Dataset.objects.filter(lineage__model=model).distinct().order_by("name"))
    return {
        "model": _inline(str(model)),
        "general": _general(model, datasets),
        "sources": _sources(datasets, model),
        "processing": {
            "code_of_practice": _answer(model.signed_code_of_practice),
            "tdm_opt_out_measures": _answer(model.tdm_opt_out_measures),
            "comments": _optional(model.comments_tdm),
            "illegal_content_measures": _answer(model.illegal_content_measures),
            "other": _optional(model.other_processing),
        },
    }


# --- the text ------------------------------------------------------------------------------------


def _q(key: str, answer: str, indent: int = 0) -> str:
    """One question of the template and its answer, as a bullet."""
    return f"{'  ' * indent}- **{QUESTIONS[key]}** {answer}"


def _listed(key: str, names: list[str], empty: str) -> list[str]:
    """A question answered by a list: the names as sub-bullets, or ``empty`` on the line."""
    if not names:
        return [_q(key, empty)]
    return [f"- **{QUESTIONS[key]}**", *(f"  - {n}" for n in names)]


def _heading(key: str, level: int) -> list[str]:
    return ["", f"{'#' * level} {HEADINGS[key]}", ""]


def _modalities_markdown(rows: list[dict[str, str]]) -> list[str]:
    lines: list[str] = []
    for m in rows:
        lines.append(f"- **{m['modality']}**")
        lines.append(_q("modality_present", m["present"], 1))
        if "which" in m:
            lines += [_q("other_modality", m["which"], 1), _q("other_size", m["size"], 1)]
        else:
            lines += [_q("size", m["size"], 1), _q("other_unit", m["other_unit"], 1)]
        lines.append(_q("content_types", m["content_types"], 1))
    return lines


def _sources_markdown(s: dict[str, Any]) -> list[str]:
    public, third, crawled = s["public"], s["third_party"], s["crawled"]
    user, synthetic, other = s["user_data"], s["synthetic"], s["other"]
    large = [
        f"{d['name']} ({d['modality'].lower()})"
        + ("" if d["share"] != TO_BE_PROVIDED else f": share of the public data {TO_BE_PROVIDED}")
        for d in public["large_datasets"]
    ]
    domains = crawled["domains"]
    return [
        *_heading("2", 2)[1:],
        *_heading("2.1", 3)[1:],
        _q("public_used", public["used"]),
        _q("modalities", public["modalities"]),
        *_listed("large_datasets", large, _if_used(public["used"], "none")),
        _q("other_public", public["other_datasets"]),
        _q("comments", public["comments"]),
        *_heading("2.2", 3),
        *_heading("2.2.1", 4)[1:],
        _q("licensed_used", s["licensed"]["used"]),
        _q("modalities", s["licensed"]["modalities"]),
        *_heading("2.2.2", 4),
        _q("third_party_used", third["used"]),
        _q("modalities", third["modalities"]),
        *_listed("publicly_known", third["publicly_known"], _if_used(third["used"], NOT_APPLICABLE)),
        _q("not_publicly_known", third["not_publicly_known"]),
        _q("comments", third["comments"]),
        *_heading("2.3", 3),
        _q("crawled_used", crawled["used"]),
        _q("crawlers", crawled["crawlers"]),
        _q("purposes", crawled["purposes"]),
        _q("behaviour", crawled["behaviour"]),
        _q("period", crawled["period"]),
        _q("content", crawled["content"]),
        _q("modality_covered", crawled["modalities"]),
        _q("domains", crawled["domain_rule"]),
        *(f"  - {d}" for d in domains),
        _q("comments", crawled["comments"]),
        *_heading("2.4", 3),
        _q("from_model", user["from_model"]),
        _q("from_other_services", user["from_other_services"]),
        _q("services", user["services"]),
        _q("modality_covered", user["modalities"]),
        _q("comments", user["comments"]),
        *_heading("2.5", 3),
        _q("synthetic_used", synthetic["used"]),
        _q("synthetic_modalities", synthetic["modalities"]),
        _q("market_models", synthetic["market_models"]),
        _q("other_models", synthetic["other_models"]),
        _q("comments", synthetic["comments"]),
        *_heading("2.6", 3),
        _q("other_used", other["used"]),
        _q("other_description", other["description"]),
        _q("comments", other["comments"]),
    ]


def render_markdown(document: dict[str, Any], *, version: int | None, last_update: date) -> str:
    """The published text (Markdown subset of compliance.services.pdf): the template's headings and
    questions in its order, each answered. ``version`` None is the unpublished draft."""
    g, p = document["general"], document["processing"]
    lines = [
        f"# Public Summary of Training Content for {document['model']}",
        "",
        _q("version", str(version) if version is not None else "draft, not published"),
        _q("last_update", last_update.isoformat()),
        *_heading("1", 2),
        *_heading("1.1", 3)[1:],
        _q("provider", g["provider"]["name_and_contact"]),
        _q("authorised_representative", g["provider"]["authorised_representative"]),
        *_heading("1.2", 3),
        _q("versioned_name", g["model"]["versioned_name"]),
        _q("dependencies", g["model"]["dependencies"]),
        _q("placed_on_market", g["model"]["placed_on_market"]),
        *_heading("1.3", 3),
        *_modalities_markdown(g["modalities"]),
        _q("latest_collection", g["latest_collection"]),
        _q("continuously_trained", g["continuously_trained"]),
        _q("linguistic", g["linguistic_characteristics"]),
        _q("other_characteristics", g["other_characteristics"]),
        _q("comments", g["comments"]),
        "",
        *_sources_markdown(document["sources"]),
        *_heading("3", 2),
        *_heading("3.1", 3)[1:],
        _q("code_of_practice", p["code_of_practice"]),
        _q("tdm_measures", p["tdm_opt_out_measures"]),
        _q("comments", p["comments"]),
        *_heading("3.2", 3),
        _q("illegal_content", p["illegal_content_measures"]),
        *_heading("3.3", 3),
        _q("other_processing", p["other"]),
    ]
    return "\n".join(lines) + "\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- publishing, diffs, exports ------------------------------------------------------------------


def publish(model: GpaiModel, *, user: Any) -> SummaryVersion:
    """Freeze the current draft as the next version, or raise SummaryUnchanged.

    1. Lock the model's row: two publishes of one model queue here, so each sees the other's
       version and neither takes the same number (the unique constraint is the backstop).
    2. Build the draft and compare it with the latest version's document: unchanged is refused.
    3. Render, hash, store; the audit entry is written in the same transaction.
    """
    with transaction.atomic():
        locked = GpaiModel.objects.select_for_update().get(pk=model.pk)
        document = build_document(locked)
        latest = locked.summaries.order_by("-version").first()
        if latest is not None and latest.document == document:
            raise SummaryUnchanged(
                f"Nothing changed in the register since version {latest.version}: no new version published."
            )
        number = latest.version + 1 if latest is not None else 1
        today = timezone.localdate()
        text = render_markdown(document, version=number, last_update=today)
        summary = SummaryVersion.objects.create(
            model=locked,
            version=number,
            document=document,
            text=text,
            sha256=sha256(text),
            last_update=today,
            published_by=user,
        )
        record(AuditAction.ACTION, obj=summary, message=f"Published summary v{number}", actor=user)
        transaction.on_commit(lambda: queue_pdf(summary.pk))  # rendered once, by a worker
    return summary


def previous(summary: SummaryVersion) -> SummaryVersion | None:
    return summary.model.summaries.filter(version__lt=summary.version).order_by("-version").first()


def diff(old: SummaryVersion | None, new: SummaryVersion) -> str:
    """The unified diff of two published texts, as ``diff -u`` prints it; against nothing for a
    first version (every line added)."""
    return "\n".join(
        difflib.unified_diff(
            old.text.splitlines() if old else [],
            new.text.splitlines(),
            fromfile=f"v{old.version} ({old.last_update.isoformat()})" if old else "nothing published",
            tofile=f"v{new.version} ({new.last_update.isoformat()})",
            lineterm="",
        )
    )


EXPORT_FORMATS = {"md": "text/markdown; charset=utf-8", "json": "application/json", "pdf": "application/pdf"}

# --- the PDF: rendered once per published version, by a worker, then served as stored -----------

# Advisory lock keys of PDF renders: this class in the high 32 bits ("gpPD"), the version's id below.
PDF_LOCK_CLASS = 0x6770_5044
# How long a download waits for a PDF the worker has not stored yet (stored_pdf).
PDF_WAIT_SECONDS = 5.0


class PdfNotReady(Exception):
    """The version's PDF is not rendered yet (a worker is on it): try again shortly."""


def render_summary_pdf(summary: SummaryVersion) -> bytes:
    """The published text as a PDF, the hash on every page. Hundreds of pages for a large crawl:
    called by the worker (``store_pdf``), never per download."""
    return render_pdf(
        summary.text,
        title=f"Public summary of training content: {summary.model} v{summary.version}",
        footer=f"SHA-256 {summary.sha256}",
    )


def store_pdf(summary_id: int) -> SummaryPdf | None:
    """Render version ``summary_id``'s PDF and store it, once: a version that has its PDF keeps it
    (the row is frozen), and while one render runs another of the same version does nothing
    (returns None). Runs in the worker (compliance.tasks_summary.render_summary_pdf)."""
    with transaction.atomic():
        with transaction.get_connection().cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [(PDF_LOCK_CLASS << 32) | summary_id])
            if not cursor.fetchone()[0]:
                return None
        if stored := SummaryPdf.objects.filter(pk=summary_id).first():
            return stored
        summary = SummaryVersion.objects.select_related("model").get(pk=summary_id)
        started = time.monotonic()
        body = render_summary_pdf(summary)
        return SummaryPdf.objects.create(
            summary=summary,
            content=body,
            sha256=hashlib.sha256(body).hexdigest(),
            size=len(body),
            render_ms=round((time.monotonic() - started) * 1000),
        )


def queue_pdf(summary_id: int) -> None:
    """Queue the rendering of a version's PDF (in eager mode, the embedded runtime, it runs now)."""
    from compliance.summary.tasks import render_summary_pdf as task

    task.delay(summary_id)


def _stored_content(summary_id: int) -> Any:
    return SummaryPdf.objects.filter(pk=summary_id).values_list("content", flat=True).first()


def stored_pdf(summary: SummaryVersion) -> bytes:
    """The version's stored PDF, or PdfNotReady. One not stored yet (just published, or its task
    lost) has its rendering queued again, and is waited for a few seconds (PDF_WAIT_SECONDS): a
    summary of ordinary size renders in well under a second, one over a large crawl in half a
    minute, and that download is answered with a 409 to retry instead of holding the request."""
    content = _stored_content(summary.pk)
    if content is None:
        queue_pdf(summary.pk)
        deadline = time.monotonic() + (0 if settings.EAGER_TASKS else PDF_WAIT_SECONDS)
        while (content := _stored_content(summary.pk)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
    if content is None:
        raise PdfNotReady(f"The PDF of summary v{summary.version} is being rendered; try again in a few seconds.")
    return bytes(content)


def export(summary: SummaryVersion, fmt: str, *, actor: Any) -> bytes:
    """One published version as ``fmt`` (a key of EXPORT_FORMATS), audited as ``actor``'s download."""
    if fmt == "md":
        body = summary.text.encode()
    elif fmt == "json":
        payload = {
            "model": str(summary.model),
            "version": summary.version,
            "last_update": summary.last_update.isoformat(),
            "sha256": summary.sha256,
            "document": summary.document,
        }
        body = json.dumps(payload, indent=2, ensure_ascii=False).encode()
    elif fmt == "pdf":
        body = stored_pdf(summary)
    else:
        raise ValueError(f"Unknown export format {fmt!r}: one of {', '.join(EXPORT_FORMATS)}.")
    record(AuditAction.EXPORT, obj=summary, message=f"Downloaded summary v{summary.version} as {fmt}", actor=actor)
    return body
