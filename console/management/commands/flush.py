"""`manage.py flush`, as the owner role: the console's role may not TRUNCATE the audit log (the test
suite's transactional tests flush through this after each test)."""

from __future__ import annotations

from typing import Any

from django.core.management.commands.flush import Command as FlushCommand
from django.db import DEFAULT_DB_ALIAS

from console import dbroles


class Command(FlushCommand):
    def handle(self, **options: Any) -> None:
        owner = dbroles.owner_credentials() if options["database"] == DEFAULT_DB_ALIAS else None
        with dbroles.connected_as(owner):
            super().handle(**options)
