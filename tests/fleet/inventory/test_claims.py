"""A GPU UUID or hostname of one site sent by another site's token is a claim an Admin resolves
(fleet.inventory.claims): recorded and counted, its samples held back (409 naming the value) while
the rest of the batch is written, shown on the fleet page and resolved in the admin (kept or
moved), with an audit trail."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from compliance.models import AuditEntry
from fleet.inventory import claims
from fleet.models import ClaimConflict, Gpu, GpuSample, Node, Rack, Site
from fleet.telemetry.store import store_gpu_samples
from tests.conftest import make_sample, post_batch

pytestmark = pytest.mark.django_db

B_GPU = "GPU-bbbbbbbb-0000-0000-0000-000000000001"
ADMIN_LIST = "/admin/fleet/claimconflict/"


@pytest.fixture
def gpu_b(site_b: Site) -> Gpu:
    rack = Rack.objects.create(site=site_b, name="r1")
    node = Node.objects.create(site=site_b, rack=rack, hostname="gpu-b-001")
    return Gpu.objects.create(node=node, index=0, uuid=B_GPU, model="NVIDIA H100 80GB HBM3")


def _admin_action(client: Client, action: str, conflict: ClaimConflict) -> Any:
    return client.post(ADMIN_LIST, {"action": action, "_selected_action": [conflict.pk]}, follow=True)


def test_a_sighting_is_recorded_once_per_claimant_and_counted(client, token_a, site_a, site_b, gpu_b) -> None:
    for _ in range(2):
        response = post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
        assert response.status_code == 409
        [held] = response.json()["held_back"]
        assert held["value"] == B_GPU and held["state"] == "pending"
        assert "pending Admin resolution" in held["detail"] and "iad-2" in held["detail"]
    claim = ClaimConflict.objects.get()
    assert (claim.kind, claim.value, claim.owner_site, claim.claimant_site) == ("uuid", B_GPU, site_b, site_a)
    assert claim.count == 2 and claim.claimant_hostname == "gpu-a-007" and claim.first_seen <= claim.last_seen
    assert not GpuSample.objects.exists()
    assert not Node.objects.filter(hostname="gpu-a-007").exists()  # nothing half-registered


def test_the_owner_keeps_writing_its_gpu_while_the_claim_is_pending(client, token_a, token_b, gpu_b) -> None:
    post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
    response = post_batch(client, token_b, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-b-001")]})
    assert response.status_code == 202
    assert GpuSample.objects.filter(gpu=gpu_b).count() == 1


def test_the_writer_drops_another_sites_samples_that_reach_it(site_a, gpu_b) -> None:
    """A Prometheus push is parsed again by the worker, and a GPU may move between the door and the
    write: the one writer never writes a site's samples onto another site's GPU."""
    from fleet.ingest.batches import GpuBatchIn, parse_gpu_batch

    samples = [make_sample(), make_sample(gpu_uuid=B_GPU, hostname="gpu-a-001")]
    batch: GpuBatchIn = parse_gpu_batch(__import__("json").dumps({"samples": samples}).encode())
    assert store_gpu_samples(site_id=site_a.pk, batch_key="raced", samples=batch.samples) == 1
    assert not GpuSample.objects.filter(gpu=gpu_b).exists() and GpuSample.objects.count() == 1


def test_the_fleet_page_shows_the_pending_claims_and_an_admin_the_way_to_them(
    client, token_a, gpu_b, viewer_client, admin_client
) -> None:
    assert 'id="claim-conflicts"' not in viewer_client.get("/fleet/").content.decode()
    post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
    viewer_page = viewer_client.get("/fleet/").content.decode()
    assert 'id="claim-conflicts"' in viewer_page and "1 claim of a GPU or node" in viewer_page
    assert ADMIN_LIST not in viewer_page
    admin_page = admin_client.get("/fleet/").content.decode()
    assert f'href="{ADMIN_LIST}?resolution__exact="' in admin_page
    assert B_GPU in admin_client.get(f"{ADMIN_LIST}?resolution__exact=").content.decode()


def test_an_admin_moves_the_gpu_to_the_claimant_and_its_samples_flow(
    client, token_a, token_b, site_a, gpu_b, admin_client
) -> None:
    post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
    claim = ClaimConflict.objects.get()
    page = _admin_action(admin_client, "move_to_claimant", claim).content.decode()
    assert "1 claim(s) resolved" in page
    claim.refresh_from_db()
    assert claim.resolution == "moved" and claim.resolved_by.username == "ada" and claim.resolved_at
    gpu_b.refresh_from_db()
    assert gpu_b.node.hostname == "gpu-a-007" and gpu_b.node.site == site_a
    # Audited: the claim's resolution and the GPU's move, both by the Admin.
    assert AuditEntry.objects.filter(model="claimconflict", object_id=str(claim.pk), actor="ada").exists()
    assert AuditEntry.objects.filter(model="gpu", object_id=str(gpu_b.pk), action="update", actor="ada").exists()
    response = post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
    assert response.status_code == 202 and GpuSample.objects.filter(gpu=gpu_b).count() == 1
    # Now the old owner's samples of it are the claim.
    response = post_batch(client, token_b, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-b-001")]})
    assert response.status_code == 409 and ClaimConflict.objects.pending().get().claimant_site.name == "iad-2"


def test_an_admin_keeps_it_with_the_owner_and_the_claimants_samples_stay_refused(
    client, token_a, gpu_b, admin_client
) -> None:
    post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
    claim = ClaimConflict.objects.get()
    _admin_action(admin_client, "keep_with_owner", claim)
    claim.refresh_from_db()
    assert claim.resolution == "kept" and claim.resolved_by.username == "ada"
    gpu_b.refresh_from_db()
    assert gpu_b.node.hostname == "gpu-b-001"
    response = post_batch(client, token_a, {"samples": [make_sample(), make_sample(gpu_uuid=B_GPU, hostname="x")]})
    assert response.status_code == 403 and response.json()["held_back"][0]["state"] == "kept"
    assert response.json()["accepted"] == 1 and GpuSample.objects.count() == 1
    assert ClaimConflict.objects.count() == 1 and not ClaimConflict.objects.pending().exists()
    # Resolved once: a second resolution is refused, and changes nothing.
    with pytest.raises(claims.ClaimError):
        claims.resolve(claim, resolution="moved", actor=None)
    gpu_b.refresh_from_db()
    assert gpu_b.node.hostname == "gpu-b-001"


def test_moving_a_node_takes_it_out_of_its_rack_and_settles_its_gpus_claims(
    client, token_a, site_a, gpu_b, admin_client
) -> None:
    response = post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-b-001")]})
    assert response.status_code == 409
    assert {h["field"] for h in response.json()["held_back"]} == {"gpu_uuid", "hostname"}
    node_claim = ClaimConflict.objects.get(kind="hostname")
    _admin_action(admin_client, "move_to_claimant", node_claim)
    node = Node.objects.get(hostname="gpu-b-001")
    assert node.site == site_a and node.rack is None
    assert not ClaimConflict.objects.pending().exists()  # the GPU came with its node
    assert set(ClaimConflict.objects.values_list("resolution", flat=True)) == {"moved"}
    assert (
        post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-b-001")]}).status_code == 202
    )


def test_an_operator_cannot_resolve_a_claim(client, token_a, gpu_b, operator_client) -> None:
    post_batch(client, token_a, {"samples": [make_sample(gpu_uuid=B_GPU, hostname="gpu-a-007")]})
    claim = ClaimConflict.objects.get()
    response = operator_client.post(ADMIN_LIST, {"action": "move_to_claimant", "_selected_action": [claim.pk]})
    assert response.status_code in (302, 403)
    claim.refresh_from_db()
    assert claim.resolved_at is None
    assert Gpu.objects.get(uuid=B_GPU).node.hostname == "gpu-b-001"
