"""The recovery register in the compliance pack (the register and the period's restore-test log,
the same states as the page) and in the demo (its datasets, checkpoints, weights and the console's
database, a week of backups, one item overdue for a restore test; a restart adds nothing twice)."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from datetime import date, timedelta

import pytest
from django.db.models import Count
from django.utils import timezone

from compliance import detectors
from compliance.demo import seed_compliance
from compliance.demo_recovery import OVERDUE
from compliance.models import BackupReport, CompliancePack, RecoveryItem, RestoreTest
from compliance.services import pack as pack_service
from compliance.services import recovery
from fleet.models import Job, Site
from tests.compliance.recovery_support import backup, make_item, restore

pytestmark = pytest.mark.django_db


def test_the_pack_holds_the_register_and_the_restore_tests_of_the_period(site_a: Site, site_b: Site) -> None:
    today = timezone.localdate()
    ok = make_item(site_a, name="ok-dataset")
    backup(ok, timedelta(hours=2), copy_site=site_b, copy_tier="object-store")
    restore(ok, timedelta(days=3))
    restore(ok, timedelta(days=40))  # before the period
    make_item(None, name="console-db", kind="console_database")
    pack = CompliancePack.objects.create(period_start=today - timedelta(days=7), period_end=today)
    archive = zipfile.ZipFile(io.BytesIO(pack_service.build_pack(pack)))

    register = list(csv.DictReader(io.StringIO(archive.read("recovery_register.csv").decode())))
    by_name = {row["name"]: row for row in register}
    assert set(by_name) == {"ok-dataset", "console-db"}
    assert by_name["ok-dataset"]["state"] == "ok" and by_name["ok-dataset"]["copy_site"] == "iad-2"
    assert by_name["console-db"]["state"] == "rpo_breached"  # never backed up: the page says the same
    assert by_name["console-db"]["problems"] == "rpo_breached; rto_unproven"
    tests = list(csv.DictReader(io.StringIO(archive.read("restore_tests.csv").decode())))
    assert [(t["item"], t["verified"], t["duration_seconds"]) for t in tests] == [("ok-dataset", "yes", "3600.0")]
    doc = json.loads(archive.read("pack.json"))
    assert len(doc["recovery_register"]) == 2 and len(doc["restore_tests"]) == 1
    manifest = json.loads(archive.read("manifest.json"))
    assert {"recovery_register.csv", "restore_tests.csv"} <= {f["name"] for f in manifest["files"]}


@pytest.fixture
def demo_fleet(db: None) -> dict[str, Site]:
    sites = {name: Site.objects.create(name=name, region=name) for name in ("ams-1", "iad-2", "sin-1")}
    for n, site in enumerate(sites.values()):
        Job.objects.create(
            site=site, cluster=f"{site.name}-train", name=f"demo-{n}", team="nlp", gang_size=8, scheduler_id=f"d{n}"
        )
    return sites


def test_the_demo_register_has_the_datasets_checkpoints_weights_and_database_with_a_week_of_backups(
    demo_fleet: dict[str, Site],
) -> None:
    seed_compliance(today=date.today())
    kinds = dict(RecoveryItem.objects.order_by().values_list("kind").annotate(n=Count("pk")))
    assert kinds == {"dataset": 6, "checkpoints": 3, "model_weights": 1, "console_database": 1}
    assert RecoveryItem.objects.filter(kind="dataset", dataset__isnull=True).count() == 0  # linked to the register
    now = timezone.now()
    oldest = BackupReport.objects.order_by("finished").first()
    assert oldest is not None and now - oldest.finished <= timedelta(days=7)
    for state in recovery.item_states():
        assert not recovery.backup_failing(state) and not recovery.rpo_breached(state, now), state.item.name
        assert state.last_good is not None and state.last_good.bytes
        took = state.last_good.finished - state.last_good.started
        assert state.last_good.bytes / took.total_seconds() < 10 * 10**9  # under 10 GB/s: physically possible
    overdue = {s.labels["recovery_item"] for s in detectors.recovery_rto_unproven(now)}
    assert overdue == {OVERDUE}


def test_a_restart_of_the_demo_adds_no_item_and_no_restore_test_twice(demo_fleet: dict[str, Site]) -> None:
    first = seed_compliance(today=date.today())
    items, tests, reports = RecoveryItem.objects.count(), RestoreTest.objects.count(), BackupReport.objects.count()
    again = seed_compliance(today=date.today())
    assert first["backup reports"] == reports > 0 and again["backup reports"] == 0
    assert (RecoveryItem.objects.count(), RestoreTest.objects.count(), BackupReport.objects.count()) == (
        items,
        tests,
        reports,
    )


@pytest.mark.parametrize("clock", ["00:01", "02:00", "02:26", "02:50", "03:09", "14:00", "23:59"])
def test_the_demo_shows_no_rpo_breached_whatever_the_hour_it_starts(demo_fleet: dict[str, Site], clock: str) -> None:
    # The datasets' nightly runs finish from 02:00 to 02:25: a demo started just after one used to
    # leave that item a day and some minutes old, past its 24-hour RPO.
    from datetime import UTC, datetime

    from compliance.demo_recovery import seed_recovery

    hour, minute = (int(part) for part in clock.split(":"))
    now = datetime(2026, 12, 6, hour, minute, tzinfo=UTC)
    seed_recovery(now=now)
    states = recovery.item_states()
    assert states
    assert [s.item.name for s in states if recovery.rpo_breached(s, now)] == []
