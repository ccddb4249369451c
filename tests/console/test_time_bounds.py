"""One bound on every date and time a client sends (console.timebounds): ten years either side of
today, refused with a 400 naming the field, nothing written: reservations (people and agent
tokens), orders, the plan's start, serving changes and evals, action items, silences, compliance
records and the audit filter (tests/compliance/test_edge_inputs.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from console.timebounds import bounds, moment_problem
from fleet.models import EndpointChange, EndpointEval, ProcurementOrder, Reservation, Site
from fleet.serving.models import Endpoint
from incidents.models import ActionItem, Silence
from incidents.services.engine import Actor, raise_finding
from tests.fleet.capacity import add_nodes, make_pool

pytestmark = pytest.mark.django_db

YEAR_1 = "0001-01-01T00:00:00Z"
YEAR_9999 = "9999-12-31T00:00:00Z"


def _json(client: Client, method: str, url: str, body: Any, **headers: str) -> Any:
    return getattr(client, method)(url, json.dumps(body), content_type="application/json", **headers)


def test_the_bound_is_ten_years_either_side_of_today() -> None:
    today = datetime(2026, 12, 1, tzinfo=UTC).date()
    assert bounds(today) == (today.replace(year=2016), today.replace(year=2036))
    assert moment_problem(today.replace(year=2036), today) is None
    assert "10 years ahead" in moment_problem(today.replace(year=2036) + timedelta(days=1), today)
    assert "10 years back" in moment_problem(today.replace(year=2016) - timedelta(days=1), today)
    assert bounds(datetime(2028, 2, 29).date())[1].isoformat() == "2038-02-28"


@pytest.mark.parametrize(("field", "value"), [("start", YEAR_1), ("end", YEAR_9999)])
def test_a_reservation_window_out_of_bounds_is_a_400_for_people_and_tokens(
    client, operator_client, site_a: Site, token_a: str, field: str, value: str
) -> None:
    add_nodes(site_a, 1)
    pool = make_pool(site_a)
    now = timezone.now()
    body = {
        "team": "t",
        "pool": pool.pk,
        "gpus": 1,
        "start": now.isoformat(),
        "end": (now + timedelta(days=1)).isoformat(),
    }
    body[field] = value
    url = "/api/v1/capacity/reservations/"
    for response in (
        _json(operator_client, "post", url, body),
        _json(client, "post", url, body, HTTP_AUTHORIZATION=f"Bearer {token_a}"),
    ):
        assert response.status_code == 400 and field in response.json(), response.content
    assert not Reservation.objects.exists()


def test_an_order_promised_for_year_9999_is_a_400(operator_client, site_a: Site) -> None:
    pool = make_pool(site_a)
    body = {"pool": pool.pk, "count": 8, "ordered_on": timezone.localdate().isoformat(), "promised_on": "9999-01-01"}
    response = _json(operator_client, "post", "/api/v1/capacity/orders/", body)
    assert response.status_code == 400 and "promised_on" in response.json()
    assert not ProcurementOrder.objects.exists()


@pytest.mark.parametrize("path", ["plan", "plan.csv"])
def test_a_plan_starting_near_year_10000_is_a_400_naming_start(viewer_client, site_a: Site, path: str) -> None:
    make_pool(site_a)
    response = viewer_client.get(f"/api/v1/capacity/{path}", {"months": 36, "start": "9997-01-01"})
    assert response.status_code == 400 and "start" in response.json()
    assert viewer_client.get(f"/api/v1/capacity/{path}", {"months": 36}).status_code == 200


@pytest.mark.parametrize("what", ["changes", "evals"])
def test_serving_changes_and_evals_in_year_1_are_a_400_naming_ts(operator_client, site_a: Site, what: str) -> None:
    endpoint = Endpoint.objects.create(site=site_a, name="llama", framework="vllm", model_name="llama")
    item = (
        {"ts": YEAR_1, "kind": "quantisation", "from_value": "bf16", "to_value": "fp8"}
        if what == "changes"
        else {"ts": YEAR_1, "suite": "mmlu", "metric": "accuracy", "score": 0.8, "model_version": "v3"}
    )
    response = _json(operator_client, "post", f"/api/v1/serving/endpoints/{endpoint.pk}/{what}", {"items": [item]})
    assert response.status_code == 400 and response.json()["field"] == "items[0].ts", response.content
    assert not EndpointChange.objects.exists() and not EndpointEval.objects.exists()


def test_incident_dates_out_of_bounds_are_a_400(operator_client) -> None:
    incident = raise_finding(
        "xid:GPU-1", {"gpu": "GPU-1"}, "SEV2", "XID", "", source="detector:test", actor=Actor.system("test")
    ).incident
    body = {"incident": incident.pk, "title": "RMA", "due_date": "9999-12-31"}
    response = _json(operator_client, "post", "/api/v1/action-items/", body)
    assert response.status_code == 400 and "due_date" in response.json()
    silence = {"matchers": [{"name": "site", "op": "=", "value": "a"}], "starts_at": YEAR_1, "ends_at": YEAR_9999}
    response = _json(operator_client, "post", "/api/v1/silences/", {**silence, "comment": "x"})
    assert response.status_code == 400 and "starts_at" in response.json()
    assert not ActionItem.objects.exists() and not Silence.objects.exists()
    # The incident page's form says so too, rather than failing on a date it cannot read.
    for due in ("99999", "9999-12-31"):
        page = operator_client.post(
            f"/incidents/{incident.pk}/act/", {"action": "add_item", "title": "t", "due_date": due}
        )
        assert page.status_code == 302 and not ActionItem.objects.exists()
    page = operator_client.get(incident.get_absolute_url()).content.decode()
    assert "Invalid input: due date: Is after" in page
