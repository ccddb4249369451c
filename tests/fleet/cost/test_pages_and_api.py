"""The /cost/ page, its API routes and CSV, the overview tile, and the money beside GPU-hours on
the job, incident and capacity pages: each of those calls the function /cost/ does, and the tests
below show the two places say the same amount."""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from fleet.cost import figures, read
from fleet.models import Pool, Site
from incidents.models import Incident

from .conftest import H100, L40S, account, job_on, node_with_gpus, owned_price, rate_price, rollup

pytestmark = pytest.mark.django_db


def _hour_ago(hours: int):
    return figures.floor_hour(timezone.now()) - timedelta(hours=hours)


@pytest.fixture
def priced(site_a: Site, h100_pool: Pool, l40s_pool: Pool):
    """A rented L40S job with 4 GPU-hours of hang two hours ago at 2.50 (10.00 EUR)."""
    owned_price(h100_pool, valid_from=date(2025, 1, 1))
    rate_price(l40s_pool, "2.50", valid_from=date(2025, 1, 1))
    job = job_on(site_a, node_with_gpus(site_a, L40S, 4, "l-1"), name="ft-7b", team="apps")
    account(job, _hour_ago(2), hang_s=4 * 3600, productive_s=3600)
    return job


def test_the_page_renders_for_a_viewer_and_feeds_from_the_snapshot(viewer_client, priced) -> None:
    page = viewer_client.get("/cost/")
    assert page.status_code == 200
    body = page.content.decode()
    assert '"snapshot_url": "/api/v1/cost/"' in body and '"topic": "cost"' in body
    assert "admin/fleet/poolprice" not in body  # a viewer sets no prices


def test_the_snapshot_prices_the_badput_by_team_pool_cause_and_job(viewer_client, priced) -> None:
    snap = viewer_client.get("/api/v1/cost/", {"range": "24h"}).json()
    assert (snap["currency"], snap["total"], snap["has_prices"]) == ("EUR", "10.00", True)
    assert snap["by_team"] == [{"team": "apps", "gpu_hours": 4.0, "amount": "10.00"}]
    assert snap["by_cause"][0] | {} == {
        "kind": "training",
        "cause": "hang",
        "label": "Hang (allocated, no progress)",
        "gpu_hours": 4.0,
        "amount": "10.00",
    }
    assert snap["top_jobs"] == [{"job_id": priced.pk, "name": "ft-7b", "gpu_hours": 4.0, "amount": "10.00"}]
    assert [p["pool"] for p in snap["by_pool"]] == ["l40s"]


def test_each_figure_has_its_own_route(viewer_client, priced) -> None:
    training = viewer_client.get("/api/v1/cost/training/", {"range": "24h"}).json()
    assert training["total"] == "10.00" and training["rows"][0]["job_id"] == priced.pk
    for part in ("idle", "reserved", "incidents"):
        answer = viewer_client.get(f"/api/v1/cost/{part}/", {"range": "7d"})
        assert answer.status_code == 200 and answer.json()["total"] == "0.00", part
    assert viewer_client.get("/api/v1/cost/serving/").json()["endpoints"] == []
    pools = viewer_client.get("/api/v1/cost/own-or-rent/").json()["pools"]
    assert {p["pool"] for p in pools} == {"h100", "l40s"}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"range": "2y"}, "range"),
        ({"from": "yesterday", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"from": "2026-01-02T00:00:00Z"}, "to"),
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),
    ],
)
def test_a_bad_window_is_a_400_naming_the_field(viewer_client, query, field) -> None:
    for url in ("/api/v1/cost/", "/api/v1/cost/training/", "/api/v1/cost/export.csv"):
        answer = viewer_client.get(url, query)
        assert answer.status_code == 400, url
        assert field in answer.json(), url


def test_the_csv_has_a_row_per_month_team_pool_and_cause(viewer_client, priced) -> None:
    answer = viewer_client.get("/api/v1/cost/export.csv", {"range": "24h"})
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    assert [(r["team"], r["site"], r["pool"], r["kind"], r["cause"], r["amount"], r["currency"]) for r in rows] == [
        ("apps", "ams-1", "l40s", "training", "hang", "10.00", "EUR")
    ]
    assert rows[0]["month"] == timezone.now().strftime("%Y-%m") or rows[0]["month"] < timezone.now().strftime("%Y-%m")


def test_a_team_name_that_looks_like_a_formula_is_written_as_text(viewer_client, site_a, l40s_pool) -> None:
    rate_price(l40s_pool, "1.00")
    job = job_on(site_a, node_with_gpus(site_a, L40S, 1, "l-1"), team="=HYPERLINK(1)")
    account(job, _hour_ago(1), hang_s=3600)
    text = viewer_client.get("/api/v1/cost/export.csv", {"range": "24h"}).content.decode()
    assert "'=HYPERLINK(1)" in text


def test_the_overview_tile_shows_the_last_30_days_in_money(viewer_client, priced) -> None:
    body = viewer_client.get("/").content.decode()
    assert 'id="cost-tile"' in body and "10.00" in body


def test_the_tile_says_how_to_set_prices_when_there_are_none(viewer_client, site_a) -> None:
    assert "No pool prices yet" in viewer_client.get("/").content.decode()


def test_the_job_page_shows_the_same_badput_cost_as_cost_page(viewer_client, priced) -> None:
    body = viewer_client.get(f"/training/jobs/{priced.pk}/").content.decode()
    assert 'id="job-cost"' in body
    job_figure = figures.job_cost(priced.pk, start=_hour_ago(24), end=timezone.now())
    snap = viewer_client.get("/api/v1/cost/", {"range": "24h"}).json()
    on_cost_page = next(j for j in snap["top_jobs"] if j["job_id"] == priced.pk)
    assert job_figure["total"] == on_cost_page["amount"] == "10.00"
    assert f"{job_figure['total']}<small> EUR" in body


def _incident(job, gpu_hours: float) -> Incident:
    return Incident.objects.create(
        title="NCCL timeout",
        severity="SEV2",
        category="training",
        group_key=f"job:{job.pk}",
        labels={"site": "ams-1", "job": str(job.pk), "team": job.team},
        started_at=_hour_ago(3),
        gpu_hours_lost=gpu_hours,
    )


def test_the_incident_page_shows_the_same_money_as_cost_page(viewer_client, priced) -> None:
    incident = _incident(priced, 6.0)  # 6 GPU-hours x 2.50 = 15.00
    body = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert 'id="gpu-hours-cost"' in body and "15.00 EUR" in body
    rows = viewer_client.get("/api/v1/cost/incidents/", {"range": "24h"}).json()["rows"]
    assert [(r["incident_id"], r["amount"], r["team"], r["pool"]) for r in rows] == [
        (incident.pk, "15.00", "apps", "l40s")
    ]
    assert figures.incident_cost(incident.pk)["amount"] == "15.00"


def test_an_incident_in_no_priced_pool_shows_no_money(viewer_client, site_a) -> None:
    job = job_on(site_a, [], name="bare")
    incident = _incident(job, 6.0)
    assert 'id="gpu-hours-cost"' not in viewer_client.get(f"/incidents/{incident.pk}/").content.decode()


def test_the_capacity_page_says_own_or_rent_as_cost_page_does(viewer_client, site_a, h100_pool) -> None:
    owned_price(h100_pool, valid_from=date(2025, 1, 1), cloud_rate_per_gpu_hour=Decimal("2.00"))
    gpus = node_with_gpus(site_a, H100, 2, "h-1")
    for hours_ago in range(1, 25):  # one GPU busy, one idle for the last day: about 50 % of a day
        rollup(gpus[0], _hour_ago(hours_ago), util=80.0, power=700.0)
        rollup(gpus[1], _hour_ago(hours_ago), util=0.0, power=700.0)
    rows = viewer_client.get("/api/v1/cost/own-or-rent/").json()["pools"]
    sentence = rows[0]["periods"][0]["sentence"]
    # 24 busy of 2 x 30 x 24 installed GPU-hours = 1.7 %: renting at 2.00 costs 0.033 an installed
    # hour against owning's 1.12: renting would have cost 97 % less.
    assert sentence == "at 2 % utilisation, renting would have cost 97 % less"
    assert rows[0]["break_even_pct"] == 56.2  # 1.1238 / 2.00
    page = viewer_client.get("/capacity/").content.decode()
    assert 'id="own-or-rent"' in page and sentence in page


def test_serving_cost_per_million_tokens_is_the_gpus_price_over_the_tokens(site_a, l40s_pool, monkeypatch) -> None:
    from fleet.serving import slo
    from fleet.serving.models import Endpoint

    rate_price(l40s_pool, "1.00")
    ep = Endpoint.objects.create(site=site_a, name="chat")
    ep.gpus.set(node_with_gpus(site_a, L40S, 2, "l-9"))
    generated = {"1h": 1_000_000.0, "24h": 0.0, "30d": 48_000_000.0}

    def totals(endpoint_id, windows, **kwargs):
        return {name: slo.Totals(counters={"generation_tokens": generated[name]}) for name in windows}

    monkeypatch.setattr(slo, "window_totals", totals)
    now = figures.floor_hour(timezone.now())
    row = read.serving(now=now)[0]
    # 1 h: 2 GPUs x 1 h x 1.00 = 2.00 for 1 M tokens: 2.00 per million
    assert row["windows"]["1h"] == {"tokens": 1_000_000, "amount": "2.00", "per_million_tokens": "2.0000"}
    assert row["windows"]["24h"]["per_million_tokens"] is None  # nothing generated: no unit cost
    # 30 d: 2 x 720 h x 1.00 = 1,440.00 for 48 M tokens: 30.00 per million
    assert row["windows"]["30d"]["per_million_tokens"] == "30.0000"
