"""Series the Prometheus door does not store itself but another app maps to its own records.

A hook names the metric prefix it takes (``velero_backup_``) and is called with the pushed text
when the door's parse ignored series of that prefix, so a push without them (every dcgm-exporter
or vLLM scrape) costs one look at the few names the parse ignored, nothing more. Apps register
hooks in AppConfig.ready(); fleet imports none of them (compliance registers Velero's mapping,
compliance.services.velero), so the import rule (fleet <- compliance) holds.

A hook runs in the door's request, before the push is queued: what it maps is small (a few series
per backup schedule) and written idempotently, so a retried push maps nothing twice. It may raise
fleet.validation.IngestError to refuse the push with a 4xx naming the line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ExpositionHook:
    name: str  # the key of its figures in the door's answer ("velero")
    prefix: str  # the metric names it maps start with this
    # (text, *, site_id, received, openmetrics) -> its figures, e.g. {"backup_reports": 2}
    handle: Callable[..., dict[str, Any]]


_hooks: dict[str, ExpositionHook] = {}


def register(hook: ExpositionHook) -> None:
    _hooks[hook.name] = hook


def run(
    text: str, ignored_names: Iterable[str], *, site_id: int, received: datetime, openmetrics: bool
) -> dict[str, dict[str, Any]]:
    """Call each hook whose prefix one of the ignored names has; {hook name: its figures}."""
    names = list(ignored_names)
    figures = {}
    for hook in _hooks.values():
        if any(name.startswith(hook.prefix) for name in names):
            figures[hook.name] = hook.handle(text, site_id=site_id, received=received, openmetrics=openmetrics)
    return figures
