from django.apps import AppConfig


class GoodputConfig(AppConfig):
    """Installed only so Django finds the shell's management commands (``demo``, ``create_agent_token``)."""

    name = "goodput"
    verbose_name = "Goodput"
