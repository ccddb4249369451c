"""`manage.py migrate`, as the owner role (console.dbroles): Django's migrate, connected with
DATABASE_OWNER_URL's credentials, then the app role's grants. Without DATABASE_OWNER_URL in
production, DATABASE_URL's role migrates, with a warning: it then owns the tables it runs against.
The embedded server's superuser first hands the owner whatever an older data directory left to it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands.migrate import Command as MigrateCommand
from django.db import DEFAULT_DB_ALIAS, connections

from console import dbroles

FALLBACK_WARNING = (
    "DATABASE_OWNER_URL is not set: migrating as DATABASE_URL's role, which then owns the tables the "
    "console runs against (and may disable the audit log's triggers). See docs/production.md."
)


class Command(MigrateCommand):
    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] != DEFAULT_DB_ALIAS:
            return super().handle(*args, **options)
        owner = dbroles.owner_credentials()
        if owner is None:
            self.stderr.write(self.style.WARNING(FALLBACK_WARNING))
            return super().handle(*args, **options)
        app = dbroles.app_credentials()["USER"]
        try:
            if settings.EMBEDDED_DATABASE and dbroles.admin_credentials():
                with dbroles.connected_as(dbroles.admin_credentials()), connections[DEFAULT_DB_ALIAS].cursor() as cur:
                    moved = dbroles.claim_database(cur, owner=owner["USER"], app=app)
                if moved and options["verbosity"]:
                    self.stdout.write(f"Handed {len(moved)} objects to {owner['USER']} (the owner role).")
            with dbroles.connected_as(owner):
                super().handle(*args, **options)
                if dbroles.separate_roles():
                    with connections[DEFAULT_DB_ALIAS].cursor() as cur:
                        dbroles.grant_app(cur, app)
        except dbroles.RoleError as exc:
            raise CommandError(str(exc)) from exc
