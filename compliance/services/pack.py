"""The compliance pack: one zip an auditor can take away and check on their own.

It holds ``pack.json`` (everything, machine-readable), ``pack.pdf`` (the same, to read), one CSV
per record kind and, written last, ``manifest.json`` with every other file's name, size and
SHA-256. The pack is built from the stored rows of the register, the published summaries, the
records of processing, retention and the audit log, so it says what the database says at the
moment it is built; the audit extract covers the requested period (first to last day, inclusive,
in the console's time zone).

``request_pack`` creates the row and queues the build after commit; the Celery task
(compliance.pack.tasks) builds one pack at a time and stores the zip as the pack's chunks.

A year's audit extract runs to a million entries, so nothing holds the pack whole (``write_pack``):

1. every read is in one REPEATABLE READ transaction (one moment of the database), and the audit
   extract comes through a server-side cursor, a few thousand rows at a time;
2. each record is written as it is read: into ``pack.json``, which streams straight into the zip,
   and into its CSV, spooled to a temporary file; sizes and SHA-256 sums are taken as the bytes go;
3. the PDF (the audit table capped at ``PDF_AUDIT_ROWS``), the CSVs and the manifest follow, and
   the zip itself goes to a file the task stores a chunk at a time (``save_zip``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import shutil
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import date, datetime, time, timedelta
from typing import IO, Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from compliance.choices import PackStatus
from compliance.models import (
    AuditEntry,
    CompliancePack,
    CompliancePackChunk,
    CrawledDomain,
    DataAsset,
    Dataset,
    GpaiModel,
    LegalHold,
    ProcessorRecord,
    RetentionPolicy,
    RetentionRun,
    SubjectRequest,
)
from compliance.models.gdpr import PROCESSOR_FIELDS, RECORD_FIELDS
from compliance.models.pack import CHUNK_BYTES
from compliance.services import audit_chain, audit_heads, recovery_pack
from compliance.services.audit import _json_safe
from compliance.services.pdf import render_pdf
from console import spreadsheet

# A year and a leap day: an annual review fits, and an extract stays a size a worker builds in
# minutes rather than hours.
MAX_PERIOD_DAYS = 366
# The PDF is for reading; past this many audit rows it says that audit.csv holds them all.
PDF_AUDIT_ROWS = 1000
# Audit rows fetched per round trip of the server-side cursor.
AUDIT_FETCH_ROWS = 2000
# A CSV stays in memory up to this size, then spills to a temporary file.
SPOOL_BYTES = 4 * 1024 * 1024

Progress = Callable[[int, str], None]

# (file name, column names): the CSVs in the order they are written. Each column is a key of the
# matching pack.json record, so the CSV and the JSON cannot drift apart.
CSV_FILES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "models.csv",
        "models",
        (
            "name",
            "version",
            "provider_name",
            "provider_contact",
            "authorised_representative",
            "base_model",
            "placed_on_market",
            "modalities",
            "training_compute_flop",
            "systemic_risk",
            "weights_location",
            "weights_classification",
            "export_control_checked_on",
            "export_control_due",
            "export_control_overdue",
            "datasets",
            "latest_summary_version",
            "latest_summary_sha256",
        ),
    ),
    (
        "datasets.csv",
        "datasets",
        (
            "name",
            "source_category",
            "modality",
            "size",
            "size_unit",
            "licence",
            "personal_data",
            "special_categories",
            "lawful_basis",
            "tdm_opt_outs",
            "crawler_names",
            "crawl_started",
            "crawl_ended",
            "models",
        ),
    ),
    (
        "records_of_processing.csv",
        "records_of_processing",
        RECORD_FIELDS,
    ),
    (
        "processor_records.csv",
        "processor_records",
        PROCESSOR_FIELDS,
    ),
    (
        # Every request before the controller during the period: open, and closed in it.
        "subject_requests.csv",
        "subject_requests",
        (
            "id",
            "kind",
            "subject_reference",
            "received_on",
            "due_on",
            "extended",
            "extension_notified_on",
            "extension_reason",
            "overdue",
            "status",
            "closed_on",
            "late",
            "assets",
            # a correction and the request it corrects name each other (kind and date are fixed)
            "corrects",
            "corrected_by",
            "correction_reason",
        ),
    ),
    (
        # The internal register's per-domain byte counts, which the public summary leaves out.
        "crawled_domains.csv",
        "crawled_domains",
        ("dataset", "domain", "bytes"),
    ),
    (
        "retention_policies.csv",
        "retention_policies",
        (
            "data_class",
            "tenant",
            "days",
            "action",
            "enforced",
            "owner",
            "review_due",
            "review_overdue",
            "last_run_at",
            "last_run_affected",
            "last_run_held",
        ),
    ),
    (
        "retention_runs.csv",
        "retention_runs",
        (
            "id",
            "data_class",
            "tenant",
            "policy_days",
            "action",
            "dry_run",
            "cutoff",
            "affected",
            "held",
            "started_at",
            "finished_at",
            "triggered_by",
        ),
    ),
    (
        "legal_holds.csv",
        "legal_holds",
        ("id", "name", "data_class", "tenant", "incident_ids", "reason", "placed_at", "released_at", "active"),
    ),
    # the recovery register and the period's restore-test log (compliance.services.recovery_pack)
    *recovery_pack.CSV_FILES,
    (
        "audit.csv",
        "audit",
        (
            "id",
            "at",
            "actor",
            "action",
            "app_label",
            "model",
            "object_id",
            "object_repr",
            "message",
            "remote_addr",
            "before",
            "after",
        ),
    ),
)


def period_error(start: date, end: date) -> str | None:
    """Why a period cannot be packed (the message belongs to its end), or None when it can."""
    if end < start:
        return "The period must end on or after its first day."
    if (end - start).days + 1 > MAX_PERIOD_DAYS:
        return f"A pack covers at most {MAX_PERIOD_DAYS} days; split a longer period into several packs."
    return None


def request_pack(*, period_start: date, period_end: date, actor: Any = None) -> CompliancePack:
    """Create a queued pack and queue its build once the row is committed (the worker must find
    it). In eager mode (embedded) the build runs in this process when the transaction commits.
    Packs are built one at a time: behind another, its step says what it waits for."""
    from compliance.pack.tasks import build_compliance_pack

    with transaction.atomic():
        pack = CompliancePack.objects.create(
            period_start=period_start,
            period_end=period_end,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        if (
            CompliancePack.objects.filter(status__in=(PackStatus.QUEUED, PackStatus.RUNNING))
            .exclude(pk=pack.pk)
            .exists()
        ):
            pack.step = waiting_step(pack.pk)
            CompliancePack.objects.filter(pk=pack.pk).update(step=pack.step)
        transaction.on_commit(lambda: build_compliance_pack.delay(pack.pk))
    return pack


def waiting_step(pack_id: int) -> str:
    """A queued pack's step while another is built: packs are built one at a time, oldest first."""
    running = CompliancePack.objects.filter(status=PackStatus.RUNNING).exclude(pk=pack_id).order_by("pk").first()
    ahead = CompliancePack.objects.filter(status=PackStatus.QUEUED, pk__lt=pack_id).count()
    waiting = f"Waiting for pack #{running.pk} to finish" if running else "Waiting for the pack being built to finish"
    if ahead:
        waiting += f", then {ahead} queued before this one"
    return f"{waiting} (packs are built one at a time)"


def period_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """[first instant of ``start``, first instant after ``end``) in the console's time zone."""
    zone = timezone.get_current_timezone()
    return (
        datetime.combine(start, time.min, tzinfo=zone),
        datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone),
    )


# --- gathering the records ----------------------------------------------------------------------


def _models(today: date) -> Iterator[dict[str, Any]]:
    """Each model with its published summaries (newest first), one model at a time."""
    for model in GpaiModel.objects.select_related("base_model").prefetch_related("lineage__dataset"):
        published = list(model.summaries.order_by("-version"))
        yield {
            "name": model.name,
            "version": model.version,
            "provider_name": model.provider_name,
            "provider_contact": model.provider_contact,
            "authorised_representative": model.authorised_representative,
            "base_model": str(model.base_model) if model.base_model else model.base_model_external,
            "placed_on_market": model.placed_on_market,
            "modalities": list(model.modalities),
            "training_compute_flop": model.training_compute_flop,
            "systemic_risk": model.systemic_risk,
            "weights_location": model.weights_location,
            "weights_classification": model.weights_classification,
            "export_control_notes": model.export_control_notes,
            "export_control_checked_on": model.export_control_checked_on,
            "export_control_due": model.export_control_due(),
            "export_control_overdue": model.export_control_overdue(today),
            "signed_code_of_practice": model.signed_code_of_practice,
            "datasets": sorted({link.dataset.name for link in model.lineage.all()}),
            "latest_summary_version": published[0].version if published else None,
            "latest_summary_sha256": published[0].sha256 if published else "",
            "summaries": [
                {
                    "version": s.version,
                    "last_update": s.last_update,
                    "published_at": s.published_at,
                    "sha256": s.sha256,
                    "document": s.document,
                    "text": s.text,
                }
                for s in published
            ],
        }


def _datasets() -> list[dict[str, Any]]:
    return [
        {
            "name": d.name,
            "source_category": d.source_category,
            "modality": d.modality,
            "size": d.size,
            "size_unit": d.size_unit,
            "licence": d.licence,
            "personal_data": d.personal_data,
            "special_categories": d.special_categories,
            "lawful_basis": d.lawful_basis,
            "tdm_opt_outs": d.tdm_opt_outs,
            "crawler_names": d.crawler_names,
            "crawl_started": d.crawl_started,
            "crawl_ended": d.crawl_ended,
            "models": sorted({str(link.model) for link in d.lineage.all()}),
        }
        for d in Dataset.objects.prefetch_related("lineage__model")
    ]


def _records_of_processing() -> list[dict[str, Any]]:
    fields = next(columns for name, _, columns in CSV_FILES if name == "records_of_processing.csv")
    return list(DataAsset.objects.values(*fields))


def _processor_records() -> list[dict[str, Any]]:
    return list(ProcessorRecord.objects.values(*PROCESSOR_FIELDS))


def _subject_requests(today: date, start: date, end: date) -> list[dict[str, Any]]:
    """Every request of the period (SubjectRequest.objects.of_period): those still open and those
    closed in it, each with its due date, extension, completion date, late flag and the
    correction links both ways (ids: the other end may fall outside the period)."""
    return [
        {
            "id": r.pk,
            "kind": r.kind,
            "subject_reference": r.subject_reference,
            "received_on": r.received_on,
            "due_on": r.due_on,
            "extended": r.extended,
            "extension_notified_on": r.extension_notified_on,
            "extension_reason": r.extension_reason,
            "overdue": r.is_overdue(today),
            "status": r.status,
            "closed_on": r.closed_on,
            "late": r.is_late(),
            "assets": sorted(a.name for a in r.assets.all()),
            "corrects": r.corrects_id,
            "corrected_by": r.correction.pk if r.correction else None,
            "correction_reason": r.correction_reason,
        }
        for r in SubjectRequest.objects.of_period(start, end)
        .order_by("received_on", "pk")
        .select_related("corrected_by")
        .prefetch_related("assets")
    ]


def _crawled_domains() -> Iterator[dict[str, Any]]:
    rows = CrawledDomain.objects.order_by("dataset__name", "-bytes", "domain").values_list(
        "dataset__name", "domain", "bytes"
    )
    for dataset, domain, size in rows.iterator(chunk_size=AUDIT_FETCH_ROWS):
        yield {"dataset": dataset, "domain": domain, "bytes": size}


def _run(run: RetentionRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "data_class": run.data_class,
        "tenant": run.tenant,
        "policy_days": run.policy_days,
        "action": run.action,
        "dry_run": run.dry_run,
        "cutoff": run.cutoff,
        "affected": run.affected,
        "held": run.held,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "triggered_by": run.triggered_by,
        "detail": run.detail,
    }


def _retention(today: date, start: datetime, end: datetime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The policies, each with its last real run (a dry run changed nothing), and every run
    started in the period."""
    # A policy is unique per (class, tenant), and a run names the class and tenant it applied to
    # even when its policy has been deleted since: DISTINCT ON gives the latest run per pair.
    latest = {
        (run.data_class, run.tenant): run
        for run in RetentionRun.objects.filter(dry_run=False)
        .order_by("data_class", "tenant", "-started_at", "-pk")
        .distinct("data_class", "tenant")
    }
    policies = []
    for policy in RetentionPolicy.objects.all():
        last = latest.get((policy.data_class, policy.tenant))
        policies.append(
            {
                "data_class": policy.data_class,
                "tenant": policy.tenant,
                "days": policy.days,
                "action": policy.action,
                "enforced": policy.enforced,
                "owner": policy.owner,
                "review_due": policy.review_due,
                "review_overdue": policy.review_overdue(today),
                "notes": policy.notes,
                "last_run_at": last.started_at if last else None,
                "last_run_affected": last.affected if last else None,
                "last_run_held": last.held if last else None,
                "last_run": _run(last) if last else None,
            }
        )
    runs = [
        _run(run)
        for run in RetentionRun.objects.filter(started_at__gte=start, started_at__lt=end).order_by("started_at", "pk")
    ]
    return policies, runs


def _legal_holds(start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Active holds, and those released during the period."""
    holds = LegalHold.objects.filter(released_at__isnull=True) | LegalHold.objects.filter(
        released_at__gte=start, released_at__lt=end
    )
    return [
        {
            "id": h.pk,
            "name": h.name,
            "data_class": h.data_class,
            "tenant": h.tenant,
            "incident_ids": h.incident_ids,
            "reason": h.reason,
            "placed_at": h.placed_at,
            "released_at": h.released_at,
            "active": h.released_at is None,
        }
        for h in holds.order_by("placed_at", "pk")
    ]


AUDIT_FIELDS = next(columns for name, _, columns in CSV_FILES if name == "audit.csv")


def _audit(start: datetime, end: datetime) -> Iterator[dict[str, Any]]:
    """The period's entries, oldest first, through a server-side cursor: call it inside a
    transaction (``_snapshot``), where the cursor streams rather than being materialised.

    Each comes JSON-safe (``at`` as ISO 8601; ``before`` and ``after`` come from JSON columns, so
    are JSON already): a million entries skip _json_safe's walk through their before and after."""
    entries = AuditEntry.objects.filter(at__gte=start, at__lt=end).order_by("at", "pk")
    for row in entries.values(*AUDIT_FIELDS).iterator(chunk_size=AUDIT_FETCH_ROWS):
        row["at"] = row["at"].isoformat()
        yield row


# --- writing the files --------------------------------------------------------------------------


def _csv_value(value: Any) -> Any:
    """A CSV cell: a number stays a number (console.spreadsheet escapes text only, and a negative
    number written as text would be escaped); the rest as ``_cell`` writes it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return _cell(value)


def _cell(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        # Records reach here JSON-safe already; json.dumps asks _json_safe about anything it cannot write.
        return json.dumps(value, sort_keys=True, default=_json_safe)
    if isinstance(value, list):
        return "; ".join(map(str, value))
    return str(_json_safe(value))


class _Sink:
    """A file being written, its size and SHA-256 (the manifest's figures) taken as it goes."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.size = 0
        self._sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.raw.write(data)
        self._sha.update(data)
        self.size += len(data)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


class _CsvFile(_Sink):
    """One CSV, a row at a time, spooled (in memory while small, then a temporary file)."""

    FLUSH_ROWS = 500

    def __init__(self, columns: tuple[str, ...]) -> None:
        super().__init__(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))  # noqa: SIM115 (closed by close())
        self.columns = columns
        self._text = io.StringIO()
        self._writer = spreadsheet.writer(self._text, lineterminator="\r\n")
        self._pending = 0
        self._writer.writerow(columns)

    def row(self, record: dict[str, Any]) -> None:
        self._writer.writerow([_csv_value(record[c]) for c in self.columns])
        self._pending += 1
        if self._pending >= self.FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        self.write(self._text.getvalue().encode())
        self._text.seek(0)
        self._text.truncate()
        self._pending = 0

    def copy_to(self, dest: IO[bytes]) -> None:
        self.flush()
        self.raw.seek(0)
        shutil.copyfileobj(self.raw, dest, CHUNK_BYTES)

    def close(self) -> None:
        self.raw.close()


_json_string = json.encoder.encode_basestring  # C-accelerated, as json.dumps(ensure_ascii=False) uses


def _indented(value: Any, indent: str) -> str:
    """``value`` as json.dumps(indent=2, ensure_ascii=False) writes it, its lines after the first
    prefixed with ``indent``. A million audit entries go through here: strings, numbers and
    containers are formatted directly, a few times faster than json's pure-Python indenting
    encoder; anything else (a float that is not finite, a key that is not a string) goes to
    json.dumps itself."""
    if isinstance(value, str):
        return _json_string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)
    inner = indent + "  "
    if type(value) is dict and all(type(k) is str for k in value):
        if not value:
            return "{}"
        items = [f"{inner}{_json_string(k)}: {_indented(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if type(value) is list:
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + _indented(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n" + indent)


def _json(value: Any, level: int) -> bytes:
    """``value`` as json.dumps(indent=2) writes it nested ``level`` deep in a larger document."""
    return _indented(value, "  " * level).encode()


class _JsonDocument:
    """One JSON object written key by key, and a list value item by item, byte for byte as
    ``json.dumps(document, indent=2, ensure_ascii=False)`` writes the whole object at once."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self._keys = 0
        self._items: int | None = None
        sink.write(b"{")

    def _key(self, key: str) -> None:
        self.sink.write((b"\n  " if not self._keys else b",\n  ") + _json(key, 0) + b": ")
        self._keys += 1

    def value(self, key: str, value: Any) -> None:
        self._key(key)
        self.sink.write(_json(value, 1))

    def begin_list(self, key: str) -> None:
        self._key(key)
        self._items = 0

    def item(self, value: Any) -> None:
        assert self._items is not None, "item() outside begin_list()"
        self.sink.write((b"[\n    " if not self._items else b",\n    ") + _json(value, 2))
        self._items += 1

    def end_list(self) -> None:
        self.sink.write(b"\n  ]" if self._items else b"[]")
        self._items = None

    def close(self) -> None:
        self.sink.write(b"\n}" if self._keys else b"}")


def _md(value: Any) -> str:
    """A value as one Markdown table cell or bullet: no pipe or newline may break the row."""
    text = _cell(value) or "–"
    return text.replace("|", "/").replace("\r", " ").replace("\n", " ")


def _table(header: tuple[str, ...], rows: Iterable[Iterable[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in rows]
    return lines


def _correction_cell(r: dict[str, Any]) -> str:
    """A request's correction links, as the register shows them: "corrects #3: why", "corrected by #5"."""
    parts = []
    if r["corrects"] is not None:
        parts.append(f"corrects #{r['corrects']}: {r['correction_reason']}")
    if r["corrected_by"] is not None:
        parts.append(f"corrected by #{r['corrected_by']}")
    return "; ".join(parts)


def _markdown(doc: dict[str, Any]) -> str:
    """The pack as the Markdown subset compliance.services.pdf renders, one section after another;
    the published summaries' texts go in verbatim, so the PDF says the very words their hashes
    were taken of."""
    sections = (
        _md_heading,
        _md_models,
        _md_datasets,
        _md_records_of_processing,
        _md_processor_records,
        _md_retention,
        _md_legal_holds,
        _md_subject_requests,
        _md_audit,
    )
    lines = [line for section in sections for line in section(doc)]
    lines += recovery_pack.markdown(doc, _table)
    return "\n".join(lines) + "\n"


def _md_heading(doc: dict[str, Any]) -> list[str]:
    """The title, the period and what the zip holds, up to the heading of section 1."""
    period = doc["period"]
    return [
        "# Compliance pack",
        f"Period: **{period['start']} to {period['end']}** (audit extract, both days included). "
        f"Generated {doc['generated_at']}.",
        "The zip's manifest.json holds the SHA-256 of every file; the CSVs hold every row.",
        "",
        "## 1. General-purpose models",
    ]


def _md_models(doc: dict[str, Any]) -> list[str]:
    """Section 1: each general-purpose model, its summaries' hashes and the latest one verbatim."""
    lines: list[str] = []
    if not doc["models"]:
        lines.append("No models registered.")
    for m in doc["models"]:
        lines += [
            "",
            f"### {m['name']} {m['version']}",
            f"- Provider: {_md(m['provider_name'])} ({_md(m['provider_contact'])})",
            f"- Authorised representative: {_md(m['authorised_representative'])}",
            f"- Base model: {_md(m['base_model'])}",
            f"- Placed on the EU market: {_md(m['placed_on_market'])}",
            f"- Modalities: {_md(m['modalities'])}",
            f"- Training compute (FLOP): {_md(m['training_compute_flop'])}"
            + (" (**systemic risk**)" if m["systemic_risk"] else ""),
            f"- Weights: {_md(m['weights_location'])}, {_md(m['weights_classification'])}",
            f"- Export control checked on {_md(m['export_control_checked_on'])}"
            + (" (**review overdue**)" if m["export_control_overdue"] else ""),
            f"- Datasets: {_md(m['datasets'])}",
        ]
        if not m["summaries"]:
            lines.append("- Published training-content summary: none yet.")
            continue
        for s in m["summaries"]:
            lines.append(f"- Summary v{s['version']}, last update {s['last_update']}, SHA-256:")
            lines.append(f"  - {s['sha256']}")
        latest = m["summaries"][0]
        lines += ["", f"Published summary v{latest['version']}, verbatim:", "", *latest["text"].splitlines(), ""]
    return lines


def _md_datasets(doc: dict[str, Any]) -> list[str]:
    """Section 2: the datasets, a table row each."""
    lines = ["", "## 2. Datasets"]
    lines += _table(
        ("Name", "Source", "Modality", "Size", "Personal data", "Lawful basis", "Models"),
        (
            (
                d["name"],
                d["source_category"],
                d["modality"],
                f"{_cell(d['size'])} {d['size_unit']}".strip(),
                d["personal_data"],
                d["lawful_basis"],
                d["models"],
            )
            for d in doc["datasets"]
        ),
    )
    return lines


def _md_records_of_processing(doc: dict[str, Any]) -> list[str]:
    """Section 3: the records of processing as controller (Art. 30(1))."""
    lines = ["", "## 3. Records of processing (GDPR Art. 30)"]
    if not doc["records_of_processing"]:
        lines.append("No records of processing.")
    for r in doc["records_of_processing"]:
        lines += [
            "",
            f"### {r['name']}",
            f"- Data class: {_md(r['data_class'])}",
            f"- Controller: {_md(r['controller'])}",
            f"- Joint controller: {_md(r['joint_controller'])}",
            f"- Representative: {_md(r['representative'])}",
            f"- Data protection officer: {_md(r['data_protection_officer'])}",
            f"- Purposes: {_md(r['purposes'])}",
            f"- Data subjects: {_md(r['data_subject_categories'])}",
            f"- Personal data: {_md(r['personal_data_categories'])}",
            f"- Special categories: {_md(r['special_categories'])}",
            f"- Recipients: {_md(r['recipients'])}",
            f"- Third-country transfers: {_md(r['third_country_transfers'])}",
            f"- Erasure time limit: {_md(r['erasure_time_limit'])}",
            f"- Security measures: {_md(r['security_measures'])}",
            f"- Lawful basis (Art. 6): {_md(r['lawful_basis'])}",
        ]
        if r["balancing_note"]:
            lines.append(f"- Balancing note: {_md(r['balancing_note'])}")
    return lines


def _md_processor_records(doc: dict[str, Any]) -> list[str]:
    """Section 3, continued: the records as processor (Art. 30(2))."""
    lines = ["", "### Records as processor (Art. 30(2))"]
    if not doc["processor_records"]:
        lines.append("No records as processor.")
    for r in doc["processor_records"]:
        lines += [
            "",
            f"#### {_md(r['name'])}",
            f"- Processor: {_md(r['processor'])}",
            f"- On behalf of: {_md(r['controllers'])}",
            f"- Representative: {_md(r['representative'])}",
            f"- Data protection officer: {_md(r['data_protection_officer'])}",
            f"- Categories of processing: {_md(r['processing_categories'])}",
            f"- Third-country transfers: {_md(r['third_country_transfers'])}",
            f"- Security measures: {_md(r['security_measures'])}",
        ]
    return lines


def _md_retention(doc: dict[str, Any]) -> list[str]:
    """Section 4: the retention policies with their last runs."""
    lines = ["", "## 4. Retention policies and their last runs"]
    lines += _table(
        ("Data class", "Tenant", "Days", "Action", "Enforced", "Owner / review", "Last run", "Affected", "Held"),
        (
            (
                p["data_class"],
                p["tenant"] or "all",
                p["days"],
                p["action"],
                p["enforced"],
                ""
                if p["enforced"]
                else f"{_cell(p['owner'])} {_cell(p['review_due'])}" + (" OVERDUE" if p["review_overdue"] else ""),
                p["last_run_at"],
                p["last_run_affected"],
                p["last_run_held"],
            )
            for p in doc["retention_policies"]
        ),
    )
    lines.append(f"{len(doc['retention_runs'])} retention runs started in the period: retention_runs.csv.")
    return lines


def _md_legal_holds(doc: dict[str, Any]) -> list[str]:
    """Section 5: the legal holds."""
    lines = ["", "## 5. Legal holds"]
    lines += _table(
        ("Name", "Data class", "Tenant", "Placed", "Released", "Reason"),
        (
            (
                h["name"],
                h["data_class"],
                h["tenant"] or "all",
                h["placed_at"],
                h["released_at"] or "active",
                h["reason"],
            )
            for h in doc["legal_holds"]
        ),
    )
    return lines


def _md_subject_requests(doc: dict[str, Any]) -> list[str]:
    """Section 6: the data-subject requests open in the period or closed in it."""
    lines = ["", "## 6. Data-subject requests of the period (open, and closed in the period)"]
    lines += _table(
        ("#", "Kind", "Reference", "Received", "Due", "Status", "Closed", "Correction"),
        (
            (
                r["id"],
                r["kind"],
                r["subject_reference"],
                r["received_on"],
                f"{r['due_on']}" + (" (extended)" if r["extended"] else "") + (" OVERDUE" if r["overdue"] else ""),
                r["status"],
                f"{_cell(r['closed_on'])}" + (" LATE" if r["late"] else ""),
                _correction_cell(r),
            )
            for r in doc["subject_requests"]
        ),
    )
    return lines


def _md_audit(doc: dict[str, Any]) -> list[str]:
    """Section 7: the audit extract (the first PDF_AUDIT_ROWS entries; audit.csv holds them all)."""
    period = doc["period"]
    # doc["audit"] holds the first PDF_AUDIT_ROWS entries only; doc["audit_count"] counts them all.
    audit, count = doc["audit"], doc["audit_count"]
    lines = ["", "## 7. Audit extract", f"{count} entries from {period['start']} to {period['end']}."]
    if count > PDF_AUDIT_ROWS:
        lines.append(f"The first {PDF_AUDIT_ROWS} are shown here; audit.csv holds all {count}.")
    lines += _table(
        ("When", "Who", "Action", "Object", "Message"),
        (
            (
                e["at"],
                e["actor"],
                e["action"],
                f"{e['app_label']}.{e['model']} {e['object_id']} {e['object_repr']}",
                e["message"],
            )
            for e in audit[:PDF_AUDIT_ROWS]
        ),
    )
    return lines


@contextlib.contextmanager
def _snapshot() -> Iterator[None]:
    """One transaction for every read: REPEATABLE READ, so the pack is one moment of the
    database however long the extract takes (the audit chain's head included), and the
    transaction a server-side cursor streams in (outside one, PostgreSQL materialises a holdable
    cursor's whole result first). Inside an enclosing transaction (a test's) the reads join it."""
    outermost = not transaction.get_connection().in_atomic_block
    with transaction.atomic():
        if outermost:
            with transaction.get_connection().cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _pdf_model(model: dict[str, Any]) -> dict[str, Any]:
    """What pack.pdf needs of a model: every summary's version, date and hash, and the latest text."""
    summaries = [{**s, "document": None, "text": s["text"] if i == 0 else ""} for i, s in enumerate(model["summaries"])]
    return {**model, "summaries": summaries}


def write_pack(pack: CompliancePack, out: IO[bytes], *, progress: Progress | None = None) -> None:
    """Write the pack's zip to ``out`` (a seekable binary file). ``progress(percent, step)`` is told
    how far it is (0-100) as it goes. Memory stays flat whatever the period holds: see the module's
    docstring for how."""
    report = progress or (lambda percent, step: None)
    now = timezone.now()
    today = timezone.localdate(now)
    start, end = period_bounds(pack.period_start, pack.period_end)
    generated_at, period = _json_safe(now), _json_safe({"start": pack.period_start, "end": pack.period_end})
    stamp = timezone.localtime(now).timetuple()[:6]
    csvs = {key: (name, _CsvFile(columns)) for name, key, columns in CSV_FILES}
    pdf_doc: dict[str, Any] = {"generated_at": generated_at, "period": period}
    files: list[tuple[str, _Sink]] = []

    def member(name: str) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=stamp)
        info.compress_type = zipfile.ZIP_DEFLATED
        return info

    def section(
        doc: _JsonDocument,
        key: str,
        records: Iterable[dict[str, Any]],
        keep: int | None = None,
        json_safe: bool = False,
    ) -> int:
        """Write each record to pack.json and its CSV; keep the first ``keep`` (all: None) for the
        PDF. ``json_safe``: the records need no _json_safe (they come that way)."""
        kept: list[dict[str, Any]] = []
        count = 0
        sheet = csvs[key][1] if key in csvs else None
        doc.begin_list(key)
        for raw in records:
            record = raw if json_safe else _json_safe(raw)
            doc.item(record)
            if sheet is not None:
                sheet.row(record)
            if keep is None or count < keep:
                kept.append(_pdf_model(record) if key == "models" else record)
            count += 1
        doc.end_list()
        pdf_doc[key] = kept
        return count

    try:
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            # pack.json streams into the zip as it is read; its size is not known in advance.
            with _snapshot(), archive.open(member("pack.json"), "w", force_zip64=True) as raw:
                sink = _Sink(raw)
                doc = _JsonDocument(sink)
                doc.value("generated_at", generated_at)
                doc.value("period", period)
                # The audit chain's head in this snapshot: an auditor keeps it and later checks that
                # the chain still holds it (`manage.py verify_audit_log --head SEQ:HASH`).
                head = audit_chain.chain_head()
                chain = _json_safe(audit_chain.head_json(head, audit_chain.last_check()))
                audit_heads.keep_head(head, source="pack")
                doc.value("audit_chain", chain)
                report(5, "Reading the register and the published summaries")
                section(doc, "models", _models(today))
                section(doc, "datasets", _datasets())
                report(15, "Reading the records of processing and data-subject requests")
                section(doc, "records_of_processing", _records_of_processing())
                section(doc, "processor_records", _processor_records())
                report(20, "Reading retention policies, runs and legal holds")
                policies, runs = _retention(today, start, end)
                section(doc, "retention_policies", policies)
                section(doc, "retention_runs", runs)
                section(doc, "legal_holds", _legal_holds(start, end))
                section(doc, "subject_requests", _subject_requests(today, pack.period_start, pack.period_end))
                section(doc, "crawled_domains", _crawled_domains(), keep=0)  # crawled_domains.csv only
                section(doc, "recovery_register", recovery_pack.register_rows(now))
                section(doc, "restore_tests", recovery_pack.restore_test_rows(start, end))
                total = AuditEntry.objects.filter(at__gte=start, at__lt=end).count()
                report(25, f"Reading the audit extract: {total:,} entries")
                pdf_doc["audit_count"] = section(
                    doc, "audit", _counted(_audit(start, end), total, report), PDF_AUDIT_ROWS, json_safe=True
                )
                doc.close()
            files.append(("pack.json", sink))

            report(85, "Rendering pack.pdf")
            footer = f"Goodput compliance pack {pack.period_start} to {pack.period_end}, generated {generated_at}"
            with archive.open(member("pack.pdf"), "w") as raw:
                sink = _Sink(raw)
                sink.write(render_pdf(_markdown(pdf_doc), title="Compliance pack", footer=footer))
            files.append(("pack.pdf", sink))
            pdf_doc.clear()

            report(90, "Writing the CSVs and the manifest")
            for name, sheet in csvs.values():
                sheet.flush()
                with archive.open(member(name), "w", force_zip64=sheet.size >= zipfile.ZIP64_LIMIT) as raw:
                    sheet.copy_to(raw)
                sheet.close()
                files.append((name, sheet))
            manifest = {
                "generated_at": generated_at,
                "period": period,
                "algorithm": "sha256",
                "files": [{"name": n, "size": f.size, "sha256": f.sha256} for n, f in files],
                "audit_chain": chain,
            }
            archive.writestr(member("manifest.json"), json.dumps(manifest, indent=2).encode())
    finally:
        for _, sheet in csvs.values():
            sheet.close()
    report(95, "Zip written")


def _counted(rows: Iterable[dict[str, Any]], total: int, report: Progress) -> Iterator[dict[str, Any]]:
    """``rows``, telling ``report`` how far through the ``total`` it is (25 % to 85 %) every 2 %."""
    step = max(AUDIT_FETCH_ROWS, total // 30)
    for n, row in enumerate(rows, 1):
        yield row
        if n % step == 0 and n < total:
            report(25 + 60 * n // total, f"Reading the audit extract: {n:,} of {total:,} entries")


def build_pack(pack: CompliancePack, *, progress: Progress | None = None) -> bytes:
    """The pack's zip in memory: for small packs and tests. The task writes to a file instead
    (``write_pack``), so that a large pack is never held whole."""
    out = io.BytesIO()
    write_pack(pack, out, progress=progress)
    (progress or (lambda percent, step: None))(100, "Done")
    return out.getvalue()


# --- storing and serving the zip ----------------------------------------------------------------


def save_zip(pack_id: int, source: IO[bytes]) -> tuple[str, int]:
    """Store the zip read from ``source`` as pack ``pack_id``'s chunks (replacing any it had), one
    chunk in memory at a time; returns its (SHA-256, size). Call it inside the transaction that
    marks the pack done, so that a pack is never done with part of its zip."""
    CompliancePackChunk.objects.filter(pack_id=pack_id).delete()
    sha, size, seq = hashlib.sha256(), 0, 0
    source.seek(0)
    while data := source.read(CHUNK_BYTES):
        CompliancePackChunk.objects.create(pack_id=pack_id, seq=seq, data=data)
        sha.update(data)
        size += len(data)
        seq += 1
    return sha.hexdigest(), size


def _chunk(pack_id: int, seq: int) -> bytes:
    return bytes(CompliancePackChunk.objects.filter(pack_id=pack_id, seq=seq).values_list("data", flat=True).get())


def _chunk_count(pack_id: int) -> int:
    return CompliancePackChunk.objects.filter(pack_id=pack_id).count()


def zip_chunks(pack_id: int) -> Iterator[bytes]:
    """The stored zip, one chunk (one query) at a time."""
    for seq in range(_chunk_count(pack_id)):
        yield _chunk(pack_id, seq)


async def azip_chunks(pack_id: int) -> AsyncIterator[bytes]:
    """``zip_chunks`` for an ASGI response, which would otherwise read a sync iterator whole."""
    for seq in range(await sync_to_async(_chunk_count)(pack_id)):
        yield await sync_to_async(_chunk)(pack_id, seq)
