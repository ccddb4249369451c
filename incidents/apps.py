from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    """The incidents app; what it plugs into the console is in incidents/plugins.py."""

    name = "incidents"
    verbose_name = "Incidents"
