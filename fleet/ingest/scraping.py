"""Scraping /metrics URLs on a schedule, like Prometheus: claim due targets, fetch with a timeout,
parse and store through the same path as a push, and record health for the targets page.

A scrape target is a URL an Operator chose, fetched from inside the console's network, so the
fetch must not become a way to probe that network:

1. Only addresses in ``OUTBOUND_ALLOWED_NETWORKS`` are scraped, checked when a target is saved
   and again when each scrape connects (console.outbound).
2. Redirects are not followed, and a failure shows people one of two words: ``unreachable``
   (refused, filtered, timed out, not HTTP, TLS, any status but 200, a redirect) or ``not a
   Prometheus exposition`` (a 200 whose body could not be stored). Telling those apart is what
   a port scanner needs; the detail goes to the server log, and never quotes what answered.
   Two refinements tell nothing about the far end: an address outside the allow-list (decided
   before any packet) names the setting, and an exposition without a model or hostname label
   names this target's field that would supply it. A failed scrape records no duration either
   (a timeout would show as one).
"""

from __future__ import annotations

import logging
import re
import time

import requests
import urllib3
from django.db import connection
from django.utils import timezone

from console import counters, outbound
from fleet import exporters
from fleet.choices import ScrapeHealth
from fleet.ingest.prometheus import check_scope, parse_exposition, store_exposition
from fleet.telemetry.models import ScrapeTarget
from fleet.validation import IngestError

logger = logging.getLogger(__name__)

MAX_BODY = 20 * 1024 * 1024
USER_AGENT = "goodput-console/1 (+scrape)"


# What a failed scrape shows on the targets page, in the API and in its finding.
UNREACHABLE = "unreachable"
NOT_AN_EXPOSITION = "not a Prometheus exposition"
OUTSIDE_THE_ALLOWED_NETWORKS = f"unreachable (outside {outbound.SETTING_NAME})"


class ScrapeFailed(Exception):
    """A scrape that failed before its body was parsed: ``shown`` for people, the message (which
    quotes nothing the target sent) for the server log."""

    def __init__(self, detail: str, *, shown: str = UNREACHABLE) -> None:
        super().__init__(detail)
        self.shown = shown


# --- errors that never quote the response -----------------------------------------------------

# A Python repr in a message: opened after a space or "(", closed before punctuation or the end
# (so the apostrophe in "the series' labels" opens nothing).
_QUOTED = re.compile(r"""(?<=[\s(])(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?=[\s;:,.)]|$)""")
_CANNOT_PARSE = re.compile(r"^line (\d+): cannot parse\b")
_LOCATION_SHOWN = 200


def _refusal(exc: IngestError) -> str:
    """The parser's refusal, without the text of the body: its messages quote the line (or a
    label value) for the agent that pushed it, which for a scrape would echo whatever answered."""
    if match := _CANNOT_PARSE.match(exc.message):
        return f"the body is not a Prometheus exposition (line {match[1]}: cannot parse)"
    return _QUOTED.sub("'…'", exc.message)


def _location(response: requests.Response) -> str:
    location = response.headers.get("Location", "")
    location = "".join(ch for ch in location if ch.isprintable())
    if len(location) > _LOCATION_SHOWN:
        location = location[:_LOCATION_SHOWN] + "…"
    return location or "none"


def _fetch(target: ScrapeTarget) -> bytes:
    """GET the target's URL through the checked connection; return the body of a 200."""
    with (
        outbound.session() as session,
        session.get(
            target.url,
            timeout=target.timeout_seconds,
            headers={"User-Agent": USER_AGENT, "Accept": "text/plain"},
            stream=True,
            allow_redirects=False,
        ) as response,
    ):
        if 300 <= response.status_code < 400:
            raise ScrapeFailed(
                f"redirects are not followed (HTTP {response.status_code}, Location: {_location(response)})"
            )
        if response.status_code != 200:
            raise ScrapeFailed(f"HTTP {response.status_code} from the target")
        body = response.raw.read(MAX_BODY + 1, decode_content=True)
        if len(body) > MAX_BODY:
            raise ScrapeFailed(f"the target's body exceeds {MAX_BODY} bytes", shown=NOT_AN_EXPOSITION)
        return body


# What a scrape records as the target's failure; anything else (a bug, the database gone) raises.
_FAILURES = (
    outbound.OutboundRefused,
    ScrapeFailed,
    IngestError,
    requests.RequestException,
    urllib3.exceptions.HTTPError,
)


def _failure(exc: Exception, target: ScrapeTarget) -> tuple[str, str]:
    """What a failed scrape (one of _FAILURES) shows people, and the detail for the server log."""
    if isinstance(exc, outbound.HostNotFound):
        return UNREACHABLE, str(exc)
    if isinstance(exc, outbound.OutboundRefused):
        return OUTSIDE_THE_ALLOWED_NETWORKS, str(exc)
    if isinstance(exc, ScrapeFailed):
        return exc.shown, str(exc)
    if isinstance(exc, IngestError):
        return _advice(exc) or NOT_AN_EXPOSITION, _refusal(exc)[:1000]
    if isinstance(exc, requests.ConnectTimeout | urllib3.exceptions.ConnectTimeoutError):
        return UNREACHABLE, "connect timed out"
    if isinstance(exc, requests.Timeout | urllib3.exceptions.ReadTimeoutError):
        return UNREACHABLE, f"timed out after {target.timeout_seconds:g} s"
    if isinstance(exc, requests.exceptions.SSLError):
        return UNREACHABLE, "TLS handshake failed (certificate or protocol)"
    if isinstance(exc, requests.ConnectionError):
        return UNREACHABLE, "connection failed"
    # The class says what went wrong; its text may carry what the server sent.
    return UNREACHABLE, f"the request failed ({exc.__class__.__name__})"


def _advice(exc: IngestError) -> str:
    """The push door's advice (?endpoint=, ?hostname=) as this target's own field, else ""."""
    if exc.field == "endpoint" and "cannot tell which endpoint" in exc.message:
        return "the scrape does not say which endpoint it belongs to (no model label); set this target's endpoint name"
    if exc.field == "hostname" and "no hostname" in exc.message:
        # node_exporter (and a dcgm-exporter without a Hostname label) names no host.
        return "the scrape does not say which node it comes from (no hostname label); set this target's hostname"
    return ""


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
    stored, samples = 0, 0
    try:
        body = _fetch(target)
        text = body.decode("utf-8", errors="replace")
        exposition = parse_exposition(
            text,
            hostname=target.hostname or None,
            endpoint=target.endpoint_name or None,
            kind=target.kind,
            now=scraped_at,
        )
        # Series mapped from the text as a whole (Velero's), as the push door hands them over.
        exporters.map_pushes(
            text, exposition.ignored_metrics, site_id=target.site_id, received=scraped_at, openmetrics=False
        )
        check_scope(exposition, site_id=target.site_id)
        samples = exposition.count
        stored = store_exposition(
            exposition,
            site_id=target.site_id,
            batch_key=f"{target.site_id}:scrape:{target.id}:{scraped_at.isoformat()}",
        )
        error, detail = "", ""
    except _FAILURES as exc:
        error, detail = _failure(exc, target)
    ScrapeTarget.objects.filter(pk=target.pk).update(
        last_scrape_at=scraped_at,
        last_duration_ms=None if error else (time.monotonic() - started) * 1000,
        last_samples=samples,
        last_error=error,
        health=ScrapeHealth.DOWN if error else ScrapeHealth.UP,
    )
    counters.increment("goodput_scrapes_total", result="error" if error else "ok")
    if error:
        logger.warning("scrape of %s (target %s) failed: %s", target.url, target.pk, detail)
    return stored
