"""The compliance pack: one zip an auditor can take away and check on their own.

It holds ``pack.json`` (everything, machine-readable), ``pack.pdf`` (the same, to read), one CSV
per record kind and, written last, ``manifest.json`` with every other file's name, size and
SHA-256. The pack is built from the stored rows of the register, the published summaries, the
records of processing, retention and the audit log, so it says what the database says at the
moment it is built; the audit extract covers the requested period (first to last day, inclusive,
in the console's time zone).

``request_pack`` creates the row and queues the build after commit; the Celery task
(compliance.tasks_pack) calls ``build_pack`` and stores the zip on the row.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from compliance.choices import OPEN_REQUEST_STATES
from compliance.models import (
    AuditEntry,
    CompliancePack,
    DataAsset,
    Dataset,
    GpaiModel,
    LegalHold,
    RetentionPolicy,
    RetentionRun,
    SubjectRequest,
    SummaryVersion,
)
from compliance.models.gdpr import RECORD_FIELDS
from compliance.services.audit import _json_safe
from compliance.services.pdf import render_pdf
from console import spreadsheet

# A year and a leap day: an annual review fits, and an extract stays a size a worker builds in
# minutes rather than hours.
MAX_PERIOD_DAYS = 366
# The PDF is for reading; past this many audit rows it says that audit.csv holds them all.
PDF_AUDIT_ROWS = 1000

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
        "subject_requests.csv",
        "open_subject_requests",
        ("id", "kind", "subject_reference", "received_on", "due_on", "overdue", "status", "assets"),
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
    it). In eager mode (embedded) the build runs in this process when the transaction commits."""
    from compliance.tasks_pack import build_compliance_pack

    with transaction.atomic():
        pack = CompliancePack.objects.create(
            period_start=period_start,
            period_end=period_end,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        transaction.on_commit(lambda: build_compliance_pack.delay(pack.pk))
    return pack


def period_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """[first instant of ``start``, first instant after ``end``) in the console's time zone."""
    zone = timezone.get_current_timezone()
    return (
        datetime.combine(start, time.min, tzinfo=zone),
        datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone),
    )


# --- gathering the records ----------------------------------------------------------------------


def _models(today: date) -> list[dict[str, Any]]:
    summaries: dict[int, list[SummaryVersion]] = {}
    for summary in SummaryVersion.objects.order_by("model_id", "-version"):
        summaries.setdefault(summary.model_id, []).append(summary)
    rows = []
    for model in GpaiModel.objects.select_related("base_model").prefetch_related("lineage__dataset"):
        published = summaries.get(model.pk, [])
        rows.append(
            {
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
        )
    return rows


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


def _open_requests(today: date) -> list[dict[str, Any]]:
    return [
        {
            "id": r.pk,
            "kind": r.kind,
            "subject_reference": r.subject_reference,
            "received_on": r.received_on,
            "due_on": r.due_on,
            "overdue": r.is_overdue(today),
            "status": r.status,
            "assets": sorted(a.name for a in r.assets.all()),
        }
        for r in SubjectRequest.objects.filter(status__in=OPEN_REQUEST_STATES).prefetch_related("assets")
    ]


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


def _audit(start: datetime, end: datetime) -> list[dict[str, Any]]:
    entries = AuditEntry.objects.filter(at__gte=start, at__lt=end).order_by("at", "pk")
    return [
        {
            "id": e.pk,
            "at": e.at,
            "actor": e.actor,
            "action": e.action,
            "app_label": e.app_label,
            "model": e.model,
            "object_id": e.object_id,
            "object_repr": e.object_repr,
            "message": e.message,
            "remote_addr": e.remote_addr,
            "before": e.before,
            "after": e.after,
        }
        for e in entries.iterator(chunk_size=2000)
    ]


# --- writing the files --------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return json.dumps(_json_safe(value), sort_keys=True)
    if isinstance(value, list):
        return "; ".join(map(str, value))
    return str(_json_safe(value))


def _csv(rows: Iterable[dict[str, Any]], columns: tuple[str, ...]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([spreadsheet.cell(_cell(row[c])) for c in columns])
    return out.getvalue().encode()


def _md(value: Any) -> str:
    """A value as one Markdown table cell or bullet: no pipe or newline may break the row."""
    text = _cell(value) or "–"
    return text.replace("|", "/").replace("\r", " ").replace("\n", " ")


def _table(header: tuple[str, ...], rows: Iterable[Iterable[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in rows]
    return lines


def _markdown(doc: dict[str, Any]) -> str:
    """The pack as the Markdown subset compliance.services.pdf renders; the published summaries'
    texts go in verbatim, so the PDF says the very words their hashes were taken of."""
    period = doc["period"]
    lines = [
        "# Compliance pack",
        f"Period: **{period['start']} to {period['end']}** (audit extract, both days included). "
        f"Generated {doc['generated_at']}.",
        "The zip's manifest.json holds the SHA-256 of every file; the CSVs hold every row.",
        "",
        "## 1. General-purpose models",
    ]
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

    lines += ["", "## 2. Datasets"]
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

    lines += ["", "## 3. Records of processing (GDPR Art. 30)"]
    if not doc["records_of_processing"]:
        lines.append("No records of processing.")
    for r in doc["records_of_processing"]:
        lines += [
            "",
            f"### {r['name']}",
            f"- Data class: {_md(r['data_class'])}",
            f"- Controller: {_md(r['controller_contact'])}",
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

    lines += ["", "## 4. Retention policies and their last runs"]
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

    lines += ["", "## 5. Legal holds"]
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

    lines += ["", "## 6. Open data-subject requests"]
    lines += _table(
        ("#", "Kind", "Reference", "Received", "Due", "Status"),
        (
            (
                r["id"],
                r["kind"],
                r["subject_reference"],
                r["received_on"],
                f"{r['due_on']}" + (" OVERDUE" if r["overdue"] else ""),
                r["status"],
            )
            for r in doc["open_subject_requests"]
        ),
    )

    audit = doc["audit"]
    lines += ["", "## 7. Audit extract"]
    lines.append(f"{len(audit)} entries from {period['start']} to {period['end']}.")
    if len(audit) > PDF_AUDIT_ROWS:
        lines.append(f"The first {PDF_AUDIT_ROWS} are shown here; audit.csv holds all {len(audit)}.")
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
    return "\n".join(lines) + "\n"


def build_pack(pack: CompliancePack, *, progress: Progress | None = None) -> bytes:
    """The pack's zip. ``progress(percent, step)`` is told how far it is (0-100) as it goes.

    1. gather every record into one document (pack.json's content);
    2. write the CSVs from that same document, then the PDF;
    3. write the manifest of sizes and SHA-256 sums, last, and the zip in a fixed order.
    """
    report = progress or (lambda percent, step: None)
    now = timezone.now()
    today = timezone.localdate(now)
    start, end = period_bounds(pack.period_start, pack.period_end)

    report(5, "Reading the register and the published summaries")
    models, datasets = _models(today), _datasets()
    report(20, "Reading the records of processing and data-subject requests")
    records, requests = _records_of_processing(), _open_requests(today)
    report(30, "Reading retention policies, runs and legal holds")
    policies, runs = _retention(today, start, end)
    holds = _legal_holds(start, end)
    report(40, "Reading the audit extract")
    audit = _audit(start, end)
    doc: dict[str, Any] = {
        "generated_at": now,
        "period": {"start": pack.period_start, "end": pack.period_end},
        "models": models,
        "datasets": datasets,
        "records_of_processing": records,
        "retention_policies": policies,
        "retention_runs": runs,
        "legal_holds": holds,
        "open_subject_requests": requests,
        "audit": audit,
    }
    doc = _json_safe(doc)

    report(55, "Writing pack.json and the CSVs")
    files: list[tuple[str, bytes]] = [("pack.json", json.dumps(doc, indent=2, ensure_ascii=False).encode())]
    csvs = [(name, _csv(doc[key], columns)) for name, key, columns in CSV_FILES]
    report(65, "Rendering pack.pdf")
    footer = f"Goodput compliance pack {pack.period_start} to {pack.period_end}, generated {doc['generated_at']}"
    files.append(("pack.pdf", render_pdf(_markdown(doc), title="Compliance pack", footer=footer)))
    files += csvs

    report(90, "Writing the manifest and the zip")
    manifest = {
        "generated_at": doc["generated_at"],
        "period": doc["period"],
        "algorithm": "sha256",
        "files": [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files],
    }
    files.append(("manifest.json", json.dumps(manifest, indent=2).encode()))
    stamp = timezone.localtime(now).timetuple()[:6]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files:
            archive.writestr(zipfile.ZipInfo(name, date_time=stamp), data, compress_type=zipfile.ZIP_DEFLATED)
    report(100, "Done")
    return out.getvalue()
