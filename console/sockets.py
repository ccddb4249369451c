"""Who may hold a live websocket, and for how long.

The HTTP side checks the session on every request; a websocket is one request that lasts for
hours, so it needs the same checks made again:

1. At the handshake the Origin must be the very scheme, host and port the socket connects to
   (``SameOriginValidator``).
2. The session is read by the consumer, not by a middleware, so a database outage can be answered
   with the console's 503 instead of the server's 500 (``deny_unavailable``).
3. Each socket joins ``user.<id>``: logout and a password change close it at once (the receivers
   below), and the consumer re-reads its session every ``SESSION_RECHECK_SECONDS`` for what no
   signal reports (expiry, a deleted session row, a role taken away, a change made by SQL).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib import import_module
from typing import Any
from urllib.parse import urlsplit

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.sessions.backends.base import SessionBase
from django.db import InterfaceError, OperationalError, transaction
from django.http.request import validate_host
from django.utils.crypto import constant_time_compare, salted_hmac

from console import live
from console.middleware import database_unavailable

logger = logging.getLogger(__name__)

# How often an open socket re-reads its session. Module-level so tests can shorten it.
SESSION_RECHECK_SECONDS: float = 60.0

# Close codes the page understands (static/js/live.js): 4401, 4403 and 4413 stop the reconnect
# loop; after 4429 the page waits a minute before it tries again; after 1013 (and any other) it
# reconnects with backoff.
CLOSE_SIGNED_OUT = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY_TOPICS = 4413  # more than WS_MAX_TOPICS topics on one socket
CLOSE_TOO_MANY_SOCKETS = 4429  # the user already holds WS_MAX_PER_USER sockets (console.socket_slots)
# RFC 6455 registry "try again later": the session, the socket's slot or the channel layer's
# Redis cannot be reached right now (its connection pool exhausted by a burst of sockets, say).
CLOSE_TRY_AGAIN_LATER = 1013
TRY_AGAIN_REASON = "Server busy: try again shortly"

# What a database outage looks like from Django (a pool timeout arrives as OperationalError).
DATABASE_DOWN = (OperationalError, InterfaceError)

SESSION_ENDED = "session.ended"  # channel-layer message type, handled by LiveConsumer.session_ended
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The page scheme a socket's own scheme belongs to (ASGI says ws or wss; http and https are taken too).
_PAGE_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}
_HTTP_RESPONSE_EXTENSION = "websocket.http.response"


def slot_ttl() -> float:
    """How long a socket's slot lasts unrefreshed: a few session checks (each refreshes it)."""
    return 2.5 * SESSION_RECHECK_SECONDS


def user_group(user_id: int) -> str:
    """The channel-layer group every socket of one user joins."""
    return f"user.{int(user_id)}"


# --- the handshake ---------------------------------------------------------------------------


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin1")
    return None


def is_same_origin(headers: Iterable[tuple[bytes, bytes]], scheme: str = "ws") -> bool:
    """True when the Origin is the scheme, host and port the socket was opened to: ``scheme``
    (the ASGI scope's, which goodput.asgi sets from X-Forwarded-Proto behind a trusted proxy)
    and the Host header. An http:// page may not open a socket to an https console.

    A port the Origin leaves out is its scheme's default, and so is one the Host leaves out: a
    browser omits the default port from both. With no Host header (RFC 6455 requires one, so
    only an in-process client gets here) the Origin must name an allowed host on its default port.
    """
    headers = list(headers)
    origin = _header(headers, b"origin")
    if origin is None:
        return False
    parsed = urlsplit(origin)
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.hostname:  # "null", file:, extensions
        return False
    if parsed.scheme != _PAGE_SCHEMES.get(scheme):
        return False
    default_port = _DEFAULT_PORTS[parsed.scheme]
    try:
        origin_at = (parsed.hostname, parsed.port or default_port)
        host = _header(headers, b"host")
        if host is None:
            return parsed.port is None and validate_host(parsed.hostname, settings.ALLOWED_HOSTS)
        target = urlsplit(f"//{host}")
        return target.hostname is not None and origin_at == (target.hostname, target.port or default_port)
    except ValueError:  # a port that is not a number or out of range
        return False


class SameOriginValidator:
    """Refuse (403) a websocket whose Origin is not the scheme, host and port it connected to.

    Channels' AllowedHostsOriginValidator compares host names only, so a page served on another
    port of the same host (another service, a dev server) could open a socket with the user's
    cookie. The scheme counts too: a plain-http page of the same host, which anyone on the path
    can write into, may not open a socket to the https console. Channels' validator stays in the
    stack as well: a Host header can be chosen by a DNS-rebinding page, and that validator keeps
    such an Origin out of ALLOWED_HOSTS.
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator is for websocket connections only")
        if not is_same_origin(scope.get("headers", []), scope.get("scheme", "ws")):
            await WebsocketDenier()(scope, receive, send)
            return
        await self.application(scope, receive, send)


async def deny_unavailable(consumer: AsyncWebsocketConsumer) -> None:
    """Refuse a handshake because the database is down: the console's 503 with Retry-After.

    The response goes out through ASGI's ``websocket.http.response`` extension where the server
    offers it (uvicorn does); otherwise the socket is closed before it is accepted (a 403).
    """
    if _HTTP_RESPONSE_EXTENSION not in (consumer.scope.get("extensions") or {}):
        await consumer.close(code=CLOSE_TRY_AGAIN_LATER)
        return
    response = database_unavailable()
    headers = [(name.lower().encode("latin1"), value.encode("latin1")) for name, value in response.items()]
    await consumer.base_send(
        {"type": "websocket.http.response.start", "status": response.status_code, "headers": headers}
    )
    await consumer.base_send({"type": "websocket.http.response.body", "body": response.content})


# --- the session, checked at the handshake and again every SESSION_RECHECK_SECONDS -----------


def session_user(session: SessionBase) -> AbstractBaseUser | None:
    """The active user a session signs in, as Django's auth middleware would find it, or None.

    1. The session exists and has not expired (a store loads a missing or expired one as empty).
    2. It names a user through a configured backend, and the backend still returns that user
       (ModelBackend returns none for an inactive user).
    3. Its auth hash is the user's current one, which changes with the password.

    Reads the database: call it through ``database_sync_to_async``.
    """
    try:
        user_id = get_user_model()._meta.pk.to_python(session[SESSION_KEY])
        backend_path = session[BACKEND_SESSION_KEY]
    except KeyError:
        return None
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(user_id)
    if user is None:
        return None
    if not constant_time_compare(session.get(HASH_SESSION_KEY) or "", user.get_session_auth_hash()):
        return None
    return user


def session_tag(session_key: str) -> str:
    """Names a session in channel-layer messages without putting its key (a credential) in Redis."""
    return salted_hmac("console.sockets.session", session_key, algorithm="sha256").hexdigest()


def load_session(session_key: str | None) -> SessionBase:
    """A fresh store for ``session_key`` (nothing is read until it is used)."""
    return import_module(settings.SESSION_ENGINE).SessionStore(session_key)


# --- closing a user's sockets when the HTTP side ends their sessions -------------------------


def end_sockets(user_id: int, *, session_key: str | None = None) -> None:
    """After commit, close the user's sockets: those of one session, or all of them when None.

    A channel layer that cannot take the message must not fail the logout or the password change
    that asked for it: the consumer's periodic re-check closes the socket within a minute anyway.
    """
    message = {"type": SESSION_ENDED, "session": session_tag(session_key) if session_key else None}

    def send() -> None:
        try:
            live.send_to_group(user_group(user_id), message)
        except Exception:
            logger.warning("could not tell user %s's sockets that a session ended", user_id, exc_info=True)

    transaction.on_commit(send)


def end_sockets_on_logout(sender: Any, request: Any, user: AbstractBaseUser | None, **kwargs: Any) -> None:
    """``user_logged_out``: close the sockets of the session being logged out.

    Logging out ends one session, not the user's others (another browser stays signed in), so
    only that session's sockets close; without a request to name it, all of the user's do.
    """
    if user is None or user.pk is None:
        return
    session = getattr(request, "session", None)
    end_sockets(user.pk, session_key=getattr(session, "session_key", None))


def remember_password_hash(sender: Any, instance: AbstractBaseUser, raw: bool, **kwargs: Any) -> None:
    """``pre_save`` of the user: keep the stored password hash to compare after the save."""
    update_fields = kwargs.get("update_fields")
    if raw or instance.pk is None or (update_fields is not None and "password" not in update_fields):
        instance._password_hash_before_save = None  # type: ignore[attr-defined]
        return
    before = sender._default_manager.filter(pk=instance.pk).values_list("password", flat=True).first()
    instance._password_hash_before_save = before  # type: ignore[attr-defined]


def end_sockets_on_password_change(sender: Any, instance: AbstractBaseUser, raw: bool, **kwargs: Any) -> None:
    """``post_save`` of the user: a new password hash ends every session, so every socket closes.

    That includes the session that changed it: ``update_session_auth_hash`` gives that browser a
    new session key, and the socket still holds the old one.
    """
    before = getattr(instance, "_password_hash_before_save", None)
    instance._password_hash_before_save = None  # type: ignore[attr-defined]
    if raw or before is None or before == instance.password:
        return
    end_sockets(instance.pk)


def connect_receivers() -> None:
    """Wire the receivers above (called from ConsoleConfig.ready)."""
    from django.contrib.auth.signals import user_logged_out
    from django.db.models.signals import post_save, pre_save

    user_model = settings.AUTH_USER_MODEL
    user_logged_out.connect(end_sockets_on_logout, dispatch_uid="console.sockets.logout")
    pre_save.connect(remember_password_hash, sender=user_model, dispatch_uid="console.sockets.password_before")
    post_save.connect(end_sockets_on_password_change, sender=user_model, dispatch_uid="console.sockets.password")
