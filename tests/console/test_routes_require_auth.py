"""Deny by default: every route in the URL conf and the websocket refuses anonymous users,
except /healthz, /readyz and the login page."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.urls import URLPattern, URLResolver, get_resolver

from goodput.asgi import application
from goodput.routing import websocket_urlpatterns

OPEN = {"/healthz", "/readyz", "/accounts/login/"}
SAMPLE_VALUES = {
    "int": "1",
    "str": "x",
    "slug": "x",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "path": "x",
    "drf_format_suffix": ".json",
}


def _concrete(pattern: str) -> str:
    """Turn a route or regex into a URL a client can request."""
    # regex groups first (admin, DRF routers; DRF's format suffix wants a real format)
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: "json" if m.group(1) == "format" else "x", pattern)
    route = re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLE_VALUES.get(m.group(1) or "str", "x"), route)
    route = route.replace("^", "").replace("$", "").replace("\\.", ".").replace("\\", "")
    route = re.sub(r"\(\?:[^)]*\)\??", "", route)
    return route.replace("?", "")


def _walk(patterns, prefix=""):  # type: ignore[no-untyped-def]
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, prefix + _concrete(str(p.pattern)))
        elif isinstance(p, URLPattern):
            yield "/" + prefix + _concrete(str(p.pattern))


def all_urls() -> list[str]:
    return sorted(set(_walk(get_resolver().url_patterns)))


def test_the_url_conf_is_enumerated() -> None:
    urls = all_urls()
    assert len(urls) > 30  # admin, API routers, pages: a walk that found little would prove nothing
    for expected in ["/fleet/", "/api/v1/ingest/gpu-samples", "/api/v1/fleet/gpus/", "/api/schema/", "/admin/"]:
        assert expected in urls


@pytest.mark.django_db
@pytest.mark.parametrize("url", [u for u in all_urls() if u not in OPEN])
def test_anonymous_is_refused_everywhere_but_the_open_routes(anon_client, url: str) -> None:
    for method in ("get", "post"):
        response = getattr(anon_client, method)(url)
        if response.status_code in (301, 302):
            assert response["Location"].startswith("/accounts/login/"), (method, url, response["Location"])
        else:
            assert response.status_code in (401, 403, 405), (method, url, response.status_code)


@pytest.mark.django_db
@pytest.mark.parametrize("url", sorted(OPEN))
def test_the_open_routes_answer_anonymous_users(anon_client, url: str) -> None:
    assert anon_client.get(url).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_every_websocket_route_refuses_anonymous_users() -> None:
    assert websocket_urlpatterns
    for pattern in websocket_urlpatterns:
        path = "/" + _concrete(str(pattern.pattern))

        async def attempt(path: str = path) -> bool:
            communicator = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://127.0.0.1")])
            connected, _ = await communicator.connect()
            await communicator.disconnect()
            return connected

        assert async_to_sync(attempt)() is False, path


def test_the_admin_login_is_not_a_second_open_door(anon_client) -> None:
    response = anon_client.get("/admin/login/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
