"""Agent-token authentication for machine clients (NVML agent, scripts, exporters' pushers)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from console.models import AgentToken


class AgentPrincipal:
    """The ``request.user`` of a token-authenticated request: an agent, never a person."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False

    def __init__(self, token: AgentToken) -> None:
        self.token = token
        self.username = f"agent:{token.name}"
        self.pk = None

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False

    def has_perms(self, perms: Any, obj: Any = None) -> bool:
        return False

    def __str__(self) -> str:
        return self.username


class AgentTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AgentPrincipal, AgentToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, plain = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not plain.strip():
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <agent token>'.")
        token = AgentToken.authenticate(plain.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked agent token.")
        now = timezone.now()
        # Touch last_used_at at most once a minute: a write per ingest request would be pure overhead.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now  # the cached token must not write again on the next request
        return AgentPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="goodput"'
