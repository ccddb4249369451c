"""Scrape targets: /metrics URLs (dcgm-exporter, vLLM, Triton, TGI) the console pulls on a schedule."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator, URLValidator
from django.db import models
from django.utils import timezone

from console.outbound import validate_url
from fleet.choices import ScrapeHealth, ScrapeKind


class ScrapeTargetQuerySet(models.QuerySet["ScrapeTarget"]):
    def due(self) -> ScrapeTargetQuerySet:
        return self.filter(enabled=True, next_scrape_at__lte=timezone.now())


class ScrapeTarget(models.Model):
    site = models.ForeignKey("fleet.Site", on_delete=models.CASCADE, related_name="scrape_targets")
    name = models.CharField(max_length=100)
    url = models.CharField(max_length=500, validators=[URLValidator(schemes=["http", "https"]), validate_url])
    kind = models.CharField(max_length=16, choices=ScrapeKind.choices, default=ScrapeKind.AUTO)
    endpoint_name = models.CharField(
        max_length=200, blank=True, help_text="Serving endpoint to file metrics under (default: the model label)"
    )
    hostname = models.CharField(max_length=253, blank=True, help_text="Host for GPU metrics without a hostname label")
    interval_seconds = models.PositiveIntegerField(
        default=15, validators=[MinValueValidator(5), MaxValueValidator(3600)]
    )
    timeout_seconds = models.FloatField(default=5, validators=[MinValueValidator(0.5), MaxValueValidator(60)])
    enabled = models.BooleanField(default=True)
    next_scrape_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_scrape_at = models.DateTimeField(null=True, blank=True)
    last_duration_ms = models.FloatField(null=True, blank=True)
    last_samples = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    health = models.CharField(max_length=8, choices=ScrapeHealth.choices, default=ScrapeHealth.UNKNOWN)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ScrapeTargetQuerySet.as_manager()

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="scrapetarget_unique_per_site")]

    def __str__(self) -> str:
        return f"{self.name} ({self.url})"
