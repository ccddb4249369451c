from django.apps import AppConfig


class ComplianceConfig(AppConfig):
    name = "compliance"
    verbose_name = "Compliance"

    def ready(self) -> None:
        # The audit log's receivers (every create, change and delete of the audited models); what
        # compliance plugs into the other apps is in compliance/plugins.py.
        from compliance import signals

        signals.connect()
        # The console's own backups and restores, recorded in the recovery register.
        from compliance.services import recovery_console

        recovery_console.connect()
        # The audit floor reaches the database's purge function after each migrate (as the owner).
        from django.db.models.signals import post_migrate

        post_migrate.connect(_write_audit_floor, sender=self, dispatch_uid="compliance.audit_floor")


def _write_audit_floor(sender: AppConfig, using: str = "default", **kwargs: object) -> None:
    from compliance.services.audit import write_floor

    write_floor(using)
