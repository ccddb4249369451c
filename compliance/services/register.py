"""Writing the register where more than one row moves at once: a crawler's per-domain CSV and
the lineage between training jobs, datasets and model versions.

Both are entry points for data from outside (a crawler's export, an API client), so each checks
everything before it writes anything: a bad line names itself and the register is unchanged.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, Sum

from compliance.choices import AuditAction, SourceCategory
from compliance.models.register import CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.services import audit

CSV_HEADER = ["domain", "bytes"]
# A host name: dot-separated labels of letters, digits and inner hyphens, at most 253 characters.
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DOMAIN = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})+$")
MAX_BYTES = 2**63 - 1  # the column is a bigint
MAX_CSV_BYTES = 20 * 1024 * 1024  # about 400,000 domains: far more than a summary lists


def scratch_error(trained_from_scratch: bool | None, base_model: Any, base_model_external: str) -> str | None:
    """Why the model's answers to 1.2 contradict each other: trained from scratch, yet named a base
    model (the database's check gpaimodel_scratch_has_no_base, asked first by the form and API)."""
    if trained_from_scratch and (base_model is not None or (base_model_external or "").strip()):
        return "A model trained from scratch has no base model: clear the base model or this answer."
    return None


class CsvLineError(ValidationError):
    """A crawler CSV line that cannot be imported; ``line`` is its 1-based number (1: the header)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message, code="line")
        self.line = line


def parse_domains(text: str) -> dict[str, int]:
    """The CSV's rows as {domain: bytes}, or a ValidationError naming the first bad line (line 1
    is the header). Domains are lower-cased; a domain listed twice is an error (which count would
    be right?)."""
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    try:
        rows = list(reader)
    except csv.Error as exc:  # a NUL byte, an unclosed quote at the end
        raise CsvLineError(reader.line_num, f"Line {reader.line_num}: {exc}.") from None
    if not rows or [c.strip().lower() for c in rows[0]] != CSV_HEADER:
        raise CsvLineError(1, "Line 1: the header must be exactly: domain,bytes.")
    domains: dict[str, int] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue  # a blank line (a trailing newline) says nothing
        if len(row) != 2:
            raise CsvLineError(number, f"Line {number}: expected 2 columns (domain,bytes), got {len(row)}.")
        domain, raw = row[0].strip().lower(), row[1].strip()
        if not _DOMAIN.match(domain):
            raise CsvLineError(number, f"Line {number}: {row[0]!r} is not a domain name.")
        if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_BYTES:
            raise CsvLineError(number, f"Line {number}: bytes must be a whole number ≥ 0, got {raw!r}.")
        if domain in domains:
            raise CsvLineError(number, f"Line {number}: {domain} is listed twice.")
        domains[domain] = int(raw)
    return domains


def import_domains(dataset: Dataset, text: str) -> int:
    """Replace ``dataset``'s per-domain byte counts with the CSV ``text`` (header ``domain,bytes``);
    returns how many domains it now has. Every line is checked before anything is written, and the
    replacement is one transaction: readers see the old list or the new one, never a mix."""
    if dataset.source_category != SourceCategory.CRAWLED:
        raise ValidationError("Only a crawled dataset (2.3) has per-domain counts.", code="category")
    domains = parse_domains(text)
    with transaction.atomic():
        Dataset.objects.select_for_update().filter(pk=dataset.pk).first()  # one import at a time
        old = CrawledDomain.objects.filter(dataset=dataset).aggregate(domains=Count("pk"), bytes=Sum("bytes"))
        CrawledDomain.objects.filter(dataset=dataset).delete()
        CrawledDomain.objects.bulk_create(
            CrawledDomain(dataset=dataset, domain=domain, bytes=count) for domain, count in domains.items()
        )
        audit.record(
            AuditAction.UPDATE,
            obj=dataset,
            before={"domains": old["domains"], "domain_bytes": old["bytes"] or 0},
            after={"domains": len(domains), "domain_bytes": sum(domains.values())},
            message="Crawled domains imported from CSV",
        )
    return len(domains)


def record_lineage(model: GpaiModel, dataset: Dataset, job: Any = None, user: Any = None) -> tuple[Lineage, bool]:
    """Record that ``model`` was trained on ``dataset`` (by ``job`` when known); (row, created).
    Recording the same triple again returns the row already there, so a retried API call or a
    double-submitted form leaves one row."""
    values = {"model": model, "dataset": dataset, "job": job}
    existing = Lineage.objects.filter(**values).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():  # a savepoint: the same link posted twice at once loses here
            return Lineage.objects.create(**values, recorded_by=user if user and user.is_authenticated else None), True
    except IntegrityError:
        return Lineage.objects.get(**values), False


def lineage_graph(model: GpaiModel) -> dict[str, list]:
    """The model's lineage as a Sankey: nodes are training jobs, datasets and the model version;
    links go job → dataset → model. A dataset recorded without a job links straight to the model.
    The link value is 1 per lineage row (the sizes of datasets differ in units, so they do not
    compare)."""
    rows = list(model.lineage.select_related("dataset", "job").order_by("dataset__name", "job__name"))
    labels: list[str] = [str(model)]
    kinds: list[str] = ["model"]
    index: dict[tuple[str, int], int] = {}

    def node(kind: str, pk: int, label: str) -> int:
        if (kind, pk) not in index:
            index[(kind, pk)] = len(labels)
            labels.append(label)
            kinds.append(kind)
        return index[(kind, pk)]

    links: dict[tuple[int, int], int] = {}
    for row in rows:
        d = node(
            "dataset", row.dataset_id, f"{row.dataset.name} ({row.dataset.get_source_category_display().split()[0]})"
        )
        links[(d, 0)] = links.get((d, 0), 0) + 1
        if row.job_id is not None:
            j = node("job", row.job_id, f"job {row.job.name}")
            links[(j, d)] = links.get((j, d), 0) + 1
    return {
        "labels": labels,
        "kinds": kinds,
        "source": [s for s, _ in links],
        "target": [t for _, t in links],
        "value": list(links.values()),
    }
