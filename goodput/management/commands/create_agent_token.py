from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.models import AgentToken


class Command(BaseCommand):
    help = "Issue an agent token scoped to one site. The token is printed once; only its hash is stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--site", required=True, help="Site name (see the admin or /api/v1/fleet/sites/)")
        parser.add_argument("--name", default="agent", help="A label for the token, e.g. the host or exporter")
        parser.add_argument("--create-site", action="store_true", help="Create the site if it does not exist")

    def handle(self, *args: Any, **options: Any) -> None:
        from fleet.models import Site

        name = options["site"]
        if options["create_site"]:
            site, _ = Site.objects.get_or_create(name=name)
        else:
            site = Site.objects.filter(name=name).first()
            if site is None:
                known = ", ".join(Site.objects.values_list("name", flat=True)[:20]) or "none yet"
                raise CommandError(f"No site named {name!r} (known: {known}). Use --create-site to make it.")
        token, plain = AgentToken.issue(site=site, name=options["name"])
        self.stderr.write(f"Token {token.name!r} for site {site.name} (id gp_{token.key_id}). Shown once:")
        self.stdout.write(plain)
