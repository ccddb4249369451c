"""`manage.py backup` and `manage.py restore`: a restored backup is equal to the original, table by
table, and a restore refuses what it cannot prove (a tampered dump, a database already in use).

The dump must see committed rows, so these tests use transactional databases; each restore goes
into a fresh database of its own, dropped afterwards.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.utils import timezone

from compliance.demo import seed_compliance
from compliance.models import GpaiModel
from console import dbroles
from console.backup import libpq_params, load_manifest, manifest_path, params_from_url, verify_database
from fleet.models import Gpu, GpuSample, Site
from incidents.choices import Severity
from incidents.models import Incident
from tests.conftest import make_sample, post_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet_rows(client: Any, site_a: Site, token_a: str) -> int:
    """Samples through the real ingest path (so telemetry partitions hold rows), an incident and the
    demo's compliance register; returns the number of samples."""
    samples = [make_sample(hostname="gpu-a-001", gpu_index=i) for i in range(6)]
    assert post_batch(client, token_a, {"samples": samples}).status_code == 202
    now = timezone.now()
    Incident.objects.create(
        title="NVLink down", severity=Severity.SEV2, group_key="nvl", started_at=now, detected_at=now
    )
    seed_compliance(today=timezone.localdate())
    return len(samples)


@pytest.fixture
def empty_database() -> Iterator[dict[str, str]]:
    """A new, empty database on the test server, made (and restored into) by the owner role, as
    an operator would (the console's own role may not create databases); yields its libpq parameters."""
    params = libpq_params({**connections["default"].settings_dict, **(dbroles.owner_credentials() or {})})
    name = f"test_restore_{uuid.uuid4().hex[:10]}"
    admin = {**params, "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {**params, "dbname": name}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def url_of(params: dict[str, str]) -> str:
    """The ``--database-url`` a user would type for these parameters. The embedded server's host is
    a unix socket directory, which a URL carries percent-encoded (``%2Fwork%2F...``), never as is."""
    host = quote(params.get("host", ""), safe="")
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgres://{quote(params['user'], safe='')}@{host}{port}/{quote(params['dbname'], safe='')}"


def backup(tmp_path: Path) -> Path:
    out = io.StringIO()
    call_command("backup", output=tmp_path, stdout=out)
    return Path(out.getvalue().strip().splitlines()[-1])


def restore(dump: Path, params: dict[str, str], *extra: str) -> str:
    out = io.StringIO()
    call_command("restore", str(dump), f"--database-url={url_of(params)}", *extra, stdout=out, stderr=out)
    return out.getvalue()


def test_backup_writes_a_dump_and_a_manifest_with_every_tables_count(tmp_path: Path, fleet_rows: int) -> None:
    dump = backup(tmp_path)

    assert dump.name.startswith("goodput-") and dump.suffix == ".dump" and dump.stat().st_size > 0
    manifest = json.loads(manifest_path(dump).read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dump.name, manifest_path(dump).name])
    tables = manifest["tables"]
    assert tables["fleet_site"]["rows"] == 1
    assert tables["fleet_gpu"]["rows"] == Gpu.objects.count() == fleet_rows
    assert tables["incidents_incident"]["rows"] == 1
    assert tables["compliance_gpaimodel"]["rows"] == GpaiModel.objects.count() > 0
    # Samples live in daily partitions: counted there, and not again on the partitioned parent.
    assert "fleet_gpusample" not in tables
    partitions = {name: t["rows"] for name, t in tables.items() if name.startswith("fleet_gpusample_")}
    assert sum(partitions.values()) == GpuSample.objects.count() == fleet_rows
    assert manifest["database"] == connections["default"].settings_dict["NAME"]
    assert manifest["migrations"]["fleet"].startswith("00")
    assert manifest["dump"]["size"] == dump.stat().st_size and len(manifest["dump"]["sha256"]) == 64


def test_a_restored_backup_equals_the_original(tmp_path: Path, fleet_rows: int, empty_database: dict[str, str]) -> None:
    dump = backup(tmp_path)

    output = restore(dump, empty_database)

    manifest = load_manifest(dump)
    rows = sum(t["rows"] for t in manifest["tables"].values())
    assert f"RESULT tables={len(manifest['tables'])} rows={rows} mismatches=0" in output
    with psycopg.connect(**empty_database) as conn:
        assert conn.execute("SELECT count(*) FROM fleet_gpusample").fetchone() == (fleet_rows,)
        assert conn.execute("SELECT count(*) FROM incidents_incident").fetchone() == (1,)
        assert conn.execute("SELECT name FROM fleet_site").fetchall() == [("ams-1",)]


def test_restore_refuses_a_database_that_is_not_empty(
    tmp_path: Path, fleet_rows: int, empty_database: dict[str, str]
) -> None:
    dump = backup(tmp_path)
    with psycopg.connect(**empty_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (body text)")

    with pytest.raises(CommandError, match="is not empty"):
        restore(dump, empty_database)

    with psycopg.connect(**empty_database) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    assert tables == [("notes",)]


def test_restore_refuses_a_dump_that_does_not_match_its_manifest(
    tmp_path: Path, fleet_rows: int, empty_database: dict[str, str]
) -> None:
    dump = backup(tmp_path)
    data = bytearray(dump.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dump.write_bytes(bytes(data))

    with pytest.raises(CommandError, match="SHA-256"):
        restore(dump, empty_database)

    with psycopg.connect(**empty_database) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_verify_reports_a_changed_row_and_a_missing_table(
    tmp_path: Path, fleet_rows: int, empty_database: dict[str, str]
) -> None:
    dump = backup(tmp_path)
    assert "mismatches=0" in restore(dump, empty_database)
    with psycopg.connect(**empty_database, autocommit=True) as conn:
        conn.execute("UPDATE fleet_site SET region = 'tampered'")
        conn.execute("DELETE FROM incidents_incident")
        conn.execute("DROP TABLE compliance_legalhold")

    result = verify_database(empty_database, load_manifest(dump))

    by_table = {m.table: m for m in result.mismatches}
    assert set(by_table) == {"fleet_site", "incidents_incident", "compliance_legalhold"}
    assert by_table["fleet_site"].checksum_differs and by_table["fleet_site"].actual_rows == 1
    assert (by_table["incidents_incident"].expected_rows, by_table["incidents_incident"].actual_rows) == (1, 0)
    assert by_table["compliance_legalhold"].actual_rows is None
    assert "missing from the restored database" in str(by_table["compliance_legalhold"])


def test_a_failed_backup_leaves_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pg_dump failing midway (here: a stand-in that exits 1) must leave neither a dump nor a manifest."""
    from console import backup as backup_module

    monkeypatch.setattr(backup_module, "_candidates", lambda name: [Path("/bin/false")])
    monkeypatch.setattr(backup_module, "binary_version", lambda binary: "99.0")

    with pytest.raises(CommandError, match="Backup failed"):
        backup(tmp_path)

    assert list(tmp_path.iterdir()) == []


def test_backup_refuses_a_pg_dump_older_than_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from console import backup as backup_module

    monkeypatch.setattr(backup_module, "binary_version", lambda binary: "9.6")

    with pytest.raises(CommandError, match=r"No pg_dump for the PostgreSQL \d+ server"):
        backup(tmp_path)

    assert list(tmp_path.iterdir()) == []


def test_the_oldest_client_tool_that_is_new_enough_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """pg_restore 18 fails on a PostgreSQL 15 server (it sends `SET transaction_timeout`); 15's own works."""
    from console import backup as backup_module

    installed = {Path("/embedded/pg_restore"): "18.6", Path("/usr/bin/pg_restore"): "15.20"}
    monkeypatch.setattr(backup_module, "_candidates", lambda name: list(installed))
    monkeypatch.setattr(backup_module, "binary_version", installed.__getitem__)

    assert backup_module.pg_binary("pg_restore", 150020) == (Path("/usr/bin/pg_restore"), "15.20")
    assert backup_module.pg_binary("pg_restore", 180001) == (Path("/embedded/pg_restore"), "18.6")


def test_the_empty_database_is_on_the_consoles_own_server(empty_database: dict[str, str]) -> None:
    """The restore tests target the server the suite runs on (the embedded one, on a unix socket,
    without DATABASE_URL), never whatever server the default socket leads to."""
    own = libpq_params({**connections["default"].settings_dict, **(dbroles.owner_credentials() or {})})
    target = params_from_url(url_of(empty_database))
    where = ("host", "port", "user")
    assert {key: target.get(key) for key in where} == {key: own.get(key) for key in where}
    assert target["dbname"] == empty_database["dbname"]


def test_database_urls_for_a_tcp_server_and_a_unix_socket_directory() -> None:
    tcp = "postgres://ops:p%40ss@db.example.com:6543/goodput_restored?sslmode=require&connect_timeout=3"
    assert params_from_url(tcp) == {
        "dbname": "goodput_restored",
        "user": "ops",
        "password": "p@ss",
        "host": "db.example.com",
        "port": "6543",
        "sslmode": "require",
        "connect_timeout": "3",
    }
    socket = {"dbname": "goodput_restored", "user": "postgres", "host": "/Srv/Goodput/var/pgdata"}
    # libpq's two spellings of a socket directory; the case of the path is kept.
    assert params_from_url("postgres://postgres@%2FSrv%2FGoodput%2Fvar%2Fpgdata/goodput_restored") == socket
    assert params_from_url("postgres://postgres@/goodput_restored?host=/Srv/Goodput/var/pgdata") == socket
    assert params_from_url("postgres://postgres@%2Fsrv%2Fpg:5433/x")["port"] == "5433"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://postgres@/srv/goodput/var/pgdata:5432/goodput_restored", "more than a database name"),
        ("postgres://ops:secret@db.example.com:5432", "names no database"),
    ],
)
def test_restore_refuses_a_url_it_would_misread(tmp_path: Path, url: str, message: str) -> None:
    """A bare socket path in the URL would be read as a database name on the default socket's server."""
    with pytest.raises(CommandError, match=message) as caught:
        call_command("restore", str(tmp_path / "goodput-x.dump"), f"--database-url={url}")
    assert "secret" not in str(caught.value)


# --- the recovery register (issue 26): the console's own database backs up and restores into it ---


def test_backup_and_restore_record_a_backup_and_a_verified_restore_test_of_the_console_database(
    tmp_path: Path, fleet_rows: int, empty_database: dict[str, str]
) -> None:
    from compliance.models import RecoveryItem, RestoreTest

    dump = backup(tmp_path)
    restore(dump, empty_database)

    item = RecoveryItem.objects.get(kind="console_database")
    report = item.backups.get(external_id=dump.name)
    assert (report.outcome, report.bytes) == ("success", dump.stat().st_size)
    test = RestoreTest.objects.get(item=item, verification__startswith=dump.name)  # besides the demo seed's
    assert test.verified and test.backup == report
    assert test.into.endswith(empty_database["dbname"])
    assert "0 mismatches" in test.verification and test.by_name.endswith("(manage.py)")
    assert test.finished >= test.started
    # the restored copy is the dump's: the register's own rows written after it are not in it
    with psycopg.connect(**empty_database) as conn:
        query = "SELECT count(*) FROM compliance_restoretest WHERE verification LIKE %s"
        assert conn.execute(query, [f"{dump.name}%"]).fetchone() == (0,)


def test_a_restore_whose_copy_differs_from_the_manifest_records_an_unverified_test(
    tmp_path: Path, fleet_rows: int, empty_database: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from compliance.models import RestoreTest
    from console import backup as backup_module

    dump = backup(tmp_path)
    real = backup_module.verify_database

    def tampered(params: Any, manifest: Any) -> Any:
        result = real(params, manifest)
        mismatch = backup_module.Mismatch("fleet_site", 1, 0, False)
        return backup_module.RestoreResult(result.tables, result.rows, [mismatch])

    monkeypatch.setattr(backup_module, "verify_database", tampered)
    with pytest.raises(CommandError, match="differs from the backup"):
        restore(dump, empty_database)
    test = RestoreTest.objects.get(verification__startswith=dump.name)
    assert not test.verified and "1 mismatches" in test.verification
