from django.apps import AppConfig


class FleetConfig(AppConfig):
    """The fleet app. Its rooms plug into each other and into console and incidents from their own
    plugins.py (console.extension_points), not from here."""

    name = "fleet"
    verbose_name = "Fleet"
