"""Serving endpoints and their raw metric series (vLLM, Triton, TGI), for the serving SLO work."""

from __future__ import annotations

from django.db import models

from fleet.choices import ServingFramework


class Endpoint(models.Model):
    site = models.ForeignKey("fleet.Site", on_delete=models.PROTECT, related_name="endpoints")
    name = models.CharField(max_length=200, help_text="Unique within the site, e.g. the served model name")
    framework = models.CharField(max_length=16, choices=ServingFramework.choices, default=ServingFramework.OTHER)
    model_name = models.CharField(max_length=200, blank=True)
    version = models.CharField(
        max_length=64, blank=True, help_text="The model version last reported (Triton's version label)"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="endpoint_unique_per_site")]

    def __str__(self) -> str:
        return f"{self.name} ({self.site})"


class ServingSample(models.Model):
    """One value of one serving series at one time: a gauge, a counter or a histogram bucket.

    (endpoint, metric, series, ts) is the table's primary key: a series is stored once per time,
    whichever batch key brings it. Counters and histogram buckets are stored cumulative, as
    exposed; rates and percentiles are taken from per-interval deltas at read time (a decrease
    is a server restart, as in rate()).
    Partitioned by day on ``ts``.
    """

    pk = models.CompositePrimaryKey("endpoint", "ts", "metric", "series")
    endpoint = models.ForeignKey("fleet.Endpoint", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    ts = models.DateTimeField()
    metric = models.CharField(max_length=200, help_text="Sample name as exposed, e.g. vllm:num_requests_running")
    # Text, not a bounded column: a cut label string would make two series collide silently. The
    # ingest door bounds each label value instead and names the one that is too long.
    series = models.TextField(help_text='Canonical labels, e.g. finished_reason="stop",le="0.5"')
    value = models.FloatField()

    class Meta:
        db_table = "fleet_servingsample"

    def __str__(self) -> str:
        return f"{self.metric}{{{self.series}}} {self.value}"
