"""Fleet inventory API: filters, pagination, lookups by hostname and UUID, and the OpenAPI schema."""

from __future__ import annotations

import pytest

from fleet.models import Gpu, Node, Rack, Site


@pytest.fixture
def fleet(site_a: Site, site_b: Site) -> None:
    rack = Rack.objects.create(site=site_a, name="r01", power_budget_kw=45)
    for site, prefix, model in ((site_a, "ams", "NVIDIA H100 80GB HBM3"), (site_b, "iad", "NVIDIA A100-SXM4-80GB")):
        for n in range(3):
            node = Node.objects.create(site=site, hostname=f"{prefix}-{n:03d}", rack=rack if site == site_a else None)
            for i in range(8):
                Gpu.objects.create(
                    node=node, index=i, uuid=f"GPU-{prefix}{n:03d}{i:02d}-0000-0000", model=model, hbm_gib=80
                )


def test_gpus_filter_by_site_and_model_and_paginate(viewer_client, fleet) -> None:
    response = viewer_client.get("/api/v1/fleet/gpus/", {"site": "ams-1", "limit": 5})
    body = response.json()
    assert body["count"] == 24 and len(body["results"]) == 5 and body["next"]
    assert {g["site"] for g in body["results"]} == {"ams-1"}
    response = viewer_client.get("/api/v1/fleet/gpus/", {"model": "a100"})
    assert response.json()["count"] == 24
    assert {g["hostname"][:3] for g in response.json()["results"]} == {"iad"}


def test_nodes_are_looked_up_by_hostname_with_their_gpu_count(viewer_client, fleet) -> None:
    body = viewer_client.get("/api/v1/fleet/nodes/ams-001/").json()
    assert body["hostname"] == "ams-001" and body["site"] == "ams-1" and body["gpu_count"] == 8
    assert viewer_client.get("/api/v1/fleet/nodes/", {"site": "iad-2"}).json()["count"] == 3


def test_gpu_detail_by_uuid_includes_latest_state(viewer_client, fleet) -> None:
    body = viewer_client.get("/api/v1/fleet/gpus/GPU-ams00103-0000-0000/").json()
    assert body["index"] == 3 and body["hostname"] == "ams-001" and body["state"] is None


def test_a_rack_must_belong_to_the_nodes_site(admin_client, fleet, site_b) -> None:
    rack = Rack.objects.get(name="r01")
    response = admin_client.post(
        "/api/v1/fleet/nodes/",
        {"site": site_b.name, "rack": rack.pk, "hostname": "iad-100"},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "rack" in response.json()
    assert not Node.objects.filter(hostname="iad-100").exists()


def test_bad_api_input_names_the_field(admin_client) -> None:
    response = admin_client.post(
        "/api/v1/fleet/sites/", {"name": "has spaces!", "contracted_power_kw": "lots"}, content_type="application/json"
    )
    assert response.status_code == 400
    assert set(response.json()) == {"name", "contracted_power_kw"}


def test_the_openapi_schema_documents_the_api(viewer_client) -> None:
    response = viewer_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    for path in ("/api/v1/ingest/gpu-samples", "/api/v1/fleet/gpus/", "/api/v1/fleet/overview/"):
        assert path in schema["paths"], path
    assert schema["components"]["securitySchemes"]["agentToken"]["scheme"] == "bearer"
    assert viewer_client.get("/api/docs/").status_code == 200


def test_the_overview_rejects_an_unknown_range(viewer_client) -> None:
    response = viewer_client.get("/api/v1/fleet/overview/", {"range": "1y"})
    assert response.status_code == 400 and "range" in response.json()
