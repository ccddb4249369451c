"""The one websocket consumer: clients connect to /ws/live/, then subscribe to topics.

The consumer reads its own session (console.sockets explains why) and keeps checking it: a socket
ends when its session does (logout, password change, expiry) or when its user loses the role.

When the channel layer's Redis fails it (its connection pool exhausted by a burst of sockets
joining their topics, Redis down), the socket is closed with 1013 "try again later" and one
warning line, not a traceback and a 1006; the page reconnects with backoff. However a socket ends
(closed by either side, refused, or its consumer failed), its slot is given back
(console.socket_slots) and it leaves its groups.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase
from django.db import DataError

from console import drain, live, socket_slots, sockets
from console.permissions import DASHBOARD_PERMISSION

logger = logging.getLogger(__name__)

ACTIONS = ("subscribe", "unsubscribe")
USAGE = 'Send {"action": "subscribe", "topics": [...]}.'


class LiveConsumer(AsyncJsonWebsocketConsumer):
    accepted = False
    cleaned_up = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Channels calls disconnect() for a websocket.disconnect message only: a consumer whose
        # handler raised (a burst's MaxConnectionsError) kept its slot until it lapsed.
        try:
            await super().__call__(scope, receive, send)
        except redis.RedisError as exc:  # from any handler, or the layer's receive loop
            await self._try_again_later(exc)
        finally:  # however the socket ended, normally or not: its slot and groups go back
            await self._clean_up()

    async def _try_again_later(self, exc: Exception) -> None:
        """Close with 1013 (accepted first, so the page gets the code) after one warning line."""
        logger.warning(
            "websocket closed with %s (try again later): Redis failed it: %s: %s",
            sockets.CLOSE_TRY_AGAIN_LATER,
            exc.__class__.__name__,
            exc,
        )
        try:
            if not self.accepted:
                await self.accept()
            await self.close(code=sockets.CLOSE_TRY_AGAIN_LATER, reason=sockets.TRY_AGAIN_REASON)
        except Exception:  # the client went away meanwhile: nothing to tell it
            pass

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        self.accepted = True

    async def connect(self) -> None:
        self.topics: set[str] = set()
        self.user_id: int | None = None
        self.session_key: str | None = None
        self.session_tag = ""
        self.watcher: asyncio.Task[None] | None = None
        self.slot_held = False
        if drain.is_draining():
            # This process is stopping: accepted and closed at once with "service restart", so
            # the page reconnects (through the balancer, to another process) rather than backing off.
            await self.accept()
            await self.close(code=drain.CLOSE_SERVICE_RESTART, reason="service restart")
            return
        try:
            user, code = await self._check(self.scope["session"])
        except DataError:  # a session cookie no session can have (a NUL, say)
            await self.close(code=sockets.CLOSE_SIGNED_OUT)
            return
        except sockets.DATABASE_DOWN:
            logger.warning("websocket refused: the database is unavailable", exc_info=True)
            await sockets.deny_unavailable(self)
            return
        if user is None:
            await self.close(code=code)
            return
        self.scope["user"] = user
        self.user_id, self.session_key = user.pk, self.scope["session"].session_key
        self.session_tag = sockets.session_tag(self.session_key or "")
        await self.channel_layer.group_add(sockets.user_group(user.pk), self.channel_name)
        # A logout between the check and joining the group sent its close to nobody: look again.
        if (await self._check(sockets.load_session(self.session_key)))[0] is None:
            await self.close(code=sockets.CLOSE_SIGNED_OUT)
            return
        try:
            self.slot_held = await socket_slots.take(user.pk, self.channel_name, sockets.slot_ttl())
        except Exception as exc:  # its slot cannot be counted
            await self._try_again_later(exc)
            return
        await self.accept()
        drain.add(self)
        if not self.slot_held:
            # Accepted, then closed: a refused handshake reaches the page without its close code.
            await self.close(code=sockets.CLOSE_TOO_MANY_SOCKETS, reason=f"At most {settings.WS_MAX_PER_USER} sockets")
            return
        self.watcher = asyncio.create_task(self._watch_session())

    @database_sync_to_async
    def _check(self, session: SessionBase) -> tuple[Any, int | None]:
        """The session's user and None, or None and the close code that refuses the socket."""
        user = sockets.session_user(session)
        if user is None:
            return None, sockets.CLOSE_SIGNED_OUT
        if not user.has_perm(DASHBOARD_PERMISSION):
            return None, sockets.CLOSE_FORBIDDEN
        return user, None

    async def _recheck(self) -> int | None:
        """Read the session afresh: the close code that ends the socket, or None to keep it."""
        user, code = await self._check(sockets.load_session(self.session_key))
        if user is not None and user.pk != self.user_id:
            return sockets.CLOSE_SIGNED_OUT
        return code

    async def _watch_session(self) -> None:
        # Logout and a password change close the socket at once (console.sockets); this loop
        # catches what sends no signal: expiry, a deleted session, a role taken away, SQL.
        while True:
            await asyncio.sleep(sockets.SESSION_RECHECK_SECONDS)
            try:
                code = await self._recheck()
            except Exception:
                # Fail closed, whatever went wrong: a watcher that died quietly would leave the
                # socket open with nobody checking it. The page reconnects with backoff (and gets
                # a 503 while the database is down).
                logger.warning("closing a websocket: its session cannot be checked", exc_info=True)
                code = sockets.CLOSE_TRY_AGAIN_LATER
            if code is not None:
                await self.close(code=code)
                return
            await self._renew_watches(self.topics)
            await self._refresh_slot()

    async def _refresh_slot(self) -> None:
        """Keep this socket's slot from lapsing (console.socket_slots): here, on the session check
        that already runs, rather than in a task of its own that shutdown would wait for."""
        try:
            await socket_slots.refresh(self.user_id, self.channel_name, sockets.slot_ttl())
        except Exception:  # the slot lapses a few checks later; the next refresh puts it back
            logger.warning("could not refresh a websocket's slot", exc_info=True)

    async def _renew_watches(self, topics: set[str]) -> None:
        """Keep the page's watched topics (gpu.<id>, node.<id>) pushed while this socket follows them;
        ingest stops asking for their pushes a little after the last socket lets go."""
        watched = sorted(t for t in topics if live.has_watcher(t))
        if not watched:
            # Nothing to renew: no hop onto the one thread every socket's database calls share,
            # where a herd of reconnects would queue its "subscribed" behind the others' checks.
            return
        try:
            await database_sync_to_async(live.renew_watches)(watched)
        except Exception:  # a missed renewal costs a few pushes until the next; the socket stays
            logger.warning("could not renew the watches of a websocket's topics", exc_info=True)

    async def disconnect(self, code: int) -> None:
        await self._clean_up()

    async def _clean_up(self) -> None:
        """Give back what the socket holds, once: its slot first (its own Redis client, so a pool
        the channel layer exhausted does not keep it), then its groups."""
        if self.cleaned_up:
            return
        self.cleaned_up = True
        drain.discard(self)
        if getattr(self, "watcher", None) is not None:
            self.watcher.cancel()
        if getattr(self, "slot_held", False):
            self.slot_held = False
            try:
                await socket_slots.release(self.user_id, self.channel_name)
            except Exception as exc:  # it lapses on its own
                logger.warning("could not release a websocket's slot: %s: %s", exc.__class__.__name__, exc)
        groups = [live.group_name(topic) for topic in getattr(self, "topics", set())]
        if getattr(self, "user_id", None) is not None:
            groups.append(sockets.user_group(self.user_id))
        try:
            for group in groups:
                await self.channel_layer.group_discard(group, self.channel_name)
        except redis.RedisError as exc:  # the layer drops a dead channel's messages after its expiry
            logger.warning("a closed websocket left its groups in Redis: %s: %s", exc.__class__.__name__, exc)

    async def session_ended(self, event: dict[str, Any]) -> None:
        """Sent to ``user.<id>`` on logout (naming the session) or a password change (all sessions)."""
        if event.get("session") in (None, self.session_tag):
            await self.close(code=sockets.CLOSE_SIGNED_OUT)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        # A malformed frame gets an error reply rather than an exception that drops the socket.
        if text_data is None:
            await self._error(f"Binary frames are not accepted: send JSON text. {USAGE}")
            return
        try:
            content = await self.decode_json(text_data)
        except json.JSONDecodeError as exc:
            await self._error(f"The message is not valid JSON ({exc.msg} at position {exc.pos}). {USAGE}")
            return
        except (ValueError, RecursionError):  # digits past Python's limit, nesting past the decoder's
            await self._error(f"The message is not JSON this server can read. {USAGE}")
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self._error(f"The message must be a JSON object, not {_json_kind(content)}. {USAGE}")
            return
        if "action" not in content:
            await self._error(f"The message has no action. {USAGE}")
            return
        action = content["action"]
        if action not in ACTIONS:
            await self._error(f'Unknown action {json.dumps(action)[:40]}: use "subscribe" or "unsubscribe".')
            return
        topics = content.get("topics")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            await self._error("topics must be a list of strings.")
            return
        bad = [t for t in topics if not live.is_valid_topic(t)]
        if bad:
            await self._error(f"Unknown topics: {', '.join(bad[:5])}.")
            return
        if action == "subscribe":
            if len(self.topics | set(topics)) > settings.WS_MAX_TOPICS:
                # Closed, not just refused: the page subscribes the same list again on every
                # reconnect, so it stops and says why (static/js/live.js).
                await self._error(f"At most {settings.WS_MAX_TOPICS} topics per connection.")
                await self.close(code=sockets.CLOSE_TOO_MANY_TOPICS, reason=f"At most {settings.WS_MAX_TOPICS} topics")
                return
            # Joined together rather than one Redis round trip after another. All are awaited
            # and all counted as followed, so a socket closed for one that failed leaves them all.
            joined = await asyncio.gather(
                *(self.channel_layer.group_add(live.group_name(t), self.channel_name) for t in topics),
                return_exceptions=True,
            )
            self.topics |= set(topics)
            for outcome in joined:
                if isinstance(outcome, BaseException):
                    raise outcome
            await self._renew_watches(set(topics))
        else:
            for topic in topics:
                await self.channel_layer.group_discard(live.group_name(topic), self.channel_name)
            self.topics -= set(topics)
        await self.send_json({"type": "subscribed", "topics": sorted(self.topics)})

    async def _error(self, message: str) -> None:
        await self.send_json({"type": "error", "error": message})

    async def live_message(self, event: dict[str, Any]) -> None:
        text = event.get("text")  # JSON encoded once for every socket (live.broadcast)
        if text is None:  # from a process of the previous release, during a rolling deploy
            await self.send_json(event["payload"])
            return
        await self.send(text_data=text)


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"
