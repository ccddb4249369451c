"""The console's two database roles: the owner, which migrates, and the role the console runs as.

- **owner** (``DATABASE_OWNER_URL``): owns the tables, the triggers and the SECURITY DEFINER
  functions; ``manage.py migrate`` and ``flush`` connect as it. It is a member of the app role, so
  it may alter the tables the app role owns.
- **app** (``DATABASE_URL``): what every console process connects as. Not a superuser, owns
  nothing, may create nothing in the schema (CREATE there would let it plant a function or
  operator that one of the owner's SECURITY DEFINER functions resolves to, and so run as the
  owner). SELECT, INSERT, UPDATE, DELETE on the tables, but no UPDATE, DELETE or TRUNCATE on the
  append-only ones (the audit log, published summaries, incident timelines) and only SELECT on
  the audit settings, the seals and the chain checks. It makes and drops telemetry partitions
  through the owner's functions (fleet migration 0024), since PostgreSQL lets only a table's
  owner do either.
- **admin** (``DATABASE_ADMIN_URL``, a superuser or a role with CREATEROLE): used once, by
  ``manage.py setup_database_roles``, to create the two roles and hand them the database. The
  embedded PostgreSQL's superuser does this on its own at start-up and before each migrate.

Every SECURITY DEFINER function runs with ``search_path = pg_catalog, pg_temp`` and names every
table and function of ours with its schema (compliance migration 0009, fleet migration 0024), as
PostgreSQL's documentation for SECURITY DEFINER prescribes.

The functions here take a DB-API cursor (Django's or psycopg's), so the embedded server's start-up
(before Django is set up) and the management commands share them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

CREDENTIAL_KEYS = ("USER", "PASSWORD", "HOST", "PORT")

# Rows the console's role may add, never change, delete or empty.
APPEND_ONLY_TABLES = ("compliance_auditentry", "compliance_summaryversion", "incidents_timelineentry")
# Tables the console's role may only read (the audit chain's seals are written by the owner's
# function at commit).
# Tables the console's role may only read: the audit settings, and the chain's seals and checks,
# which only the owner's functions write ("hash chain verified" cannot be written by the console).
READ_ONLY_TABLES = ("goodput_audit_settings", "compliance_auditseal", "compliance_auditchaincheck")
# The owner's SECURITY DEFINER functions the console's role calls (EXECUTE is revoked from PUBLIC).
APP_FUNCTIONS = (
    "goodput_audit_purge(timestamp with time zone, text)",
    "goodput_audit_seal_pending()",
    "goodput_audit_verify(bigint[], text[], timestamp with time zone[], text)",
    "goodput_purge_incident_timeline(bigint[])",
    "goodput_create_partition(text, text, timestamp with time zone)",
    "goodput_drop_partition(text)",
)


class RoleError(Exception):
    """A role set-up that cannot be made safe (a superuser as the app role, a missing grant)."""


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    # standard_conforming_strings is on (the default since PostgreSQL 9.1): only quotes need doubling.
    return "'" + value.replace("'", "''") + "'"


def _one(cur: Any, query: str, params: list[Any] | None = None) -> Any:
    if params is None:
        cur.execute(query)
    else:
        cur.execute(query, params)
    return cur.fetchone()


def _all(cur: Any, query: str, params: list[Any] | None = None) -> list[Any]:
    if params is None:
        cur.execute(query)
    else:
        cur.execute(query, params)
    return list(cur.fetchall())


# --- credentials on the default connection ---------------------------------------------------


def app_credentials() -> dict[str, str]:
    from django.conf import settings

    return dict(settings.DATABASE_APP)


def owner_credentials() -> dict[str, str] | None:
    """The owner's credentials, or None where DATABASE_URL's role migrates too (no owner set)."""
    from django.conf import settings

    owner = getattr(settings, "DATABASE_OWNER", None)
    return dict(owner) if owner else None


def admin_credentials() -> dict[str, str] | None:
    from django.conf import settings

    admin = getattr(settings, "DATABASE_ADMIN", None)
    return dict(admin) if admin else None


def separate_roles() -> bool:
    owner = owner_credentials()
    return owner is not None and owner["USER"] != app_credentials()["USER"]


def use(credentials: Mapping[str, str] | None, alias: str = "default") -> None:
    """Put ``credentials`` on the connection ``alias``: it reconnects as that role (its pool too)."""
    from django.db import connections

    if not credentials:
        return
    connection = connections[alias]
    current = {key: connection.settings_dict.get(key) or "" for key in CREDENTIAL_KEYS}
    wanted = {key: credentials.get(key) or "" for key in CREDENTIAL_KEYS}
    if current == wanted:
        return
    connection.close()
    connection.close_pool()
    connection.settings_dict.update(wanted)


@contextlib.contextmanager
def connected_as(credentials: Mapping[str, str] | None, alias: str = "default") -> Iterator[None]:
    """Run the block with the connection ``alias`` signed in as ``credentials`` (None: unchanged)."""
    from django.db import connections

    if not credentials:
        yield
        return
    saved = {key: connections[alias].settings_dict.get(key) or "" for key in CREDENTIAL_KEYS}
    use(credentials, alias)
    try:
        yield
    finally:
        use(saved, alias)


# --- the cluster's roles (as the admin) ----------------------------------------------------------


def ensure_role(
    cur: Any, name: str, password: str | None = None, *, createdb: bool | None = None, update: bool = True
) -> bool:
    """Create the login role ``name`` (not a superuser), or bring an existing one to these
    attributes when ``update``; True when it was created. A superuser of that name is refused.
    ``createdb`` None leaves that attribute as it is (the embedded owner creates the test suite's
    databases; a production owner need not)."""
    row = _one(cur, "SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = %s", [name])
    if row is not None and row[0]:
        raise RoleError(f"The role {name!r} is a superuser; the console's two roles must not be. Name other roles.")
    attributes = "LOGIN NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"
    if createdb is not None:
        attributes += " CREATEDB" if createdb else " NOCREATEDB"
    if password:
        attributes += f" PASSWORD {literal(password)}"
    if row is None:
        cur.execute(f"CREATE ROLE {ident(name)} {attributes}")
        return True
    if update:
        cur.execute(f"ALTER ROLE {ident(name)} {attributes}")
    elif createdb is not None and row[1] != createdb:
        cur.execute(f"ALTER ROLE {ident(name)} {'CREATEDB' if createdb else 'NOCREATEDB'}")
    return False


def ensure_roles(
    cur: Any,
    *,
    owner: str,
    app: str,
    owner_password: str | None = None,
    app_password: str | None = None,
    owner_createdb: bool | None = None,
    update: bool = True,
) -> None:
    """Both roles, and the owner a member of the app role (never the other way round)."""
    if owner == app:
        raise RoleError("The owner and the console's role must be two roles (DATABASE_OWNER_URL, DATABASE_URL).")
    ensure_role(cur, owner, owner_password, createdb=owner_createdb, update=update)
    ensure_role(cur, app, app_password, createdb=False, update=update)
    if _one(cur, "SELECT pg_has_role(%s, %s, 'MEMBER')", [app, owner])[0]:
        cur.execute(f"REVOKE {ident(owner)} FROM {ident(app)}")
    if not _one(cur, "SELECT pg_has_role(%s, %s, 'MEMBER')", [owner, app])[0]:
        cur.execute(f"GRANT {ident(app)} TO {ident(owner)}")


def claim_database(cur: Any, *, owner: str, app: str) -> list[str]:
    """Connected to the console's database as the admin: make ``owner`` the owner of the database,
    its schema and every object in it that neither role owns (tables a superuser made before the
    roles existed), and take CREATE on the schema from everyone else; returns what changed."""
    database, schema = _one(cur, "SELECT current_database(), current_schema()")
    moved: list[str] = []
    if _one(cur, "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [database])[0] != owner:
        cur.execute(f"ALTER DATABASE {ident(database)} OWNER TO {ident(owner)}")
        moved.append(f"now owned by {owner}: database {database}")
    schema_owner = _one(cur, "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", [schema])[0]
    if schema_owner not in (owner, "pg_database_owner"):
        cur.execute(f"ALTER SCHEMA {ident(schema)} OWNER TO {ident(owner)}")
        moved.append(f"now owned by {owner}: schema {schema}")
    moved += revoke_create(cur, schema, ["PUBLIC", app])
    kinds = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE", "S": "SEQUENCE"}
    for name, kind in _all(
        cur,
        """
        SELECT c.relname, c.relkind FROM pg_class c
        WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)
          AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
          AND pg_get_userbyid(c.relowner) NOT IN (%s, %s)
          -- a sequence that belongs to a table changes hands with it
          AND NOT (c.relkind = 'S' AND EXISTS (
              SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.classid = 'pg_class'::regclass
                AND d.deptype IN ('a', 'i')))
          AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.objid = c.oid AND e.deptype = 'e')
        ORDER BY c.relkind, c.relname
        """,
        [schema, owner, app],
    ):
        cur.execute(f"ALTER {kinds[kind]} {ident(schema)}.{ident(name)} OWNER TO {ident(owner)}")
        moved.append(f"now owned by {owner}: {kinds[kind].lower()} {name}")
    for (signature,) in _all(
        cur,
        """
        SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s) AND p.prokind IN ('f', 'p')
          AND pg_get_userbyid(p.proowner) NOT IN (%s, %s)
          AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.objid = p.oid AND e.deptype = 'e')
        ORDER BY 1
        """,
        [schema, owner, app],
    ):
        cur.execute(f"ALTER ROUTINE {signature} OWNER TO {ident(owner)}")
        moved.append(f"now owned by {owner}: function {signature}")
    return moved


# --- the app role's grants (as the owner, after each migrate) -----------------------------------


def create_grantees(cur: Any, schema: str) -> list[str]:
    """Who holds CREATE on ``schema`` by a grant of its own ('PUBLIC' for everyone), the schema's
    owner aside."""
    return [
        name
        for (name,) in _all(
            cur,
            """
            SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
            FROM pg_namespace n, aclexplode(n.nspacl) a
            WHERE n.nspname = %s AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
            ORDER BY 1
            """,
            [schema],
        )
    ]


def revoke_create(cur: Any, schema: str, roles: list[str]) -> list[str]:
    """Revoke CREATE on ``schema`` from each of ``roles`` ('PUBLIC' included) that holds it; return
    what was revoked, so a second run says nothing."""
    holders = set(create_grantees(cur, schema))
    revoked = []
    for role in roles:
        if role in holders:
            grantee = "PUBLIC" if role == "PUBLIC" else ident(role)
            cur.execute(f"REVOKE CREATE ON SCHEMA {ident(schema)} FROM {grantee}")
            revoked.append(f"CREATE on schema {schema} revoked from {role}")
    return revoked


def grant_app(cur: Any, app: str) -> list[str]:
    """Connected as the owner: give ``app`` what the console needs and nothing that rewrites the
    record or runs as the owner. Idempotent; run after every migrate, since a migration may add
    tables. Returns what it changed beyond the routine grants (taken back, revoked)."""
    database, schema, me = _one(cur, "SELECT current_database(), current_schema(), current_user")
    strangers = _all(
        cur,
        """
        SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c
        WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)
          AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND pg_get_userbyid(c.relowner) NOT IN (%s, %s)
        ORDER BY 1 LIMIT 5
        """,
        [schema, me, app],
    )
    if strangers:
        names = ", ".join(f"{name} (owned by {who})" for name, who in strangers)
        raise RoleError(
            f"Tables in {database} belong to neither {me} nor {app}: {names}. "
            "Run `manage.py setup_database_roles` with DATABASE_ADMIN_URL to hand them to the owner."
        )
    changed = revoke_create(cur, schema, ["PUBLIC", app])
    app_owned = _all(
        cur,
        """
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s) AND c.relkind IN ('r', 'p')
          AND pg_get_userbyid(c.relowner) = %s
        ORDER BY c.relkind, c.relname
        """,
        [schema, app],
    )
    if app_owned and not _one(cur, "SELECT pg_has_role(current_user, %s, 'MEMBER')", [app])[0]:
        raise RoleError(
            f"{me} is not a member of {app}, so it cannot take back the tables {app} owns: "
            "run `manage.py setup_database_roles` with DATABASE_ADMIN_URL."
        )
    # Older versions handed the partitioned tables to the console's role: the owner takes them back
    # (partitions are now made and dropped by its functions, fleet migration 0024).
    for (name,) in app_owned:
        cur.execute(f"ALTER TABLE {ident(schema)}.{ident(name)} OWNER TO {ident(me)}")
    if app_owned:
        changed.append(f"{len(app_owned)} tables taken back from {app}")
    cur.execute(f"GRANT CONNECT, TEMPORARY ON DATABASE {ident(database)} TO {ident(app)}")
    cur.execute(f"GRANT USAGE ON SCHEMA {ident(schema)} TO {ident(app)}")
    cur.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {ident(schema)} TO {ident(app)}")
    cur.execute(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {ident(schema)} TO {ident(app)}")
    # Partitions the owner's function makes from now on get the same grants.
    cur.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {ident(schema)} "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {ident(app)}"
    )
    for table in APPEND_ONLY_TABLES:
        if _one(cur, "SELECT to_regclass(%s)", [table])[0]:
            cur.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON {ident(table)} FROM {ident(app)}, PUBLIC")
    for table in READ_ONLY_TABLES:
        if _one(cur, "SELECT to_regclass(%s)", [table])[0]:
            cur.execute(f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {ident(table)} FROM {ident(app)}, PUBLIC")
    for function in APP_FUNCTIONS:
        if _one(cur, "SELECT to_regprocedure(%s)", [function])[0]:
            cur.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
            cur.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {ident(app)}")
    return changed


# --- what a connection is ---------------------------------------------------------------------


def connection_role_problems(cur: Any) -> list[str]:
    """Why the role of this connection should not be the console's (empty: it is fit): a
    superuser, the audit log's owner or a member of it, UPDATE/DELETE/TRUNCATE on an
    append-only table."""
    me, superuser = _one(cur, "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
    problems = []
    if superuser:
        problems.append(f"the console connects as {me}, a superuser: every trigger is advisory to it")
    for (schema,) in _all(
        cur,
        """
        SELECT n.nspname FROM pg_namespace n
        WHERE has_schema_privilege(current_user, n.oid, 'CREATE')
          AND n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'
        ORDER BY 1
        """,
    ):
        if not superuser:
            problems.append(
                f"the console's role {me} may CREATE in schema {schema}: a function or operator it plants "
                "there can run as the owner inside a SECURITY DEFINER function"
            )
    for table in APPEND_ONLY_TABLES:
        row = _one(
            cur,
            """
            SELECT pg_get_userbyid(c.relowner), pg_has_role(current_user, c.relowner, 'USAGE'),
                   has_table_privilege(c.oid, 'UPDATE') OR has_table_privilege(c.oid, 'DELETE')
                   OR has_table_privilege(c.oid, 'TRUNCATE')
            FROM pg_class c WHERE c.oid = to_regclass(%s)
            """,
            [table],
        )
        if row is None or superuser:
            continue
        owner, owns, rewrites = row
        if owns:
            problems.append(
                f"the console connects as {me}, which owns {table} (as {owner}) and may disable its triggers"
            )
        elif rewrites:
            problems.append(f"the console's role {me} may UPDATE, DELETE or TRUNCATE {table}")
    return problems
