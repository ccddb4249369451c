"""Custom time ranges (issue 21, item 21): every page's read takes ``from`` / ``to`` beside its
presets, through one parser (console.ranges) that names the parameter at fault; the fleet, GPU
and node reads draw exactly that window at the resolution its span picks; an incident's page
links to the fleet, node, GPU, job and endpoint pages at the incident's window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest
from django.test import Client
from django.utils import timezone

from console import ranges
from console.ranges import RangeError, custom_window, incident_window, resolution_for, window_from_query
from fleet.ingest.batches import GpuSampleIn
from fleet.models import Endpoint, Job, Site
from fleet.telemetry import partitions
from fleet.telemetry.read import figures
from fleet.telemetry.rollups import update_rollups
from fleet.telemetry.store import store_gpu_samples
from incidents.models import Incident
from tests.conftest import make_sample

pytestmark = pytest.mark.django_db

HOST = "gpu-r-021"
G0 = "GPU-21212121-0000"
PRESETS = {key: timedelta(seconds=s) for key, s in figures.RANGES.items()}


def z(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def store(site: Site, key: str, *, at: list[datetime], util: float) -> None:
    samples = []
    for ts in at:
        raw = make_sample(gpu_uuid=G0, hostname=HOST, gpu_index=0, gpu_util=util, power_w=10 * util)
        raw["ts"] = ts
        samples.append(msgspec.convert(raw, GpuSampleIn, from_attributes=False, strict=False))
    store_gpu_samples(site_id=site.id, batch_key=key, samples=samples)


# --- the one parser --------------------------------------------------------------------------------


def test_a_preset_is_the_span_ending_now_at_the_resolution_the_presets_have_always_read() -> None:
    now = timezone.now()
    for key in figures.RANGES:
        window = window_from_query({"range": key}, presets=PRESETS, default="15m", now=now)
        assert (window.start, window.end, window.preset) == (now - PRESETS[key], now, key)
        # One rule for presets and custom windows: the fleet reads' own table of resolutions.
        assert window.resolution == figures.RESOLUTION[key], key
    assert window_from_query({}, presets=PRESETS, default="15m", now=now).preset == "15m"


def test_a_custom_window_from_0210_to_0240_yesterday_reads_minute_rollups() -> None:
    now = timezone.now()
    yesterday = (now - timedelta(days=1)).replace(hour=2, minute=10, second=0, microsecond=0)
    params = {"from": z(yesterday), "to": z(yesterday + timedelta(minutes=30))}
    window = window_from_query(params, presets=PRESETS, default="15m", now=now)
    assert (window.start, window.end, window.custom) == (yesterday, yesterday + timedelta(minutes=30), True)
    assert (window.resolution, window.bucket_seconds) == ("1m", 60)
    assert window.as_json() == {"range": "custom", **params}
    assert window.query() == f"from={params['from'].replace(':', '%3A')}&to={params['to'].replace(':', '%3A')}"


def test_the_resolution_follows_the_span_and_steps_coarser_for_a_window_older_than_its_table() -> None:
    now = timezone.now()
    hour_ago = now - timedelta(hours=1)
    assert resolution_for(hour_ago, hour_ago + timedelta(minutes=15), now=now) == "raw"
    assert resolution_for(hour_ago, hour_ago + timedelta(minutes=16), now=now) == "1m"
    assert resolution_for(now - timedelta(hours=24), now, now=now) == "1m"
    assert resolution_for(now - timedelta(hours=25), now, now=now) == "1h"
    # Raw samples are kept 7 days, minute rollups 30: ten minutes of 10 days ago read minutes,
    # of 40 days ago hours.
    ten_days = now - timedelta(days=10)
    assert resolution_for(ten_days, ten_days + timedelta(minutes=10), now=now) == "1m"
    forty_days = now - timedelta(days=40)
    assert resolution_for(forty_days, forty_days + timedelta(minutes=10), now=now) == "1h"


def test_the_retention_a_window_is_checked_against_is_the_one_the_partitions_drop_by() -> None:
    assert ranges.retention("raw") == partitions.SAMPLES.retention
    assert ranges.retention("1m") == partitions.GPU_ROLLUP_1M.retention == partitions.GROUP_ROLLUP_1M.retention
    assert ranges.retention("1h") == partitions.GPU_ROLLUP_1H.retention == partitions.GROUP_ROLLUP_1H.retention
    assert ranges.RAW_MAX_POINTS == figures.MAX_POINTS


def test_times_without_an_offset_are_utc_and_offsets_are_honoured() -> None:
    now = timezone.now()
    day = (now - timedelta(days=1)).date().isoformat()
    window = window_from_query(
        {"from": f"{day}T02:10", "to": f"{day}T04:40+02:00"}, presets=PRESETS, default="15m", now=now
    )
    assert (window.start.hour, window.start.minute, window.end.hour, window.end.minute) == (2, 10, 2, 40)
    assert window.start.tzinfo == UTC


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        ({"from": "yesterday 02:10", "to": "2024-05-01T02:40:00Z"}, "from", "Not an ISO 8601 time"),
        ({"from": "2024-05-01T02:10:00Z", "to": "2024-13-45T02:40:00Z"}, "to", "Not an ISO 8601 time"),
        ({"from": "0001-01-01T00:00:00+01:00", "to": "2024-05-01T02:40:00Z"}, "from", "Not an ISO 8601 time"),
        ({"from": "2024-05-01T02:10:00\x00", "to": "2024-05-01T02:40:00Z"}, "from", "Not an ISO 8601 time"),
        ({"from": "9" * 5000, "to": "2024-05-01T02:40:00Z"}, "from", "5000 characters"),
        ({"from": "2024-05-01T02:10:00Z"}, "to", "Give to with from"),
        ({"to": "2024-05-01T02:10:00Z"}, "from", "Give from with to"),
        ({"range": "1h", "from": "x", "to": "y"}, "range", "not both"),
        ({"range": "2h"}, "range", "Use one of 15m, 1h, 6h, 24h, 7d."),
    ],
)
def test_a_bad_window_is_refused_naming_the_parameter(params: dict[str, str], field: str, says: str) -> None:
    with pytest.raises(RangeError) as caught:
        window_from_query(params, presets=PRESETS, default="15m")
    assert caught.value.field == field and says in caught.value.message, caught.value.as_dict()


def test_a_window_must_end_after_it_starts_and_not_far_in_the_future() -> None:
    now = timezone.now()
    for end in (now - timedelta(hours=1), now - timedelta(hours=2)):
        with pytest.raises(RangeError) as caught:
            custom_window(now - timedelta(hours=1), end, now=now)
        assert caught.value.field == "to" and "Must be after from" in caught.value.message
    with pytest.raises(RangeError) as caught:
        custom_window(now, now + timedelta(days=2), now=now)
    assert caught.value.field == "to" and "in the future" in caught.value.message
    custom_window(now - timedelta(minutes=5), now + timedelta(minutes=5), now=now)  # clock skew is fine


def test_a_window_beyond_what_the_console_keeps_or_of_too_many_points_is_refused(settings: Any) -> None:
    now = timezone.now()
    kept = settings.ROLLUP_1H_RETENTION_DAYS
    with pytest.raises(RangeError) as caught:
        custom_window(now - timedelta(days=kept + 1), now, now=now)
    assert caught.value.field == "from" and f"the console keeps {kept}" in caught.value.message
    with pytest.raises(RangeError) as caught:
        custom_window(now - timedelta(days=kept + 10), now - timedelta(days=kept + 9), now=now)
    assert caught.value.field == "from" and "older than" in caught.value.message
    # Within the retention, but more hourly points than a chart is given.
    hours = ranges.MAX_POINTS + 24
    with pytest.raises(RangeError) as caught:
        custom_window(now - timedelta(hours=hours), now, now=now)
    assert caught.value.field == "from" and f"{hours} points" in caught.value.message
    assert custom_window(now - timedelta(hours=ranges.MAX_POINTS), now, now=now).resolution == "1h"


def test_an_incident_window_runs_from_before_its_fault_to_after_it_resolved() -> None:
    # Off the minute on purpose: a resolution on a whole minute is not rounded up (checked below).
    now = timezone.now().replace(second=45, microsecond=0)
    began = now - timedelta(hours=5, seconds=30)
    resolved = now - timedelta(hours=4, minutes=1, seconds=10)
    window = incident_window(began, resolved, now=now)
    assert window.start == (began - ranges.INCIDENT_MARGIN).replace(second=0)
    assert window.end == (resolved + ranges.INCIDENT_MARGIN).replace(second=0) + timedelta(minutes=1)
    on_the_minute = resolved.replace(second=0)
    assert incident_window(began, on_the_minute, now=now).end == on_the_minute + ranges.INCIDENT_MARGIN
    # Open: up to now. A long incident: its last longest_span().
    assert incident_window(began, None, now=now).end == now
    long = incident_window(now - timedelta(days=2000), None, now=now)
    assert long.span == ranges.longest_span()
    # Every incident window is one the pages accept.
    for w in (window, long, incident_window(now + timedelta(minutes=3), None, now=now)):
        assert custom_window(w.start, w.end, now=now).resolution == w.resolution


# --- the fleet, GPU and node reads --------------------------------------------------------------


@pytest.fixture
def history(site_a: Site) -> dict[str, datetime]:
    """GPU G0 at 30 % every 20 s for 10 minutes from the minute 3 hours ago, and at 90 % over the
    last 5 minutes; minute rollups made."""
    now = timezone.now()
    base = (now - timedelta(hours=3)).replace(second=0, microsecond=0)
    old = [base + timedelta(seconds=20 * i) for i in range(31)]
    store(site_a, "old", at=old, util=30.0)
    store(site_a, "new", at=[now - timedelta(seconds=30 * i) for i in range(1, 10)], util=90.0)
    update_rollups()
    return {"now": now, "old": old[0]}


def _iso_in(ts: str, start: datetime, end: datetime) -> bool:
    return start <= datetime.fromisoformat(ts) < end


def test_the_fleet_page_draws_a_custom_window_from_the_minute_rollups(
    viewer_client: Client, site_a: Site, history: dict[str, datetime]
) -> None:
    start, end = history["old"] - timedelta(minutes=5), history["old"] + timedelta(minutes=15)
    response = viewer_client.get("/api/v1/fleet/overview/", {"from": z(start), "to": z(end)})
    assert response.status_code == 200, response.content
    body = response.json()
    series = body["series"]
    assert body["range"] == series["range"] == "custom"
    assert (series["from"], series["to"], series["resolution"], series["bucket_seconds"]) == (
        z(start),
        z(end),
        "1m",
        60,
    )
    site = series["sites"][str(site_a.pk)]
    assert site["util"] and set(site["util"]) == {30.0}, "only the window's samples, not the last minutes' 90 %"
    assert all(_iso_in(ts, start.replace(second=0), end) for ts in site["ts"])
    # The totals are the fleet now, whatever the window.
    assert body["totals"]["mean_util"] == 90.0


def test_the_gpu_and_node_pages_draw_a_short_custom_window_from_raw_samples(
    viewer_client: Client, history: dict[str, datetime]
) -> None:
    start, end = history["old"] + timedelta(minutes=2), history["old"] + timedelta(minutes=7)
    params = {"from": z(start), "to": z(end)}
    for path in (f"/api/v1/fleet/gpus/{G0}/series/", f"/api/v1/fleet/nodes/{HOST}/series/"):
        response = viewer_client.get(path, params)
        assert response.status_code == 200, (path, response.content)
        body = response.json()
        assert (body["range"], body["from"], body["to"], body["resolution"]) == ("custom", z(start), z(end), "raw")
        assert body["bucket_seconds"] == 10 and body["range_seconds"] == 300
        s = body["series"] if "series" in body else body["gpus"][0]["series"]
        assert len(s["util"]) == 15 and set(s["util"]) == {30.0}, s  # 20-second samples in 10-second buckets
        assert all(_iso_in(ts, start, end) for ts in s["ts"])
    # The preset still ends now: its last points are the 90 % ones.
    preset = viewer_client.get(f"/api/v1/fleet/gpus/{G0}/series/", {"range": "15m"}).json()
    assert preset["range"] == "15m" and "from" not in preset and preset["series"]["util"][-1] == 90.0


def test_a_custom_window_of_days_reads_the_hour_rollups(viewer_client: Client, history: dict[str, datetime]) -> None:
    update_rollups(now=timezone.now() + timedelta(hours=2))  # settle the hours
    start = history["now"] - timedelta(days=2)
    body = viewer_client.get(f"/api/v1/fleet/gpus/{G0}/series/", {"from": z(start), "to": z(history["now"])}).json()
    assert (body["resolution"], body["bucket_seconds"]) == ("1h", 3600)
    assert 30.0 in body["series"]["util"]


@pytest.fixture
def pages(site_a: Site, history: dict[str, datetime]) -> list[str]:
    """Every read that takes a range."""
    job = Job.objects.create(site=site_a, name="j", team="t", gang_size=8, scheduler_id="j")
    endpoint = Endpoint.objects.create(site=site_a, name="llama")
    return [
        "/api/v1/fleet/overview/",
        f"/api/v1/fleet/gpus/{G0}/series/",
        f"/api/v1/fleet/nodes/{HOST}/series/",
        "/api/v1/training/overview",
        f"/api/v1/training/jobs/{job.pk}/snapshot",
        f"/api/v1/serving/endpoints/{endpoint.pk}/snapshot",
    ]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "02:10 yesterday", "to": "2030-01-01T00:00:00Z"}, "from"),
        ({"from": "2026-01-01T02:40:00Z", "to": "2026-01-01T02:10:00Z"}, "to"),
        ({"from": "2026-01-01T02:10:00Z"}, "to"),
        ({"from": "1900-01-01T00:00:00Z", "to": "1900-01-02T00:00:00Z"}, "from"),
        ({"from": "1000-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"from": "2026-01-01T02:10:00Z", "to": "9999-12-31T23:59:59-23:59"}, "to"),
    ],
)
def test_every_read_refuses_a_bad_window_with_a_400_naming_the_field(
    viewer_client: Client, pages: list[str], params: dict[str, str], field: str
) -> None:
    for path in pages:
        response = viewer_client.get(path, params)
        assert response.status_code == 400, (path, response.content)
        assert list(response.json()) == [field], (path, response.json())


def test_every_read_takes_a_custom_window(
    viewer_client: Client, pages: list[str], history: dict[str, datetime]
) -> None:
    start, end = history["old"], history["old"] + timedelta(minutes=30)
    for path in pages:
        response = viewer_client.get(path, {"from": z(start), "to": z(end)})
        assert response.status_code == 200, (path, response.content)
        body = response.json()
        meta = body.get("series", {}) if "from" not in body else body
        assert (meta["range"], meta["from"], meta["to"]) == ("custom", z(start), z(end)), path


# --- the incident page's links ------------------------------------------------------------------


def test_the_incident_page_links_to_the_fleet_job_and_endpoint_pages_at_its_window(
    viewer_client: Client, site_a: Site
) -> None:
    now = timezone.now()
    began, resolved = now - timedelta(hours=26, minutes=3), now - timedelta(hours=25, minutes=40)
    incident = Incident.objects.create(
        title="XID 79 on gpu-r-021",
        severity="SEV2",
        category="gpu-health",
        group_key="node:gpu-r-021",
        state="resolved",
        labels={"hostname": HOST, "gpu": G0, "job": "7", "endpoint": "3", "team": "foundation"},
        started_at=began,
        detected_at=began + timedelta(minutes=1),
        resolved_at=resolved,
    )
    page = viewer_client.get(f"/incidents/{incident.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    window = incident_window(began, resolved, now=now)
    expected = {"from": [z(window.start)], "to": [z(window.end)]}
    links = _links(text)
    for path in (
        "/fleet/",
        f"/fleet/nodes/{HOST}/",
        f"/fleet/gpus/{G0}/",
        "/training/jobs/7/",
        "/serving/endpoints/3/",
    ):
        [href] = [h for h in links if urlsplit(h).path == path and urlsplit(h).query]
        assert parse_qs(urlsplit(href).query) == expected, href
    # The window: 10 minutes before the fault began to 10 minutes after it resolved.
    assert expected["from"] == [z((began - timedelta(minutes=10)).replace(second=0, microsecond=0))]


def test_every_page_with_charts_has_the_range_control(viewer_client: Client, pages: list[str]) -> None:
    job, endpoint = Job.objects.get(), Endpoint.objects.get()
    charted = ["/fleet/", f"/fleet/gpus/{G0}/", f"/fleet/nodes/{HOST}/", "/training/", f"/training/jobs/{job.pk}/"]
    for path in [*charted, f"/serving/endpoints/{endpoint.pk}/"]:
        text = viewer_client.get(path).content.decode()
        assert 'id="range-from"' in text and 'value="custom"' in text and "js/range.js" in text, path
    # A job's page has no presets: its own last 24 hours, or a custom window.
    text = viewer_client.get(f"/training/jobs/{job.pk}/").content.decode()
    assert '<option value="" selected>last 24 h</option>' in text


def _links(html: str) -> list[str]:
    import re
    from html import unescape

    return [unescape(h) for h in re.findall(r'href="([^"]+)"', html)]
