"""`manage.py setup_database_roles`: create the owner and app roles and hand them the database.

Connects as an admin (``--admin-url`` or DATABASE_ADMIN_URL: a superuser, or a role with
CREATEROLE that owns the database), then, idempotently:

1. creates the owner (DATABASE_OWNER_URL's user) and the app role (DATABASE_URL's user) as login
   roles that are not superusers, with the URLs' passwords, the owner a member of the app role;
2. makes the owner the owner of the database, its schema and every table, sequence and function
   in it that neither role owns (a deployment that ran as a superuser until now), and revokes
   CREATE on the schema from PUBLIC and the app role (each line it prints says what changed);
3. as the owner, takes back what the app role owns and grants it what the console needs
   (console.dbroles.grant_app): DML on the tables, none that rewrites the audit log, published
   summaries or incident timelines, EXECUTE on the owner's functions, nothing it could create.

Run it once before the first `manage.py migrate`, and again whenever the roles or passwords change.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console import dbroles
from console.backup import libpq_params, params_from_url

# Runs of the whole set-up when PostgreSQL refuses a grant made at the same moment as another's.
ATTEMPTS = 3


def _params(url: str | None, fallback: dict[str, str] | None, what: str) -> dict[str, str]:
    if url:
        try:
            return params_from_url(url)
        except ValueError as exc:
            raise CommandError(f"{what}: {exc}") from exc
    if not fallback:
        raise CommandError(f"{what} is not set.")
    return libpq_params({**settings.DATABASES["default"], **fallback})


class Command(BaseCommand):
    help = "Create the database owner and app roles and grant them (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-url", help="A superuser (or CREATEROLE) role; default DATABASE_ADMIN_URL")
        parser.add_argument("--owner-url", help="The owner role's URL; default DATABASE_OWNER_URL")
        parser.add_argument("--app-url", help="The console's role's URL; default DATABASE_URL")

    def handle(self, *args: Any, **options: Any) -> None:
        admin = _params(options["admin_url"], dbroles.admin_credentials(), "DATABASE_ADMIN_URL (or --admin-url)")
        owner = _params(options["owner_url"], dbroles.owner_credentials(), "DATABASE_OWNER_URL (or --owner-url)")
        app = _params(options["app_url"], dbroles.app_credentials(), "DATABASE_URL (or --app-url)")
        database = app["dbname"]
        if owner.get("dbname", database) != database:
            raise CommandError("DATABASE_OWNER_URL and DATABASE_URL must name the same database.")
        for attempt in range(1, ATTEMPTS + 1):
            try:
                moved = self._set_up(admin, owner, app, database)
                break
            except dbroles.RoleError as exc:
                raise CommandError(str(exc)) from exc
            except psycopg.errors.InternalError_ as exc:
                # Another session granting on the same role or object at the same moment (two
                # processes starting together): PostgreSQL refuses one with "tuple concurrently
                # updated". Every step is idempotent, so the whole set-up is simply run again.
                if "concurrently updated" not in str(exc) or attempt == ATTEMPTS:
                    raise CommandError(f"setting up the roles failed: {exc}") from exc
                time.sleep(0.2 * attempt)
            except psycopg.Error as exc:
                raise CommandError(f"setting up the roles failed: {exc}") from exc
        for item in moved:
            self.stdout.write(f"  {item}")
        self.stdout.write(f"RESULT database={database} owner={owner['user']} app={app['user']} changes={len(moved)}")

    def _set_up(self, admin: dict[str, Any], owner: dict[str, Any], app: dict[str, Any], database: str) -> list[str]:
        """The roles made and granted, as the admin then as the owner; what changed."""
        with psycopg.connect(**{**admin, "dbname": database}, autocommit=True) as conn:
            cur = conn.cursor()
            dbroles.ensure_roles(
                cur,
                owner=owner["user"],
                app=app["user"],
                owner_password=owner.get("password"),
                app_password=app.get("password"),
            )
            moved = dbroles.claim_database(cur, owner=owner["user"], app=app["user"])
        with psycopg.connect(**{**owner, "dbname": database}, autocommit=True) as conn:
            moved += dbroles.grant_app(conn.cursor(), app["user"])
        return moved
