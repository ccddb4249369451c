"""Cross-cutting models: agent tokens and the console's own permissions."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "gp"
TOKEN_CACHE_SECONDS = 30
_verified: dict[str, tuple[AgentToken, float]] = {}


def forget_verified_tokens() -> None:
    _verified.clear()


def hash_secret(secret: str) -> str:
    # Tokens carry 256 bits of randomness, so a fast hash is enough (as GitHub does for its
    # tokens); a slow KDF would add latency to every ingest request without adding safety.
    return hashlib.sha256(secret.encode()).hexdigest()


class AgentTokenQuerySet(models.QuerySet["AgentToken"]):
    def active(self) -> AgentTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class AgentToken(models.Model):
    """A credential for a telemetry agent, scoped to one site and hashed at rest.

    The plain token (``gp_<key_id>_<secret>``) is shown once, when it is made.
    """

    name = models.CharField(max_length=100)
    site = models.ForeignKey("fleet.Site", on_delete=models.CASCADE, related_name="agent_tokens")
    key_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = AgentTokenQuerySet.as_manager()

    class Meta:
        ordering = ["site__name", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.site}, {TOKEN_PREFIX}_{self.key_id}_…)"

    @classmethod
    def issue(cls, *, site: models.Model, name: str, created_by: object = None) -> tuple[AgentToken, str]:
        """Create a token and return it with its plain text, which is never stored."""
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        token = cls.objects.create(
            site=site, name=name, key_id=key_id, secret_hash=hash_secret(secret), created_by=created_by
        )
        return token, f"{TOKEN_PREFIX}_{key_id}_{secret}"

    @classmethod
    def authenticate(cls, plain: str) -> AgentToken | None:
        """Return the active token matching ``plain``, or None.

        Verified tokens are remembered in this process for TOKEN_CACHE_SECONDS: an agent posts
        many times a second fleet-wide, and a database read per request was measurable. So a
        revocation takes effect within that time, not at once.
        """
        parts = plain.split("_", 2)
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
            return None
        cached = _verified.get(parts[1])
        if cached is not None and cached[1] > time.monotonic():
            token = cached[0]
        else:
            token = cls.objects.active().select_related("site").filter(key_id=parts[1]).first()
            if token is None:
                return None
        if not hmac.compare_digest(token.secret_hash, hash_secret(parts[2])):
            return None
        if cached is None or cached[0] is not token:
            _verified[parts[1]] = (token, time.monotonic() + TOKEN_CACHE_SECONDS)
        return token

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class ConsolePermissions(models.Model):
    """Holds permissions that belong to no single model (dashboards, operating, compliance)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_dashboards", "Can view dashboards and read the API"),
            ("operate", "Can act on incidents, reservations, jobs and scrape targets"),
            ("manage_compliance", "Can edit compliance records and export compliance packs"),
        ]

    def __str__(self) -> str:
        return "console permissions"
