"""A page drawn from one snapshot API over a range (console.ranges) and one live topic, as the fabric
and storage pages are: the API view, its OpenAPI parameters and the page view, written once.

A room supplies its read side (``RangeReads``: presets, the default range, ``window`` and
``snapshot``), its topic and its serializer; the answer is the room's ``snapshot`` as it stands.
Fetching the snapshot renews the page's watch on the topic (console.live.watch_topic), so ingest
keeps pushing to it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar, Protocol

from django.urls import reverse
from django.views.generic import TemplateView
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import live
from console.permissions import DashboardRequiredMixin
from console.ranges import WINDOW_PARAMETERS, RangeError, Window


class RangeReads(Protocol):
    """What a room's read side offers a range page (a module satisfies it)."""

    PRESETS: dict[str, timedelta]
    DEFAULT_RANGE: str

    def window(self, params: Any) -> Window: ...

    def snapshot(self, win: Window) -> dict[str, Any]: ...


def range_parameters(reads: RangeReads) -> list[OpenApiParameter]:
    """The snapshot's query parameters in the API schema: ``range`` (one of the presets) or a window."""
    return [
        OpenApiParameter("range", str, enum=list(reads.PRESETS), default=reads.DEFAULT_RANGE),
        *WINDOW_PARAMETERS,
    ]


class RangeSnapshotView(APIView):
    # No docstring here or on get(): drf-spectacular would publish it as each room's description.
    reads: ClassVar[RangeReads]
    topic: ClassVar[str]

    def get(self, request: Request) -> Response:
        try:
            win = self.reads.window(request.query_params)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        live.watch_topic(self.topic)
        return Response(self.reads.snapshot(win))


class RangeSnapshotPage(DashboardRequiredMixin, TemplateView):
    """The page's server-rendered shell: its range presets and where its JS fetches and listens."""

    reads: ClassVar[RangeReads]
    topic: ClassVar[str]
    snapshot_url_name: ClassVar[str]

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["ranges"] = list(self.reads.PRESETS)
        context["default_range"] = self.reads.DEFAULT_RANGE
        context["page_config"] = {"snapshot_url": reverse(self.snapshot_url_name), "topic": self.topic}
        return context
