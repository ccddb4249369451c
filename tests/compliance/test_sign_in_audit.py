"""Issue 22: sign-ins, failed sign-ins, lock-outs and sign-outs are in the audit log, not only in
django-axes' throttling tables."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from compliance.choices import AuditAction
from compliance.models import AuditEntry
from tests.conftest import PASSWORD


def sign_in(client: Client, username: str, password: str, address: str = "10.0.0.7") -> Any:
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_a_sign_in_and_a_sign_out_are_audited(viewer_user: User) -> None:
    client = Client()
    assert sign_in(client, viewer_user.username, PASSWORD).status_code == 302

    entry = AuditEntry.objects.get(action=AuditAction.SIGN_IN)
    assert (entry.actor, entry.actor_id, entry.remote_addr) == ("vera", viewer_user.pk, "10.0.0.7")
    assert (entry.app_label, entry.model, entry.object_id) == ("auth", "user", str(viewer_user.pk))

    client.post("/accounts/logout/", REMOTE_ADDR="10.0.0.7")
    out = AuditEntry.objects.get(action=AuditAction.SIGN_OUT)
    assert (out.actor, out.message) == ("vera", "signed out")


def test_a_failed_sign_in_is_audited_with_the_name_tried_and_never_the_password(viewer_user: User) -> None:
    sign_in(Client(), viewer_user.username, "not-the-password-42", address="203.0.113.9")
    sign_in(Client(), "nobody-of-that-name", "hunter2-guess", address="203.0.113.9")

    failed = list(AuditEntry.objects.filter(action=AuditAction.SIGN_IN_FAILED).order_by("pk"))
    assert [(e.actor, e.actor_id, e.remote_addr, e.message) for e in failed] == [
        ("vera", None, "203.0.113.9", "sign-in failed"),
        ("nobody-of-that-name", None, "203.0.113.9", "sign-in failed"),
    ]
    everything = str(list(AuditEntry.objects.values()))
    assert "not-the-password-42" not in everything and "hunter2-guess" not in everything
    assert not AuditEntry.objects.filter(action=AuditAction.SIGN_IN).exists()


def test_a_lock_out_is_audited(viewer_user: User, settings: Any) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        sign_in(client, viewer_user.username, "wrong", address="198.51.100.4")
    assert sign_in(client, viewer_user.username, PASSWORD, address="198.51.100.4").status_code == 429

    lockouts = AuditEntry.objects.filter(action=AuditAction.LOCKOUT, actor="vera")
    first = lockouts.order_by("pk").first()
    assert first is not None and first.remote_addr == "198.51.100.4"
    assert first.after["failures"] == settings.AXES_FAILURE_LIMIT
    assert first.message == f"sign-in locked out after {settings.AXES_FAILURE_LIMIT} failures"
    assert (
        AuditEntry.objects.filter(action=AuditAction.SIGN_IN_FAILED, actor="vera").count()
        >= settings.AXES_FAILURE_LIMIT
    )
    assert not AuditEntry.objects.filter(action=AuditAction.SIGN_IN, actor="vera").exists()
