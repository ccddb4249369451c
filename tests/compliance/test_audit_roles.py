"""Issue 22, items 1 and 2: the console runs as a role that cannot rewrite or empty the audit log.

`manage.py setup_database_roles` creates the owner and the app role and hands them the test
database; these tests then connect as each role explicitly. Where the suite already runs as two
roles (the embedded PostgreSQL: goodput_owner and goodput_app) those are the ones set up again
(idempotently); where DATABASE_URL's role is the only one, two roles are made for the test.
The roles are cluster-wide and what they own is committed, so the database is transactional.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from compliance.choices import AuditAction
from compliance.models import AuditEntry
from compliance.services import audit_chain, retention
from compliance.services.audit import record
from console import dbroles
from fleet.telemetry import partitions
from incidents.choices import Severity, TimelineKind
from incidents.models import Incident, TimelineEntry
from tests.compliance.audit_support import admin_user, url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # setup_database_roles alters the server's roles, which every parallel worker's database shares:
    # two workers altering one role at once can fail ("tuple concurrently updated"), so one worker runs these.
    pytest.mark.xdist_group("database-roles"),
]

ROOT = Path(__file__).resolve().parents[2]
APPEND_ONLY = ("compliance_auditentry", "compliance_auditseal", "compliance_summaryversion", "incidents_timelineentry")
# Every session setting that ever opened a door, set both ways.
SETTINGS = (
    None,
    "SET goodput.audit_purge = 'on'",
    "SET LOCAL goodput.audit_purge = 'on'",
    "SET goodput.retention_purge = 'on'",
    "SET LOCAL goodput.retention_purge = 'on'",
)


def refused(conn: psycopg.Connection[Any], statement: str, setting: str | None = None) -> str:
    """Run ``statement`` (after ``setting``) in a transaction; the error it was refused with ('' if
    it went through, which is then rolled back)."""
    try:
        with conn.transaction(force_rollback=True):
            if setting:
                conn.execute(setting)
            conn.execute(statement)
    except psycopg.Error as exc:
        return str(exc)
    return ""


def test_setup_database_roles_makes_two_roles_and_is_idempotent(db_roles: tuple[str, str], as_role: Any) -> None:
    owner, app = db_roles
    conn = as_role(admin_user())
    for role in (owner, app):
        assert conn.execute("SELECT rolsuper, rolcanlogin FROM pg_roles WHERE rolname = %s", [role]).fetchone() == (
            False,
            True,
        )
    assert conn.execute(
        "SELECT pg_has_role(%s, %s, 'MEMBER'), pg_has_role(%s, %s, 'MEMBER')", [owner, app, app, owner]
    ).fetchone() == (True, False)
    owners = dict(
        conn.execute(
            "SELECT relname, pg_get_userbyid(relowner) FROM pg_class WHERE relname = ANY(%s)",
            [[*APPEND_ONLY, "fleet_site", "fleet_gpusample"]],
        ).fetchall()
    )
    assert owners == {
        "compliance_auditentry": owner,
        "compliance_auditseal": owner,
        "compliance_summaryversion": owner,
        "incidents_timelineentry": owner,
        "fleet_site": owner,
        "fleet_gpusample": owner,  # partitions are made and dropped by the owner's functions (issue 37)
    }
    assert conn.execute(
        "SELECT count(*) FROM pg_class WHERE pg_get_userbyid(relowner) = %s AND relnamespace = 'public'::regnamespace",
        [app],
    ).fetchone() == (0,)
    out = io.StringIO()
    call_command(
        "setup_database_roles", admin_url=url(admin_user()), owner_url=url(owner), app_url=url(app), stdout=out
    )
    assert "changes=0" in out.getvalue()
    if dbroles.separate_roles():  # the embedded PostgreSQL: the suite itself runs as the app role
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            assert cursor.fetchone() == (app,)


def test_setup_hands_what_a_superuser_made_before_to_the_owner(db_roles: tuple[str, str], as_role: Any) -> None:
    """A deployment that ran as a superuser until now: its tables change hands, and the app role
    gets its grants on them."""
    owner, app = db_roles
    admin = as_role(admin_user())
    admin.execute("CREATE TABLE legacy_notes (body text)")
    try:
        out = io.StringIO()
        call_command(
            "setup_database_roles", admin_url=url(admin_user()), owner_url=url(owner), app_url=url(app), stdout=out
        )
        assert "table legacy_notes" in out.getvalue() and "changes=1" in out.getvalue()
        owned = admin.execute("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'legacy_notes'")
        assert owned.fetchone() == (owner,)
        as_role(app).execute("INSERT INTO legacy_notes VALUES ('kept')")
    finally:
        admin.execute("DROP TABLE legacy_notes")


def test_the_app_role_cannot_update_delete_or_truncate_the_append_only_tables(
    db_roles: tuple[str, str], as_role: Any
) -> None:
    """The issue's Done when: with and without any session setting."""
    _, app = db_roles
    conn = as_role(app)
    entry_id = conn.execute(
        "INSERT INTO compliance_auditentry (at, actor, action, app_label, model, object_id, object_repr, message)"
        " VALUES (now(), 'system', 'action', '', '', '', '', 'written by the app role') RETURNING id"
    ).fetchone()[0]
    sealed = conn.execute("SELECT seq, hash FROM compliance_auditseal WHERE entry_id = %s", [entry_id]).fetchone()
    assert sealed[0] is not None and len(sealed[1]) == 64  # sealed at commit, by the owner's function
    forged = f"INSERT INTO compliance_auditseal VALUES ({entry_id} + 1000, 1, '', '', '')"
    assert "permission denied for table compliance_auditseal" in refused(conn, forged)

    for table in APPEND_ONLY:
        for setting in SETTINGS:
            column = "entry_id" if table == "compliance_auditseal" else "id"
            for statement in (f"UPDATE {table} SET {column} = {column}", f"DELETE FROM {table}", f"TRUNCATE {table}"):
                error = refused(conn, statement, setting)
                assert f"permission denied for table {table}" in error, (statement, setting, error)
    assert "permission denied" in refused(conn, "SET session_replication_role = replica")
    assert "must be owner" in refused(conn, "ALTER TABLE compliance_auditentry DISABLE TRIGGER ALL")
    assert "permission denied" in refused(conn, "UPDATE goodput_audit_settings SET floor_days = 365")
    # The one door it has: the purge function, which keeps the floor.
    assert conn.execute("SELECT goodput_audit_purge(now() + interval '1 day', 'mallory')").fetchone() == (0,)
    assert AuditEntry.objects.filter(pk=entry_id).exists()


def test_a_role_that_may_write_every_table_is_refused_by_the_triggers(db_roles: tuple[str, str], as_role: Any) -> None:
    """A non-owner with pg_write_all_data: the privileges let it, the triggers do not, whatever it sets."""
    admin = as_role(admin_user())
    if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'goodput_test_writer'").fetchone():
        admin.execute("CREATE ROLE goodput_test_writer LOGIN")
    admin.execute("GRANT pg_write_all_data, pg_read_all_data TO goodput_test_writer")
    record(AuditAction.ACTION, message="kept", actor="system")
    now = timezone.now()
    incident = Incident.objects.create(
        title="x", severity=Severity.SEV3, group_key="x", started_at=now, detected_at=now
    )
    TimelineEntry.objects.create(incident=incident, kind=TimelineKind.STATE, actor_label="system", text="opened")
    conn = as_role("goodput_test_writer")

    for setting in SETTINGS:
        for statement in ("UPDATE compliance_auditentry SET message = 'x'", "DELETE FROM compliance_auditentry"):
            assert "compliance_auditentry is append-only" in refused(conn, statement, setting), (statement, setting)
        assert "append-only" in refused(conn, "DELETE FROM incidents_timelineentry WHERE id > 0", setting)
    assert "permission denied" in refused(conn, "TRUNCATE compliance_auditentry")
    assert AuditEntry.objects.filter(message="kept").exists()
    assert TimelineEntry.objects.filter(incident=incident).count() == 1


def test_the_console_works_as_the_app_role(db_roles: tuple[str, str]) -> None:
    """What the console does as it runs, as the app role: partitions made and dropped, retention
    (the purge and timeline functions), audited writes, the chain walked."""
    _, app = db_roles
    creds = {
        "USER": app,
        "PASSWORD": "",
        "HOST": connection.settings_dict["HOST"],
        "PORT": connection.settings_dict["PORT"],
    }
    day = timezone.now() + timedelta(days=40)
    with dbroles.connected_as(creds):
        partitions.forget_known_partitions()
        made = partitions.ensure_partitions(partitions.SAMPLES, day, day)
        assert made and made[0] in partitions.existing_partitions(partitions.SAMPLES)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            assert cursor.fetchone() == (app,)
            assert "must be owner" in _error(cursor, f'DROP TABLE "{made[0]}"')
            # Dropping goes through the owner's function, which counts what it dropped.
            cursor.execute("SELECT dropped_rows FROM goodput_drop_partition(%s)", [made[0]])
            assert cursor.fetchone() == (0,)
            assert made[0] not in partitions.existing_partitions(partitions.SAMPLES)
        runs = retention.run_retention(triggered_by="app-role test")
        assert {r.data_class for r in runs} >= {"audit", "incidents"}
        record(AuditAction.ACTION, message="as the app role", actor="system")
        assert audit_chain.verify_chain().ok
    partitions.forget_known_partitions()


def _error(cursor: Any, statement: str, params: list[Any] | None = None) -> str:
    """The error ``statement`` fails with, in a savepoint so the test's connection goes on."""
    try:
        with transaction.atomic():
            cursor.execute(statement, params)
    except DatabaseError as exc:
        return str(exc)
    return ""


def test_check_deploy_warns_about_a_superuser_or_an_owner_and_not_the_app_role(
    db_roles: tuple[str, str], as_role: Any
) -> None:
    owner, app = db_roles
    assert any("a superuser" in p for p in dbroles.connection_role_problems(as_role(admin_user()).cursor()))
    assert any(
        f"which owns compliance_auditentry (as {owner})" in p
        for p in dbroles.connection_role_problems(as_role(owner).cursor())
    )
    assert dbroles.connection_role_problems(as_role(app).cursor()) == []

    environment = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "DATABASE_URL": url(admin_user()),
        "DATABASE_OWNER_URL": url(owner),
        "REDIS_URL": "redis://redis.internal:6379/0",
        "SECRET_KEY": "x7Qm2-Lk9vRt4_Zp8Wc1Ys6Hn3Jd5Fb0Ge2Ua7Io4Pl9Kq1Mr6Nt8Sv3Xw5Yz0Ab",
        "ALLOWED_HOSTS": "goodput.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://goodput.example.com",
        "GOODPUT_BEHIND_PROXY": "true",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "goodput.W102" in result.stdout + result.stderr
    assert "a superuser" in result.stdout + result.stderr
    # The owner's URL in a serving process's environment is itself a warning (issue 37, item 3).
    assert "goodput.W101" in result.stdout + result.stderr
    assert "DATABASE_OWNER_URL is set in this process's environment" in result.stdout + result.stderr
    environment["DATABASE_URL"] = url(app)
    del environment["DATABASE_OWNER_URL"]
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert "goodput.W101" not in output and "goodput.W102" not in output, output
