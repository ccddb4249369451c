"""The endpoint API: SLOs edited by Operators and refused whole when out of range; change events
and evals stored whole or refused whole with a 400 naming items[i].field; retries stored once;
agent tokens write their own site's endpoints only."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Endpoint, Gpu, Node, Site
from fleet.serving.models import EndpointChange, EndpointEval

pytestmark = pytest.mark.django_db

SLO_DEFAULTS = {
    "ttft_threshold_ms": 500.0,
    "ttft_target_pct": 99.0,
    "itl_threshold_ms": 50.0,
    "itl_target_pct": 99.0,
    "availability_target_pct": 99.9,
    "slo_window_days": 30,
}


@pytest.fixture
def endpoint(site_a: Site) -> Endpoint:
    return Endpoint.objects.create(site=site_a, name="llama-3-70b", framework="vllm", model_name="llama-3-70b")


def _ts(minutes_ago: float = 60) -> str:
    return (timezone.now() - timedelta(minutes=minutes_ago)).isoformat()


def _patch(client: Client, endpoint: Endpoint, body: dict[str, Any]) -> Any:
    return client.patch(f"/api/v1/fleet/endpoints/{endpoint.pk}/", json.dumps(body), content_type="application/json")


def _post(client: Client, endpoint: Endpoint, what: str, body: Any, token: str | None = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(
        f"/api/v1/serving/endpoints/{endpoint.pk}/{what}", json.dumps(body), content_type="application/json", **headers
    )


def _slos(endpoint: Endpoint) -> dict[str, Any]:
    endpoint.refresh_from_db()
    return {name: getattr(endpoint, name) for name in SLO_DEFAULTS}


def _eval(**fields: Any) -> dict[str, Any]:
    return {"ts": _ts(), "suite": "mmlu", "metric": "accuracy", "score": 0.812, "model_version": "v3", **fields}


def _change(**fields: Any) -> dict[str, Any]:
    return {"ts": _ts(), "kind": "quantisation", "from_value": "bf16", "to_value": "fp8", **fields}


# --- SLOs on the endpoint ---------------------------------------------------------------------


def test_a_new_endpoint_has_the_default_slos_and_get_shows_them(viewer_client: Client, endpoint: Endpoint) -> None:
    response = viewer_client.get(f"/api/v1/fleet/endpoints/{endpoint.pk}/")
    assert response.status_code == 200
    body = response.json()
    assert {name: body[name] for name in SLO_DEFAULTS} == SLO_DEFAULTS
    assert body["replicas"] == 1 and body["region"] == "" and body["gpus"] == [] and body["scrape_targets"] == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttft_target_pct", 0),  # no request need be fast: not an objective
        ("ttft_target_pct", 100),  # no error budget at all: every burn rate is a division by zero
        ("itl_target_pct", -1),
        ("availability_target_pct", 100.5),
        ("ttft_threshold_ms", 0),
        ("itl_threshold_ms", -5),
        ("slo_window_days", 0),
        ("slo_window_days", 91),
        ("replicas", 0),
    ],
)
def test_an_slo_out_of_range_is_a_400_naming_the_field_and_nothing_changes(
    operator_client: Client, endpoint: Endpoint, field: str, value: float
) -> None:
    # A valid field alongside the bad one: the whole PATCH is refused, not the bad field alone.
    response = _patch(operator_client, endpoint, {"region": "us-east-1", field: value})
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert _slos(endpoint) == SLO_DEFAULTS
    assert endpoint.region == "" and endpoint.replicas == 1


def test_an_operator_sets_the_slos_region_replicas_and_gpus(
    operator_client: Client, endpoint: Endpoint, site_a: Site
) -> None:
    node = Node.objects.create(site=site_a, hostname="gpu-a-001")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", model="H100")
    body = {
        "ttft_threshold_ms": 800,
        "ttft_target_pct": 95.5,
        "itl_target_pct": 99.5,
        "availability_target_pct": 99.95,
        "slo_window_days": 28,
        "region": "eu-west-4",
        "replicas": 4,
        "gpus": [gpu.uuid],
    }
    response = _patch(operator_client, endpoint, body)
    assert response.status_code == 200, response.content
    assert response.json()["gpus"] == [gpu.uuid]
    assert _slos(endpoint) == {**SLO_DEFAULTS, **{k: v for k, v in body.items() if k in SLO_DEFAULTS}}
    assert (endpoint.region, endpoint.replicas, list(endpoint.gpus.all())) == ("eu-west-4", 4, [gpu])


def test_gpus_of_another_site_are_refused(operator_client: Client, endpoint: Endpoint, site_b: Site) -> None:
    node = Node.objects.create(site=site_b, hostname="gpu-b-001")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-bbbbbbbb-0000-0000-0000-000000000001", model="H100")
    response = _patch(operator_client, endpoint, {"gpus": [gpu.uuid]})
    assert response.status_code == 400
    assert list(response.json()) == ["gpus"]
    assert not endpoint.gpus.exists()


def test_a_viewer_cannot_edit_the_slos(viewer_client: Client, endpoint: Endpoint) -> None:
    assert _patch(viewer_client, endpoint, {"ttft_target_pct": 95}).status_code == 403
    assert _slos(endpoint) == SLO_DEFAULTS


# --- changes and evals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({k: v for k, v in _eval().items() if k != "score"}, "score"),  # missing
        (_eval(score="NaN"), "score"),
        (_eval(score="Infinity"), "score"),
        (_eval(ts="yesterday"), "ts"),
        (_eval(ts=(timezone.now() + timedelta(days=2)).isoformat()), "ts"),  # a clock two days ahead
        (_eval(suite=""), "suite"),
        (_eval(scor=0.5), "scor"),  # a misspelt field is not dropped silently
    ],
)
def test_a_bad_eval_is_a_400_naming_items_i_field_and_nothing_is_written(
    operator_client: Client, endpoint: Endpoint, item: dict[str, Any], field: str
) -> None:
    # Two good items around the bad one: the batch is stored whole or not at all.
    response = _post(operator_client, endpoint, "evals", {"items": [_eval(), item, _eval(metric="f1")]})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == f"items[1].{field}"
    assert not EndpointEval.objects.exists()


@pytest.mark.parametrize(
    ("item", "field"),
    [
        (_change(kind="weights"), "kind"),  # not one of model / quantisation / kernel / framework / config
        ({k: v for k, v in _change().items() if k != "kind"}, "kind"),
        (_change(ts="2026-13-01T00:00:00Z"), "ts"),
        (_change(to_value="x" * 201), "to_value"),
    ],
)
def test_a_bad_change_is_a_400_naming_items_i_field_and_nothing_is_written(
    operator_client: Client, endpoint: Endpoint, item: dict[str, Any], field: str
) -> None:
    response = _post(operator_client, endpoint, "changes", {"items": [_change(), _change(), item]})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == f"items[2].{field}"
    assert not EndpointChange.objects.exists()


def test_a_single_bad_object_names_the_field(operator_client: Client, endpoint: Endpoint) -> None:
    response = _post(operator_client, endpoint, "changes", _change(kind="nope"))
    assert response.status_code == 400
    assert response.json()["field"] == "kind"
    assert not EndpointChange.objects.exists()


def test_more_than_1000_items_are_refused_and_nothing_is_written(operator_client: Client, endpoint: Endpoint) -> None:
    response = _post(operator_client, endpoint, "evals", {"items": [_eval(id=f"e{i}") for i in range(1001)]})
    assert response.status_code == 400
    assert response.json()["field"] == "items"
    assert not EndpointEval.objects.exists()
    # 1000 is the limit, not over it.
    response = _post(operator_client, endpoint, "evals", {"items": [_eval(id=f"e{i}") for i in range(1000)]})
    assert response.status_code == 201
    assert EndpointEval.objects.count() == 1000


def test_a_repeated_id_inside_one_batch_is_refused(operator_client: Client, endpoint: Endpoint) -> None:
    response = _post(operator_client, endpoint, "evals", {"items": [_eval(id="a"), _eval(id="a")]})
    assert response.status_code == 400
    assert response.json()["field"] == "items[1].id"
    assert not EndpointEval.objects.exists()


def test_a_retry_with_the_same_ids_writes_once(operator_client: Client, endpoint: Endpoint) -> None:
    batch = {"items": [_change(id="c1"), _change(id="c2", kind="kernel", from_value="fa2", to_value="fa3")]}
    first = _post(operator_client, endpoint, "changes", batch)
    assert (first.status_code, first.json()) == (201, {"written": 2, "repeated": 0})
    # The retry brings one new item: the two known are skipped and counted, the new one is written.
    retry = {"items": [*batch["items"], _change(id="c3", kind="model")]}
    second = _post(operator_client, endpoint, "changes", retry)
    assert (second.status_code, second.json()) == (201, {"written": 1, "repeated": 2})
    assert sorted(EndpointChange.objects.values_list("client_id", flat=True)) == ["c1", "c2", "c3"]
    assert EndpointChange.objects.get(client_id="c1").created_by.username == "oscar"
    again = _post(operator_client, endpoint, "changes", retry)
    assert (again.status_code, again.json()) == (200, {"written": 0, "repeated": 3})
    assert EndpointChange.objects.count() == 3


def test_an_agent_of_the_endpoints_site_posts_and_another_sites_agent_gets_403(
    endpoint: Endpoint, token_a: str, token_b: str
) -> None:
    client = Client()
    assert _post(client, endpoint, "evals", _eval(id="e1"), token=token_b).status_code == 403
    assert _post(client, endpoint, "changes", _change(id="c1"), token=token_b).status_code == 403
    assert not EndpointEval.objects.exists() and not EndpointChange.objects.exists()
    ok = _post(client, endpoint, "evals", _eval(id="e1", score=0.5, higher_is_better=False), token=token_a)
    assert (ok.status_code, ok.json()) == (201, {"written": 1, "repeated": 0})
    stored = EndpointEval.objects.get()
    assert (stored.score, stored.higher_is_better, stored.client_id) == (0.5, False, "e1")
    change = _post(client, endpoint, "changes", _change(id="c1"), token=token_a)
    assert change.status_code == 201
    assert EndpointChange.objects.get().created_by is None  # an agent is no person
    # An agent writes; it reads nothing.
    assert (
        client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/evals", HTTP_AUTHORIZATION=f"Bearer {token_a}").status_code
        == 403
    )


def test_every_role_reads_and_a_viewer_cannot_write(
    operator_client: Client, viewer_client: Client, endpoint: Endpoint
) -> None:
    _post(operator_client, endpoint, "evals", {"items": [_eval(id="late", ts=_ts(5)), _eval(id="early", ts=_ts(50))]})
    response = viewer_client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/evals")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["id"] for r in results] == ["early", "late"]  # oldest first
    assert results[0]["score"] == 0.812 and results[0]["suite"] == "mmlu"
    assert _post(viewer_client, endpoint, "evals", _eval()).status_code == 403
    assert _post(viewer_client, endpoint, "changes", _change()).status_code == 403
    assert EndpointEval.objects.count() == 2
    assert viewer_client.get("/api/v1/serving/endpoints/999999/changes").status_code == 404


# --- capacity changes and the SLO read ----------------------------------------------------------


def test_a_replica_load_keeps_its_ready_time(operator_client: Client, endpoint: Endpoint) -> None:
    item = _change(kind="replica_load", from_value="", to_value="replica-3", ts=_ts(10), ready_at=_ts(4))
    assert _post(operator_client, endpoint, "changes", item).status_code == 201
    change = EndpointChange.objects.get()
    assert (change.ready_at - change.ts).total_seconds() == pytest.approx(360, abs=1)
    listed = operator_client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/changes").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert rows[0]["kind"] == "replica_load" and rows[0]["ready_at"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (_change(ready_at=_ts(1)), "ready time"),  # a quantisation change has no ready time
        (_change(kind="scale_out", ts=_ts(5), ready_at=_ts(20)), "before ts"),
        (_change(kind="scale_out", ready_at="not a time"), "Datetime"),
    ],
)
def test_a_bad_ready_time_is_a_400_naming_it_and_nothing_is_written(
    operator_client: Client, endpoint: Endpoint, item: dict[str, Any], message: str
) -> None:
    response = _post(operator_client, endpoint, "changes", {"items": [_change(), item]})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "items[1].ready_at"
    assert message.lower() in response.json()["error"].lower()
    assert not EndpointChange.objects.exists()


def test_the_slo_read_gives_budget_and_burn_rates_from_rollups(viewer_client: Client, endpoint: Endpoint) -> None:
    from fleet.serving import rollups as serving_rollups
    from fleet.serving.store import ServingPoint, store_serving_points

    now = timezone.now()
    ok, name = "vllm:request_success_total", endpoint.name
    points = [
        ServingPoint(name, "vllm", name, now - timedelta(minutes=3), ok, 'finished_reason="stop"', 0),
        ServingPoint(name, "vllm", name, now - timedelta(minutes=3), ok, 'finished_reason="error"', 0),
        ServingPoint(name, "vllm", name, now - timedelta(minutes=2), ok, 'finished_reason="stop"', 997),
        ServingPoint(name, "vllm", name, now - timedelta(minutes=2), ok, 'finished_reason="error"', 3),
    ]
    store_serving_points(site_id=endpoint.site_id, batch_key="slo", points=points)
    serving_rollups.roll_everything()
    body = viewer_client.get(f"/api/v1/serving/endpoints/{endpoint.pk}/slo").json()
    availability = body["slo"]["availability"]
    assert availability["sli"] == pytest.approx(0.997)
    assert availability["windows"]["5m"]["burn_rate"] == pytest.approx(3.0)  # 0.3 % errors / 0.1 % allowed
    assert availability["budget_left"] == pytest.approx(-2.0)
    # 3x burns neither page rule (14.4x, 6x) but both ticket windows (1x over 3 d and 6 h); the
    # ticket counts only once the data spans its short window (6 h), and these are 3 minutes.
    assert availability["windows"]["6h"]["burn_rate"] == availability["windows"]["3d"]["burn_rate"] == 3.0
    assert availability["alerts"] == []
    coverage = body["slo"]["coverage"]
    # The first scrape only starts the counters: the data begins with the minute of the second.
    assert coverage["since"] == (now - timedelta(minutes=2)).replace(second=0, microsecond=0).isoformat()
    assert coverage["period_days"] == 30 and coverage["complete"] is False
    assert set(availability["windows"]) == {"5m", "30m", "1h", "6h", "3d"}
    assert body["since_start"]["requests"]["requests_failed"] == 3
