"""The console's own /metrics, in Prometheus text format (a session with a role, or an agent token).

Apps register collectors (functions yielding prometheus_client metric families) in their
plugins.py; counters shared across processes come from console.counters.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from console import counters
from console.authentication import AgentTokenAuthentication
from console.models import AgentToken
from console.permissions import DASHBOARD_PERMISSION
from console.queues import queue_depth

logger = logging.getLogger(__name__)

Collector = Callable[[], Iterable[Metric]]
_collectors: list[Collector] = []
_LABELS = re.compile(r'(\w+)="([^"]*)"')


def register_collector(collector: Collector) -> None:
    if collector not in _collectors:
        _collectors.append(collector)


def _console_metrics() -> Iterable[Metric]:
    families: dict[str, CounterMetricFamily] = {}
    for key, value in sorted(counters.snapshot().items()):
        name, _, rest = key.partition("{")
        labels = dict(_LABELS.findall(rest))
        base = name.removesuffix("_total")
        family = families.get(base)
        if family is None:
            family = families[base] = CounterMetricFamily(base, f"{base.replace('_', ' ')}", labels=sorted(labels))
        family.add_metric([labels[k] for k in sorted(labels)], value)
    yield from families.values()
    broker_up = GaugeMetricFamily("goodput_broker_up", "1 when the task broker answers")
    depth = GaugeMetricFamily("goodput_ingest_queue_depth", "Batches and tasks waiting for a worker")
    try:
        depth.add_metric([], queue_depth())
        broker_up.add_metric([], 1)
        yield depth
    except Exception:
        broker_up.add_metric([], 0)
    yield broker_up


class _Registry:
    def collect(self) -> Iterable[Metric]:
        for collector in [_console_metrics, *_collectors]:
            try:
                yield from collector()
            except Exception:  # one broken collector must not hide the others
                logger.exception("metrics collector %s failed", getattr(collector, "__name__", collector))


class SessionRoleOrAgent(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if isinstance(request.auth, AgentToken):
            return True
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(DASHBOARD_PERMISSION))


class MetricsView(APIView):
    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]
    permission_classes = [SessionRoleOrAgent]
    schema = None  # Prometheus text, not part of the JSON API

    def get(self, request: Request) -> HttpResponse:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Registry())  # type: ignore[arg-type]
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
