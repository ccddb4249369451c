"""A revoked token is refused at once by every web process: each keeps verified agent tokens in
memory, and a revocation bumps a generation in Redis that each compares on every request.
Personal tokens are not cached at all. Tried on two real uvicorn servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from django.contrib.auth.models import User

from console.models import AgentToken, PersonalToken
from fleet.models import Site
from tests.conftest import make_sample, redis_url
from tests.stack import Stack

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def servers(tmp_path, settings) -> Iterator[list[Stack]]:  # type: ignore[no-untyped-def]
    # This process revokes through the same shared cache as the servers (the suite's default is
    # a cache of its own, in memory).
    settings.CACHES = {"default": {"BACKEND": "console.cache.SharedRedisCache", "LOCATION": redis_url()}}
    stacks = []
    try:
        for n in range(2):
            (tmp_path / str(n)).mkdir()
            stack = Stack(redis_url(), tmp_path / str(n))
            if n == 0:
                stack.flush_redis()
            stack.start_server()
            stacks.append(stack)
        yield stacks
    finally:
        for stack in stacks:
            stack.stop()
        if stacks:
            stacks[0].flush_redis()


def _push(stack: Stack, token: str) -> int:
    response = requests.post(
        f"{stack.base_url}/api/v1/ingest/gpu-samples",
        json={"samples": [make_sample()]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    return response.status_code


def _read(stack: Stack, token: str) -> int:
    response = requests.get(
        f"{stack.base_url}/api/v1/fleet/sites/", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    return response.status_code


def test_a_revoked_agent_token_is_refused_by_every_web_process_on_the_next_request(servers, site_a: Site) -> None:
    token, plain = AgentToken.issue(site=site_a, name="node-agent")
    for stack in servers:
        assert _push(stack, plain) == 202
        assert _push(stack, plain) == 202  # now from each process's cache
    assert AgentToken.objects.filter(pk=token.pk).revoke() == 1
    assert [_push(stack, plain) for stack in servers] == [401, 401]


def test_an_agent_token_revoked_in_the_admin_is_refused_at_once(servers, site_a: Site, admin_user: User) -> None:
    from django.test import Client

    token, plain = AgentToken.issue(site=site_a, name="node-agent")
    assert [_push(stack, plain) for stack in servers] == [202, 202]
    admin = Client()
    admin.force_login(admin_user)
    response = admin.post(
        "/admin/console/agenttoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True
    )
    assert response.status_code == 200
    assert [_push(stack, plain) for stack in servers] == [401, 401]


def test_a_revoked_personal_token_is_refused_by_every_web_process_on_the_next_request(
    servers, viewer_user: User
) -> None:
    token, plain = PersonalToken.issue(user=viewer_user, name="script")
    assert [_read(stack, plain) for stack in servers] == [200, 200]
    assert token.revoke(actor=viewer_user)
    assert [_read(stack, plain) for stack in servers] == [401, 401]
