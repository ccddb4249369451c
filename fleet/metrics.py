"""Fleet collectors for the console's /metrics: ingest rate and latency, scrape health, rollup lag."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db import connection
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from fleet.models import ScrapeTarget
from fleet.serving import rollups as serving_rollups
from fleet.telemetry.rollups import rollup_lag_seconds

RATE_WINDOW = timedelta(seconds=60)
LATENCY_WINDOW = timedelta(minutes=5)


def collect() -> Iterable[Metric]:
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT coalesce(sum(samples) FILTER (WHERE received_at >= %s), 0),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM received_at - enqueued_at)),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM received_at - enqueued_at)),
                   max(extract(epoch FROM received_at - enqueued_at))
            FROM fleet_ingestbatch WHERE received_at >= %s
            """,
            [now - RATE_WINDOW, now - LATENCY_WINDOW],
        )
        stored, p50, p95, worst = cursor.fetchone()
    rate = GaugeMetricFamily("goodput_ingest_samples_per_second", "Samples stored per second over the last minute")
    rate.add_metric([], float(stored) / RATE_WINDOW.total_seconds())
    yield rate
    latency = GaugeMetricFamily(
        "goodput_ingest_task_latency_seconds",
        "Time from the API accepting a batch to a worker committing it, over the last 5 minutes",
        labels=["quantile"],
    )
    for quantile, value in (("0.5", p50), ("0.95", p95), ("1", worst)):
        if value is not None:
            latency.add_metric([quantile], float(value))
    yield latency
    lag = GaugeMetricFamily("goodput_rollup_lag_seconds", "Age of the oldest minute not yet rolled up")
    lag.add_metric([], rollup_lag_seconds(now=now))
    yield lag
    serving_lag = GaugeMetricFamily(
        "goodput_serving_rollup_lag_seconds", "Age of the oldest serving minute not yet rolled up"
    )
    serving_lag.add_metric([], serving_rollups.rollup_lag_seconds(now=now))
    yield serving_lag

    up = GaugeMetricFamily("goodput_scrape_target_up", "1 if the last scrape succeeded", labels=["site", "target"])
    duration = GaugeMetricFamily(
        "goodput_scrape_duration_seconds", "Duration of the last scrape", labels=["site", "target"]
    )
    samples = GaugeMetricFamily("goodput_scrape_samples", "Samples in the last scrape", labels=["site", "target"])
    for target in ScrapeTarget.objects.select_related("site").filter(enabled=True):
        labels = [target.site.name, target.name]
        up.add_metric(labels, 1 if target.health == "up" else 0)
        if target.last_duration_ms is not None:
            duration.add_metric(labels, target.last_duration_ms / 1000)
        if target.last_samples is not None:
            samples.add_metric(labels, target.last_samples)
    yield from (up, duration, samples)
