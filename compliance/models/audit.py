"""The append-only audit log: who changed what, when, with the object before and after.

Entries are written by compliance.services.audit (signals on the audited models, plus explicit
calls for exports, actions and sign-ins). The database keeps them (migrations 0002 and 0006):

- the console's role has no UPDATE, DELETE or TRUNCATE on the table (``manage.py
  setup_database_roles``), and a trigger refuses UPDATE and DELETE to every other role too;
- entries are deleted only by ``goodput_audit_purge()``, a SECURITY DEFINER function of the
  owner role (SET search_path = pg_catalog, pg_temp, every name schema-qualified: migration
  0009) that deletes nothing younger than the audit floor and writes its own entry;
- each entry is sealed when its transaction commits, by the database, with an ``AuditSeal``:
  ``seq`` numbers the entries in commit order, ``content_hash`` is the SHA-256 of the entry's
  content and ``hash`` the SHA-256 of ``prev_hash`` (the entry before's ``hash``) followed by
  ``content_hash``. ``manage.py verify_audit_log`` walks the chain; an edit, a removal or an
  unsealed entry names the first entry that does not match.

The actor is kept by name and id, not as a foreign key: deleting a user must not have to touch
(and so be refused by) the entries that name them.
"""

from __future__ import annotations

from django.db import models

from compliance.choices import AuditAction

# The hash before the first entry: 64 zeros.
GENESIS_HASH = "0" * 64


class AuditEntry(models.Model):
    at = models.DateTimeField(db_index=True)
    actor_id = models.IntegerField(null=True, blank=True, help_text="The user's id, when a person acted")
    actor = models.CharField(max_length=200, help_text="User name, token name, or 'system'")
    action = models.CharField(max_length=16, choices=AuditAction.choices)
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


class AuditSeal(models.Model):
    """An entry's place in the hash chain, written by the database (``goodput_audit_seal_entry``)
    when the entry's transaction commits; never by the app, never changed. A row of its own rather
    than columns of the entry, so that the entry is never updated, not even to seal it."""

    # No foreign key in the database: a seal checked per row at commit doubled the cost of sealing,
    # and verify_audit_log names a seal whose entry is gone.
    entry = models.OneToOneField(
        AuditEntry, primary_key=True, on_delete=models.DO_NOTHING, related_name="seal", db_constraint=False
    )
    seq = models.BigIntegerField(unique=True, help_text="Place in the chain, in commit order")
    content_hash = models.CharField(max_length=64, help_text="SHA-256 of the entry's content")
    prev_hash = models.CharField(max_length=64, help_text="The hash of the entry before (64 zeros for the first)")
    hash = models.CharField(max_length=64, help_text="SHA-256 of prev_hash followed by content_hash")

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"seal {self.seq} of entry {self.entry_id}"


class AuditChainCheck(models.Model):
    """One walk of the audit chain (``manage.py verify_audit_log`` or the daily task)."""

    checked_at = models.DateTimeField(db_index=True)
    ok = models.BooleanField()
    entries = models.BigIntegerField(help_text="Entries walked")
    head_seq = models.BigIntegerField(null=True, blank=True)
    head_hash = models.CharField(max_length=64, blank=True)
    problem = models.CharField(max_length=500, blank=True, help_text="The first entry that did not match, and how")
    first_bad_entry = models.BigIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    triggered_by = models.CharField(max_length=100)

    class Meta:
        ordering = ["-checked_at", "-pk"]

    def __str__(self) -> str:
        return f"audit chain {'intact' if self.ok else 'BROKEN'} at {self.checked_at:%Y-%m-%d %H:%M}"
