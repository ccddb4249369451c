"""Issue 37, items 1 to 3: the console's role gets nothing of the owner's through the owner's
functions, a chain re-sealed to be consistent is caught by the heads kept outside the database, and
the owner's URL stays out of the serving processes.

As reported: the app role could CREATE in schema public, and the SECURITY DEFINER functions that
seal and purge the log looked names up through public, so a function the app role planted with the
name and argument types of one they call ran as the owner. These tests connect as the app role
(the suite's own role on the embedded PostgreSQL; made by setup_database_roles otherwise) and try
the whole sequence against the real server.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from compliance.choices import AuditAction
from compliance.models import AuditChainCheck, AuditEntry, AuditSeal
from compliance.services import audit_chain, audit_heads, retention
from compliance.services.audit import purge_entries_before, record
from console import dbroles
from fleet.telemetry import partitions
from incidents.choices import Severity, TimelineKind
from incidents.models import Incident, TimelineEntry
from tests.compliance.audit_support import admin_user, rewrite_consistently, tamper, three_entries, url, verify

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # setup_database_roles alters the server's roles, which every parallel worker's database shares:
    # two workers altering one role at once can fail ("tuple concurrently updated"), so one worker runs these.
    pytest.mark.xdist_group("database-roles"),
]

ROOT = Path(__file__).resolve().parents[2]
# Operators the owner's functions use: each is planted too, for the argument types they take.
OPERATORS = ("||", "=", "<>", "<", ">", ">=", "<=", "+", "-", "*", "~", "->", "->>", "?")
SHADOW_TYPES = ("text", "character varying", "bigint", "integer", "jsonb", "timestamp with time zone", "bigint[]")


def _definer_sources(cursor: Any) -> dict[str, str]:
    """Every function of ours that runs as the owner or inside one (definer, trigger, helper)."""
    cursor.execute(
        """
        SELECT p.oid::regprocedure::text, p.prosrc, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), '')
        FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
          AND (p.proname LIKE 'goodput\\_%%' OR p.proname LIKE 'incidents\\_%%')
        """
    )
    rows = cursor.fetchall()
    assert any(secdef for _, _, secdef, _ in rows), "no SECURITY DEFINER function found"
    for signature, _, secdef, config in rows:
        if secdef:
            # PostgreSQL's prescription for SECURITY DEFINER: a pinned path with pg_temp last.
            assert "search_path=pg_catalog, pg_temp" in config, (signature, config)
    return {signature: source for signature, source, _, _ in rows}


def _called_names(sources: dict[str, str]) -> set[str]:
    names = set()
    for source in sources.values():
        names |= {m.lower() for m in re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", source)}
    return names - {"if", "and", "or", "not", "in", "values", "exists", "select", "as", "on", "returning", "using"}


def _error(statement: str, params: list[Any] | None = None) -> str:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, params)
    except DatabaseError as exc:
        return str(exc)
    return ""


def _create(cursor: Any, statement: str) -> str:
    """Run a CREATE of ``{schema}.…`` in public, as the reported attack did; where that is refused,
    in pg_temp, the one schema every role may create in. Returns the schema it went into. (Both
    connections are in autocommit: a refused statement leaves nothing to roll back.)"""
    try:
        cursor.execute(statement.replace("{schema}", "public"))
    except (DatabaseError, psycopg.Error) as exc:
        assert "permission denied for schema public" in str(exc), exc
        cursor.execute(statement.replace("{schema}", "pg_temp"))
        return "pg_temp"
    return "public"


def plant(cursor: Any, *, tables: bool) -> list[str]:
    """On this session: a shadow of every name and operator the owner's functions use, for the
    argument types they take, each recording who ran it in pg_temp.ran; with ``tables``, temporary
    tables named as the ones they read too (an unqualified name in a function whose path ends in
    pg_temp would read those: a floor of 0 days, a forged last seal). Returns the schema of each
    shadow (closing the session drops those in pg_temp; any in public go with the test database)."""
    names = _called_names(_definer_sources(cursor))
    assert {"goodput_audit_field", "goodput_audit_content", "sha256", "encode", "format"} <= names
    cursor.execute("CREATE TEMP TABLE ran (who text, what text)")
    made = []
    for name in sorted(names):
        for argtype in SHADOW_TYPES:
            made.append(
                _create(
                    cursor,
                    f'CREATE FUNCTION {{schema}}."{name}"(a {argtype}) RETURNS text LANGUAGE sql AS '
                    f"$$ INSERT INTO pg_temp.ran VALUES (current_user, '{name}({argtype})') RETURNING 'x' $$",
                )
            )
    for argtype in ("text", "character varying", "bigint", "jsonb"):
        shadow = f"goodput_shadow_op_{argtype.replace(' ', '_')}"
        schema = _create(
            cursor,
            f"CREATE FUNCTION {{schema}}.{shadow}(a {argtype}, b {argtype}) RETURNS boolean LANGUAGE sql AS "
            f"$$ INSERT INTO pg_temp.ran VALUES (current_user, 'operator on {argtype}') RETURNING true $$",
        )
        for op in OPERATORS:
            made.append(
                _create(
                    cursor,
                    f"CREATE OPERATOR {{schema}}.{op} (LEFTARG = {argtype}, RIGHTARG = {argtype}, "
                    f"FUNCTION = {schema}.{shadow})",
                )
            )
    if tables:
        for table in ("compliance_auditentry", "compliance_auditseal", "goodput_audit_settings", "incidents_incident"):
            cursor.execute(f"CREATE TEMP TABLE {table} (LIKE public.{table})")
        cursor.execute("INSERT INTO pg_temp.goodput_audit_settings VALUES (1, 0)")
    return made


def _seals() -> list[tuple[Any, ...]]:
    return list(AuditSeal.objects.order_by("seq").values_list("entry_id", "seq", "content_hash", "prev_hash", "hash"))


def test_nothing_planted_runs_as_the_owner_when_the_console_writes_and_purges() -> None:
    """The console's own connection plants the shadows, then writes once and uses every door it
    has into the owner's functions: the seal at commit, the purge, the timeline purge, the chain
    check and the partitions."""
    three_entries()
    now = timezone.now()
    old = AuditEntry.objects.create(at=now - timedelta(days=400), actor="system", action="action", message="kept")
    before = _seals()
    incident = Incident.objects.create(
        title="x", severity=Severity.SEV3, group_key="x", started_at=now, detected_at=now
    )
    TimelineEntry.objects.create(incident=incident, kind=TimelineKind.STATE, actor_label="system", text="opened")
    day = partitions.SAMPLES.start_of(now + timedelta(days=50))
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            assert cursor.fetchone()[0] == dbroles.app_credentials()["USER"]
            assert len(plant(cursor, tables=False)) > 100

        entry = record(AuditAction.ACTION, message="written beside the plants", actor="mallory")
        assert purge_entries_before(now + timedelta(days=1), actor="mallory") == 0  # the floor keeps 400 days
        runs = retention.run_retention(triggered_by="planted")
        check = audit_chain.check_and_record(triggered_by="planted")
        with connection.cursor() as cursor:
            cursor.execute("SELECT goodput_purge_incident_timeline(ARRAY[%s]::bigint[])", [incident.pk])
            assert cursor.fetchone() == (0,)  # not resolved: kept
            cursor.execute("SELECT goodput_create_partition('fleet_gpusample', 'day', %s)", [day])
            cursor.execute("SELECT who, what FROM pg_temp.ran")
            ran = cursor.fetchall()
    finally:
        connection.close()

    assert ran == [], f"planted objects ran: {ran}"
    assert {r.data_class for r in runs} >= {"audit", "incidents"}
    assert check.ok, check.problem
    after = _seals()
    assert after[: len(before)] == before  # nothing rewritten, nothing removed
    assert entry.pk in [row[0] for row in after[len(before) :]]  # the new entry, sealed in the real table
    assert AuditEntry.objects.filter(pk=old.pk).exists()
    assert TimelineEntry.objects.filter(incident=incident).count() == 1
    assert audit_chain.verify_chain().ok
    partitions.forget_known_partitions()
    assert partitions.SAMPLES.partition_name(day) in partitions.existing_partitions(partitions.SAMPLES)


def test_nothing_planted_runs_as_the_owner_and_no_temporary_table_stands_in(
    db_roles: tuple[str, str], as_role: Any
) -> None:
    """A session of the app role with shadow tables as well calls the owner's functions directly."""
    _, app = db_roles
    three_entries()
    now = timezone.now()
    AuditEntry.objects.create(at=now - timedelta(days=400), actor="system", action="action", message="kept")
    before = _seals()
    conn = as_role(app)
    cursor = conn.cursor()
    plant(cursor, tables=True)

    written = cursor.execute(
        "INSERT INTO public.compliance_auditentry (at, actor, action, app_label, model, object_id, object_repr,"
        " message) VALUES (now(), 'mallory', 'action', '', '', '', '', 'planted beside') RETURNING id"
    ).fetchone()[0]
    cursor.execute("SELECT public.goodput_audit_seal_pending()")
    cursor.execute("SELECT public.goodput_audit_purge(now() + interval '1 day', 'mallory')")
    assert cursor.fetchone() == (0,)
    cursor.execute("SELECT public.goodput_purge_incident_timeline(ARRAY[1, 2, 3]::bigint[])")
    cursor.execute("SELECT public.goodput_audit_verify('{}', '{}', '{}', 'planted')")
    check = AuditChainCheck.objects.get(pk=cursor.fetchone()[0])
    day = partitions.SAMPLES.start_of(now + timedelta(days=51))
    cursor.execute("SELECT public.goodput_create_partition('fleet_gpusample', 'day', %s)", [day])

    assert cursor.execute("SELECT who, what FROM pg_temp.ran").fetchall() == []
    assert cursor.execute("SELECT count(*) FROM pg_temp.compliance_auditseal").fetchone() == (0,)
    assert check.ok, check.problem
    after = _seals()
    assert after[: len(before)] == before
    assert [row[0] for row in after[len(before) :]] == [written]
    assert AuditEntry.objects.filter(message="kept").exists()
    conn.close()
    partitions.forget_known_partitions()


def test_the_owners_functions_refuse_what_is_not_a_telemetry_partition() -> None:
    assert "not a telemetry table" in _error(
        "SELECT goodput_create_partition('compliance_auditentry', 'day', now()::date::timestamptz)"
    )
    assert "start of a UTC day or month" in _error(
        "SELECT goodput_create_partition('fleet_gpusample', 'day', '2026-01-01 05:00+00')"
    )
    assert "not a partition" in _error("SELECT * FROM goodput_drop_partition('compliance_auditentry')")
    assert "not a partition" in _error("SELECT * FROM goodput_drop_partition('fleet_gpusample')")


def test_setup_database_roles_takes_create_back_says_so_and_changes_nothing_the_second_time(
    db_roles: tuple[str, str], as_role: Any
) -> None:
    owner, app = db_roles
    admin = as_role(admin_user())
    admin.execute(f'GRANT CREATE ON SCHEMA public TO PUBLIC, "{app}"')
    assert any("may CREATE in schema public" in p for p in dbroles.connection_role_problems(as_role(app).cursor()))

    out = io.StringIO()
    call_command(
        "setup_database_roles", admin_url=url(admin_user()), owner_url=url(owner), app_url=url(app), stdout=out
    )

    assert "CREATE on schema public revoked from PUBLIC" in out.getvalue()
    assert f"CREATE on schema public revoked from {app}" in out.getvalue()
    assert dbroles.connection_role_problems(as_role(app).cursor()) == []
    again = io.StringIO()
    call_command(
        "setup_database_roles", admin_url=url(admin_user()), owner_url=url(owner), app_url=url(app), stdout=again
    )
    assert "revoked" not in again.getvalue() and "changes=0" in again.getvalue()


def test_only_the_owners_function_writes_the_chain_checks(officer_client: Any) -> None:
    three_entries()
    forged = (
        "INSERT INTO compliance_auditchaincheck (checked_at, ok, entries, head_hash, problem, duration_ms, "
        "triggered_by) VALUES (now(), true, 1, '', '', 0, 'mallory')"
    )
    assert "permission denied for table compliance_auditchaincheck" in _error(forged)
    assert "permission denied" in _error("UPDATE compliance_auditchaincheck SET ok = true")

    check = audit_chain.check_and_record(triggered_by="test")

    assert check.ok and check.entries == AuditEntry.objects.count() and check.triggered_by == "test"
    assert check.head_seq == audit_chain.chain_head().seq
    assert "hash chain verified" in officer_client.get("/compliance/").content.decode()


# --- item 2: heads kept outside the database --------------------------------------------------


def test_the_hourly_task_keeps_the_head_once_per_move(tmp_path: Path) -> None:
    from compliance.tasks import keep_audit_head

    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    three_entries()
    head = audit_chain.chain_head()

    assert keep_audit_head() == {"kept": True, "seq": head.seq}
    assert keep_audit_head() == {"kept": False, "seq": head.seq}  # the chain has not moved
    record(AuditAction.ACTION, message="one more", actor="system")
    assert keep_audit_head()["kept"] is True

    kept = audit_heads.kept_heads()
    assert [k.seq for k in kept] == [head.seq, head.seq + 1]
    assert (kept[0].hash, kept[0].at, kept[0].source) == (head.hash, head.at, "beat")
    assert "keep-audit-head" in settings.CELERY_BEAT_SCHEDULE
    assert settings.CELERY_BEAT_SCHEDULE["keep-audit-head"]["schedule"] <= 3600


def test_a_pack_keeps_its_head_too(tmp_path: Path) -> None:
    from compliance.services import pack

    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    three_entries()
    today = timezone.localdate()
    made = pack.request_pack(period_start=today - timedelta(days=1), period_end=today)
    pack.build_pack(made)
    assert audit_heads.kept_heads()[-1].source == "pack"


def test_a_chain_resealed_to_be_consistent_is_caught_by_the_kept_heads_by_default(
    superuser: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The reported rewrite: without --head, verify_audit_log used to say ok."""
    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    _, _, last = three_entries()
    audit_heads.keep_head(audit_chain.chain_head(), source="beat")
    record(AuditAction.ACTION, message="later", actor="system")
    audit_heads.keep_head(audit_chain.chain_head(), source="beat")
    kept = audit_heads.kept_heads()
    assert verify()[0] == 0

    rewrite_consistently(superuser, last.pk, "rewritten")  # and the entry after it is re-chained too
    later = AuditEntry.objects.get(message="later")
    rewrite_consistently_from(superuser, later.pk)
    assert audit_chain.verify_chain().ok  # consistent again: only a kept head can tell

    status, output = verify()

    assert status == 1
    assert f"the earlier head seq {kept[0].seq} with hash {kept[0].hash} is not in the chain" in output
    assert "heads_checked=2" in output
    assert not AuditChainCheck.objects.latest("pk").ok


def rewrite_consistently_from(conn: psycopg.Connection[Any], entry_id: int) -> None:
    """Re-chain ``entry_id`` onto whatever its predecessor's hash now is (a superuser's re-seal)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.content_hash, (SELECT p.hash FROM compliance_auditseal p WHERE p.seq = s.seq - 1)"
            " FROM compliance_auditseal s WHERE s.entry_id = %s",
            [entry_id],
        )
        content_hash, prev_hash = cursor.fetchone()
    tamper(
        conn,
        "UPDATE compliance_auditseal SET prev_hash = %s, hash = %s WHERE entry_id = %s",
        params=(prev_hash, audit_chain.chain_hash(prev_hash, content_hash), entry_id),
    )


def test_a_kept_head_that_a_lawful_purge_removed_still_verifies(tmp_path: Path) -> None:
    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    now = timezone.now()
    old = [
        AuditEntry.objects.create(at=now - timedelta(days=3000 - i), actor="system", action="action") for i in range(3)
    ]
    # Heads kept when those entries were the newest: the middle one ends up inside the purged range.
    for entry in old[:2]:
        seal = AuditSeal.objects.get(entry=entry)
        audit_heads.keep_head(audit_chain.Head(seal.seq, seal.hash, entry.pk, entry.at), source="beat")
    three_entries()
    assert purge_entries_before(now, actor="cora") == 3

    assert verify()[0] == 0


def test_a_damaged_heads_file_is_an_error_naming_the_line(tmp_path: Path) -> None:
    from django.core.management.base import CommandError

    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    three_entries()
    audit_heads.keep_head(audit_chain.chain_head(), source="beat")
    with audit_heads.heads_path().open("a") as handle:
        handle.write("12 not-a-hash\n")

    with pytest.raises(CommandError, match=r"line 2"):
        call_command("verify_audit_log", "--no-record")


# --- item 3: the owner's URL stays out of web and worker processes -----------------------------


def test_a_web_process_with_the_owners_url_warns_at_start_up() -> None:
    environment = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": "postgres://goodput@db.internal:5432/goodput",
        "DATABASE_OWNER_URL": "postgres://goodput_owner@db.internal:5432/goodput",
        "REDIS_URL": "redis://127.0.0.1:6379/15",
        "SECRET_KEY": "x" * 50,
        "ALLOWED_HOSTS": "goodput.example.com",
        "DJANGO_SETTINGS_MODULE": "console.settings",
    }
    script = "import django; django.setup(); from console.runtime import announce_mode; announce_mode('web')"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "[goodput:web] WARNING: DATABASE_OWNER_URL is set in this process's environment" in result.stderr
    del environment["DATABASE_OWNER_URL"]
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert "WARNING" not in result.stderr, result.stderr
