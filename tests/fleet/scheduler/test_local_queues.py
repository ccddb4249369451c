"""Kueue LocalQueues and Slurm accounts: registered as queues of their own kind from the
exporters' series, a team suggested from a matching name (the LocalQueue's namespace or its own
name, the account's), the team set through the API and the page (audited) but never a pool, and
their pending and admitted figures on the team's page."""

from __future__ import annotations

import re

import pytest

from compliance.models import AuditEntry
from fleet.models import SchedulerQueue, Team
from fleet.scheduler.read import team_queues
from tests.fleet.capacity import make_pool, team
from tests.fleet.scheduler.support import KUEUE, SLURM, minute_ago, push
from tests.fleet.scheduler.test_pool_queues import scrape

pytestmark = pytest.mark.django_db

API = "/api/v1/scheduler/queues/"
PAGE = "/scheduler/queues/"


def _queue(kind: str, name: str) -> SchedulerQueue:
    return SchedulerQueue.objects.get(kind=kind, name=name)


@pytest.fixture
def pushed(client, token_a) -> None:  # type: ignore[no-untyped-def]
    """Kueue's and the Slurm exporter's fixtures a minute ago; teams team-a and team-b exist."""
    team("team-a")
    team("team-b")
    assert push(client, token_a, scrape(KUEUE, minute_ago(1))).status_code == 202
    assert push(client, token_a, scrape(SLURM, minute_ago(1))).status_code == 202


def test_local_queues_and_accounts_are_registered_by_kind_beside_cluster_queues_and_partitions(pushed) -> None:
    kinds = sorted(SchedulerQueue.objects.values_list("scheduler", "kind", "name"))
    assert kinds == [
        ("kueue", "clusterqueue", "team-a-h100"),
        ("kueue", "clusterqueue", "team-b-h100"),
        ("kueue", "localqueue", "team-a/training"),
        ("kueue", "localqueue", "team-b/batch"),
        ("slurm", "account", "team-a"),
        ("slurm", "account", "team-b"),
        ("slurm", "cluster", ""),
        ("slurm", "partition", "debug"),
        ("slurm", "partition", "h100"),
    ]
    assert _queue("localqueue", "team-a/training").cohort == ""  # Kueue labels a LocalQueue with no cohort


def test_a_local_queue_or_account_named_like_a_team_suggests_it_and_no_pool(pushed, site_a, viewer_client) -> None:
    make_pool(site_a, name="h100")  # matches the partition and the ClusterQueues' cohort, not the others
    Team.objects.create(name="training")
    rows = {(r["kind"], r["name"]): r for r in viewer_client.get(API).json()["results"]}
    # team-a/training holds both team-a and training: the longer match wins ("training", 8 > 5).
    assert rows[("localqueue", "team-a/training")]["suggested_team"] == "training"
    assert rows[("localqueue", "team-b/batch")]["suggested_team"] == "team-b"  # from its namespace
    assert rows[("account", "team-a")]["suggested_team"] == "team-a"
    for key in (("localqueue", "team-b/batch"), ("account", "team-a"), ("account", "team-b")):
        assert rows[key]["suggested_pool"] is None, key
    assert rows[("partition", "h100")]["suggested_pool"] is not None


def test_an_operator_sets_a_local_queues_and_an_accounts_team_audited(pushed, operator_client) -> None:
    for kind, name, owner in (("localqueue", "team-b/batch", "team-b"), ("account", "team-a", "team-a")):
        queue = _queue(kind, name)
        response = operator_client.patch(f"{API}{queue.pk}/", {"team": owner}, content_type="application/json")
        assert response.status_code == 200, response.content
        assert (response.json()["kind"], response.json()["team"], response.json()["pool"]) == (kind, owner, None)
        queue.refresh_from_db()
        assert queue.team == Team.objects.get(name=owner)
        entry = AuditEntry.objects.get(model="schedulerqueue", object_id=str(queue.pk), action="update")
        assert entry.actor == "oscar" and (entry.before["team"], entry.after["team"]) == (None, queue.team_id)


def test_a_pool_is_refused_for_a_local_queue_or_an_account_naming_the_field(pushed, site_a, operator_client) -> None:
    pool = make_pool(site_a)
    for kind, name in (("localqueue", "team-a/training"), ("account", "team-b")):
        queue = _queue(kind, name)
        refused = operator_client.patch(
            f"{API}{queue.pk}/", {"pool": pool.pk, "team": "team-a"}, content_type="application/json"
        )
        assert refused.status_code == 400 and "team only" in refused.json()["pool"][0], refused.content
        page = operator_client.post(PAGE, {"action": "map", "id": queue.pk, "pool": pool.pk, "team": "team-a"})
        assert page.status_code == 400 and 'data-field="pool"' in page.content.decode()
        queue.refresh_from_db()
        assert (queue.pool, queue.team) == (None, None)
    assert not AuditEntry.objects.filter(model="schedulerqueue", action="update").exists()


def test_the_page_lists_them_offers_a_team_but_no_pool_and_accepts_the_team_suggestion(
    pushed, site_a, operator_client
) -> None:
    make_pool(site_a)
    html = operator_client.get(PAGE).content.decode()
    batch, account = _queue("localqueue", "team-b/batch"), _queue("account", "team-a")
    for queue in (batch, account):
        row = re.search(rf'<tr data-queue="{queue.pk}" data-kind="{queue.kind}"[^>]*>(.*?)</tr>', html, re.S)
        assert row and queue.name in row[1], queue
        assert f'id="team-{queue.pk}"' in row[1] and f'id="pool-{queue.pk}"' not in row[1]
        assert "team only" in row[1] and 'data-action="accept"' in row[1]
    partition = _queue("partition", "h100")
    assert f'id="pool-{partition.pk}"' in html
    # The form without a pool sets the team; accepting the suggestion takes the team alone.
    assert operator_client.post(PAGE, {"action": "map", "id": account.pk, "team": "team-a"}).status_code == 302
    assert operator_client.post(PAGE, {"action": "accept", "id": batch.pk}).status_code == 302
    account.refresh_from_db()
    batch.refresh_from_db()
    assert (account.team.name, account.pool) == ("team-a", None)
    assert (batch.team.name, batch.pool) == ("team-b", None)


def test_a_teams_page_shows_its_local_queues_and_accounts_pending_and_admitted(pushed, viewer_client) -> None:
    SchedulerQueue.objects.filter(name__in=["team-b/batch", "team-b"], kind__in=["localqueue", "account"]).update(
        team=team("team-b")
    )
    rows = {q["name"]: q for q in team_queues(Team.objects.get(name="team-b").pk)}
    # Kueue's fixture: team-b/batch has 3 active and 4 inadmissible pending, 2 admitted active;
    # the Slurm fixture: account team-b has 14 jobs pending and 12 running.
    assert {k: rows["team-b/batch"][k] for k in ("kind", "pending", "inadmissible", "admitted")} == {
        "kind": "LocalQueue",
        "pending": 3,
        "inadmissible": 4,
        "admitted": 2,
    }
    assert {k: rows["team-b"][k] for k in ("kind", "pending", "inadmissible", "admitted")} == {
        "kind": "Account",
        "pending": 14,
        "inadmissible": None,
        "admitted": 12,
    }
    html = viewer_client.get(f"/capacity/teams/{Team.objects.get(name='team-b').pk}/").content.decode()
    for q in rows.values():
        row = re.search(rf'<tr data-local-queue="{q["id"]}"[^>]*>(.*?)</tr>', html, re.S)
        assert row and q["name"] in row[1]
        cells = dict(re.findall(r'data-value="(\w+)">([^<]*)', row[1]))
        assert cells == {
            "pending": f"{q['pending']:.0f}",
            "inadmissible": "–" if q["inadmissible"] is None else f"{q['inadmissible']:.0f}",
            "admitted": f"{q['admitted']:.0f}",
        }
    team_a = viewer_client.get(f"/capacity/teams/{Team.objects.get(name='team-a').pk}/").content.decode()
    assert 'id="team-local-queues"' not in team_a  # nothing mapped to team-a
