"""Token authentication: agent tokens for machine clients (NVML agent, exporters' pushers) on the
ingest doors, personal tokens for people's scripts on the rest of the API."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from console.models import PERSONAL_TOKEN_PREFIX, AgentToken, PersonalToken


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
        if plain.strip().startswith(f"{PERSONAL_TOKEN_PREFIX}_"):
            # A person's token on an agent door: say what the door takes, not that the token is bad.
            raise exceptions.AuthenticationFailed(
                "This route takes an agent token (Authorization: Bearer gp_..., made with "
                "manage.py create_agent_token or in Admin › Agent tokens), not a personal API token (gpt_...)."
            )
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


class PersonalTokenAuthentication(authentication.BaseAuthentication):
    """A person's token (``Authorization: Bearer gpt_...``): the request acts as that user, so the
    user's role decides what it may do, exactly as for their browser session.

    No CSRF check: a token is not sent by the browser on its own, as a cookie is. The agent doors
    do not list this class, so a personal token never pushes telemetry.
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, PersonalToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, plain = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None  # no header, or another scheme: the session (if any) decides
        plain = plain.strip()
        if not plain.startswith(f"{PERSONAL_TOKEN_PREFIX}_"):
            # Refused here rather than passed on: a bearer token that is not a person's must not
            # fall back to a session cookie sent with it.
            raise exceptions.AuthenticationFailed(
                "This route takes a personal API token (Authorization: Bearer gpt_...); "
                "agent tokens are accepted only by the ingest routes, the Alertmanager webhook and "
                "the recovery backup reports."
            )
        token = PersonalToken.authenticate(plain)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked personal token.")
        token.touch()
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="goodput"'


class AgentOrPersonalTokenAuthentication(authentication.BaseAuthentication):
    """For routes both machines and people write (training jobs and their events): a ``gpt_``
    token is a person's and acts with their role; any other bearer token must be an agent token,
    scoped to its site by the view's permission."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, plain = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        if plain.strip().startswith(f"{PERSONAL_TOKEN_PREFIX}_"):
            return PersonalTokenAuthentication().authenticate(request)
        return AgentTokenAuthentication().authenticate(request)

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="goodput"'
