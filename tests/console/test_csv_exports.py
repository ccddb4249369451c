"""Every CSV the console writes escapes cells a spreadsheet would run as a formula (OWASP "CSV
injection"): one writer, console.spreadsheet, tested here for every export through its real URL.
The exports are found in the URL resolver (``csv_routes``), not listed by hand: a new CSV route
fails the test until it is fetched here.

Each export is fed records whose every free-text field holds a formula (``=HYPERLINK(...)``,
``+1``, ``-1``, ``@SUM(1)``), or one after a delimiter (``ops;=1+1;``, a tab, a comma, a line
break); no cell of any export may start with a formula character unless it is a number the
console wrote as one (a negative priority stays ``-3``), whether the spreadsheet splits lines on
the comma, on ``;`` or on a tab."""

from __future__ import annotations

import csv
import io
import itertools
import zipfile
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import models
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from compliance.choices import DataClass, LawfulBasis, Modality, RequestKind, SizeUnit, SourceCategory
from compliance.models import (
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
)
from compliance.services import summary
from compliance.services.audit import record
from console.spreadsheet import FORMULA_STARTS
from fleet.capacity.models import Team
from fleet.models import Pool, Reservation, Site
from tests.fleet.capacity import days_ahead
from tests.fleet.cost.conftest import L40S, account, job_on, node_with_gpus, rate_price

pytestmark = pytest.mark.django_db

PAYLOADS = ['=HYPERLINK("http://x")', "+1", "-1", "@SUM(1)", "ops;=1+1;", "ops\t=1+1", "ops,=1+1", "ops\n=1+1"]
# How a spreadsheet may split a line: on the comma this writer uses, or on ";" or a tab (a locale
# whose list separator is not the comma), reading a quote in the middle of a cell as text.
SPLITS = (",", ";", "\t")


# Routes the name rule below matches that write no CSV, with why (checked, so it cannot go stale).
NOT_CSV = {"api:compliance-api:summary-version-export": "a published summary as Markdown, JSON or PDF"}
# Routes whose CSVs come inside a ZIP (the compliance pack: opened and read below).
ZIPPED = {"api:compliance-api:pack-download"}


def _patterns(patterns: list[Any], prefix: str = "", namespace: str = "") -> Any:
    for p in patterns:
        if isinstance(p, URLResolver):
            inner = f"{namespace}:{p.namespace}" if namespace and p.namespace else p.namespace or namespace
            yield from _patterns(p.url_patterns, prefix + str(p.pattern), inner)
        elif isinstance(p, URLPattern) and p.name:
            yield prefix + str(p.pattern), f"{namespace}:{p.name}" if namespace else p.name


def csv_routes() -> dict[str, str]:
    """name -> route of every URL pattern that writes a CSV or an export, by its path (ending in
    ``.csv``) or its name (ending in ``csv``, ``export`` or ``download``)."""
    found = {}
    for route, name in _patterns(get_resolver().url_patterns):
        path = route.rstrip("$/").replace("\\.", ".")
        if path.endswith(".csv") or name.endswith(("csv", "export", "download")):
            found[name] = route
    return found


def test_the_routes_found_include_every_known_csv_and_the_exceptions_are_true() -> None:
    routes = csv_routes()
    for name in (
        "compliance:audit-export",
        "api:capacity-api:plan-csv",
        "api:capacity-api:reservations-csv",
        "api:cost-api:export",
        *ZIPPED,
        *NOT_CSV,
    ):
        assert name in routes, name
    assert not any("csv" in media for media in summary.EXPORT_FORMATS.values())


def planted(model: type[models.Model], **given: Any) -> Any:
    """A saved ``model`` whose every free-text field (text without choices) holds a formula."""
    payloads = itertools.cycle(PAYLOADS)
    values = dict(given)
    for f in model._meta.concrete_fields:
        if f.name in values or f.primary_key or f.choices or not isinstance(f, models.CharField | models.TextField):
            continue
        values[f.name] = next(payloads)[: f.max_length or None]
    return model.objects.create(**values)


def _rows(text: str, delimiter: str = ",") -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


def _unescaped(rows: list[list[str]]) -> list[str]:
    """Cells a spreadsheet would run: a formula start that is not a number written as one."""
    bad = []
    for cell in itertools.chain.from_iterable(rows):
        if cell.startswith(FORMULA_STARTS):
            try:
                float(cell)
            except ValueError:
                bad.append(cell)
            else:
                if cell in PAYLOADS:  # "+1" and "-1" were planted as text: they must be escaped
                    bad.append(cell)
    return bad


def _is_escaped(cell: str, text: str) -> bool:
    """The cell is ``text`` with apostrophes added (the spreadsheet shows what follows one as text)."""
    return cell != text and cell.replace("'", "") == text


def _escaped(rows: list[list[str]]) -> set[str]:
    return {p for cell in itertools.chain.from_iterable(rows) for p in PAYLOADS if _is_escaped(cell, p)}


@pytest.fixture
def hostile_records(db: None) -> dict[str, Any]:
    site = planted(Site)
    pool = planted(Pool, site=site)
    reservation = planted(
        Reservation,
        pool=pool,
        team=planted(Team),
        gpus=4,
        start=days_ahead(-1),
        end=days_ahead(20),
        state="active",
        priority=-3,
        client_id=None,
    )
    model = planted(GpaiModel, modalities=[Modality.TEXT], training_compute_flop=Decimal("1e24"))
    dataset = planted(
        Dataset,
        source_category=SourceCategory.CRAWLED,
        modality=Modality.TEXT,
        size=Decimal(10),
        size_unit=SizeUnit.TOKENS,
    )
    Lineage.objects.create(model=model, dataset=dataset)
    planted(CrawledDomain, dataset=dataset, bytes=5)
    planted(DataAsset, data_class=DataClass.TRAINING_CORPUS, lawful_basis=LawfulBasis.CONSENT)
    planted(ProcessorRecord)
    planted(
        SubjectRequest,
        kind=RequestKind.ACCESS,
        received_on=timezone.localdate(),
        extension_reason="",
        correction_reason="",
    )
    policy = planted(RetentionPolicy, data_class=DataClass.TELEMETRY, days=30)
    now = timezone.now()
    planted(
        RetentionRun,
        data_class=DataClass.TELEMETRY,
        policy=policy,
        cutoff=now,
        started_at=now,
        finished_at=now,
        affected=1,
    )
    planted(LegalHold, data_class=DataClass.INCIDENTS)
    for payload in PAYLOADS:
        record("update", obj=reservation, actor=payload, message=payload)
    # A priced job of a team named like a formula, with an hour of hang: a row of the cost export.
    rented = Pool.objects.create(site=site, gpu_model=L40S, name="@rented")
    rate_price(rented, "2.50")
    job = job_on(site, node_with_gpus(site, L40S, 2, "c-1"), name="-job", team=PAYLOADS[0])
    account(job, timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2), hang_s=7200)
    return {"reservation": reservation, "pool": pool}


# Each CSV route by name: how to fetch it (reverse()'s kwargs, the query) and who may.
FETCH: dict[str, tuple[dict[str, Any], str, str]] = {
    "api:capacity-api:plan-csv": ({}, "months=2", "viewer"),
    "api:capacity-api:reservations-csv": ({}, "", "viewer"),
    "api:cost-api:export": ({}, "range=24h", "viewer"),
    "compliance:audit-export": ({}, "", "admin"),
}


def test_every_csv_export_escapes_formulas_in_text_and_keeps_numbers(
    hostile_records: dict[str, Any], viewer_client: Client, admin_client: Client, django_capture_on_commit_callbacks
) -> None:
    uncovered = set(csv_routes()) - set(FETCH) - ZIPPED - set(NOT_CSV)
    assert not uncovered, f"CSV routes this test does not fetch: add them to FETCH: {sorted(uncovered)}"
    exports: dict[str, str] = {}
    clients = {"viewer": viewer_client, "admin": admin_client}
    for name, (kwargs, query, who) in FETCH.items():
        response = clients[who].get(f"{reverse(name, kwargs=kwargs)}?{query}")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv"), name
        body = b"".join(response.streaming_content) if response.streaming else response.content
        exports[name] = body.decode()

    today = timezone.localdate()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/api/v1/compliance/packs/",
            {"period_start": (today - timedelta(days=1)).isoformat(), "period_end": today.isoformat()},
            content_type="application/json",
        )
    assert response.status_code == 202, response.content
    status = admin_client.get(f"/api/v1/compliance/packs/{response.json()['id']}/").json()
    assert status["status"] == "done", status
    download = admin_client.get(status["download_url"])
    with zipfile.ZipFile(io.BytesIO(b"".join(download.streaming_content))) as archive:
        names = [n for n in archive.namelist() if n.endswith(".csv")]
        assert len(names) >= 10
        for name in names:
            exports[f"pack:{name}"] = archive.read(name).decode("utf-8-sig")

    for where, text in exports.items():
        for delimiter in SPLITS:
            assert _unescaped(_rows(text, delimiter)) == [], (where, delimiter)
        rows = _rows(text)
        if len(rows) > 1:  # every export with rows carried some planted text, escaped
            assert _escaped(rows), where
    assert set().union(*(_escaped(_rows(text)) for text in exports.values())) == set(PAYLOADS)

    reservations = _rows(exports["api:capacity-api:reservations-csv"])
    row = dict(zip(reservations[0], reservations[1], strict=True))
    assert row["priority"] == "-3" and row["gpus"] == "4"  # numbers stay numbers
    plan = _rows(exports["api:capacity-api:plan-csv"])
    gpu_model = hostile_records["pool"].gpu_model
    assert any(_is_escaped(r[3], gpu_model) for r in plan[1:])  # the plan's gpu_model column, escaped
    cost_rows = _rows(exports["api:cost-api:export"])
    cost = [dict(zip(cost_rows[0], r, strict=True)) for r in cost_rows[1:]]
    [hang] = [r for r in cost if r["cause"] == "hang"]
    assert (hang["team"], hang["pool"], hang["gpu_hours"]) == ("'" + PAYLOADS[0], "'@rented", "2.0")
