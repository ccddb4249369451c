from django.apps import AppConfig


class ComplianceConfig(AppConfig):
    name = "compliance"
    verbose_name = "Compliance"

    def ready(self) -> None:
        # signals: the audit log's receivers (every create, change and delete of the audited models);
        # detectors: importing it registers the recovery detectors with the incident engine.
        from compliance import detectors, overview, signals  # noqa: F401

        signals.connect()
        overview.register()
        # The console's own backups and restores, recorded in the recovery register.
        from compliance.services import recovery_console

        recovery_console.connect()
        # Velero's backup metrics pushed to the Prometheus door become backup reports.
        from compliance.services import velero

        velero.register_hook()
        # The audit floor reaches the database's purge function after each migrate (as the owner).
        from django.db.models.signals import post_migrate

        post_migrate.connect(_write_audit_floor, sender=self, dispatch_uid="compliance.audit_floor")


def _write_audit_floor(sender: AppConfig, using: str = "default", **kwargs: object) -> None:
    from compliance.services.audit import write_floor

    write_floor(using)
