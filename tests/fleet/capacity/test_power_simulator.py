"""The simulator's hot rack: ams-1's r01 runs flat out near board power for a while, over the budget
the demo gives it, and the power detectors catch it from the stored samples; in its cool phase
they stay quiet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from fleet.ingest.batches import GpuSampleIn
from fleet.models import Node, Rack, Site
from fleet.telemetry import simulator
from fleet.telemetry.rollups import update_rollups
from fleet.telemetry.store import store_gpu_samples
from incidents.choices import FindingStatus
from incidents.detectors import run_detectors
from incidents.models import Finding

POWER = ["power-rack-over-budget", "power-site-near-contract", "power-rack-capping"]
# The start of a hot phase an hour or so ago (the phases follow the clock).
PHASE = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
PHASE = PHASE.replace(minute=PHASE.minute - PHASE.minute % simulator.HOT_PERIOD_MINUTES)


@pytest.fixture
def hot_rack(db: None, settings) -> tuple[Site, simulator.FleetSimulator]:  # type: ignore[no-untyped-def]
    settings.NODE_OVERHEAD_W = 2000
    fleet = simulator.build_fleet(simulator.DEFAULT_SITES, gpu_limit=32, seed=simulator.DEFAULT_SEED)
    gpus = fleet["ams-1"]
    assert gpus and all(g.hot_rack for g in gpus)  # the first 32 GPUs: ams1-h100-001..004
    site = Site.objects.create(name="ams-1", contracted_power_kw=520)
    rack = Rack.objects.create(site=site, name=simulator.HOT_RACK_NAME, power_budget_kw=simulator.HOT_RACK_BUDGET_KW)
    for hostname in sorted({g.hostname for g in gpus}):
        Node.objects.create(site=site, rack=rack, hostname=hostname)
    sim = simulator.FleetSimulator({"ams-1": gpus}, fault_rate_per_gpu_hour=0, interval=60, seed=1)
    return site, sim


def _run(site: Site, sim: simulator.FleetSimulator, first_minute: int, minutes: int) -> None:
    for m in range(first_minute, first_minute + minutes):
        samples = sim.batches(PHASE + timedelta(minutes=m, seconds=15))["ams-1"]
        store_gpu_samples(
            site_id=site.pk,
            batch_key=f"sim-{m}",
            samples=[msgspec.convert(s, GpuSampleIn, strict=False) for s in samples],
        )
    update_rollups()


def _firing(detector: str) -> list[Finding]:
    return list(Finding.objects.filter(source=f"detector:{detector}", status=FindingStatus.FIRING))


def test_the_hot_rack_goes_over_its_budget_and_the_detectors_fire(hot_rack) -> None:  # type: ignore[no-untyped-def]
    site, sim = hot_rack
    _run(site, sim, 0, 6)
    run_detectors(now=PHASE + timedelta(minutes=6, seconds=20), only=POWER)
    (over,) = _firing("power-rack-over-budget")
    assert over.labels["rack"] == "r01" and over.impact["kw_over_budget"] > 1.0
    (capping,) = _firing("power-rack-capping")  # flat out at the power cap: every GPU throttled
    assert capping.impact["gpus_affected"] == 32
    assert not _firing("power-site-near-contract")


def test_in_its_cool_phase_the_hot_rack_stays_under_90_percent(hot_rack) -> None:  # type: ignore[no-untyped-def]
    site, sim = hot_rack
    start = simulator.HOT_MINUTES + 1
    _run(site, sim, start, 6)
    run_detectors(now=PHASE + timedelta(minutes=start + 6, seconds=20), only=POWER)
    assert not any(_firing(d) for d in POWER)
