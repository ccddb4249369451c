"""ASGI entry point: Django first, then the websocket router (as the Channels docs order it)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from channels.sessions import SessionMiddlewareStack  # noqa: E402

from console import live  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402
from console.runtime import announce_mode  # noqa: E402
from console.sockets import SameOriginValidator  # noqa: E402

announce_mode("web")

# Sessions, not AuthMiddlewareStack: the consumer reads the user from the session itself, so a
# database outage meets its 503 rather than a middleware's unhandled error (a 500).
router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(
            AllowedHostsOriginValidator(SessionMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # Tell the live hub which loop serves this process's websockets (see console.live).
    live.bind_event_loop(asyncio.get_running_loop())
    await router(scope, receive, send)
