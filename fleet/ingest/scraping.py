"""Scraping /metrics URLs on a schedule, like Prometheus: claim due targets, fetch with a timeout,
parse and store through the same path as a push, and record health for the targets page.

A scrape target is a URL an Operator chose, fetched from inside the console's network, so the
fetch must not become a way to probe that network:

1. Only addresses in ``OUTBOUND_ALLOWED_NETWORKS`` are scraped, checked when a target is saved
   and again when each scrape connects (console.outbound).
2. Redirects are not followed, and the error recorded never quotes the response: a status, a
   line number, "connection failed" (refused and filtered ports read the same).
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
from fleet.choices import ScrapeHealth
from fleet.ingest import hooks
from fleet.ingest.prometheus import check_scope, parse_exposition, store_exposition
from fleet.telemetry.models import ScrapeTarget
from fleet.validation import IngestError

logger = logging.getLogger(__name__)

MAX_BODY = 20 * 1024 * 1024
USER_AGENT = "goodput-console/1 (+scrape)"


class ScrapeFailed(Exception):
    """A scrape that failed before its body was parsed; the message quotes nothing the target sent."""


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
            raise ScrapeFailed(f"the target's body exceeds {MAX_BODY} bytes")
        return body


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
    timed_out = f"timed out after {target.timeout_seconds:g} s"
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
        # Series another app maps (Velero's backup metrics), as the push door hands them over.
        hooks.run(text, exposition.ignored_metrics, site_id=target.site_id, received=scraped_at, openmetrics=False)
        check_scope(exposition, site_id=target.site_id)
        samples = exposition.count
        stored = store_exposition(
            exposition,
            site_id=target.site_id,
            batch_key=f"{target.site_id}:scrape:{target.id}:{scraped_at.isoformat()}",
        )
    except (ScrapeFailed, outbound.OutboundRefused) as exc:
        error = str(exc)
    # A connect that times out reads like one refused: which of the two it was would tell a
    # filtered port from a closed one.
    except (requests.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError):
        error = "connection failed"
    except (requests.Timeout, urllib3.exceptions.ReadTimeoutError):
        error = timed_out
    except requests.exceptions.SSLError:
        error = "TLS handshake failed (certificate or protocol)"
    except requests.ConnectionError:
        error = "connection failed"
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        # The class says what went wrong; its text may carry what the server sent.
        error = f"the request failed ({exc.__class__.__name__})"
    except IngestError as exc:
        error = _refusal(exc)[:1000]
        if exc.field == "endpoint" and "cannot tell which endpoint" in exc.message:
            # The push door's advice (?endpoint=NAME) means nothing for a target: its own field does.
            error = (
                "the scrape does not say which endpoint it belongs to (no model label); set this target's endpoint name"
            )
        elif exc.field == "hostname" and "no hostname" in exc.message:
            # Likewise ?hostname=: node_exporter (and a dcgm-exporter without a Hostname label) names
            # no host; the target's hostname does.
            error = "the scrape does not say which node it comes from (no hostname label); set this target's hostname"
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
