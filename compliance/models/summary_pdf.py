"""A published summary's PDF, rendered once, by a worker, and then served as stored.

A summary over a large crawl runs to hundreds of pages and takes half a minute to render, so the
PDF is not rendered per download on the web process: publishing queues its rendering
(compliance.summary.tasks), and the export serves these bytes. Like the version it renders, the
row is frozen: the trigger of migration 0002 refuses UPDATE and DELETE on the table, so the PDF a
reader downloads is the one rendered when the version was published, with its SHA-256.
"""

from __future__ import annotations

from django.db import models

from compliance.models.summary import SummaryVersion


class SummaryPdf(models.Model):
    summary = models.OneToOneField(SummaryVersion, on_delete=models.PROTECT, primary_key=True, related_name="pdf")
    content = models.BinaryField()
    sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    render_ms = models.PositiveIntegerField(help_text="How long the worker took to render it")
    rendered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "summary PDF"

    def __str__(self) -> str:
        return f"PDF of {self.summary_id}"
