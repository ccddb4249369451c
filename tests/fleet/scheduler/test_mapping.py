"""Mapping a scheduler queue to the capacity pool and team it stands for: suggested from matching
names, set by Operators through the API and the page (audited), refused naming the field for a
pool of another site or an unknown team, read by every role."""

from __future__ import annotations

import pytest

from compliance.models import AuditEntry
from console import roles
from fleet.models import Pool, SchedulerQueue, Team
from fleet.scheduler.mapping import gpu_model_slug, normalise, suggest_team
from tests.conftest import _client_for, _make_user
from tests.fleet.scheduler.support import KUEUE, push

API = "/api/v1/scheduler/queues/"
PAGE = "/scheduler/queues/"


def kueue_queues(*names: str, cohort: str = "gpu-cohort") -> str:
    """A Kueue exposition naming ClusterQueues in one cohort (their GPU nominal quota, 8 each)."""
    lines = ["# TYPE kueue_cluster_queue_nominal_quota gauge"]
    lines += [
        f'kueue_cluster_queue_nominal_quota{{cluster_queue="{n}",cohort="{cohort}",flavor="default",'
        f'resource="nvidia.com/gpu"}} 8'
        for n in names
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def fleet_a(site_a, site_b):  # type: ignore[no-untyped-def]
    """Pools at site A (H100 and A100) and one H100 pool at site B; teams alpha, beta, alpha-2."""
    return {
        "h100": Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="h100 reserved"),
        "a100": Pool.objects.create(site=site_a, gpu_model="NVIDIA A100-SXM4-80GB", name="training"),
        "h100_b": Pool.objects.create(site=site_b, gpu_model="NVIDIA H100 80GB HBM3", name="h100 reserved"),
        "alpha": Team.objects.create(name="alpha"),
        "beta": Team.objects.create(name="beta"),
        "alpha2": Team.objects.create(name="Alpha-2"),
    }


def _queue(name: str) -> SchedulerQueue:
    return SchedulerQueue.objects.get(scheduler="kueue", name=name)


def test_names_compare_as_lowercase_alphanumerics_and_a_gpu_model_by_its_own_word() -> None:
    assert normalise("Team-Alpha_H100") == "teamalphah100"
    assert gpu_model_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_model_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_model_slug("AMD Instinct MI300X") == "mi300x"


def test_the_longest_matching_team_wins_and_a_tie_suggests_none(db) -> None:  # type: ignore[no-untyped-def]
    teams = [Team(name="alpha"), Team(name="alpha-2"), Team(name="beta")]
    assert suggest_team("team-alpha-h100", teams).name == "alpha"
    assert suggest_team("alpha-2-h100", teams).name == "alpha-2"
    assert suggest_team("alpha", teams).name == "alpha"
    assert suggest_team("gamma", teams) is None
    assert suggest_team("alpha-beta", [Team(name="alpha"), Team(name="betas"), Team(name="gamma")]).name == "alpha"
    assert suggest_team("ab", [Team(name="a"), Team(name="b")]) is None  # a tie: no guess


def test_any_role_lists_queues_with_their_suggested_pool_and_team(
    client, site_a, token_a, viewer_client, fleet_a
) -> None:
    body = kueue_queues("team-alpha-h100", "beta") + kueue_queues("alpha-2-a100", cohort="a100-cohort")
    assert push(client, token_a, body).status_code == 202
    response = viewer_client.get(API)
    assert response.status_code == 200, response.content
    rows = {r["name"]: r for r in response.json()["results"]}
    assert rows["team-alpha-h100"] == {
        "id": _queue("team-alpha-h100").pk,
        "site": site_a.name,
        "scheduler": "kueue",
        "kind": "clusterqueue",
        "name": "team-alpha-h100",
        "cohort": "gpu-cohort",
        "pool": None,
        "team": None,
        "suggested_pool": fleet_a["h100"].pk,  # the GPU model's word in the queue's name, at its own site
        "suggested_team": "alpha",
    }
    assert (rows["beta"]["suggested_team"], rows["beta"]["suggested_pool"]) == ("beta", None)
    # The team whose name matches longest; the pool whose name or model the cohort holds.
    assert (rows["alpha-2-a100"]["suggested_team"], rows["alpha-2-a100"]["suggested_pool"]) == (
        "Alpha-2",
        fleet_a["a100"].pk,
    )


def test_an_operator_maps_a_queue_to_a_pool_and_team_audited(client, token_a, operator_client, fleet_a) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    queue = _queue("team-a-h100")
    response = operator_client.patch(
        f"{API}{queue.pk}/", {"pool": fleet_a["h100"].pk, "team": "alpha"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert (response.json()["pool"], response.json()["team"]) == (fleet_a["h100"].pk, "alpha")
    queue.refresh_from_db()
    assert (queue.pool, queue.team, queue.name, queue.cohort) == (
        fleet_a["h100"],
        fleet_a["alpha"],
        "team-a-h100",
        "h100-pool",
    )
    entry = AuditEntry.objects.get(model="schedulerqueue", object_id=str(queue.pk), action="update")
    assert entry.actor == "oscar"
    assert (entry.before["pool"], entry.after["pool"]) == (None, fleet_a["h100"].pk)
    assert (entry.before["team"], entry.after["team"]) == (None, fleet_a["alpha"].pk)
    # Unmapping is a change too.
    assert (
        operator_client.patch(f"{API}{queue.pk}/", {"team": None}, content_type="application/json").status_code == 200
    )
    queue.refresh_from_db()
    assert queue.team is None and queue.pool == fleet_a["h100"]


def test_a_pool_of_another_site_or_an_unknown_team_is_refused_naming_the_field(
    client, token_a, admin_client, fleet_a
) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    queue = _queue("team-a-h100")
    url = f"{API}{queue.pk}/"
    other_site = admin_client.patch(url, {"pool": fleet_a["h100_b"].pk}, content_type="application/json")
    assert other_site.status_code == 400 and "another site" in other_site.json()["pool"][0]
    unknown = admin_client.patch(url, {"team": "nobody"}, content_type="application/json")
    assert unknown.status_code == 400 and "team" in unknown.json()
    # What Kueue reports is not the console's to change.
    admin_client.patch(url, {"name": "renamed", "cohort": "x"}, content_type="application/json")
    queue.refresh_from_db()
    assert (queue.pool, queue.team, queue.name, queue.cohort) == (None, None, "team-a-h100", "h100-pool")
    assert not AuditEntry.objects.filter(model="schedulerqueue", action="update").exists()


def test_viewers_and_capacity_approvers_read_but_do_not_map(client, token_a, viewer_client, fleet_a) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    queue = _queue("team-a-h100")
    approver = _client_for(_make_user("cappy", roles.CAPACITY_APPROVER))
    for reader in (viewer_client, approver):
        assert reader.get(f"{API}{queue.pk}/").status_code == 200
        refused = reader.patch(f"{API}{queue.pk}/", {"team": "alpha"}, content_type="application/json")
        assert refused.status_code == 403
    queue.refresh_from_db()
    assert queue.team is None


def test_the_page_lists_queues_and_offers_forms_only_to_operators(
    client, token_a, viewer_client, operator_client, fleet_a
) -> None:
    assert push(client, token_a, kueue_queues("team-alpha-h100")).status_code == 202
    seen = viewer_client.get(PAGE)
    assert seen.status_code == 200
    html = seen.content.decode()
    assert "team-alpha-h100" in html and "Quota drift" in html
    assert 'data-action="accept"' not in html and 'data-action="map"' not in html
    html = operator_client.get(PAGE).content.decode()
    assert 'data-action="accept"' in html and 'data-action="map"' in html
    assert viewer_client.post(PAGE, {"action": "accept", "id": _queue("team-alpha-h100").pk}).status_code == 403


def test_an_operator_accepts_the_suggestion_on_the_page_audited(client, token_a, operator_client, fleet_a) -> None:
    assert push(client, token_a, kueue_queues("team-alpha-h100")).status_code == 202
    queue = _queue("team-alpha-h100")
    response = operator_client.post(PAGE, {"action": "accept", "id": queue.pk})
    assert response.status_code == 302 and response.url == PAGE
    queue.refresh_from_db()
    assert (queue.pool, queue.team) == (fleet_a["h100"], fleet_a["alpha"])
    entry = AuditEntry.objects.get(model="schedulerqueue", object_id=str(queue.pk), action="update")
    assert entry.actor == "oscar" and entry.after["team"] == fleet_a["alpha"].pk
    # Once taken, nothing is left to accept.
    assert f'data-queue="{queue.pk}"' in operator_client.get(PAGE).content.decode()
    assert 'data-action="accept"' not in operator_client.get(PAGE).content.decode()


def test_the_page_form_sets_and_refuses_like_the_api(client, token_a, operator_client, fleet_a) -> None:
    assert push(client, token_a, kueue_queues("gpu-queue")).status_code == 202
    queue = _queue("gpu-queue")
    refused = operator_client.post(PAGE, {"action": "map", "id": queue.pk, "pool": fleet_a["h100_b"].pk, "team": ""})
    assert refused.status_code == 400 and 'data-field="pool"' in refused.content.decode()
    refused = operator_client.post(PAGE, {"action": "map", "id": queue.pk, "pool": "", "team": "nobody"})
    assert refused.status_code == 400 and 'data-field="team"' in refused.content.decode()
    queue.refresh_from_db()
    assert (queue.pool, queue.team) == (None, None)
    done = operator_client.post(PAGE, {"action": "map", "id": queue.pk, "pool": fleet_a["a100"].pk, "team": "beta"})
    assert done.status_code == 302
    queue.refresh_from_db()
    assert (queue.pool, queue.team) == (fleet_a["a100"], fleet_a["beta"])
