"""The recovery register: defaults by kind, the four findings (each fires, and a case where it must
not), the backup door (create, idempotent repeat, 409, 400 naming the field, the token's site, 401)
and the items list's figures."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from compliance import detectors
from compliance.choices import BackupMethod, BackupOutcome, RecoveryKind
from compliance.models import BackupReport, Dataset, RecoveryItem, RestoreTest
from console.models import PersonalToken
from fleet.models import Site
from incidents.choices import FindingStatus
from incidents.detectors import registered, run_detectors
from incidents.models import Finding

pytestmark = pytest.mark.django_db

BACKUPS = "/api/v1/recovery/backups/"
ITEMS = "/api/v1/recovery/items/"
NOW = timezone.now()


@pytest.fixture(autouse=True)
def _now() -> None:
    """Each test's own "now": the module's import time is minutes old by a long suite's later tests."""
    global NOW
    NOW = timezone.now()


def make_item(site: Site | None = None, **fields: Any) -> RecoveryItem:
    fields = {"kind": RecoveryKind.DATASET, "name": "c4-en", "method": BackupMethod.REPLICATION, **fields}
    return RecoveryItem.objects.create(source_site=site, source_tier=fields.pop("source_tier", "nfs"), **fields)


def backup(item: RecoveryItem, ago: timedelta, outcome: str = BackupOutcome.SUCCESS, **fields: Any) -> BackupReport:
    finished = NOW - ago
    fields.setdefault("external_id", f"run-{BackupReport.objects.count() + 1}")
    return BackupReport.objects.create(
        item=item, started=finished - timedelta(minutes=20), finished=finished, outcome=outcome, **fields
    )


def restore(item: RecoveryItem, ago: timedelta, verified: bool = True) -> RestoreTest:
    finished = NOW - ago
    return RestoreTest.objects.create(
        item=item,
        into="scratch-nfs",
        by_name="ops",
        started=finished - timedelta(hours=1),
        finished=finished,
        verified=verified,
        verification="sha256 of every shard matched" if verified else "",
    )


def fingerprints(detector: Any) -> set[str]:
    return {spec.fingerprint for spec in detector(NOW)}


def post(client: Client, body: dict[str, Any], token: str | None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(BACKUPS, json.dumps(body), content_type="application/json", **headers)


def report_body(**overrides: Any) -> dict[str, Any]:
    finished = NOW - timedelta(hours=1)
    body = {
        "item": "c4-en",
        "id": "velero-c4-en-20261205",
        "started": (finished - timedelta(minutes=30)).isoformat(),
        "finished": finished.isoformat(),
        "bytes": 7_340_032_000,
        "outcome": "success",
        "copy_site": "iad-2",
        "copy_tier": "object-store",
    }
    return {**body, **overrides}


# --- the register --------------------------------------------------------------------------------


def test_rpo_and_rto_default_by_kind_and_restore_tests_are_due_every_quarter(site_a: Site) -> None:
    weights = make_item(site_a, kind=RecoveryKind.MODEL_WEIGHTS, name="llama-70b-weights")
    database = make_item(None, kind=RecoveryKind.CONSOLE_DATABASE, name="console-db")
    checkpoints = make_item(site_a, kind=RecoveryKind.CHECKPOINTS, name="ckpt", rpo=timedelta(hours=2))
    assert (weights.rpo, weights.rto) == (timedelta(hours=24), timedelta(minutes=30))
    assert (database.rpo, database.rto) == (timedelta(hours=24), timedelta(hours=4))
    assert (checkpoints.rpo, checkpoints.rto) == (timedelta(hours=2), timedelta(hours=8))  # its own RPO kept
    assert weights.restore_test_every == timedelta(days=92)


def test_an_item_may_name_the_compliance_registers_dataset(site_a: Site) -> None:
    dataset = Dataset.objects.create(name="c4", source_category="public", modality="text")
    item = make_item(site_a, dataset=dataset)
    assert list(dataset.recovery_items.all()) == [item]


# --- findings ------------------------------------------------------------------------------------


def test_rpo_breached_fires_when_the_last_good_backup_is_older_than_the_rpo(site_a: Site) -> None:
    item = make_item(site_a)
    backup(item, timedelta(hours=30))
    backup(item, timedelta(hours=1), BackupOutcome.FAILED)  # a later failure is no copy
    specs = detectors.recovery_rpo_breached(NOW)
    assert [s.fingerprint for s in specs] == [f"recovery-rpo-breached:{item.pk}"]
    assert specs[0].impact["backup_age_hours"] == 30.0
    assert specs[0].labels == {"recovery_item": "c4-en", "kind": "dataset", "site": "ams-1", "tier": "nfs"}


def test_rpo_breached_fires_for_an_item_never_backed_up(site_a: Site) -> None:
    item = make_item(site_a)
    specs = detectors.recovery_rpo_breached(NOW)
    assert [s.fingerprint for s in specs] == [f"recovery-rpo-breached:{item.pk}"]
    assert "no successful backup" in specs[0].summary


def test_rpo_breached_does_not_fire_within_the_rpo(site_a: Site) -> None:
    item = make_item(site_a)
    backup(item, timedelta(hours=23))
    backup(item, timedelta(hours=48))
    assert fingerprints(detectors.recovery_rpo_breached) == set()
    item.rpo = timedelta(hours=12)
    item.save()
    assert fingerprints(detectors.recovery_rpo_breached) == {f"recovery-rpo-breached:{item.pk}"}


def test_rto_unproven_fires_without_a_verified_restore_within_the_period(site_a: Site) -> None:
    never = make_item(site_a, name="never-restored")
    stale = make_item(site_a, name="restored-last-year")
    restore(stale, timedelta(days=93))
    unverified = make_item(site_a, name="restored-unverified")
    restore(unverified, timedelta(days=1), verified=False)
    assert fingerprints(detectors.recovery_rto_unproven) == {
        f"recovery-rto-unproven:{i.pk}" for i in (never, stale, unverified)
    }


def test_rto_unproven_does_not_fire_after_a_recent_verified_restore(site_a: Site) -> None:
    item = make_item(site_a)
    restore(item, timedelta(days=91))
    restore(item, timedelta(days=2), verified=False)  # a later failed test does not undo the proof
    assert fingerprints(detectors.recovery_rto_unproven) == set()


def test_backup_failing_fires_when_the_last_three_runs_failed(site_a: Site) -> None:
    item = make_item(site_a)
    backup(item, timedelta(hours=40))
    for hours in (3, 2, 1):
        backup(item, timedelta(hours=hours), BackupOutcome.FAILED)
    specs = detectors.recovery_backup_failing(NOW)
    assert [s.fingerprint for s in specs] == [f"recovery-backup-failing:{item.pk}"]
    assert len(specs[0].impact["failed_runs"]) == 3


def test_backup_failing_does_not_fire_while_one_of_the_last_three_did_not_fail(site_a: Site) -> None:
    item = make_item(site_a)
    backup(item, timedelta(hours=3), BackupOutcome.FAILED)
    backup(item, timedelta(hours=2), BackupOutcome.PARTIAL)
    backup(item, timedelta(hours=1), BackupOutcome.FAILED)
    other = make_item(site_a, name="two-failures-only")
    backup(other, timedelta(hours=2), BackupOutcome.FAILED)
    backup(other, timedelta(hours=1), BackupOutcome.FAILED)
    assert fingerprints(detectors.recovery_backup_failing) == set()


def test_same_site_copy_fires_when_the_copy_shares_the_sources_site_and_tier(site_a: Site) -> None:
    item = make_item(site_a, source_tier="nfs")
    backup(item, timedelta(hours=1), copy_site=site_a, copy_tier="nfs")
    assert fingerprints(detectors.recovery_same_site_copy) == {f"recovery-same-site-copy:{item.pk}"}


def test_same_site_copy_does_not_fire_for_another_site_or_another_tier(site_a: Site, site_b: Site) -> None:
    elsewhere = make_item(site_a, name="replicated")
    backup(elsewhere, timedelta(hours=1), copy_site=site_b, copy_tier="nfs")
    other_tier = make_item(site_a, name="to-object-store")
    backup(other_tier, timedelta(hours=1), copy_site=site_a, copy_tier="object-store")
    unknown = make_item(site_a, name="copy-site-not-reported")
    backup(unknown, timedelta(hours=1), copy_tier="nfs")
    assert fingerprints(detectors.recovery_same_site_copy) == set()


def test_the_detectors_are_registered_and_raise_and_clear_findings(site_a: Site, site_b: Site) -> None:
    names = ["recovery-rpo-breached", "recovery-rto-unproven", "recovery-backup-failing", "recovery-same-site-copy"]
    assert set(names) <= set(registered())
    item = make_item(site_a)
    run_detectors(now=NOW, only=names)
    firing = set(Finding.objects.filter(status=FindingStatus.FIRING).values_list("fingerprint", flat=True))
    assert firing == {f"recovery-rpo-breached:{item.pk}", f"recovery-rto-unproven:{item.pk}"}
    backup(item, timedelta(hours=1), copy_site=site_b, copy_tier="object-store")
    restore(item, timedelta(days=1))
    run_detectors(now=NOW, only=names)
    assert not Finding.objects.filter(status=FindingStatus.FIRING).exists()


# --- the backup door -----------------------------------------------------------------------------


def test_a_backup_job_reports_a_run(client: Client, site_a: Site, site_b: Site, token_a: str) -> None:
    item = make_item(site_a)
    response = post(client, report_body(), token_a)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["item"] == "c4-en" and body["id"] == "velero-c4-en-20261205" and body["copy_site"] == "iad-2"
    report = BackupReport.objects.get()
    assert (report.item, report.copy_site, report.bytes, report.outcome) == (item, site_b, 7_340_032_000, "success")
    assert body["record"] == report.pk


def test_the_item_may_be_named_by_its_id(client: Client, site_a: Site, token_a: str) -> None:
    item = make_item(site_a)
    response = post(client, report_body(item=item.pk, copy_site=None, copy_tier=""), token_a)
    assert response.status_code == 201, response.content
    assert BackupReport.objects.get().copy_site is None


def test_a_repeated_report_is_the_same_record(client: Client, site_a: Site, site_b: Site, token_a: str) -> None:
    make_item(site_a)
    first = post(client, report_body(), token_a)
    again = post(client, report_body(), token_a)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["record"] == first.json()["record"]
    assert BackupReport.objects.count() == 1


def test_a_repeated_run_id_with_other_figures_is_a_409(
    client: Client, site_a: Site, site_b: Site, token_a: str
) -> None:
    make_item(site_a)
    assert post(client, report_body(), token_a).status_code == 201
    response = post(client, report_body(outcome="failed", bytes=0), token_a)
    assert response.status_code == 409
    assert response.json()["fields"] == ["bytes", "outcome"]
    assert BackupReport.objects.get().outcome == "success"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"outcome": "fine"}, "outcome"),
        ({"item": "no-such-item"}, "item"),
        ({"copy_site": "no-such-site"}, "copy_site"),
        ({"started": "1900-01-01T00:00:00Z"}, "started"),  # past the console's ten-year bound
        ({"finished": "2026-13-01T00:00:00Z"}, "finished"),
        ({"finished": (NOW - timedelta(days=1)).isoformat()}, "finished"),  # before started
        ({"finished": (NOW + timedelta(hours=1)).isoformat()}, "finished"),  # not ended yet
        ({"bytes": -1}, "bytes"),
        ({"id": ""}, "id"),
        ({"target": "c4-en"}, "target"),  # a field the door does not take
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    client: Client, site_a: Site, site_b: Site, token_a: str, overrides: dict[str, Any], field: str
) -> None:
    make_item(site_a)
    response = post(client, report_body(**overrides), token_a)
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not BackupReport.objects.exists()


def test_a_token_reports_only_for_its_own_sites_items(client: Client, site_a: Site, site_b: Site, token_a: str) -> None:
    make_item(site_b)
    response = post(client, report_body(), token_a)
    assert response.status_code == 400
    assert response.json() == {"item": ["No recovery item at this token's site is named 'c4-en' (or has that id)."]}
    assert not BackupReport.objects.exists()


@pytest.mark.parametrize("by", ["name", "id"])
def test_another_sites_item_is_answered_as_a_name_nobody_has(
    client: Client, site_a: Site, site_b: Site, token_a: str, by: str
) -> None:
    """Issue 37, item 10: the door said 403 "item c4-en is at site iad-2" to site A's token, and 400
    for a name nobody has, so a token could list what other sites back up, and where. The site is
    checked first now: both answers are the same."""
    theirs = make_item(site_b)
    asked = theirs.name if by == "name" else str(theirs.pk)
    missing = "no-such-item" if by == "name" else str(theirs.pk + 1000)
    exists = post(client, report_body(item=asked), token_a)
    nobody = post(client, report_body(item=missing), token_a)
    assert (exists.status_code, nobody.status_code) == (400, 400)
    assert exists.content.decode().replace(repr(asked), repr(missing)) == nobody.content.decode()
    assert "iad-2" not in exists.content.decode() and not BackupReport.objects.exists()


def test_the_backup_door_refuses_anonymous_callers_and_sessions(
    client: Client, viewer_client: Client, admin_client: Client, site_a: Site
) -> None:
    make_item(site_a)
    assert post(client, report_body(), None).status_code == 401
    assert post(client, report_body(), "gp_0000_nonsense").status_code == 401
    assert post(admin_client, report_body(), None).status_code in (401, 403)
    assert not BackupReport.objects.exists()


# --- the items list ------------------------------------------------------------------------------


def test_the_items_list_shows_each_items_backup_age_rpo_state_and_last_restore(
    operator_client: Client, site_a: Site, site_b: Site
) -> None:
    fresh = make_item(site_a, name="a-fresh")
    good = backup(fresh, timedelta(hours=2), copy_site=site_b, copy_tier="object-store", bytes=10)
    backup(fresh, timedelta(hours=1), BackupOutcome.FAILED)
    restore(fresh, timedelta(days=3))
    stale = make_item(site_a, name="b-stale", kind=RecoveryKind.MODEL_WEIGHTS)
    backup(stale, timedelta(hours=25), copy_site=site_a, copy_tier="nfs")
    make_item(None, name="c-never", kind=RecoveryKind.CONSOLE_DATABASE)

    response = operator_client.get(ITEMS)
    assert response.status_code == 200
    rows = {row["name"]: row for row in response.json()["results"]}
    row = rows["a-fresh"]
    assert row["rpo_state"] == "met" and row["rpo_seconds"] == 86400 and row["rto_seconds"] == 8 * 3600
    assert row["last_good_backup"]["id"] == good.external_id
    assert row["last_good_backup"]["copy_site"] == "iad-2"
    assert abs(row["last_good_backup"]["age_seconds"] - 2 * 3600) < 120
    assert row["last_restore_test"]["verified"] is True and row["last_restore_test"]["duration_seconds"] == 3600
    assert row["rto_proven"] is True and row["same_site_copy"] is False
    assert rows["b-stale"]["rpo_state"] == "breached" and rows["b-stale"]["same_site_copy"] is True
    assert rows["b-stale"]["rto_seconds"] == 1800 and rows["b-stale"]["rto_proven"] is False
    never = rows["c-never"]
    assert never["rpo_state"] == "never" and never["last_good_backup"] is None and never["source_site"] is None


def test_the_items_list_takes_a_personal_token_and_refuses_anonymous_callers_and_viewers(
    client: Client, operator_user: User, viewer_user: User, site_a: Site
) -> None:
    make_item(site_a)
    refused = PersonalToken.issue(user=viewer_user, name="script")[1]
    assert client.get(ITEMS, HTTP_AUTHORIZATION=f"Bearer {refused}").status_code == 403
    plain = PersonalToken.issue(user=operator_user, name="script")[1]
    response = client.get(ITEMS, HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert response.status_code == 200
    assert [row["name"] for row in response.json()["results"]] == ["c4-en"]
    assert Client().get(ITEMS).status_code == 401


def test_the_items_list_reads_in_a_fixed_number_of_queries(
    operator_client: Client, site_a: Site, site_b: Site, django_assert_max_num_queries: Any
) -> None:
    for n in range(10):
        item = make_item(site_a, name=f"item-{n}")
        backup(item, timedelta(hours=1), copy_site=site_b)
        restore(item, timedelta(days=1))
    operator_client.get(ITEMS)  # warm the session and permission caches
    with django_assert_max_num_queries(12):
        assert len(operator_client.get(ITEMS).json()["results"]) == 10
