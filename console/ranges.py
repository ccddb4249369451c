"""The time window of a page's read: a preset (``range=1h``) or a custom window
(``from=<ISO 8601>&to=<ISO 8601>``), parsed and checked in one place for every page.

Every page with a range (fleet, GPU, node, training, a job, an endpoint) reads its window through
``window_from_query``: a bad window is a 400 naming ``from``, ``to`` or ``range``, never a 500.
The resolution a custom window reads (raw samples, 1-minute or 1-hour rollups) follows the
presets' rule (``resolution_for``): raw up to 15 minutes, minute rollups up to a day, hour rollups
beyond, and the next coarser table when the window is older than a finer one keeps.

Times without an offset are UTC, as every time the console shows is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

RAW, MINUTE, HOUR = "raw", "1m", "1h"
RESOLUTIONS = (RAW, MINUTE, HOUR)  # finest first
RETENTION_SETTINGS = {RAW: "RAW_RETENTION_DAYS", MINUTE: "ROLLUP_1M_RETENTION_DAYS", HOUR: "ROLLUP_1H_RETENTION_DAYS"}
# The presets' rule (fleet.telemetry.read.figures.RESOLUTION): the 15-minute view reads raw samples,
# 1 h to 24 h the minute rollups, 7 d the hour rollups.
RAW_MAX_SPAN = timedelta(minutes=15)
MINUTE_MAX_SPAN = timedelta(hours=24)
RAW_MAX_POINTS = 180  # raw samples are binned to at most this many points (and 10 s at the finest)
MAX_POINTS = 5000  # a custom window of more points than this at its resolution is refused
FUTURE_SLACK = timedelta(days=1)  # a window may end this far past now (clock skew), no further
MAX_TEXT = 64  # the longest from / to text read
# The API's custom window, beside each read's ``range``: both of from / to, or neither.
WINDOW_PARAMETERS = [
    OpenApiParameter(
        "from", OpenApiTypes.DATETIME, required=False, description="custom window start (ISO 8601; with to)"
    ),
    OpenApiParameter(
        "to", OpenApiTypes.DATETIME, required=False, description="custom window end (ISO 8601; with from)"
    ),
]


def retention(resolution: str) -> timedelta:
    """How long the console keeps the table a resolution reads (the partitions' retention)."""
    return timedelta(days=getattr(settings, RETENTION_SETTINGS[resolution]))


def longest_span() -> timedelta:
    """The longest window a page reads: the hour rollups' retention (the longest presets read
    them), and no more than MAX_POINTS hours."""
    return min(retention(HOUR), timedelta(hours=MAX_POINTS))


def bucket_seconds(resolution: str, span: timedelta) -> int:
    """The spacing of a series' points at a resolution: raw samples are binned to RAW_MAX_POINTS
    points (10 s at the finest), rollups are a point a bucket."""
    if resolution == RAW:
        return max(10, int(span.total_seconds()) // RAW_MAX_POINTS)
    return {MINUTE: 60, HOUR: 3600}[resolution]


def resolution_for(start: datetime, end: datetime, *, now: datetime) -> str:
    """What a window reads, by its span as the presets do (raw up to 15 minutes, minute rollups up
    to a day, hour rollups beyond); a window that starts before a table's retention reads the
    next coarser one, which still holds it."""
    span = end - start
    finest = RAW if span <= RAW_MAX_SPAN else MINUTE if span <= MINUTE_MAX_SPAN else HOUR
    for resolution in RESOLUTIONS[RESOLUTIONS.index(finest) :]:
        if start >= now - retention(resolution):
            return resolution
    return HOUR


class RangeError(ValueError):
    """A window the console cannot read: the query parameter at fault and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {self.field: self.message}


@dataclass(frozen=True)
class Window:
    """A read's window [start, end): a preset's (``preset`` its name) or a custom one (``preset`` None)."""

    start: datetime
    end: datetime
    preset: str | None
    resolution: str

    @property
    def custom(self) -> bool:
        return self.preset is None

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    @property
    def seconds(self) -> int:
        return int(self.span.total_seconds())

    @property
    def bucket_seconds(self) -> int:
        return bucket_seconds(self.resolution, self.span)

    def as_json(self) -> dict[str, str]:
        """What an answer says about its window: its name ("custom" for from / to) and its ends."""
        return {"range": self.preset or "custom", "from": iso(self.start), "to": iso(self.end)}

    def query(self) -> str:
        """The query string that reads this window again: ``range=...`` or ``from=...&to=...``."""
        if self.preset is not None:
            return urlencode({"range": self.preset})
        return urlencode({"from": iso(self.start), "to": iso(self.end)})


def iso(ts: datetime) -> str:
    """A time as the URLs carry it: UTC, to the second, with a Z."""
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(field: str, text: str) -> datetime:
    """An ISO 8601 time (``2024-05-01T02:10:00Z``, ``...+02:00``; UTC without an offset), or a
    RangeError naming the field."""
    if len(text) > MAX_TEXT:
        raise RangeError(field, f"Not a time: {len(text)} characters; an ISO 8601 time is at most {MAX_TEXT}.")
    try:
        if not text.isprintable():  # fromisoformat stops at a NUL and reads what came before it
            raise ValueError(text)
        ts = datetime.fromisoformat(text.strip())
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=UTC)
        return ts.astimezone(UTC)
    except (ValueError, OverflowError):
        raise RangeError(field, f"Not an ISO 8601 time: {text!r} (e.g. 2024-05-01T02:10:00Z).") from None


def custom_window(start: datetime, end: datetime, *, now: datetime | None = None) -> Window:
    """A custom window [start, end), checked: start before end, no end more than a day ahead, no
    span or start beyond what the console keeps (longest_span), at most MAX_POINTS points at its
    resolution. A RangeError names ``from`` or ``to``."""
    now = now or timezone.now()
    if end <= start:
        raise RangeError("to", f"Must be after from ({iso(start)}); it is {iso(end)}.")
    if end > now + FUTURE_SLACK:
        raise RangeError("to", f"{iso(end)} is more than a day in the future.")
    kept = retention(HOUR)
    if end - start > kept:
        raise RangeError("from", f"The window spans {(end - start).days} days; the console keeps {kept.days}.")
    if start < now - kept:
        raise RangeError("from", f"{iso(start)} is older than the {kept.days} days the console keeps.")
    resolution = resolution_for(start, end, now=now)
    points = math.ceil((end - start).total_seconds() / bucket_seconds(resolution, end - start))
    if points > MAX_POINTS:
        raise RangeError(
            "from", f"The window is {points} points at {resolution} resolution; at most {MAX_POINTS}: narrow it."
        )
    return Window(start=start, end=end, preset=None, resolution=resolution)


def window_from_query(
    params: Mapping[str, str],
    *,
    presets: Mapping[str, timedelta],
    default: str,
    now: datetime | None = None,
) -> Window:
    """The window a request asks for: ``from`` and ``to`` (both, ISO 8601) for a custom window,
    else ``range`` (one of ``presets``, ``default`` when absent) ending now. A RangeError names
    the parameter at fault."""
    now = now or timezone.now()
    start_text, end_text = params.get("from"), params.get("to")
    if start_text is None and end_text is None:
        key = params.get("range", default)
        if key not in presets:
            raise RangeError("range", f"Use one of {', '.join(presets)}.")
        span = presets[key]
        return Window(start=now - span, end=now, preset=key, resolution=resolution_for(now - span, now, now=now))
    if "range" in params:
        raise RangeError("range", "Give either range or from and to, not both.")
    if start_text is None:
        raise RangeError("from", "Give from with to (an ISO 8601 time, e.g. 2024-05-01T02:10:00Z).")
    if end_text is None:
        raise RangeError("to", "Give to with from (an ISO 8601 time, e.g. 2024-05-01T02:40:00Z).")
    return custom_window(parse_time("from", start_text), parse_time("to", end_text), now=now)


# An incident's pages open on its window: from this long before its fault began to this long
# after it resolved (now while it is open), so the lead-up and the recovery are on the charts.
INCIDENT_MARGIN = timedelta(minutes=10)


def incident_window(started_at: datetime, ended_at: datetime | None, *, now: datetime | None = None) -> Window:
    """The window an incident's links open the fleet, node, GPU, job and endpoint pages at: from
    INCIDENT_MARGIN before its fault began to INCIDENT_MARGIN after it resolved, on whole minutes,
    ending no later than now; a long incident's last longest_span()."""
    now = now or timezone.now()
    end = min(_ceil_minute((ended_at or now) + INCIDENT_MARGIN), now)
    start = (started_at - INCIDENT_MARGIN).replace(second=0, microsecond=0)
    start = max(min(start, end - timedelta(minutes=1)), end - longest_span())
    return Window(start=start, end=end, preset=None, resolution=resolution_for(start, end, now=now))


def _ceil_minute(ts: datetime) -> datetime:
    floor = ts.replace(second=0, microsecond=0)
    return floor if floor == ts else floor + timedelta(minutes=1)
