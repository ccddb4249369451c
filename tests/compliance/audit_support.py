"""What the audit-log tests share: connections as each database role (set up by
`manage.py setup_database_roles`), a superuser's connection for tampering, and the chain walked
through `manage.py verify_audit_log`. The fixtures reach the tests through conftest.py."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from compliance.choices import AuditAction
from compliance.models import AuditChainCheck, AuditEntry
from compliance.services import audit_chain
from compliance.services.audit import record
from console import dbroles
from console.backup import libpq_params

# --- the roles --------------------------------------------------------------------------------


def params(user: str) -> dict[str, str]:
    """libpq parameters for the test database as ``user`` (local connections are trusted)."""
    base = libpq_params({**connection.settings_dict, "USER": user, "PASSWORD": ""})
    return {**base, "user": user}


def url(user: str) -> str:
    p = params(user)
    port = f":{p['port']}" if p.get("port") else ""
    return f"postgres://{quote(user, safe='')}@{quote(p.get('host', ''), safe='')}{port}/{quote(p['dbname'])}"


def admin_user() -> str:
    return (dbroles.admin_credentials() or dbroles.app_credentials())["USER"]


@pytest.fixture
def db_roles() -> tuple[str, str]:
    """(owner, app), set up on the test database by the command."""
    if dbroles.separate_roles():
        owner, app = dbroles.owner_credentials()["USER"], dbroles.app_credentials()["USER"]  # type: ignore[index]
    else:
        owner, app = "goodput_test_owner", "goodput_test_app"
    out = io.StringIO()
    call_command(
        "setup_database_roles", admin_url=url(admin_user()), owner_url=url(owner), app_url=url(app), stdout=out
    )
    assert f"owner={owner} app={app}" in out.getvalue()
    return owner, app


@pytest.fixture
def as_role() -> Iterator[Callable[[str], psycopg.Connection[Any]]]:
    opened: list[psycopg.Connection[Any]] = []

    def connect(user: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(**params(user), autocommit=True)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


# --- tampering and walking the chain ----------------------------------------------------------


@pytest.fixture
def superuser() -> Iterator[psycopg.Connection[Any]]:
    """A superuser's connection to the test database (autocommit)."""
    credentials = dbroles.admin_credentials() or dbroles.app_credentials()
    params = libpq_params({**connection.settings_dict, **credentials})
    with psycopg.connect(**params, autocommit=True) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (True,), (
            "tampering needs a superuser: the embedded server's, DATABASE_ADMIN_URL or a superuser DATABASE_URL"
        )
        yield conn


TRIGGERS = (("compliance_auditentry", "auditentry_append_only"), ("compliance_auditseal", "auditseal_append_only"))


def tamper(conn: psycopg.Connection[Any], *statements: str, params: tuple[Any, ...] = ()) -> None:
    """What a superuser can always do: switch the append-only triggers off, change the tables, and
    switch them back on."""
    with conn.transaction():
        for table, trigger in TRIGGERS:
            conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
        for statement in statements:
            conn.execute(statement, params)
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred check left on the tables
        for table, trigger in TRIGGERS:
            conn.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {trigger}")


def verify(*args: str) -> tuple[int, str]:
    """Run `manage.py verify_audit_log`: (exit status, stdout + stderr). It walks the chain in Python
    and has the owner's goodput_audit_verify walk and record it: the two must agree every time."""
    out = io.StringIO()
    try:
        call_command("verify_audit_log", *args, stdout=out, stderr=out)
    except SystemExit as exc:
        status = int(exc.code or 0)
    else:
        status = 0
    assert "disagrees" not in out.getvalue(), out.getvalue()
    if "--no-record" not in args:
        check = AuditChainCheck.objects.latest("pk")
        assert check.ok == (status == 0) and (check.problem in out.getvalue()), (check.problem, out.getvalue())
    return status, out.getvalue()


def three_entries() -> list[AuditEntry]:
    """Three entries, each committed on its own (autocommit), so each is sealed."""
    made = [record(AuditAction.ACTION, message=f"entry {i}", actor="system") for i in range(3)]
    for entry in made:
        entry.refresh_from_db()
    return made


def rewrite_consistently(conn: psycopg.Connection[Any], entry_id: int, message: str) -> None:
    """A superuser who knows the scheme: change an entry, then recompute its content hash and its
    chain hash so that the entry agrees with itself again."""
    tamper(conn, "UPDATE compliance_auditentry SET message = %s WHERE id = %s", params=(message, entry_id))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id::text, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), actor_id::text,"
            " actor, action, app_label, model, object_id, object_repr, before::text, after::text, message,"
            " host(remote_addr), prev_hash FROM compliance_auditentry JOIN compliance_auditseal ON entry_id = id"
            " WHERE id = %s",
            [entry_id],
        )
        *fields, prev_hash = cursor.fetchone()
    content_hash = audit_chain.sha256_hex(audit_chain.content_text(fields))
    tamper(
        conn,
        "UPDATE compliance_auditseal SET content_hash = %s, hash = %s WHERE entry_id = %s",
        params=(content_hash, audit_chain.chain_hash(prev_hash, content_hash), entry_id),
    )
