"""The audit log: what each change writes (who, what, before and after), and that nothing can
alter an entry once written (ORM, admin, raw SQL, a session setting) except the database's purge
function, which keeps the audit floor. Roles and the hash chain: test_audit_roles.py and
test_audit_chain.py."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.utils import timezone

from compliance.choices import AuditAction, PackStatus
from compliance.models import AuditEntry, AuditSeal, CompliancePack, GpaiModel
from compliance.services.audit import REDACTED, purge_entries_before, record, seal_pending
from console import roles
from console.models import PersonalToken
from fleet.capacity.actions import reservations
from fleet.models import Pool, Reservation, ScrapeTarget, Site, Team
from tests.incidents.test_alertmanager import FIXTURE, post


@pytest.fixture(autouse=True)
def audit_middleware(settings) -> None:  # type: ignore[no-untyped-def]
    """The middleware as console/settings.py lists it: right after AuthenticationMiddleware."""
    middleware = list(settings.MIDDLEWARE)
    if "compliance.middleware.AuditActorMiddleware" not in middleware:
        at = middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1
        middleware.insert(at, "compliance.middleware.AuditActorMiddleware")
    settings.MIDDLEWARE = middleware


def entries_for(obj) -> list[AuditEntry]:  # type: ignore[no-untyped-def]
    return list(
        AuditEntry.objects.filter(
            app_label=obj._meta.app_label, model=obj._meta.model_name, object_id=str(obj.pk)
        ).order_by("pk")
    )


@pytest.fixture
def pool(site_a: Site) -> Pool:
    return Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="h100")


def test_a_reservation_writes_create_update_and_delete_with_before_and_after(pool: Pool, admin_user: User) -> None:
    start = timezone.now() + timedelta(days=1)
    nlp = Team.objects.create(name="nlp")
    reservation, _ = reservations.create_reservation(
        actor=admin_user, via="ada", team=nlp, pool=pool, gpus=8, start=start, end=start + timedelta(days=2)
    )
    reservation.gpus = 16
    reservation.save()
    reservation_pk = reservation.pk
    reservation.delete()

    created, updated, deleted = entries_for(Reservation(pk=reservation_pk))
    assert (created.action, updated.action, deleted.action) == ("create", "update", "delete")
    assert created.before is None and created.after["gpus"] == 8 and created.after["pool"] == pool.pk
    assert updated.before["gpus"] == 8 and updated.after["gpus"] == 16
    assert updated.before["team"] == updated.after["team"] == "nlp"
    assert deleted.before["gpus"] == 16 and deleted.after is None
    # A service called outside any request (a task, a command) acts as "system".
    assert {e.actor for e in (created, updated, deleted)} == {"system"}
    assert created.actor_id is None and created.object_repr.startswith("nlp: 8 x ams-1/h100")


def test_a_save_that_changes_nothing_writes_nothing(pool: Pool) -> None:
    start = timezone.now() + timedelta(days=1)
    reservation = Reservation.objects.create(
        team=Team.objects.create(name="nlp"), pool=pool, gpus=8, start=start, end=start + timedelta(days=1)
    )
    before = AuditEntry.objects.count()
    reservation.save()  # updated_at (auto_now) moves; nothing anyone changed
    Reservation.objects.get(pk=reservation.pk).save()
    assert AuditEntry.objects.count() == before


def test_an_incident_raised_through_the_alertmanager_api_names_the_agent_token(client: Client, token_a: str) -> None:
    assert post(client, token_a, FIXTURE).status_code == 200
    incident = AuditEntry.objects.get(app_label="incidents", model="incident")
    assert incident.action == AuditAction.CREATE and incident.actor == "agent:agent-a"
    assert incident.after["state"] == "triggered" and incident.remote_addr == "127.0.0.1"
    assert AuditEntry.objects.filter(app_label="incidents", model="timelineentry", actor="agent:agent-a").exists()


def test_a_scrape_target_added_on_the_page_names_the_session_user(
    operator_client: Client, site_a: Site, settings: Any
) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8"]  # the exporters' network
    response = operator_client.post(
        "/fleet/targets/",
        {
            "site": site_a.pk,
            "name": "dcgm-1",
            "url": "http://10.0.0.1:9400/metrics",
            "kind": "auto",
            "interval_seconds": 15,
            "timeout_seconds": 5,
        },
    )
    assert response.status_code == 302, response.content
    target = ScrapeTarget.objects.get(name="dcgm-1")
    (entry,) = entries_for(target)
    assert (entry.action, entry.actor, entry.actor_id) == ("create", "oscar", User.objects.get(username="oscar").pk)
    assert entry.after["url"] == "http://10.0.0.1:9400/metrics"
    # The scraper's bookkeeping is not a change anyone made.
    target.health, target.last_error = "down", "connection refused"
    target.save()
    assert len(entries_for(target)) == 1


def test_a_personal_token_acts_as_its_user(operator_user: User, site_a: Site, settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8"]  # the exporters' network
    plain = PersonalToken.issue(user=operator_user, name="script")[1]
    response = Client().post(
        "/api/v1/fleet/scrape-targets/",
        data=json.dumps({"site": site_a.name, "name": "vllm-1", "url": "http://10.0.0.2:8000/metrics"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {plain}",
    )
    assert response.status_code == 201, response.content
    (entry,) = entries_for(ScrapeTarget.objects.get(name="vllm-1"))
    assert (entry.actor, entry.actor_id) == ("oscar", operator_user.pk)


def test_a_personal_token_is_audited_without_its_secret(operator_user: User) -> None:
    token, plain = PersonalToken.issue(user=operator_user, name="script")
    (created,) = entries_for(token)
    assert created.after["secret_hash"] == REDACTED and created.after["name"] == "script"
    text = json.dumps([created.before, created.after])
    # gpt_<key_id>_<secret>: the secret itself may hold underscores
    assert token.secret_hash not in text and plain.split("_", 2)[2] not in text
    token.touch()  # last use is bookkeeping, and goes through .update(): nothing written
    assert len(entries_for(token)) == 1


def test_a_role_change_records_the_groups_before_and_after(viewer_user: User) -> None:
    officers = Group.objects.get(name=roles.COMPLIANCE_OFFICER)
    viewer_user.groups.add(officers)
    viewer_user.groups.remove(Group.objects.get(name=roles.VIEWER))
    officers.user_set.remove(viewer_user)  # from the group's side too
    added, removed, removed_reverse = [e for e in entries_for(viewer_user) if e.action == "update"][-3:]
    assert added.before == {"groups": [roles.VIEWER]}
    assert added.after == {"groups": sorted([roles.COMPLIANCE_OFFICER, roles.VIEWER])}
    assert removed.after == {"groups": [roles.COMPLIANCE_OFFICER]}
    assert removed_reverse.before == {"groups": [roles.COMPLIANCE_OFFICER]} and removed_reverse.after == {"groups": []}


def test_a_password_change_is_redacted_and_a_last_login_stamp_writes_nothing(viewer_user: User) -> None:
    count = len(entries_for(viewer_user))
    viewer_user.last_login = timezone.now()
    viewer_user.save(update_fields=["last_login"])
    viewer_user.save()  # last_login alone changed since the last entry
    assert len(entries_for(viewer_user)) == count
    viewer_user.set_password("another one entirely")
    viewer_user.save()
    entry = entries_for(viewer_user)[-1]
    assert entry.before["password"] == entry.after["password"] == REDACTED
    assert "pbkdf2" not in json.dumps(entry.after) and "argon2" not in json.dumps(entry.after)


def test_a_compliance_record_is_audited(gpai_model: GpaiModel) -> None:
    gpai_model.provider_contact = "legal@goodput.example"
    gpai_model.save()
    pk = gpai_model.pk
    created, updated = entries_for(gpai_model)
    assert created.action == "create" and created.after["name"] == "Goodput-LM"
    assert updated.before["provider_contact"] == "ai-office@goodput.example"
    assert updated.after["provider_contact"] == "legal@goodput.example"
    assert updated.before["version"] == updated.after["version"] == "1.0"
    gpai_model.delete()
    assert entries_for(GpaiModel(pk=pk))[-1].action == "delete"


def test_a_pack_build_records_status_changes_not_progress(officer_user: User) -> None:
    today = timezone.localdate()
    pack = CompliancePack.objects.create(period_start=today, period_end=today, created_by=officer_user)
    for progress in (10, 40, 90):
        pack.progress, pack.step = progress, f"step {progress}"
        pack.save()
    pack.status, pack.content, pack.progress = PackStatus.DONE, b"PK\x03\x04zip", 100
    pack.save()
    created, done = entries_for(pack)
    assert "content" not in created.after and "content" not in done.after
    assert (done.before["status"], done.after["status"]) == (PackStatus.QUEUED, PackStatus.DONE)


# --- append-only ----------------------------------------------------------------------------


@pytest.fixture
def entry(db: None) -> AuditEntry:
    return record(AuditAction.ACTION, message="kept forever", actor="system")


def refused(attempt) -> bool:  # type: ignore[no-untyped-def]
    """Run ``attempt`` in a savepoint; True when the database refused it: the append-only trigger,
    or (the suite running as the console's own role) the missing privilege."""
    try:
        with transaction.atomic():
            attempt()
    except DatabaseError as exc:
        return "append-only" in str(exc) or "permission denied" in str(exc)
    return False


def test_the_orm_cannot_change_or_delete_an_entry(entry: AuditEntry) -> None:
    def save_changed() -> None:
        entry.message = "rewritten"
        entry.save()

    assert refused(lambda: AuditEntry.objects.filter(pk=entry.pk).update(message="rewritten"))
    assert refused(lambda: AuditEntry.objects.filter(pk=entry.pk).delete())
    assert refused(save_changed)
    assert refused(lambda: AuditEntry.objects.get(pk=entry.pk).delete())
    assert AuditEntry.objects.get(pk=entry.pk).message == "kept forever"


def test_raw_sql_cannot_change_or_delete_an_entry(entry: AuditEntry) -> None:
    def sql(statement: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement, [entry.pk])

    assert refused(lambda: sql("UPDATE compliance_auditentry SET actor = 'mallory' WHERE id = %s"))
    assert refused(lambda: sql("DELETE FROM compliance_auditentry WHERE id = %s"))
    assert AuditEntry.objects.get(pk=entry.pk).actor == "system"


def test_the_admin_cannot_add_change_or_delete_an_entry(entry: AuditEntry) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "x" * 20))
    base = f"/admin/compliance/auditentry/{entry.pk}"
    assert client.get(f"{base}/change/").status_code == 200  # it can be read
    assert client.post(f"{base}/change/", {"message": "rewritten"}).status_code == 403
    assert client.post(f"{base}/delete/", {"post": "yes"}).status_code == 403
    assert client.post("/admin/compliance/auditentry/add/", {"message": "forged"}).status_code == 403
    assert AuditEntry.objects.get(pk=entry.pk).message == "kept forever"


def _backdated(days: int, message: str) -> AuditEntry:
    return AuditEntry.objects.create(
        at=timezone.now() - timedelta(days=days), actor="system", action=AuditAction.ACTION, message=message
    )


def test_the_purge_deletes_only_what_is_older_than_the_floor_and_records_itself(entry: AuditEntry) -> None:
    """Issue 22, item 3: a cutoff of now (a 0-day policy) reaches nothing younger than the floor."""
    ancient, old = _backdated(3000, "ancient"), _backdated(400, "a year old")
    kept = record(AuditAction.ACTION, message="newest", actor="system")
    seal_pending()  # as the commit would: the purge names what it removed by place in the chain
    seal = AuditSeal.objects.get(entry=ancient)

    assert purge_entries_before(timezone.now() + timedelta(days=1), actor="cora") == 1

    assert not AuditEntry.objects.filter(pk=ancient.pk).exists()
    assert AuditEntry.objects.filter(pk__in=[entry.pk, old.pk, kept.pk]).count() == 3
    purge = AuditEntry.objects.get(action=AuditAction.PURGE)
    assert (purge.actor, purge.app_label, purge.model) == ("cora", "compliance", "auditentry")
    assert purge.after["deleted"] == 1 and purge.after["floor_days"] == 2555
    assert purge.after["seq_ranges"] == [[seal.seq, seal.seq, seal.hash]]
    assert not AuditSeal.objects.filter(seq=seal.seq).exists()
    assert purge.message.startswith("audit purge: 1 entries older than")


def test_no_session_setting_lets_a_delete_or_update_through(entry: AuditEntry) -> None:
    """Issue 22, item 1: the settings that used to open the trigger open nothing."""

    def with_setting(statement: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL goodput.audit_purge = 'on'")
            cursor.execute("SET LOCAL goodput.retention_purge = 'on'")
            cursor.execute(statement, [entry.pk])

    assert refused(lambda: with_setting("DELETE FROM compliance_auditentry WHERE id = %s"))
    assert refused(lambda: with_setting("UPDATE compliance_auditentry SET message = 'x' WHERE id = %s"))
    assert AuditEntry.objects.get(pk=entry.pk).message == "kept forever"


def test_an_audited_update_costs_one_select_and_one_insert(site_a: Site, django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    site_a.region = "eu-central"
    with django_assert_num_queries(3):  # SELECT the old row, UPDATE, INSERT the entry
        site_a.save()
