"""The /recovery/ page and an item's page: who sees them, what they show (each item's state,
backup age against its RPO, last restore test), the filters, the forms (an item with its class's
defaults, an edit, a restore test), each change audited, bad input a 400 on the field; and the
overview tile, whose counts are the page's."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from compliance.choices import BackupOutcome, RecoveryKind
from compliance.models import AuditEntry, Dataset, RecoveryItem, RestoreTest
from console import roles
from fleet.models import Job, Site
from tests.compliance.recovery_support import backup, make_item, restore
from tests.conftest import _client_for, _make_user

pytestmark = pytest.mark.django_db

PAGE = "/recovery/"


@pytest.fixture
def officer_client(db: None) -> Client:
    return _client_for(_make_user("cora", roles.COMPLIANCE_OFFICER))


@pytest.fixture
def register(site_a: Site, site_b: Site) -> dict[str, RecoveryItem]:
    """Four items, one per state: ok, RPO breached (and RTO unproven), failing, same-site copy."""
    ok = make_item(site_a, name="ok-dataset")
    backup(ok, timedelta(hours=2), copy_site=site_b, copy_tier="object-store")
    restore(ok, timedelta(days=3))
    stale = make_item(site_a, name="stale-weights", kind=RecoveryKind.MODEL_WEIGHTS)
    backup(stale, timedelta(hours=30), copy_site=site_b)
    failing = make_item(site_a, name="failing-ckpt", kind=RecoveryKind.CHECKPOINTS)
    backup(failing, timedelta(hours=5), copy_site=site_b)
    for hours in (3, 2, 1):
        backup(failing, timedelta(hours=hours), BackupOutcome.FAILED)
    restore(failing, timedelta(days=1))
    same = make_item(site_a, name="same-site", source_tier="nfs")
    backup(same, timedelta(hours=1), copy_site=site_a, copy_tier="nfs")
    restore(same, timedelta(days=1))
    return {"ok": ok, "stale": stale, "failing": failing, "same": same}


def states(html: str) -> dict[str, str]:
    """item name -> its row's state, from the register table."""
    rows = re.findall(r'data-state="(\w+)">\s*<td><a href="/recovery/items/\d+/">([^<]+)</a>', html)
    return {name: state for state, name in rows}


def test_operators_officers_and_admins_read_the_register_and_others_do_not(
    operator_client: Client,
    officer_client: Client,
    admin_client: Client,
    viewer_client: Client,
    norole_client: Client,
    anon_client: Client,
    register: dict[str, RecoveryItem],
) -> None:
    for client in (operator_client, officer_client, admin_client):
        assert client.get(PAGE).status_code == 200
        assert client.get(f"/recovery/items/{register['ok'].pk}/").status_code == 200
    assert viewer_client.get(PAGE).status_code == 403
    assert norole_client.get(PAGE).status_code == 403
    assert anon_client.get(PAGE).status_code == 302
    assert viewer_client.post(PAGE, {"action": "item", "name": "x"}).status_code == 403
    assert not RecoveryItem.objects.filter(name="x").exists()


def test_the_register_shows_each_items_state_backup_age_and_last_restore(
    operator_client: Client, register: dict[str, RecoveryItem]
) -> None:
    html = operator_client.get(PAGE).content.decode()
    assert states(html) == {
        "ok-dataset": "ok",
        "stale-weights": "rpo_breached",
        "failing-ckpt": "failing",
        "same-site": "same_site",
    }
    assert "30.0 h ago" in html and "2.0 h ago" in html  # the last good backups' ages
    assert "· 1.0 h · verified" in html  # the last restore test: its duration and verification
    assert 'data-state="rto_unproven"' in html  # the stale weights were never restored: both badges


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("?state=rpo_breached", {"stale-weights"}),
        ("?state=failing", {"failing-ckpt"}),
        ("?state=same_site", {"same-site"}),
        ("?state=rto_unproven", {"stale-weights"}),
        ("?state=ok", {"ok-dataset"}),
        ("?kind=checkpoints", {"failing-ckpt"}),
        ("?kind=dataset&state=ok", {"ok-dataset"}),
    ],
)
def test_the_filters_keep_the_items_of_a_state_and_class(
    operator_client: Client, register: dict[str, RecoveryItem], query: str, names: set[str]
) -> None:
    assert set(states(operator_client.get(PAGE + query).content.decode())) == names


def test_an_unknown_filter_value_is_ignored_not_a_500(
    operator_client: Client, register: dict[str, RecoveryItem]
) -> None:
    response = operator_client.get(PAGE + "?state=bogus&kind=nope")
    assert response.status_code == 200
    assert len(states(response.content.decode())) == 4


def test_an_item_made_on_the_page_takes_its_classs_defaults_and_is_audited(
    operator_client: Client, site_a: Site
) -> None:
    response = operator_client.post(
        PAGE,
        {
            "action": "item",
            "kind": "model_weights",
            "name": "llama-70b-weights",
            "method": "snapshot",
            "source_site": site_a.pk,
            "restore_test_every_days": 92,
        },
    )
    assert response.status_code == 302, response.content
    item = RecoveryItem.objects.get(name="llama-70b-weights")
    assert (item.rpo, item.rto) == (timedelta(hours=24), timedelta(minutes=30))  # serving weights: minutes
    entry = AuditEntry.objects.filter(model="recoveryitem", object_id=str(item.pk)).get()
    assert entry.action == "create" and entry.actor == "oscar"


def test_checkpoints_name_their_training_job_and_datasets_the_registers_dataset(
    officer_client: Client, site_a: Site
) -> None:
    job = Job.objects.create(site=site_a, name="llama-pretrain", team="nlp", gang_size=64, scheduler_id="j1")
    dataset = Dataset.objects.create(name="c4", source_category="public", modality="text")
    assert (
        officer_client.post(
            PAGE,
            {
                "action": "item",
                "kind": "checkpoints",
                "name": "ckpt-llama",
                "method": "snapshot",
                "job": job.pk,
                "rpo_hours": "2",
                "restore_test_every_days": 30,
            },
        ).status_code
        == 302
    )
    assert (
        officer_client.post(
            PAGE,
            {
                "action": "item",
                "kind": "dataset",
                "name": "c4-copy",
                "method": "replication",
                "dataset": dataset.pk,
                "restore_test_every_days": 92,
            },
        ).status_code
        == 302
    )
    ckpt = RecoveryItem.objects.get(name="ckpt-llama")
    assert (ckpt.job, ckpt.rpo, ckpt.rto, ckpt.restore_test_every) == (
        job,
        timedelta(hours=2),
        timedelta(hours=8),
        timedelta(days=30),
    )
    assert list(dataset.recovery_items.values_list("name", flat=True)) == ["c4-copy"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": "nonsense"}, "kind"),
        ({"name": ""}, "name"),
        ({"rpo_hours": "-1"}, "rpo_hours"),
        ({"rto_hours": "many"}, "rto_hours"),
        ({"job": "999999"}, "job"),
        ({"restore_test_every_days": "0"}, "restore_test_every_days"),
    ],
)
def test_a_bad_item_is_a_400_on_its_field_and_writes_nothing(
    operator_client: Client, fields: dict[str, str], field: str
) -> None:
    body = {
        "action": "item",
        "kind": "dataset",
        "name": "bad",
        "method": "replication",
        "restore_test_every_days": 92,
        **fields,
    }
    response = operator_client.post(PAGE, body)
    assert response.status_code == 400
    assert f'data-error-for="{field}"' in response.content.decode()
    assert not RecoveryItem.objects.exists()


def test_a_dataset_link_on_a_checkpoints_item_is_refused(operator_client: Client) -> None:
    dataset = Dataset.objects.create(name="c4", source_category="public", modality="text")
    response = operator_client.post(
        PAGE,
        {
            "action": "item",
            "kind": "checkpoints",
            "name": "x",
            "method": "snapshot",
            "dataset": dataset.pk,
            "restore_test_every_days": 92,
        },
    )
    assert response.status_code == 400 and 'data-error-for="dataset"' in response.content.decode()


def test_an_edit_changes_the_item_and_the_audit_log_says_what_changed(
    officer_client: Client, site_a: Site, site_b: Site
) -> None:
    item = make_item(site_a)
    response = officer_client.post(
        f"/recovery/items/{item.pk}/",
        {
            "kind": "dataset",
            "name": "c4-en",
            "method": "velero",
            "schedule": "datasets-nightly",
            "source_site": site_a.pk,
            "source_tier": "nfs",
            "copy_site": site_b.pk,
            "copy_tier": "object-store",
            "rpo_hours": "6",
            "restore_test_every_days": 92,
        },
    )
    assert response.status_code == 302, response.content
    item.refresh_from_db()
    assert (item.method, item.schedule, item.rpo, item.copy_site) == (
        "velero",
        "datasets-nightly",
        timedelta(hours=6),
        site_b,
    )
    entry = AuditEntry.objects.filter(model="recoveryitem", action="update").get()
    assert entry.actor == "cora" and entry.after["rpo"] != entry.before["rpo"]


def test_a_viewer_cannot_edit_and_a_blank_rpo_returns_to_the_default(
    viewer_client: Client, operator_client: Client, site_a: Site
) -> None:
    item = make_item(site_a, rpo=timedelta(hours=2))
    body = {"kind": "dataset", "name": "c4-en", "method": "replication", "restore_test_every_days": 92}
    assert viewer_client.post(f"/recovery/items/{item.pk}/", body).status_code == 403
    assert operator_client.post(f"/recovery/items/{item.pk}/", body).status_code == 302
    item.refresh_from_db()
    assert item.rpo == timedelta(hours=24)


def test_a_restore_test_recorded_on_the_page_names_who_ran_it_and_proves_the_rto(
    operator_client: Client, operator_user: User, site_a: Site
) -> None:
    item = make_item(site_a)
    run = backup(item, timedelta(hours=3))
    now = timezone.now()
    moment = "%Y-%m-%dT%H:%M"
    response = operator_client.post(
        PAGE,
        {
            "action": "restore",
            "item": item.pk,
            "backup": run.external_id,
            "into": "scratch cluster",
            "started": (now - timedelta(hours=2)).strftime(moment),
            "finished": (now - timedelta(hours=1)).strftime(moment),
            "verified": "on",
            "verification": "row counts matched",
        },
    )
    assert response.status_code == 302, response.content
    test = RestoreTest.objects.get()
    assert (test.by_user, test.backup, test.verified, test.duration) == (operator_user, run, True, timedelta(hours=1))
    assert AuditEntry.objects.filter(model="restoretest", action="create").exists()
    html = operator_client.get(PAGE).content.decode()
    assert states(html) == {"c4-en": "ok"}
    detail = operator_client.get(f"/recovery/items/{item.pk}/").content.decode()
    assert "scratch cluster" in detail and "oscar" in detail


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"finished": "2020-01-01T00:00"}, "finished"),  # before started
        ({"finished": "2099-01-01T00:00", "started": "2098-01-01T00:00"}, "finished"),  # not ended yet / past bounds
        ({"backup": "no-such-run"}, "backup"),
        ({"into": ""}, "into"),
        ({"verification": ""}, "verification"),  # verified, but not said how
    ],
)
def test_a_bad_restore_test_is_a_400_on_its_field(
    operator_client: Client, site_a: Site, fields: dict[str, str], field: str
) -> None:
    item = make_item(site_a)
    now = timezone.now()
    body = {
        "action": "restore",
        "item": item.pk,
        "into": "scratch",
        "verified": "on",
        "verification": "ok",
        "started": (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"),
        "finished": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
        **fields,
    }
    response = operator_client.post(PAGE, body)
    assert response.status_code == 400
    assert f'data-error-for="{field}"' in response.content.decode()
    assert not RestoreTest.objects.exists()


def test_the_overview_tile_counts_what_the_page_counts(
    operator_client: Client, viewer_client: Client, register: dict[str, RecoveryItem]
) -> None:
    home = operator_client.get("/").content.decode()
    assert 'id="recovery-tile"' in home
    tile = dict(re.findall(r'data-count="(\w+)">(\d+)<', home))
    assert tile == {"rpo_breached": "1", "rto_unproven": "1", "failing": "1", "same_site": "1"}
    page = states(operator_client.get(PAGE).content.decode())
    for state, n in tile.items():
        listed = states(operator_client.get(f"{PAGE}?state={state}").content.decode())
        assert len(listed) == int(n), state
    assert len(page) == 4
    assert 'id="recovery-tile"' not in viewer_client.get("/").content.decode()


def test_the_page_and_the_items_api_say_the_same_state_and_copy_for_every_item(
    operator_client: Client, register: dict[str, RecoveryItem], site_b: Site
) -> None:
    declared = make_item(None, name="declared-copy", copy_site=site_b, copy_tier="tape")
    api = {row["name"]: row for row in operator_client.get("/api/v1/recovery/items/").json()["results"]}
    page = states(operator_client.get(PAGE).content.decode())
    assert {name: row["state"] for name, row in api.items()} == page
    assert api["declared-copy"]["copy"] == {"site": "iad-2", "tier": "tape"}  # no backup yet: the declared one
    assert api["same-site"]["copy"] == {"site": "ams-1", "tier": "nfs"}  # the last good backup's
    assert api["failing-ckpt"]["problems"] == ["failing"]
    assert api["stale-weights"]["problems"] == ["rpo_breached", "rto_unproven"]  # worst first: its state
    assert declared.pk in {row["id"] for row in api.values()}
