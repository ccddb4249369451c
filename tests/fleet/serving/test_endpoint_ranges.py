"""Custom time ranges on an endpoint's page (issue 21, item 21): the series, markers, prompt
lengths and range figures over from / to on whole minutes; the SLO table stays now's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Endpoint, Site
from fleet.serving import rollups as serving_rollups
from fleet.serving.models import EndpointChange
from fleet.serving.store import store_serving_points
from tests.fleet.serving.test_serving_pages import scrapes

pytestmark = pytest.mark.django_db


def z(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def served(site_a: Site) -> dict[str, Any]:
    """Endpoint "llama": 20 minutes of traffic (100 requests a minute) from the minute 3 hours
    ago, then nothing until 10 minutes ending with the current minute; a change event in each
    stretch; rolled up."""
    now = timezone.now()
    old = now.replace(second=0, microsecond=0) - timedelta(hours=3)
    recent = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    store_serving_points(site_id=site_a.pk, batch_key="old", points=scrapes("llama", old, 20))
    store_serving_points(site_id=site_a.pk, batch_key="new", points=scrapes("llama", recent, 10, start_k=20))
    serving_rollups.roll_everything(now=now)
    endpoint = Endpoint.objects.get(site=site_a, name="llama")
    EndpointChange.objects.create(endpoint=endpoint, ts=old + timedelta(minutes=5), kind="model", to_value="v2")
    EndpointChange.objects.create(endpoint=endpoint, ts=recent + timedelta(minutes=5), kind="model", to_value="v3")
    return {"endpoint": endpoint, "old": old, "now": now}


def test_an_endpoint_over_a_custom_window_draws_that_window(viewer_client: Client, served: dict[str, Any]) -> None:
    old = served["old"]
    url = f"/api/v1/serving/endpoints/{served['endpoint'].pk}/snapshot"
    # 02:10:30 to 02:40:30 style ends: read on whole minutes, the end's minute included.
    start, end = old - timedelta(minutes=10, seconds=-30), old + timedelta(minutes=30, seconds=30)
    response = viewer_client.get(url, {"from": z(start), "to": z(end)})
    assert response.status_code == 200, response.content
    snap = response.json()
    assert (snap["range"], snap["from"], snap["to"]) == ("custom", z(start), z(end))
    first, last = old - timedelta(minutes=10), old + timedelta(minutes=31)
    assert (snap["since"], snap["until"], snap["step_seconds"]) == (first.isoformat(), last.isoformat(), 60)
    ts = [datetime.fromisoformat(t) for t in snap["series"]["t"]]
    assert ts and all(first <= t < last for t in ts)
    assert [c["to_value"] for c in snap["changes"]] == ["v2"], "only the window's change event"
    # Everything the old stretch served, and its prompts (100 a minute), none of the recent ones.
    assert snap["range_figures"]["requests"] == pytest.approx(2000)
    assert snap["prompt_lengths"]["total"] == pytest.approx(2000)


def test_a_custom_window_and_a_preset_over_the_same_traffic_agree(
    viewer_client: Client, served: dict[str, Any]
) -> None:
    url = f"/api/v1/serving/endpoints/{served['endpoint'].pk}/snapshot"
    preset = viewer_client.get(url, {"range": "1h"}).json()
    start = datetime.fromisoformat(preset["since"])
    custom = viewer_client.get(url, {"from": z(start), "to": preset["until"]}).json()
    assert custom["since"] == preset["since"] and custom["until"] == preset["until"]
    assert custom["range_figures"] == preset["range_figures"]
    assert custom["prompt_lengths"] == preset["prompt_lengths"]
    assert custom["series"] == preset["series"]
