"""Scraping /metrics URLs on a schedule, like Prometheus: claim due targets, fetch with a timeout,
parse and store through the same path as a push, and record health for the targets page."""

from __future__ import annotations

import logging
import time

import requests
from django.db import connection
from django.utils import timezone

from console import counters
from fleet.choices import ScrapeHealth
from fleet.models import ScrapeTarget
from fleet.services.ingest import IngestError
from fleet.services.prometheus import check_scope, parse_exposition, store_exposition

logger = logging.getLogger(__name__)

MAX_BODY = 20 * 1024 * 1024
USER_AGENT = "goodput-console/1 (+scrape)"


def claim_due_targets() -> list[int]:
    """Move each due target's next scrape forward and return their ids, in one statement: two
    schedulers running at once cannot both claim the same scrape."""
    with connection.cursor() as cursor:
        cursor.execute(
            # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
            "UPDATE fleet_scrapetarget SET next_scrape_at = clock_timestamp() + interval_seconds * interval '1 second' "
            "WHERE enabled AND next_scrape_at <= clock_timestamp() RETURNING id"
        )
        return [row[0] for row in cursor.fetchall()]


def scrape(target_id: int) -> int:
    """Scrape one target now; return the samples stored. Failures are recorded, not raised."""
    target = ScrapeTarget.objects.filter(pk=target_id).first()
    if target is None:
        return 0
    started = time.monotonic()
    scraped_at = timezone.now()
    stored, samples, error = 0, 0, ""
    try:
        response = requests.get(
            target.url,
            timeout=target.timeout_seconds,
            headers={"User-Agent": USER_AGENT, "Accept": "text/plain"},
            stream=True,
        )
        body = response.raw.read(MAX_BODY + 1, decode_content=True)
        if response.status_code != 200:
            raise IngestError(502, f"HTTP {response.status_code} from the target")
        if len(body) > MAX_BODY:
            raise IngestError(502, f"the target's body exceeds {MAX_BODY} bytes")
        exposition = parse_exposition(
            body.decode("utf-8", errors="replace"),
            hostname=target.hostname or None,
            endpoint=target.endpoint_name or None,
            kind=target.kind,
            now=scraped_at,
        )
        check_scope(exposition, site_id=target.site_id)
        samples = exposition.count
        stored = store_exposition(
            exposition,
            site_id=target.site_id,
            batch_key=f"{target.site_id}:scrape:{target.id}:{scraped_at.isoformat()}",
        )
    except requests.Timeout:
        error = f"timed out after {target.timeout_seconds:g} s"
    except requests.RequestException as exc:
        error = f"{exc.__class__.__name__}: {exc}"[:1000]
    except IngestError as exc:
        error = exc.message[:1000]
    duration_ms = (time.monotonic() - started) * 1000
    ScrapeTarget.objects.filter(pk=target.pk).update(
        last_scrape_at=scraped_at,
        last_duration_ms=duration_ms,
        last_samples=samples,
        last_error=error,
        health=ScrapeHealth.DOWN if error else ScrapeHealth.UP,
    )
    counters.increment("goodput_scrapes_total", result="error" if error else "ok")
    if error:
        logger.warning("scrape of %s failed: %s", target.url, error)
    return stored
