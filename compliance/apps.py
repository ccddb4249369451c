from django.apps import AppConfig


class ComplianceConfig(AppConfig):
    name = "compliance"
    verbose_name = "Compliance"

    def ready(self) -> None:
        # The audit log's receivers: every create, change and delete of the audited models.
        from compliance import overview, signals

        signals.connect()
        overview.register()
