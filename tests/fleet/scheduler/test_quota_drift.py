"""Quota drift: Kueue's GPU quota per ClusterQueue (pushed through the Prometheus door) against the
console's TeamQuota for the queue's team and pool; the scheduler's values imported by an Admin or
a Capacity approver (audited, within TeamQuota's rules), refused for Operators and Viewers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from compliance.models import AuditEntry
from console import roles
from fleet.models import Pool, SchedulerQueue, Team, TeamQuota
from fleet.scheduler.drift import quota_drift, scheduler_quotas
from tests.conftest import _client_for, _make_user
from tests.fleet.scheduler.support import KUEUE, push

DRIFT = "/api/v1/scheduler/quota-drift/"
IMPORT = "/api/v1/scheduler/quota-drift/import/"
PAGE = "/scheduler/queues/"
GAUGES = {"nominal": "nominal_quota", "borrowing": "borrowing_limit", "lending": "lending_limit"}


def kueue_quota(cq: str, flavors: dict[str, dict[str, str]], *, cohort: str = "h100-pool") -> str:
    """Kueue's quota gauges for one ClusterQueue: flavor -> {nominal, borrowing, lending} (as Kueue
    prints them, +Inf for unset), plus a CPU quota the drift must ignore."""
    lines = []
    for key, gauge in GAUGES.items():
        lines.append(f"# TYPE kueue_cluster_queue_{gauge} gauge")
        for flavor, values in flavors.items():
            if key in values:
                labels = f'cluster_queue="{cq}",cohort="{cohort}",flavor="{flavor}"'
                lines.append(f'kueue_cluster_queue_{gauge}{{{labels},resource="nvidia.com/gpu"}} {values[key]}')
                lines.append(f'kueue_cluster_queue_{gauge}{{{labels},resource="cpu"}} 512')
    return "\n".join(lines) + "\n"


@pytest.fixture
def mapped(client, site_a, token_a):  # type: ignore[no-untyped-def]
    """Kueue's fixture pushed: team-a-h100 (nominal 32, borrowing 16, lending 8) and team-b-h100
    (nominal 16, no limits) mapped to teams a and b on site A's H100 pool."""
    assert push(client, token_a, KUEUE).status_code == 202
    pool = Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="h100")
    teams = {name: Team.objects.create(name=name) for name in ("team-a", "team-b")}
    for name, team in teams.items():
        SchedulerQueue.objects.filter(scheduler="kueue", name=f"{name}-h100").update(pool=pool, team=team)
    return {"pool": pool, **teams, "a": SchedulerQueue.objects.get(name="team-a-h100")}


@pytest.fixture
def approver_client(db):  # type: ignore[no-untyped-def]
    return _client_for(_make_user("cappy", roles.CAPACITY_APPROVER))


def _by_queue(response) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.content
    return {row["queue_name"]: row for row in response.json()["results"]}


def test_no_drift_when_the_console_holds_the_schedulers_quotas(mapped, viewer_client) -> None:
    TeamQuota.objects.create(
        team=mapped["team-a"], pool=mapped["pool"], nominal_gpus=32, borrowing_limit_gpus=16, lending_limit_gpus=8
    )
    TeamQuota.objects.create(team=mapped["team-b"], pool=mapped["pool"], nominal_gpus=16)  # +Inf: no limits
    assert {d.queue.name: d.status for d in quota_drift()} == {"team-a-h100": "match", "team-b-h100": "match"}
    body = viewer_client.get(DRIFT).json()
    assert (body["mapped_queues"], body["drifted"], body["results"]) == (2, 0, [])
    assert len(viewer_client.get(DRIFT + "?all=1").json()["results"]) == 2


def test_a_differing_nominal_quota_or_borrowing_limit_is_drift(mapped, viewer_client) -> None:
    TeamQuota.objects.create(
        team=mapped["team-a"], pool=mapped["pool"], nominal_gpus=24, borrowing_limit_gpus=None, lending_limit_gpus=8
    )
    TeamQuota.objects.create(team=mapped["team-b"], pool=mapped["pool"], nominal_gpus=16, borrowing_limit_gpus=4)
    rows = _by_queue(viewer_client.get(DRIFT))
    assert rows["team-a-h100"]["status"] == "drift"
    assert rows["team-a-h100"]["differences"] == {
        "nominal_gpus": {"scheduler": 32, "console": 24},
        "borrowing_limit_gpus": {"scheduler": 16, "console": None},
    }
    # Kueue's +Inf is no limit: the console's limit of 4 differs from it.
    assert rows["team-b-h100"]["differences"] == {"borrowing_limit_gpus": {"scheduler": None, "console": 4}}
    assert rows["team-a-h100"]["scheduler_quota"]["lending_limit_gpus"] == 8


def test_a_quota_missing_on_either_side_is_drift(client, token_a, mapped, viewer_client) -> None:
    # No TeamQuota at all; and a third queue Kueue reports no GPU quota for.
    body = '# TYPE kueue_pending_workloads gauge\nkueue_pending_workloads{cluster_queue="team-c",status="active"} 1\n'
    assert push(client, token_a, body).status_code == 202
    team_c = Team.objects.create(name="team-c")
    SchedulerQueue.objects.filter(name="team-c").update(pool=mapped["pool"], team=team_c)
    TeamQuota.objects.create(team=team_c, pool=mapped["pool"], nominal_gpus=8)
    rows = _by_queue(viewer_client.get(DRIFT))
    assert {name: row["status"] for name, row in rows.items()} == {
        "team-a-h100": "missing-in-console",
        "team-b-h100": "missing-in-console",
        "team-c": "missing-in-scheduler",
    }
    assert rows["team-c"]["console_quota"]["nominal_gpus"] == 8 and rows["team-c"]["scheduler_quota"] is None


def test_flavors_sum_and_an_unset_limit_in_any_flavor_means_no_limit(client, token_a, mapped) -> None:
    flavors = {
        "h100-reserved": {"nominal": "16", "borrowing": "8", "lending": "4"},
        "h100-spot": {"nominal": "8", "borrowing": "+Inf", "lending": "2"},
    }
    assert push(client, token_a, kueue_quota("team-z", flavors)).status_code == 202
    team_z = Team.objects.create(name="team-z")
    SchedulerQueue.objects.filter(name="team-z").update(pool=mapped["pool"], team=team_z)
    TeamQuota.objects.create(team=team_z, pool=mapped["pool"], nominal_gpus=24, lending_limit_gpus=6)
    row = next(d for d in quota_drift() if d.queue.name == "team-z")
    assert (row.scheduler.nominal, row.scheduler.borrowing_limit, row.scheduler.lending_limit) == (24, None, 6)
    assert row.status == "match"


def test_unmapped_queues_are_not_compared(client, token_a, site_a) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    assert quota_drift() == []


def test_an_admin_imports_the_schedulers_quota_creating_it_audited(mapped, admin_client) -> None:
    response = admin_client.post(IMPORT, {"queue": mapped["a"].pk}, content_type="application/json")
    assert response.status_code == 200, response.content
    quota = TeamQuota.objects.get(team=mapped["team-a"], pool=mapped["pool"])
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.lending_limit_gpus) == (32, 16, 8)
    assert response.json()["id"] == quota.pk
    entry = AuditEntry.objects.get(model="teamquota", object_id=str(quota.pk), action="create")
    assert entry.actor == "ada" and entry.after["nominal_gpus"] == 32
    assert next(d for d in quota_drift() if d.queue.name == "team-a-h100").status == "match"


def test_a_capacity_approver_imports_over_an_existing_quota_and_inf_becomes_no_limit(mapped, approver_client) -> None:
    quota = TeamQuota.objects.create(
        team=mapped["team-b"], pool=mapped["pool"], nominal_gpus=4, borrowing_limit_gpus=2, lending_limit_gpus=1
    )
    queue_b = SchedulerQueue.objects.get(name="team-b-h100")
    response = approver_client.post(IMPORT, {"queue": queue_b.pk}, content_type="application/json")
    assert response.status_code == 200, response.content
    quota.refresh_from_db()
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.lending_limit_gpus) == (16, None, None)
    entry = AuditEntry.objects.get(model="teamquota", object_id=str(quota.pk), action="update")
    assert entry.actor == "cappy"
    assert (entry.before["nominal_gpus"], entry.after["nominal_gpus"]) == (4, 16)


def test_operators_and_viewers_may_not_import(mapped, operator_client, viewer_client) -> None:
    for refused in (operator_client, viewer_client):
        response = refused.post(IMPORT, {"queue": mapped["a"].pk}, content_type="application/json")
        assert response.status_code == 403 and response.json()["rule"] == "quota-approver"
    assert not TeamQuota.objects.exists()
    # Nor on the page: the operator maps queues there, but importing needs the quota rule.
    assert operator_client.post(PAGE, {"action": "import", "id": mapped["a"].pk}).status_code == 403
    assert viewer_client.post(PAGE, {"action": "import", "id": mapped["a"].pk}).status_code == 403
    assert not TeamQuota.objects.exists()


def test_an_import_keeps_teamquotas_rules(client, token_a, mapped, admin_client) -> None:
    # Kueue would refuse a lending limit above nominal; the console refuses to copy one either way.
    bad = {"h100-reserved": {"nominal": "4", "borrowing": "+Inf", "lending": "8"}}
    assert push(client, token_a, kueue_quota("team-bad", bad)).status_code == 202
    SchedulerQueue.objects.filter(name="team-bad").update(pool=mapped["pool"], team=mapped["team-a"])
    queue = SchedulerQueue.objects.get(name="team-bad")
    response = admin_client.post(IMPORT, {"queue": queue.pk}, content_type="application/json")
    assert response.status_code == 400 and "lending_limit_gpus" in response.json()
    half = {"h100-reserved": {"nominal": "2.5"}}
    assert push(client, token_a, kueue_quota("team-half", half)).status_code == 202
    SchedulerQueue.objects.filter(name="team-half").update(pool=mapped["pool"], team=mapped["team-b"])
    queue = SchedulerQueue.objects.get(name="team-half")
    response = admin_client.post(IMPORT, {"queue": queue.pk}, content_type="application/json")
    assert response.status_code == 400 and "nominal_gpus" in response.json()
    assert not TeamQuota.objects.exists()


def test_an_import_needs_a_mapped_queue_with_a_reported_quota(client, token_a, mapped, admin_client) -> None:
    body = '# TYPE kueue_pending_workloads gauge\nkueue_pending_workloads{cluster_queue="quiet",status="active"} 1\n'
    assert push(client, token_a, body).status_code == 202
    quiet = SchedulerQueue.objects.get(name="quiet")
    unmapped = admin_client.post(IMPORT, {"queue": quiet.pk}, content_type="application/json")
    assert unmapped.status_code == 400 and "pool" in unmapped.json()
    SchedulerQueue.objects.filter(pk=quiet.pk).update(pool=mapped["pool"], team=mapped["team-a"])
    silent = admin_client.post(IMPORT, {"queue": quiet.pk}, content_type="application/json")
    assert silent.status_code == 409 and "queue" in silent.json()
    assert admin_client.post(IMPORT, {}, content_type="application/json").status_code == 400
    assert not TeamQuota.objects.exists()


def test_the_page_shows_the_drift_and_an_admin_imports_from_it(mapped, admin_client, viewer_client) -> None:
    TeamQuota.objects.create(team=mapped["team-a"], pool=mapped["pool"], nominal_gpus=24)
    html = viewer_client.get(PAGE).content.decode()
    assert 'id="drift-table"' in html and 'data-status="drift"' in html and 'data-status="missing-in-console"' in html
    assert 'data-action="import"' not in html
    html = admin_client.get(PAGE).content.decode()
    assert 'data-action="import"' in html
    response = admin_client.post(PAGE, {"action": "import", "id": mapped["a"].pk})
    assert response.status_code == 302
    quota = TeamQuota.objects.get(team=mapped["team-a"], pool=mapped["pool"])
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.lending_limit_gpus) == (32, 16, 8)
    assert f'data-drift="{mapped["a"].pk}" data-status="match"' in admin_client.get(PAGE).content.decode()


def test_the_overview_counts_mapped_queues_and_drift(mapped, viewer_client) -> None:
    html = viewer_client.get("/").content.decode()
    assert 'id="scheduler-tile"' in html
    assert "2<small> of 2</small>" in html and "team-a-h100, team-b-h100" in html  # both lack a console quota


def test_a_queue_reporting_now_is_read_from_its_recent_minutes_alone(mapped) -> None:
    ids = list(SchedulerQueue.objects.filter(kind="clusterqueue").values_list("pk", flat=True))  # LocalQueues: no quota
    with CaptureQueriesContext(connection) as ctx:
        now = scheduler_quotas(ids)
    assert len(ctx.captured_queries) == 1  # no queue left to look for over the day
    assert (now[mapped["a"].pk].nominal, now[mapped["a"].pk].borrowing_limit) == (32, 16)


def test_a_queue_gone_quiet_keeps_its_last_quota_of_the_day(mapped) -> None:
    ids = list(SchedulerQueue.objects.filter(kind="clusterqueue").values_list("pk", flat=True))  # LocalQueues: no quota
    later = timezone.now() + timedelta(hours=2)  # the push is two hours old: past the recent minutes
    with CaptureQueriesContext(connection) as ctx:
        quiet = scheduler_quotas(ids, now=later)
    assert len(ctx.captured_queries) == 2
    assert {pk: (q.nominal, q.borrowing_limit, q.lending_limit) for pk, q in quiet.items()} == {
        pk: (q.nominal, q.borrowing_limit, q.lending_limit) for pk, q in scheduler_quotas(ids).items()
    }
    assert scheduler_quotas(ids, now=timezone.now() + timedelta(days=2)) == {}  # a day and more: none
