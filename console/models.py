"""Cross-cutting models: agent tokens, personal API tokens and the console's own permissions."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from datetime import timedelta
from typing import Any

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.core.cache import cache
from django.db import models, transaction
from django.utils import timezone

from console.signals import row_changed

TOKEN_PREFIX = "gp"
TOKEN_CACHE_SECONDS = 30
# Bumped (in the shared cache: Redis in production) after any agent token changes: every web
# process compares it on each authentication and drops its verified tokens when it moved.
TOKEN_GENERATION_KEY = "console:agent-tokens:generation"
_verified: dict[str, tuple[AgentToken, float]] = {}
_verified_generation: list[int | None] = [None]  # the generation _verified was filled under
logger = logging.getLogger(__name__)


def forget_verified_tokens() -> None:
    _verified.clear()
    _verified_generation[0] = None


def token_generation() -> int | None:
    """The agent tokens' current generation, or None when the shared cache cannot be read."""
    try:
        return int(cache.get(TOKEN_GENERATION_KEY, 0))
    except Exception:
        logger.warning("cannot read the agent tokens' generation: checking tokens in the database", exc_info=True)
        return None


def agent_tokens_changed() -> None:
    """After commit, tell every process's verified-token cache that an agent token changed.

    After commit, so a process that sees the new generation and reads the database again finds
    the change. While Redis cannot be reached no process trusts its cache (``token_generation``
    is None, so every request reads the database); a bump lost in the moment it comes back is
    logged, and the caches then hold the token for at most TOKEN_CACHE_SECONDS.
    """

    def bump() -> None:
        try:
            try:
                cache.incr(TOKEN_GENERATION_KEY)
            except ValueError:  # no generation yet (or the cache lost it): any new value moves it
                if not cache.add(TOKEN_GENERATION_KEY, 1, timeout=None):
                    cache.incr(TOKEN_GENERATION_KEY)
        except Exception:
            logger.error("could not tell other processes that an agent token changed", exc_info=True)

    transaction.on_commit(bump)


def agent_token_saved_or_deleted(sender: Any, **kwargs: Any) -> None:
    """``post_save`` / ``post_delete`` of AgentToken (ConsoleConfig.ready)."""
    agent_tokens_changed()


def hash_secret(secret: str) -> str:
    # Tokens carry 256 bits of randomness, so a fast hash is enough (as GitHub does for its
    # tokens); a slow KDF would add latency to every ingest request without adding safety.
    return hashlib.sha256(secret.encode()).hexdigest()


class AgentTokenQuerySet(models.QuerySet["AgentToken"]):
    def active(self) -> AgentTokenQuerySet:
        return self.filter(revoked_at__isnull=True)

    def revoke(self) -> int:
        """Revoke the active tokens of this queryset, in every process at once; how many."""
        count = self.active().update(revoked_at=timezone.now())
        if count:
            agent_tokens_changed()
        return count


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
        many times a second fleet-wide, and a database read per request was measurable. Each
        call first reads the tokens' generation from the shared cache (one Redis GET), which any
        change bumps (``agent_tokens_changed``): a revocation takes effect at once in every
        process. The generation is read before the database, so a revocation committed between
        the two leaves a newer generation behind, and the next call drops what this one kept.
        """
        parts = plain.split("_", 2)
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
            return None
        generation = token_generation()
        if generation is None or generation != _verified_generation[0]:
            _verified.clear()
            _verified_generation[0] = generation
        cached = _verified.get(parts[1]) if generation is not None else None
        if cached is not None and cached[1] > time.monotonic():
            token = cached[0]
        else:
            token = cls.objects.active().select_related("site").filter(key_id=parts[1]).first()
            if token is None:
                return None
        if not hmac.compare_digest(token.secret_hash, hash_secret(parts[2])):
            return None
        if generation is not None and (cached is None or cached[0] is not token):
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


PERSONAL_TOKEN_PREFIX = "gpt"  # not the agent tokens' "gp": the two kinds are told apart by prefix alone
LAST_USED_RESOLUTION_SECONDS = 60


class PersonalTokenQuerySet(models.QuerySet["PersonalToken"]):
    def active(self) -> PersonalTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class PersonalToken(models.Model):
    """A person's API token for scripts: it acts as its user, with that user's role, on /api/v1/.

    Hashed at rest; the plain token (``gpt_<key_id>_<secret>``) is shown once, when it is made. Only
    its owner makes one (an Admin making a token for someone else would be impersonation); the owner
    or an Admin revokes it. Never accepted on the agent doors (ingest, the Alertmanager webhook).
    """

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="personal_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ack script on bastion'.")
    key_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )

    objects = PersonalTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.user}, {self.display_prefix})"

    @property
    def display_prefix(self) -> str:
        """The public part of the token, enough to recognise it in a list or a log."""
        return f"{PERSONAL_TOKEN_PREFIX}_{self.key_id}_…"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def issue(cls, *, user: Any, name: str) -> tuple[PersonalToken, str]:
        """Create a token for ``user`` and return it with its plain text, which is never stored."""
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        with transaction.atomic():
            token = cls.objects.create(user=user, name=name, key_id=key_id, secret_hash=hash_secret(secret))
            _audit(token, actor=user, flag=ADDITION, message="Issued personal API token.")
        logger.info("personal token %s (%r) issued to %s", token.display_prefix, name, user)
        return token, f"{PERSONAL_TOKEN_PREFIX}_{key_id}_{secret}"

    def revoke(self, *, actor: Any) -> bool:
        """Revoke the token at once; False if it was already revoked (nothing is written then).

        A conditional UPDATE, so two revocations at the same moment record one.
        """
        now = timezone.now()
        with transaction.atomic():
            changed = type(self).objects.active().filter(pk=self.pk).update(revoked_at=now, revoked_by=actor)
            if not changed:
                return False
            self.revoked_at, self.revoked_by = now, actor
            _audit(self, actor=actor, flag=CHANGE, message="Revoked personal API token.")
            row_changed.send(
                sender=type(self), instance=self, before={"revoked_at": None, "revoked_by": None}, message="Revoked."
            )
        logger.info("personal token %s of %s revoked by %s", self.display_prefix, self.user, actor)
        return True

    @classmethod
    def authenticate(cls, plain: str) -> PersonalToken | None:
        """Return the active token of an active user matching ``plain``, or None.

        Unlike agent tokens, nothing is cached: scripts call far less often than agents push, and a
        cached token would carry its user's cached permissions, so a revocation or a role taken
        away would lag. One indexed read per request buys both taking effect at once.
        """
        parts = plain.split("_", 2)
        if len(parts) != 3 or parts[0] != PERSONAL_TOKEN_PREFIX:
            return None
        token = cls.objects.active().select_related("user").filter(key_id=parts[1], user__is_active=True).first()
        if token is None or not hmac.compare_digest(token.secret_hash, hash_secret(parts[2])):
            return None
        return token

    def touch(self) -> None:
        """Record a use, at most once a minute: a write per API call would be pure overhead."""
        now = timezone.now()
        stale = now - timedelta(seconds=LAST_USED_RESOLUTION_SECONDS)
        if self.last_used_at is not None and self.last_used_at > stale:
            return
        type(self).objects.filter(pk=self.pk).filter(
            models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lte=stale)
        ).update(last_used_at=now)
        self.last_used_at = now


def _audit(token: PersonalToken, *, actor: Any, flag: int, message: str) -> None:
    # There is no general audit log yet: the admin's history is where an Admin looks for who did what.
    # (log_actions takes any iterable of objects; a list spares re-reading the row.)
    LogEntry.objects.log_actions(user_id=actor.pk, queryset=[token], action_flag=flag, change_message=message)  # type: ignore[arg-type]
