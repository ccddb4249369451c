"""Published training-content summaries: frozen snapshots, never edited.

The draft of a summary is not stored: it is built from the register each time it is shown
(compliance.services.summary). Publishing stores the built document and its rendered text with
the text's SHA-256; a database trigger (migration 0002) refuses UPDATE and DELETE on the table,
so neither the app, the API, the admin nor a plain ORM call can change a published version. A
later change to the register is published as the next version.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models

from compliance.models.register import GpaiModel


class SummaryVersion(models.Model):
    model = models.ForeignKey(GpaiModel, on_delete=models.PROTECT, related_name="summaries")
    version = models.PositiveIntegerField()
    document = models.JSONField(help_text="The summary's sections as built from the register")
    text = models.TextField(help_text="The rendered Markdown the hash is taken of")
    sha256 = models.CharField(max_length=64)
    last_update = models.DateField()
    published_at = models.DateTimeField(auto_now_add=True)
    # PROTECT, not SET_NULL: nulling the column would be an UPDATE the trigger refuses. A person who
    # published a summary is deactivated, not deleted, and stays named on what they published.
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["model", "-version"]
        constraints = [models.UniqueConstraint(fields=["model", "version"], name="summaryversion_unique")]

    def __str__(self) -> str:
        return f"{self.model} summary v{self.version}"

    def verify(self) -> bool:
        """The stored text still hashes to the stored sum."""
        return hashlib.sha256(self.text.encode()).hexdigest() == self.sha256
