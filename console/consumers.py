"""The one websocket consumer: clients connect to /ws/live/, then subscribe to topics."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console import live
from console.permissions import DASHBOARD_PERMISSION

MAX_TOPICS = 50


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.topics: set[str] = set()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await self._may_view(user):
            await self.close(code=4403)
            return
        await self.accept()

    @database_sync_to_async
    def _may_view(self, user: Any) -> bool:
        return bool(user.is_active and user.has_perm(DASHBOARD_PERMISSION))

    async def disconnect(self, code: int) -> None:
        for topic in getattr(self, "topics", set()):
            await self.channel_layer.group_discard(live.group_name(topic), self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("action") not in {"subscribe", "unsubscribe"}:
            await self.send_json({"type": "error", "error": 'Send {"action": "subscribe", "topics": [...]}.'})
            return
        topics = content.get("topics")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            await self.send_json({"type": "error", "error": "topics must be a list of strings."})
            return
        bad = [t for t in topics if not live.is_valid_topic(t)]
        if bad:
            await self.send_json({"type": "error", "error": f"Unknown topics: {', '.join(bad[:5])}."})
            return
        if content["action"] == "subscribe":
            if len(self.topics | set(topics)) > MAX_TOPICS:
                await self.send_json({"type": "error", "error": f"At most {MAX_TOPICS} topics per connection."})
                return
            for topic in topics:
                await self.channel_layer.group_add(live.group_name(topic), self.channel_name)
            self.topics |= set(topics)
        else:
            for topic in topics:
                await self.channel_layer.group_discard(live.group_name(topic), self.channel_name)
            self.topics -= set(topics)
        await self.send_json({"type": "subscribed", "topics": sorted(self.topics)})

    async def live_message(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])
