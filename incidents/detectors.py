"""The detector registry. Rooms register detectors (register_detectors, from their plugins.py):
functions from recent state to the findings present now. A beat task runs them all; each run is
reconciled with what that detector reported before (new fingerprints raise, vanished ones clear), so
a detector only says what is wrong now.
A detector that fails is logged and reported as its own finding while the others run.

A finding clears only on evidence of health. A fingerprint can vanish from a detector's answer
because the fault is gone, or because the data to judge it stopped (a GPU that fell off the bus
sends nothing more): a detector registered with ``judged`` says which is which, and a finding it
cannot judge now stays firing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any

from django.utils import timezone

from incidents.choices import FindingStatus, Severity
from incidents.models import Finding
from incidents.services.engine import clear_finding, raise_finding

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FindingSpec:
    fingerprint: str
    labels: dict[str, Any]
    severity: str
    summary: str
    description: str = ""
    impact: dict[str, Any] = field(default_factory=dict)
    category: str = ""
    started_at: datetime | None = None  # when the fault began, if the detector can tell
    # The fault is over and this is its final impact (a failed job that made progress again: what
    # its failure cost in the end): a firing finding takes it, then clears; none is raised anew.
    final: bool = False


Detector = Callable[[datetime], Iterable[FindingSpec]]
# (now, a firing finding's labels) -> whether the detector has data to judge it now.
Judged = Callable[[datetime, dict[str, Any]], bool]
_detectors: dict[str, Detector] = {}
_judged: dict[str, Judged] = {}


def detector(name: str, *, judged: Judged | None = None) -> Callable[[Detector], Detector]:
    """Mark a function as the detector ``name``; its room's plugins.py registers the module's marked
    functions (register_detectors), so a new detector module needs one line there and nothing else.
    ``judged`` (optional) tells whether a finding that vanished from the detector's answer was judged
    healthy (it clears) or could not be judged (it stays firing); without it, a vanished finding clears."""

    def mark(fn: Detector) -> Detector:
        fn.detector = (name, judged)  # type: ignore[attr-defined]
        return fn

    return mark


def register_detectors(module: ModuleType) -> None:
    """Register every function ``module`` defines with @detector, in the order it defines them."""
    for fn in vars(module).values():
        marked = getattr(fn, "detector", None)
        if callable(fn) and isinstance(marked, tuple) and getattr(fn, "__module__", None) == module.__name__:
            name, judged = marked
            _detectors[name] = fn
            if judged is not None:
                _judged[name] = judged
            else:
                _judged.pop(name, None)


def registered() -> dict[str, Detector]:
    return dict(_detectors)


def source_of(name: str) -> str:
    return f"detector:{name}"


def firing_since(name: str) -> dict[str, datetime]:
    """The detector's firing findings: fingerprint -> started_at (one query). Detectors with a
    hold line (clear below a lower threshold than they fire at) ask which of theirs already fire."""
    return dict(
        Finding.objects.filter(source=source_of(name), status=FindingStatus.FIRING).values_list(
            "fingerprint", "started_at"
        )
    )


def run_detectors(*, now: datetime | None = None, only: Iterable[str] | None = None) -> dict[str, Any]:
    """Run every detector once and reconcile its findings. Returns counts per detector."""
    now = now or timezone.now()
    report: dict[str, Any] = {}
    for name, detector in registered().items():
        if only is not None and name not in only:
            continue
        source = source_of(name)
        failure = f"detector-failed:{name}"
        try:
            specs = list(detector(now))
        except Exception as exc:
            logger.exception("detector %s failed", name)
            raise_finding(
                failure,
                {"detector": name},
                Severity.SEV4,
                f"Detector {name} is failing: {exc}"[:500],
                description=repr(exc),
                source="detectors",
                category="console",
            )
            report[name] = {"error": str(exc)}
            continue
        clear_finding(failure, source="detectors")
        present = {spec.fingerprint for spec in specs if not spec.final}
        finals = [spec for spec in specs if spec.final]
        firing_finals = set(
            Finding.objects.filter(
                fingerprint__in=[spec.fingerprint for spec in finals], status=FindingStatus.FIRING
            ).values_list("fingerprint", flat=True)
            if finals
            else []
        )
        for spec in specs:
            if spec.final and spec.fingerprint not in firing_finals:
                continue  # nothing firing to settle: a final impact never raises a finding
            raise_finding(
                spec.fingerprint,
                # Like Alertmanager's alertname: one matcher (detector="...") silences one detector.
                {**spec.labels, "detector": name},
                spec.severity,
                spec.summary,
                spec.description,
                spec.impact,
                source=source,
                category=spec.category or name,
                started_at=spec.started_at,
            )
        gone = (
            Finding.objects.filter(source=source, status=FindingStatus.FIRING)
            .exclude(fingerprint__in=present)
            .values_list("fingerprint", "labels")
        )
        judged = _judged.get(name)
        held = 0
        for fingerprint, labels in list(gone):
            if judged is not None and not judged(now, labels):
                held += 1  # no data to judge it by: missing data is not health
                continue
            # Cleared as of this run: MTTR counts to when the condition was seen gone.
            clear_finding(fingerprint, source=source, at=now)
        report[name] = {"firing": len(present)} | ({"held": held} if held else {})
    return report
