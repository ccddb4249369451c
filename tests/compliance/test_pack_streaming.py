"""Heavy work stays bounded (issue 22, item 11): a pack is written as its rows are read, never held
whole, and downloaded from its stored chunks a chunk at a time.

Memory is measured with tracemalloc around ``write_pack`` (everything Python allocates while it
runs); bench/pack.py measures the worker's RSS over a million entries.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tempfile
import tracemalloc
import zipfile
from datetime import time

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connection
from django.test import AsyncClient
from hypothesis import given, settings
from hypothesis import strategies as st

from compliance.choices import PackStatus
from compliance.models import CompliancePack, CompliancePackChunk
from compliance.models.pack import CHUNK_BYTES
from compliance.services import pack as pack_service
from tests.compliance.test_pack_build import END, START, local

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024
EXPECTED_FILES = ["pack.json", "pack.pdf", *(name for name, _, _ in pack_service.CSV_FILES), "manifest.json"]


def add_audit_entries(count: int, *, payload: int = 200) -> None:
    """``count`` entries one second apart from the first instant of START, each with a before and
    after of ``payload`` characters, inserted by one statement (the app's path is not what is
    measured)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO compliance_auditentry
                (at, actor, action, app_label, model, object_id, object_repr, message, before, after)
            SELECT %s + g * interval '1 second', 'cora', 'update', 'compliance', 'gpaimodel', g::text,
                   'Model ' || g, 'entry ' || g,
                   jsonb_build_object('notes', repeat('b', %s)), jsonb_build_object('notes', repeat('a', %s))
            FROM generate_series(0, %s - 1) AS g
            """,
            [local(START, time(0)), payload, payload, count],
        )


def test_a_pack_over_many_entries_is_written_in_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # 6,000 entries with 4 kB of before/after each: 24 MB as text, several times that as the
    # lists and strings a pack built in memory would hold.
    entries = 6_000
    add_audit_entries(entries, payload=2_000)
    monkeypatch.setattr(pack_service, "PDF_AUDIT_ROWS", 50)  # the PDF's table is not what is measured
    pack = CompliancePack.objects.create(period_start=START, period_end=END)
    with tempfile.TemporaryFile() as out:
        tracemalloc.start()
        try:
            pack_service.write_pack(pack, out)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 32 * MIB, f"write_pack peaked at {peak / MIB:.0f} MiB"

        out.seek(0)
        archive = zipfile.ZipFile(out)
        assert archive.namelist() == EXPECTED_FILES
        with archive.open("audit.csv") as raw:
            rows = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
            ids = [int(row["id"]) for row in rows]
        assert len(ids) == entries and ids == sorted(ids)
        doc = json.loads(archive.read("pack.json"))
        assert [e["id"] for e in doc["audit"]] == ids
        assert doc["audit"][0]["after"] == {"notes": "a" * 2_000}
        manifest = {f["name"]: f for f in json.loads(archive.read("manifest.json"))["files"]}
        for name in EXPECTED_FILES[:-1]:
            data = archive.read(name)
            assert (manifest[name]["size"], manifest[name]["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def test_pack_json_written_record_by_record_is_what_json_dumps_writes() -> None:
    """Streamed key by key and item by item, pack.json keeps the bytes of the whole-document
    json.dumps(indent=2, ensure_ascii=False) it replaced, empty lists and non-ASCII included."""
    add_audit_entries(3)
    pack = CompliancePack.objects.create(period_start=START, period_end=END)
    raw = zipfile.ZipFile(io.BytesIO(pack_service.build_pack(pack))).read("pack.json")
    doc = json.loads(raw)
    assert doc["models"] == [] and len(doc["audit"]) == 3
    assert raw == json.dumps(doc, indent=2, ensure_ascii=False).encode()

    out = io.BytesIO()
    writer = pack_service._JsonDocument(pack_service._Sink(out))
    writer.value("name", "Zoë → “quoted”\nnext line")
    writer.begin_list("empty")
    writer.end_list()
    writer.begin_list("rows")
    for row in ({"a": [1, {"b": None}], "c": {}}, {"d": []}):
        writer.item(row)
    writer.end_list()
    writer.close()
    expected = {"name": "Zoë → “quoted”\nnext line", "empty": [], "rows": [{"a": [1, {"b": None}], "c": {}}, {"d": []}]}
    assert out.getvalue() == json.dumps(expected, indent=2, ensure_ascii=False).encode()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.django_db(False)
@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, level=st.integers(0, 3))
def test_each_value_is_written_as_json_dumps_writes_it_nested(value: object, level: int) -> None:
    """The formatter that replaces json's slow indenting encoder writes the same bytes, NaN,
    infinities, escapes and non-ASCII text included."""
    expected = json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n" + "  " * level).encode()
    assert pack_service._json(value, level) == expected


def test_the_pdf_counts_every_entry_but_lists_only_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from pypdf import PdfReader

    add_audit_entries(7)
    monkeypatch.setattr(pack_service, "PDF_AUDIT_ROWS", 3)
    pack = CompliancePack.objects.create(period_start=START, period_end=END)
    archive = zipfile.ZipFile(io.BytesIO(pack_service.build_pack(pack)))
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(archive.read("pack.pdf"))).pages)
    assert "7 entries from 2026-01-01 to 2026-01-31" in text
    assert "audit.csv holds all 7" in text
    assert "entry 2" in text and "entry 3" not in text


def stored_pack(content: bytes) -> CompliancePack:
    pack = CompliancePack.objects.create(period_start=START, period_end=END, status=PackStatus.DONE, progress=100)
    sha256, size = pack_service.save_zip(pack.pk, io.BytesIO(content))
    CompliancePack.objects.filter(pk=pack.pk).update(sha256=sha256, size=size)
    pack.refresh_from_db()
    return pack


def test_the_zip_is_stored_in_chunks_and_read_back_whole() -> None:
    content = bytes(range(256)) * (CHUNK_BYTES * 5 // 2 // 256)  # two and a half chunks
    pack = stored_pack(content)
    sizes = list(CompliancePackChunk.objects.filter(pack=pack).order_by("seq").values_list("seq", "data"))
    assert [(seq, len(data)) for seq, data in sizes] == [(0, CHUNK_BYTES), (1, CHUNK_BYTES), (2, CHUNK_BYTES // 2)]
    assert (pack.size, pack.sha256) == (len(content), hashlib.sha256(content).hexdigest())
    assert b"".join(pack_service.zip_chunks(pack.pk)) == content
    # Storing again replaces the chunks rather than adding to them.
    pack_service.save_zip(pack.pk, io.BytesIO(b"short"))
    assert b"".join(pack_service.zip_chunks(pack.pk)) == b"short"


def test_a_download_streams_the_stored_chunks(officer_client, officer_user: User) -> None:
    content = bytes(range(256)) * (CHUNK_BYTES * 5 // 2 // 256)
    pack = stored_pack(content)
    url = f"/api/v1/compliance/packs/{pack.pk}/download/"

    response = officer_client.get(url)
    assert response.status_code == 200 and response.streaming
    parts = list(response.streaming_content)
    assert len(parts) == 3 and b"".join(parts) == content
    assert response["Content-Length"] == str(len(content))

    # Under ASGI (uvicorn) the chunks come through an async iterator: Django would read a sync
    # one whole before sending a byte.
    client = AsyncClient()
    client.force_login(officer_user)

    async def download() -> tuple[bool, list[bytes]]:
        answer = await client.get(url)
        return answer.is_async, [part async for part in answer.streaming_content]

    is_async, parts = async_to_sync(download)()
    assert is_async and len(parts) == 3 and b"".join(parts) == content
