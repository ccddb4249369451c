"""Serve Plotly's bundle from the installed plotly package as static/vendor/plotly.min.js."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_PATH = "vendor/plotly.min.js"


class PlotlyFinder(BaseFinder):
    def __init__(self) -> None:
        self.storage = FileSystemStorage(location=str(settings.PLOTLY_JS_DIR))

    def check(self, **kwargs: Any) -> list[Any]:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        if path != PLOTLY_PATH:
            return [] if find_all else None
        match = str(settings.PLOTLY_JS_DIR / "plotly.min.js")
        return [match] if find_all else match

    def list(self, ignore_patterns: Any) -> Any:
        # collectstatic copies plotly.min.js as vendor/plotly.min.js
        storage = FileSystemStorage(location=str(settings.PLOTLY_JS_DIR))
        storage.prefix = "vendor"  # type: ignore[attr-defined]
        yield "plotly.min.js", storage
