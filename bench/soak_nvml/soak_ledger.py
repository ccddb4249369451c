"""The soak's ledger of NVML readings, shared by the fake pynvml (which writes it, on the agents'
PYTHONPATH) and bench/soak_sources.py (which reads it to know what was sent)."""

from __future__ import annotations

import uuid
from pathlib import Path


def gpu_uuid(host: str, index: int) -> str:
    """The stable UUID of GPU ``index`` on ``host``."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host}/gpu{index}')}"


def read_ledger(path: str | Path | None) -> dict[str, int]:
    """GPU UUID -> the highest reading number recorded for it (readings 1..n were taken)."""
    last: dict[str, int] = {}
    if path is not None and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                last[parts[0]] = max(last.get(parts[0], 0), int(parts[1]))
    return last
