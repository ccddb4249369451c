"""Ingest validation speed: the msgspec schema used by the ingest view against a DRF serializer
doing the same checks, on the same 1,000-sample batch, in one run.

Prints RESULT msgspec=<samples/s> drf=<samples/s> speedup=<x>.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django

django.setup()

from _common import drf_serializer  # noqa: E402

from fleet.ingest.batches import parse_gpu_batch  # noqa: E402
from fleet.telemetry.simulator import DEFAULT_SITES, FleetSimulator, build_fleet, utcnow  # noqa: E402


def rate(fn, body: bytes, samples: int, seconds: float = 3.0) -> float:  # type: ignore[no-untyped-def]
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn(body)
        runs += 1
    return runs * samples / (time.perf_counter() - started)


def main() -> None:
    fleet = build_fleet(DEFAULT_SITES, gpu_limit=None, seed=1)
    sim = FleetSimulator(fleet, fault_rate_per_gpu_hour=0, interval=5, seed=1)
    samples: list[dict] = []
    while len(samples) < 1000:
        for batch in sim.batches(utcnow()).values():
            samples.extend(batch)
    body = json.dumps({"samples": samples[:1000]}).encode()
    batch_serializer = drf_serializer()

    def with_drf(raw: bytes) -> None:
        serializer = batch_serializer(data=json.loads(raw))
        if not serializer.is_valid():
            raise SystemExit(serializer.errors)

    print("validating 1,000-sample batches for 3 s each…", file=sys.stderr)
    fast = rate(parse_gpu_batch, body, 1000)
    slow = rate(with_drf, body, 1000)
    print(f"RESULT msgspec={fast:.0f} drf={slow:.0f} speedup={fast / slow:.1f}")


if __name__ == "__main__":
    main()
