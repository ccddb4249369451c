"""ASGI entry point: Django for HTTP (synchronously, console.http), Channels for websockets."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_handler = get_wsgi_application()  # run synchronously, one thread hop a request (console.http)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from channels.sessions import SessionMiddlewareStack  # noqa: E402
from django.conf import settings  # noqa: E402
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware  # noqa: E402

from console import drain, limits, live  # noqa: E402
from console.http import SyncDjango  # noqa: E402
from console.runtime import announce_mode, settle_heap  # noqa: E402
from console.sockets import SameOriginValidator  # noqa: E402
from goodput.routing import websocket_urlpatterns  # noqa: E402

announce_mode("web")

# Sessions, not AuthMiddlewareStack: the consumer reads the user from the session itself, so a
# database outage meets its 503 rather than a middleware's unhandled error (a 500).
router = ProtocolTypeRouter(
    {
        "http": SyncDjango(django_handler, threads=settings.WEB_THREADS),
        "websocket": SameOriginValidator(
            AllowedHostsOriginValidator(SessionMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)


async def _serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # Tell the live hub which loop serves this process's websockets (see console.live), and put
    # the websocket drain in front of the server's SIGTERM handler (console.drain).
    loop = asyncio.get_running_loop()
    live.bind_event_loop(loop)
    drain.install(loop)
    await router(scope, receive, send)


# X-Forwarded-For / -Proto become the request's client and scheme only behind a proxy, and only
# when the peer is one of TRUSTED_PROXIES (uvicorn's own middleware, given our list; uvicorn itself
# runs with --no-proxy-headers, console.processes). Everything after reads REMOTE_ADDR.
_served: Any = (
    ProxyHeadersMiddleware(_serve, trusted_hosts=settings.TRUSTED_PROXIES) if settings.BEHIND_PROXY else _serve
)

# Outermost: a body past its route's limit is refused before anything reads it (console.limits).
application = limits.RequestBodyLimit(_served)

settle_heap()  # last: everything above is start-up's, and lives as long as the process
