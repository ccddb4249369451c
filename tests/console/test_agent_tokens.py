"""Agent tokens: shown once, hashed at rest, scoped to one site, managed by command and admin."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from console.models import AgentToken
from fleet.models import Site
from tests.conftest import make_sample, post_batch


def test_create_agent_token_prints_a_working_token_once_and_stores_only_its_hash(client, site_a: Site) -> None:
    out, err = StringIO(), StringIO()
    call_command("create_agent_token", "--site", "ams-1", "--name", "dcgm-pusher", stdout=out, stderr=err)
    plain = out.getvalue().strip()
    token = AgentToken.objects.get(name="dcgm-pusher")
    assert plain.startswith(f"gp_{token.key_id}_")
    secret = plain.split("_", 2)[2]
    assert secret not in token.secret_hash and len(token.secret_hash) == 64
    assert "Shown once" in err.getvalue()
    assert post_batch(client, plain, {"samples": [make_sample()]}).status_code == 202
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_create_agent_token_refuses_an_unknown_site(site_a: Site) -> None:
    with pytest.raises(CommandError, match=r"No site named 'nowhere'.*ams-1"):
        call_command("create_agent_token", "--site", "nowhere")
    call_command("create_agent_token", "--site", "nowhere", "--create-site", stdout=StringIO(), stderr=StringIO())
    assert Site.objects.filter(name="nowhere").exists()


def test_the_admin_issues_a_token_and_shows_it_once(admin_client, site_a: Site) -> None:
    response = admin_client.post(
        "/admin/console/agenttoken/add/", {"name": "node-agent", "site": site_a.pk}, follow=True
    )
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    token = AgentToken.objects.get(name="node-agent")
    assert any(f"gp_{token.key_id}_" in m for m in shown)
    # The change page never shows the secret again.
    page = admin_client.get(f"/admin/console/agenttoken/{token.pk}/change/").content.decode()
    assert token.key_id in page and token.secret_hash not in page


def test_operators_cannot_manage_tokens(operator_client, site_a: Site) -> None:
    assert operator_client.get("/admin/console/agenttoken/").status_code in (302, 403)
    response = operator_client.post("/admin/console/agenttoken/add/", {"name": "x", "site": site_a.pk})
    assert response.status_code in (302, 403)
    assert not AgentToken.objects.filter(name="x").exists()


def test_a_revoked_token_stops_working_at_once_though_its_verification_was_cached(
    client, site_a, django_capture_on_commit_callbacks
) -> None:
    """Verified tokens are remembered, but a revocation bumps the shared generation on commit."""
    token, plain = AgentToken.issue(site=site_a, name="rotating")
    assert post_batch(client, plain, {"samples": [make_sample()]}).status_code == 202
    assert post_batch(client, plain, {"samples": [make_sample()]}).status_code == 202  # from the cache
    with django_capture_on_commit_callbacks(execute=True):
        assert AgentToken.objects.filter(pk=token.pk).revoke() == 1
    assert post_batch(client, plain, {"samples": [make_sample()]}).status_code == 401
    wrong = plain[:-3] + "xyz"
    assert post_batch(client, wrong, {"samples": [make_sample()]}).status_code == 401  # the hash is always checked
