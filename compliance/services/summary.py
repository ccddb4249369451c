"""The public summary of training content (EU AI Act Art. 53(1)(d), the AI Office's template of
July 2025), sections 1-3, built from the register.

1. ``build_document(model)`` reads the model and the datasets its lineage names and returns a
   JSON-safe dict, section by section. Every answer the register leaves blank is exactly
   ``TO_BE_PROVIDED``: nothing is guessed (a dataset without a size, or counted in a unit that is
   not its modality's, makes that modality's size "to be provided" rather than a range computed
   from the others).
2. ``render_markdown(document, version=..., last_update=...)`` writes it as the Markdown subset of
   compliance.services.pdf. That text is what is published, hashed, exported and diffed, so it is
   deterministic: the same document, version and date always give the same bytes.
3. ``publish(model, user=...)`` freezes the current draft as the next SummaryVersion (the database
   refuses any later change to it). The draft itself is never stored.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from compliance.choices import AuditAction, Modality, SizeUnit, SourceCategory
from compliance.models import CrawledDomain, Dataset, GpaiModel, SummaryVersion
from compliance.services.audit import record
from compliance.services.pdf import render_pdf

TO_BE_PROVIDED = "to be provided"
NOT_APPLICABLE = "not applicable"
YES, NO = "yes", "no"

# 2.1: a public dataset is "large", and listed by name, above this share of the public data of
# its modality.
LARGE_PUBLIC_SHARE = Decimal("0.03")
# 2.3: the share of crawled domains (by bytes) to list; SMEs list the lower of a smaller share or
# a fixed count. The count is rounded UP, so a crawl with any domains lists at least one.
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


_HOURS = SizeRanges(
    SizeUnit.HOURS, 10_000, 1_000_000, "< 10,000 hours", "10,000 – 1 million hours", "> 1 million hours"
)
RANGES: dict[str, SizeRanges] = {
    Modality.TEXT: SizeRanges(
        SizeUnit.TOKENS,
        10**9,
        10 * 10**12,
        "< 1 billion tokens",
        "1 billion – 10 trillion tokens",
        "> 10 trillion tokens",
    ),
    Modality.IMAGE: SizeRanges(
        SizeUnit.IMAGES, 10**6, 10**9, "< 1 million images", "1 million – 1 billion images", "> 1 billion images"
    ),
    Modality.AUDIO: _HOURS,
    Modality.VIDEO: _HOURS,
}


class SummaryUnchanged(Exception):
    """Publishing a draft identical to the latest version (HTTP 409): no duplicate versions."""


def _inline(text: str) -> str:
    """Free text as it may stand in one line of the published Markdown: line breaks folded (a
    heading or bullet cannot be forged into the hashed text) and pipes, which would make a table
    row of it, replaced."""
    return " ".join(text.replace("|", "/").split())


def _answer(value: Any) -> str:
    """A register field as an answer: blank is "to be provided", a date is ISO."""
    if value is None or value == "" or (isinstance(value, str) and not value.strip()):
        return TO_BE_PROVIDED
    if isinstance(value, bool):
        return YES if value else NO
    if isinstance(value, date):
        return value.isoformat()
    return _inline(str(value))


def _amount(value: Decimal) -> str:
    """1234567.00 -> "1,234,567" (sizes are whole numbers in practice; a fraction is kept)."""
    return f"{value:,.0f}" if value == value.to_integral_value() else f"{value:,}"


def _size(dataset: Dataset) -> str:
    if dataset.size is None:
        return TO_BE_PROVIDED
    return f"{_amount(dataset.size)} {dataset.size_unit}"


def _modality_size(modality: str, datasets: list[Dataset]) -> str:
    """The modality's range, summed over its datasets; "to be provided" when any dataset has no
    size or one in another unit than the modality's (tokens, images, hours). "Other" has no ranges
    in the template: its total is given as is when every dataset shares one unit."""
    if not datasets or any(d.size is None for d in datasets):
        return TO_BE_PROVIDED
    total = sum((d.size for d in datasets if d.size is not None), Decimal(0))
    ranges = RANGES.get(modality)
    if ranges is None:
        units = {d.size_unit for d in datasets}
        return f"{_amount(total)} {units.pop()}" if len(units) == 1 else TO_BE_PROVIDED
    if any(d.size_unit != ranges.unit for d in datasets):
        return TO_BE_PROVIDED
    return ranges.label(total)


def _general(model: GpaiModel, datasets: list[Dataset]) -> dict[str, Any]:
    if model.base_model is not None:
        dependencies = _inline(f"{model.base_model} (registered)")
    elif model.base_model_external:
        dependencies = _inline(f"{model.base_model_external} (external)")
    else:
        dependencies = TO_BE_PROVIDED
    by_modality: dict[str, list[Dataset]] = defaultdict(list)
    for d in datasets:
        by_modality[d.modality].append(d)
    known = bool(model.modalities) or bool(datasets)  # otherwise "not used" would be a guess
    modalities = []
    for modality in Modality:
        used = modality in model.modalities or modality in by_modality
        size = _modality_size(modality, by_modality[modality]) if used else NOT_APPLICABLE
        if not known:
            size = TO_BE_PROVIDED
        modalities.append(
            {"modality": modality.label, "used": YES if used else (NO if known else TO_BE_PROVIDED), "size": size}
        )
    collected = [d.collected_until for d in datasets if d.collected_until is not None]
    return {
        "provider": {
            "name": _answer(model.provider_name),
            "contact": _answer(model.provider_contact),
            "authorised_representative": _answer(model.authorised_representative),
        },
        "model": {
            "versioned_name": _inline(str(model)),
            "dependencies": dependencies,
            "placed_on_market": _answer(model.placed_on_market),
        },
        "modalities": modalities,
        "content_types": _answer(model.content_types),
        "latest_collection": max(collected).strftime("%m/%Y") if collected else TO_BE_PROVIDED,
        "linguistic_characteristics": _answer(model.linguistic_characteristics),
        "other_characteristics": _answer(model.other_characteristics),
    }


def _dataset_entry(dataset: Dataset) -> dict[str, str]:
    return {
        "name": _inline(dataset.name),
        "modality": dataset.get_modality_display(),
        "size": _size(dataset),
        "description": _answer(dataset.description),
        "licence": _answer(dataset.licence),
    }


def _large_public(datasets: list[Dataset]) -> list[dict[str, str]]:
    """2.1: the public datasets above 3 % of the public data of their modality. A modality where
    a public dataset's size is unknown (or in another unit) cannot be shared out: all its public
    datasets are listed, their share "to be provided"."""
    by_modality: dict[str, list[Dataset]] = defaultdict(list)
    for d in datasets:
        by_modality[d.modality].append(d)
    large = []
    for modality in Modality:
        group = by_modality.get(modality, [])
        units = {d.size_unit for d in group}
        if any(d.size is None for d in group) or len(units) > 1:
            large += [{"name": _inline(d.name), "modality": modality.label, "share": TO_BE_PROVIDED} for d in group]
            continue
        total = sum((d.size for d in group if d.size is not None), Decimal(0))
        for d in group:
            if total and d.size is not None and d.size / total > LARGE_PUBLIC_SHARE:
                share = f"{d.size / total * 100:.1f} %"
                large.append({"name": _inline(d.name), "modality": modality.label, "share": share})
    return large


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
    starts = [d.crawl_started for d in datasets]
    ends = [d.crawl_ended for d in datasets]
    if datasets and None not in starts and None not in ends:
        period = f"{min(starts).isoformat()} to {max(ends).isoformat()}"  # type: ignore[type-var]
    else:
        period = TO_BE_PROVIDED
    # One row per domain over all the crawled datasets: bytes summed, largest first, ties by name.
    rows = (
        CrawledDomain.objects.filter(dataset__in=datasets)
        .values("domain")
        .annotate(total=Sum("bytes"))
        .order_by("-total", "domain")
    )
    domains = [{"domain": r["domain"], "bytes": r["total"]} for r in rows]
    sme = settings.COMPLIANCE_SME
    listed = domain_cut(len(domains), sme=sme)
    rule = "top 5 % or 1,000 domains, whichever is lower (SME)" if sme else "top 10 %"
    return {
        "crawlers": _joined([d.crawler_names for d in datasets]),
        "purposes": _joined([d.crawl_purpose for d in datasets]),
        "behaviour": _joined([d.crawler_behaviour for d in datasets]),
        "period": period,
        "content": _joined([d.description for d in datasets]),
        # No per-domain counts imported yet: the list is missing, not empty.
        "domain_rule": f"{rule} of {len(domains)} domains by bytes, rounded up: {listed}"
        if domains
        else TO_BE_PROVIDED,
        "domains": domains[:listed],
    }


def _sources(datasets: list[Dataset]) -> dict[str, Any]:
    by_category: dict[str, list[Dataset]] = defaultdict(list)
    for d in datasets:
        by_category[d.source_category].append(d)
    sources: dict[str, Any] = {}
    for category in SourceCategory:
        group = by_category.get(category, [])
        if group:
            used = YES
            modalities = ", ".join(m.label for m in Modality if any(d.modality == m for d in group))
        else:
            # With no lineage at all the register has not answered; with some, absence means "no".
            used = NO if datasets else TO_BE_PROVIDED
            modalities = NOT_APPLICABLE if datasets else TO_BE_PROVIDED
        section: dict[str, Any] = {
            "title": category.label,
            "used": used,
            "modalities": modalities,
            "datasets": [_dataset_entry(d) for d in group],
        }
        if category == SourceCategory.PUBLIC:
            section["large_datasets"] = _large_public(group)
        elif category == SourceCategory.CRAWLED and group:
            section.update(_crawled(group))
        elif category == SourceCategory.USER_DATA and group:
            section["user_data_sources"] = _joined([d.user_data_source for d in group])
        elif category == SourceCategory.SYNTHETIC and group:
            section["generated_by"] = _joined([d.generated_by for d in group])
        sources[category.value] = section
    return sources


def build_document(model: GpaiModel) -> dict[str, Any]:
    """Sections 1-3 of the template for ``model``, from the register (JSON-safe: it is stored as
    published and compared with the next draft)."""
    datasets = list(Dataset.objects.filter(lineage__model=model).distinct().order_by("name"))
    return {
        "model": _inline(str(model)),
        "general": _general(model, datasets),
        "sources": _sources(datasets),
        "processing": {
            "code_of_practice": _answer(model.signed_code_of_practice),
            "tdm_opt_out_measures": _answer(model.tdm_opt_out_measures),
            "illegal_content_measures": _answer(model.illegal_content_measures),
            "other": _answer(model.other_processing),
        },
    }


# --- the text ------------------------------------------------------------------------------------


def _sources_markdown(sources: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for key, s in sources.items():
        lines += ["", f"### {s['title']}", "", f"- **Used:** {s['used']}", f"- **Modalities:** {s['modalities']}"]
        if key == SourceCategory.PUBLIC:
            large = s["large_datasets"]
            lines.append(
                "- **Large datasets (more than 3 % of the public data of a modality):**" + ("" if large else " none")
            )
            lines += [f"  - {d['name']} ({d['modality'].lower()}, {d['share']})" for d in large]
        if "crawlers" in s:
            lines += [
                f"- **Crawler names:** {s['crawlers']}",
                f"- **Purposes:** {s['purposes']}",
                f"- **Behaviour (robots.txt, paywalls, captchas):** {s['behaviour']}",
                f"- **Collection period:** {s['period']}",
                f"- **Content description:** {s['content']}",
                f"- **Most relevant domain names:** {s['domain_rule']}",
            ]
        if "user_data_sources" in s:
            lines.append(f"- **Sources of user data:** {s['user_data_sources']}")
        if "generated_by" in s:
            lines.append(f"- **Generating models:** {s['generated_by']}")
        lines.append("- **Datasets:**" + ("" if s["datasets"] else " none"))
        lines += [
            f"  - {d['name']} ({d['modality'].lower()}, {d['size']}): {d['description']}; "
            f"licence or terms: {d['licence']}"
            for d in s["datasets"]
        ]
        if s.get("domains"):
            lines += ["", "| Domain | Bytes |", "|---|---|"]
            lines += [f"| {d['domain']} | {d['bytes']:,} |" for d in s["domains"]]
    return lines


def render_markdown(document: dict[str, Any], *, version: int | None, last_update: date) -> str:
    """The published text (Markdown subset of compliance.services.pdf). ``version`` None is the
    unpublished draft."""
    g, p = document["general"], document["processing"]
    lines = [
        f"# Public summary of training content: {document['model']}",
        "",
        f"- **Version of the summary:** {version if version is not None else 'draft, not published'}",
        f"- **Last update:** {last_update.isoformat()}",
        "",
        "## 1. General information",
        "",
        "### 1.1 Provider identification",
        "",
        f"- **Provider name:** {g['provider']['name']}",
        f"- **Contact details:** {g['provider']['contact']}",
        f"- **Authorised representative:** {g['provider']['authorised_representative']}",
        "",
        "### 1.2 Model identification",
        "",
        f"- **Versioned model name:** {g['model']['versioned_name']}",
        f"- **Model dependencies:** {g['model']['dependencies']}",
        f"- **Date placed on the Union market:** {g['model']['placed_on_market']}",
        "",
        "### 1.3 Modalities, overall training data size and other characteristics",
        "",
        "| Modality | Used | Training data size |",
        "|---|---|---|",
        *(f"| {m['modality']} | {m['used']} | {m['size']} |" for m in g["modalities"]),
        "",
        f"- **Types of content:** {g['content_types']}",
        f"- **Latest date of data collection:** {g['latest_collection']}",
        f"- **Linguistic characteristics:** {g['linguistic_characteristics']}",
        f"- **Other characteristics:** {g['other_characteristics']}",
        "",
        "## 2. List of data sources",
        *_sources_markdown(document["sources"]),
        "",
        "## 3. Data processing aspects",
        "",
        "### 3.1 Respect of reservations of rights from the text-and-data-mining exception",
        "",
        f"- **Signatory of the General-Purpose AI Code of Practice:** {p['code_of_practice']}",
        f"- **Measures to respect opt-outs:** {p['tdm_opt_out_measures']}",
        "",
        "### 3.2 Removal of illegal content",
        "",
        f"- **Measures:** {p['illegal_content_measures']}",
        "",
        "### 3.3 Other information",
        "",
        f"- **Other information:** {p['other']}",
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
        body = render_pdf(
            summary.text,
            title=f"Public summary of training content: {summary.model} v{summary.version}",
            footer=f"SHA-256 {summary.sha256}",
        )
    else:
        raise ValueError(f"Unknown export format {fmt!r}: one of {', '.join(EXPORT_FORMATS)}.")
    record(AuditAction.EXPORT, obj=summary, message=f"Downloaded summary v{summary.version} as {fmt}", actor=actor)
    return body
