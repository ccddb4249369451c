"""Helpers for the scheduler tests: the fixtures, a push, an independent reading of a fixture's
lines (a plain split, not the console's parser), and timestamps on whole minutes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleet.models import SchedulerSample

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
KUEUE = (FIXTURES / "kueue.prom").read_text()
KSM = (FIXTURES / "kube-state-metrics.prom").read_text()
SLURM = (FIXTURES / "slurm-exporter.prom").read_text()
_SAMPLE = re.compile(r"^(?P<name>[a-z_0-9]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")


def push(client, token: str, body: str, query: str = "", **headers: str):  # type: ignore[no-untyped-def]
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(
        f"/api/v1/ingest/prometheus{query}",
        data=body,
        content_type="text/plain; version=0.0.4",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **extra,
    )


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        out.append((match["name"], labels, float(match["value"])))
    return out


def label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def stored() -> dict[tuple[str, str, str, str], float]:
    """(scheduler, queue name, quantity, series) -> value of every raw sample."""
    return {
        (s.queue.scheduler, s.queue.name, s.quantity, s.series): s.value
        for s in SchedulerSample.objects.select_related("queue")
    }


def minute_ago(minutes: int) -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def stamped(lines: list[str], moment: datetime, types: dict[str, str]) -> str:
    """Sample lines at one time (ms timestamps), under their TYPE lines."""
    out = []
    for family, kind in types.items():
        mine = [line for line in lines if line.split("{")[0].split(" ")[0].startswith(family)]
        if mine:
            out.append(f"# TYPE {family} {kind}")
            out += [f"{line} {ms(moment)}" for line in mine]
    return "\n".join(out) + "\n"
