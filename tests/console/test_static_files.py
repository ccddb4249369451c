"""Static files: Plotly compressed and cached for good under a content-hashed name, and /favicon.ico."""

from __future__ import annotations

import gzip

import pytest
from django.conf import settings
from django.templatetags.static import static
from django.test import Client

pytestmark = pytest.mark.django_db


def _body(response) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_plotly_has_a_content_hashed_url() -> None:
    url = static("vendor/plotly.min.js")
    assert url.startswith("/static/vendor/plotly.min.") and url.endswith(".js")
    assert len(url.rsplit(".", 2)[1]) == 12, url


def test_plotly_is_sent_gzipped_and_cached_for_good(viewer_client: Client) -> None:
    response = viewer_client.get(static("vendor/plotly.min.js"), HTTP_ACCEPT_ENCODING="gzip, deflate, br")

    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response["Vary"]
    assert "immutable" in response["Cache-Control"] and "max-age=315360000" in response["Cache-Control"]
    body = _body(response)
    original = (settings.PLOTLY_JS_DIR / "plotly.min.js").read_bytes()
    assert len(body) < len(original) / 3
    assert gzip.decompress(body) == original


def test_plotly_is_sent_plain_to_a_client_without_gzip(viewer_client: Client) -> None:
    response = viewer_client.get(static("vendor/plotly.min.js"))
    assert response.status_code == 200
    assert "Content-Encoding" not in response
    assert _body(response) == (settings.PLOTLY_JS_DIR / "plotly.min.js").read_bytes()


def test_favicon_ico_is_served_to_anyone(anon_client: Client) -> None:
    response = anon_client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
    assert _body(response)[:4] == b"\x00\x00\x01\x00"  # an ICO header
