"""Serving endpoints and their raw metric series (vLLM, Triton, TGI), for the serving SLO work."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from fleet.choices import ServingFramework


def validate_slo_target_pct(value: float) -> None:
    """An SLO target is a percentage strictly inside (0, 100): 100 % leaves no error budget to burn."""
    if not math.isfinite(value) or not 0 < value < 100:
        raise ValidationError("Must be a percentage strictly between 0 and 100, e.g. 99.9.")


def validate_positive_ms(value: float) -> None:
    """A latency threshold is a finite number of milliseconds above zero."""
    if not math.isfinite(value) or value <= 0:
        raise ValidationError("Must be a number of milliseconds greater than 0.")


class Endpoint(models.Model):
    site = models.ForeignKey("fleet.Site", on_delete=models.PROTECT, related_name="endpoints")
    name = models.CharField(max_length=200, help_text="Unique within the site, e.g. the served model name")
    framework = models.CharField(max_length=16, choices=ServingFramework.choices, default=ServingFramework.OTHER)
    model_name = models.CharField(max_length=200, blank=True)
    version = models.CharField(
        max_length=64, blank=True, help_text="The model version last reported (Triton's version label)"
    )
    region = models.CharField(max_length=64, blank=True)
    replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(100_000)])
    gpus = models.ManyToManyField("fleet.Gpu", blank=True, related_name="serving_endpoints")
    scrape_targets = models.ManyToManyField("fleet.ScrapeTarget", blank=True, related_name="serving_endpoints")
    # SLOs, as an SRE states them ("99 % of requests get a first token within 500 ms"). Targets are
    # percentages here and in the API; fleet.serving.metrics takes fractions (pct / 100).
    ttft_threshold_ms = models.FloatField(default=500, validators=[validate_positive_ms])
    ttft_target_pct = models.FloatField(default=99.0, validators=[validate_slo_target_pct])
    itl_threshold_ms = models.FloatField(default=50, validators=[validate_positive_ms])
    itl_target_pct = models.FloatField(default=99.0, validators=[validate_slo_target_pct])
    availability_target_pct = models.FloatField(default=99.9, validators=[validate_slo_target_pct])
    slo_window_days = models.PositiveSmallIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(90)]
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["site", "name"], name="endpoint_unique_per_site"),
            # The validators' rules again, so a write that skips them (a bulk update) cannot store
            # an SLO the burn-rate arithmetic divides by zero on.
            models.CheckConstraint(
                condition=Q(ttft_target_pct__gt=0, ttft_target_pct__lt=100)
                & Q(itl_target_pct__gt=0, itl_target_pct__lt=100)
                & Q(availability_target_pct__gt=0, availability_target_pct__lt=100),
                name="endpoint_slo_targets_inside_0_100",
            ),
            models.CheckConstraint(
                condition=Q(ttft_threshold_ms__gt=0, itl_threshold_ms__gt=0), name="endpoint_slo_thresholds_positive"
            ),
            models.CheckConstraint(
                condition=Q(slo_window_days__gte=1, slo_window_days__lte=90), name="endpoint_slo_window_1_90_days"
            ),
            models.CheckConstraint(condition=Q(replicas__gte=1), name="endpoint_replicas_positive"),
        ]

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


class EndpointChangeKind(models.TextChoices):
    MODEL = "model", "Model"
    QUANTISATION = "quantisation", "Quantisation"
    KERNEL = "kernel", "Kernel"
    FRAMEWORK = "framework", "Framework version"
    CONFIG = "config", "Configuration"
    SCALE_OUT = "scale_out", "Scale-out"
    REPLICA_LOAD = "replica_load", "Replica load"


class EndpointChange(models.Model):
    """Something changed on an endpoint (model, quantisation, kernel, framework, config): the event
    the quality-regression detector compares evals before and after."""

    endpoint = models.ForeignKey("fleet.Endpoint", on_delete=models.CASCADE, related_name="changes")
    client_id = models.CharField(
        max_length=128, blank=True, help_text="The sender's id for the change (a retry with it is skipped)"
    )
    ts = models.DateTimeField(help_text="When the change took effect")
    kind = models.CharField(max_length=16, choices=EndpointChangeKind.choices)
    from_value = models.CharField(max_length=200, blank=True)
    to_value = models.CharField(max_length=200, blank=True)
    model_version = models.CharField(max_length=64, blank=True, help_text="The model version after the change")
    ready_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Scale-out or replica load: when the new capacity was ready to serve (load-to-ready = ready_at - ts)",
    )
    note = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["endpoint", "ts", "pk"]
        indexes = [models.Index(fields=["endpoint", "ts"], name="endpointchange_endpoint_ts")]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "client_id"], condition=~Q(client_id=""), name="endpointchange_client_id_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id} {self.kind} {self.from_value} -> {self.to_value} at {self.ts:%Y-%m-%d %H:%M}"


class EndpointEval(models.Model):
    """One eval result of an endpoint (suite, metric, score) at a model version."""

    endpoint = models.ForeignKey("fleet.Endpoint", on_delete=models.CASCADE, related_name="evals")
    client_id = models.CharField(
        max_length=128, blank=True, help_text="The sender's id for the result (a retry with it is skipped)"
    )
    ts = models.DateTimeField(help_text="When the eval ran")
    suite = models.CharField(max_length=100)
    metric = models.CharField(max_length=100)
    score = models.FloatField()
    model_version = models.CharField(max_length=64, blank=True)
    higher_is_better = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["endpoint", "ts", "pk"]
        indexes = [models.Index(fields=["endpoint", "suite", "metric", "ts"], name="endpointeval_series_ts")]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "client_id"], condition=~Q(client_id=""), name="endpointeval_client_id_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id} {self.suite}/{self.metric} = {self.score} at {self.ts:%Y-%m-%d %H:%M}"


class ServingRollupColumns(models.Model):
    """One quantity of one endpoint over a bucket (fleet.serving.rollups).

    ``quantity`` is a name of fleet.serving.metrics: a histogram's per-bucket increase is
    stored under its name with ``le`` the bucket's upper bound (non-cumulative, zero buckets left
    out), its count and sum under ``<name>:count`` and ``<name>:sum``; a counter's increase under
    its name; a gauge's mean under its name and its maximum under ``<name>:max``. ``le`` is 0 for
    everything but histogram buckets.
    """

    endpoint = models.ForeignKey("fleet.Endpoint", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    bucket = models.DateTimeField()
    quantity = models.CharField(max_length=40)
    le = models.FloatField()
    value = models.FloatField()

    class Meta:
        abstract = True


class ServingRollup1m(ServingRollupColumns):
    pk = models.CompositePrimaryKey("endpoint", "bucket", "quantity", "le")

    class Meta:
        db_table = "fleet_servingrollup_1m"

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} {self.bucket:%Y-%m-%d %H:%M} {self.quantity} {self.le} {self.value}"


class ServingRollup1h(ServingRollupColumns):
    pk = models.CompositePrimaryKey("endpoint", "bucket", "quantity", "le")

    class Meta:
        db_table = "fleet_servingrollup_1h"

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} {self.bucket:%Y-%m-%d %H:00} {self.quantity} {self.le} {self.value}"


class ServingRollupDirty(models.Model):
    """Endpoint minutes and hours whose serving rollups must be (re)computed: written by the
    serving writer, claimed by the rollup task (the GPU rollups' queue, per endpoint)."""

    pk = models.CompositePrimaryKey("endpoint", "resolution", "bucket")
    endpoint = models.ForeignKey("fleet.Endpoint", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    resolution = models.CharField(max_length=2)  # 1m or 1h
    bucket = models.DateTimeField()
    dirtied_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["resolution", "bucket"], name="servingdirty_res_bucket")]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} {self.resolution} {self.bucket:%Y-%m-%d %H:%M}"
