"""The append-only audit log: who changed what, when, with the object before and after.

Entries are written by compliance.services.audit (signals on the audited models, plus explicit
calls for exports and actions). A database trigger (migration 0002) refuses UPDATE and DELETE on
the table unless the retention task itself purges entries past the audit policy (it sets the
transaction-local ``goodput.audit_purge``), so neither the app, the API, the admin nor a plain ORM
call can change or remove one.

The actor is kept by name and id, not as a foreign key: deleting a user must not have to touch
(and so be refused by) the entries that name them.
"""

from __future__ import annotations

from django.db import models

from compliance.choices import AuditAction


class AuditEntry(models.Model):
    at = models.DateTimeField(db_index=True)
    actor_id = models.IntegerField(null=True, blank=True, help_text="The user's id, when a person acted")
    actor = models.CharField(max_length=200, help_text="User name, token name, or 'system'")
    action = models.CharField(max_length=8, choices=AuditAction.choices)
    app_label = models.CharField(max_length=100)
    model = models.CharField(max_length=100)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=300, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    message = models.CharField(max_length=500, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["app_label", "model", "object_id"], name="auditentry_object"),
            models.Index(fields=["actor", "-at"], name="auditentry_actor_at"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.app_label}.{self.model} {self.object_id}"
