"""Issue 22: tamper evidence. Each audit entry is sealed at commit with the SHA-256 of its content
and of the entry before; `manage.py verify_audit_log` walks the chain and exits 1 naming the first
entry that does not match, even one a superuser edited with the triggers disabled; the pack states
the chain's head and the compliance home page when it was last verified.

The chain is sealed when a transaction commits, so these tests commit (transactional database).
Tampering needs a superuser: the embedded server's, DATABASE_ADMIN_URL's, or a superuser
DATABASE_URL's (the suite's own role may not touch the table at all: test_audit_roles.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from datetime import UTC, date, timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from compliance.choices import AuditAction
from compliance.models import GENESIS_HASH, AuditChainCheck, AuditEntry, AuditSeal
from compliance.services import audit_chain, pack
from compliance.services.audit import purge_entries_before, record
from tests.compliance.audit_support import rewrite_consistently, tamper, three_entries, verify

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_entry_is_sealed_at_commit_with_hashes_anyone_can_recompute() -> None:
    entry = record(AuditAction.ACTION, after={"n": 1}, message="m", actor="system", remote_addr="10.0.0.7")
    entry.refresh_from_db()
    first, second, third = three_entries()

    seal = entry.seal
    assert [first.seal.seq, second.seal.seq, third.seal.seq] == [seal.seq + 1, seal.seq + 2, seal.seq + 3]
    # The content, field by field as <length>:<text> (~ for NULL): id, at, actor_id, actor, action,
    # app_label, model, object_id, object_repr, before, after (jsonb text), message, remote_addr.
    at = entry.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    text = f"{len(str(entry.pk))}:{entry.pk}27:{at}~6:system6:action0:0:0:0:~" + '8:{"n": 1}1:m8:10.0.0.7'
    assert seal.content_hash == hashlib.sha256(text.encode()).hexdigest()
    assert seal.hash == hashlib.sha256((seal.prev_hash + seal.content_hash).encode()).hexdigest()
    assert (first.seal.prev_hash, second.seal.prev_hash) == (seal.hash, first.seal.hash)
    assert third.seal.prev_hash == second.seal.hash
    assert AuditSeal.objects.order_by("seq").first().prev_hash == GENESIS_HASH


def test_verify_passes_on_an_intact_chain_and_the_home_page_says_when(officer_client: Client) -> None:
    three_entries()

    status, output = verify()

    head = audit_chain.chain_head()
    assert status == 0 and f"head_seq={head.seq} head_hash={head.hash} ok" in output
    check = AuditChainCheck.objects.get()
    assert check.ok and check.head_seq == head.seq and check.entries == AuditEntry.objects.count()
    page = officer_client.get("/compliance/").content.decode()
    assert f"hash chain verified {timezone.localtime(check.checked_at):%Y-%m-%d %H:%M} UTC" in page
    assert f"{check.entries} entries intact" in page


def test_a_superuser_edit_with_the_trigger_disabled_is_caught_and_named(
    superuser: psycopg.Connection[Any], officer_client: Client
) -> None:
    _, edited, _ = three_entries()
    tamper(
        superuser, "UPDATE compliance_auditentry SET message = 'nothing happened' WHERE id = %s", params=(edited.pk,)
    )
    assert AuditEntry.objects.get(pk=edited.pk).message == "nothing happened"  # the edit went in

    status, output = verify()

    assert status == 1
    assert f"entry #{edited.pk} (seq {edited.seal.seq}) was changed after it was written" in output
    check = AuditChainCheck.objects.get()
    assert not check.ok and check.first_bad_entry == edited.pk
    assert "hash chain BROKEN" in officer_client.get("/compliance/").content.decode()


def test_an_entry_rewritten_with_its_hashes_recomputed_breaks_the_link_to_the_next(
    superuser: psycopg.Connection[Any],
) -> None:
    _, edited, after = three_entries()
    rewrite_consistently(superuser, edited.pk, "forged")

    status, output = verify()

    assert status == 1
    assert f"entry #{after.pk} (seq {after.seal.seq}) does not follow entry #{edited.pk}" in output


def test_a_removed_entry_is_caught_at_the_one_after_it(superuser: psycopg.Connection[Any]) -> None:
    _, removed, after = three_entries()
    seq = removed.seal.seq
    tamper(
        superuser,
        "DELETE FROM compliance_auditseal WHERE entry_id = %(id)s",
        "DELETE FROM compliance_auditentry WHERE id = %(id)s",
        params={"id": removed.pk},  # type: ignore[arg-type]
    )

    status, output = verify()

    assert status == 1
    assert f"entries with seq {seq} to {seq}, before entry #{after.pk}, are missing" in output


def test_an_entry_removed_behind_its_seal_is_caught(superuser: psycopg.Connection[Any]) -> None:
    _, removed, _ = three_entries()
    with superuser.transaction():
        superuser.execute("SET LOCAL session_replication_role = replica")  # no foreign-key checks either
        superuser.execute("ALTER TABLE compliance_auditentry DISABLE TRIGGER auditentry_append_only")
        superuser.execute("DELETE FROM compliance_auditentry WHERE id = %s", [removed.pk])
        superuser.execute("ALTER TABLE compliance_auditentry ENABLE ALWAYS TRIGGER auditentry_append_only")

    status, output = verify()

    assert status == 1 and f"entry #{removed.pk} (seq {removed.seal.seq}) was removed" in output


def test_an_entry_written_with_the_seal_off_is_caught(superuser: psycopg.Connection[Any]) -> None:
    three_entries()
    with superuser.transaction():
        superuser.execute("ALTER TABLE compliance_auditentry DISABLE TRIGGER auditentry_seal")
        forged = superuser.execute(
            "INSERT INTO compliance_auditentry (at, actor, action, app_label, model, object_id, object_repr, message)"
            " VALUES (now(), 'system', 'action', '', '', '', '', 'slipped in') RETURNING id"
        ).fetchone()[0]
        superuser.execute("ALTER TABLE compliance_auditentry ENABLE ALWAYS TRIGGER auditentry_seal")

    status, output = verify()

    assert status == 1 and f"entry #{forged} was never sealed" in output


def test_the_chain_is_walked_across_a_purge_which_keeps_the_floor() -> None:
    now = timezone.now()
    old = [
        AuditEntry.objects.create(at=now - timedelta(days=3000 - i), actor="system", action="action", message=f"{i}")
        for i in range(3)
    ]
    recent = AuditEntry.objects.create(at=now - timedelta(days=400), actor="system", action="action")
    three_entries()

    assert purge_entries_before(now, actor="cora") == 3  # a cutoff of now: the floor keeps 400 days

    assert not AuditEntry.objects.filter(pk__in=[e.pk for e in old]).exists()
    assert AuditEntry.objects.filter(pk=recent.pk).exists()
    purge = AuditEntry.objects.get(action=AuditAction.PURGE)
    assert AuditSeal.objects.filter(entry=purge).exists() and purge.after["deleted"] == 3
    status, output = verify()
    assert status == 0, output


def test_an_earlier_head_catches_a_chain_rewritten_to_be_consistent(superuser: psycopg.Connection[Any]) -> None:
    three_entries()
    head = audit_chain.chain_head()
    # A superuser rewrites the last entry and recomputes its hashes: the chain is consistent again.
    rewrite_consistently(superuser, head.entry_id, "rewritten")
    assert verify("--no-record")[0] == 0

    status, output = verify("--head", f"{head.seq}:{head.hash}")

    assert status == 1 and f"the earlier head seq {head.seq} with hash {head.hash} is not in the chain" in output


def test_a_malformed_head_is_refused_naming_the_option() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--head 'abc'"):
        call_command("verify_audit_log", "--head", "abc")


def test_the_pack_states_the_chain_head_and_its_last_verification() -> None:
    three_entries()
    verify()
    record(AuditAction.ACTION, message="after the check", actor="system")
    today = timezone.localdate()
    made = pack.request_pack(period_start=today - timedelta(days=1), period_end=today)
    head, check = audit_chain.chain_head(), AuditChainCheck.objects.get()

    archive = zipfile.ZipFile(io.BytesIO(pack.build_pack(made)))

    chain = json.loads(archive.read("pack.json"))["audit_chain"]
    assert (chain["head_seq"], chain["head_hash"], chain["head_entry_id"]) == (head.seq, head.hash, head.entry_id)
    assert chain["last_verified_ok"] is True and chain["last_verified_entries"] == check.entries
    assert json.loads(archive.read("manifest.json"))["audit_chain"] == chain
    assert isinstance(date.fromisoformat(chain["head_at"][:10]), date)
