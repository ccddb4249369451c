"""Helpers for the node_exporter tests: the fixture, a push, and an independent reading of the
fixture's lines (a plain split of each sample line, not the console's parser)."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "node-exporter.prom").read_text()
HOST = "gpu-a-017"
_SAMPLE = re.compile(r"^(?P<name>[a-z_0-9]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")


def push(client, token: str, body: str, query: str = f"?hostname={HOST}", **headers: str):  # type: ignore[no-untyped-def]
    """POST the exposition (stored at once: Celery runs eagerly in tests), then fold the node
    rollups' queued minutes, as the beat task does every few seconds."""
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    response = client.post(
        f"/api/v1/ingest/prometheus{query}",
        data=body,
        content_type="text/plain; version=0.0.4",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **extra,
    )
    roll()
    return response


def roll() -> dict[str, int]:
    """Fold every queued node minute into the rollups (the beat task's work)."""
    from fleet.tasks import update_node_rollups

    return update_node_rollups()


def fixture_samples(prefix: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of the fixture whose name starts with prefix."""
    out = []
    for line in FIXTURE.splitlines():
        if line.startswith("#") or not line.startswith(prefix):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        out.append((match["name"], labels, float(match["value"])))
    return out


def exposition(lines: list[str], ts_ms: int) -> str:
    """Sample lines with an explicit timestamp (ms), under node_exporter's TYPE lines."""
    types = {
        "node_infiniband_link_downed_total": "counter",
        "node_infiniband_symbol_error_total": "counter",
        "node_infiniband_state_id": "gauge",
        "node_network_carrier_changes_total": "counter",
        "node_disk_read_bytes_total": "counter",
        "node_filesystem_avail_bytes": "gauge",
    }
    out = []
    for name in types:
        mine = [line for line in lines if line.startswith(name + "{")]
        if mine:
            out.append(f"# TYPE {name} {types[name]}")
            out += [f"{line} {ts_ms}" for line in mine]
    return "\n".join(out) + "\n"
