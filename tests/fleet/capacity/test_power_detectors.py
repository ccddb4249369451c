"""The power detectors fire on the per-minute group rollups built from real samples: a rack over
its budget (and not at 90 %), a site near its contracted power, sustained capping across a rack,
with hysteresis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.models import Node, Rack, Site
from fleet.telemetry.rollups import update_rollups
from fleet.telemetry.store import store_gpu_samples
from incidents.choices import FindingStatus
from incidents.detectors import run_detectors
from incidents.models import Finding
from tests.fleet.capacity.test_power_pages import sample

POWER = ["power-rack-over-budget", "power-site-near-contract", "power-rack-capping"]
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=12)


@pytest.fixture
def rack(site_a: Site, settings) -> Rack:  # type: ignore[no-untyped-def]
    # One node of four GPUs on a 5 kW budget: draw = 4 x power + 2 kW overhead.
    settings.NODE_OVERHEAD_W = 2000
    rack = Rack.objects.create(site=site_a, name="hot-1", power_budget_kw=5)
    Node.objects.create(site=site_a, rack=rack, hostname="h-1")
    return rack


def minutes(site: Site, profile: list[float], *, throttle: int = 0, key: str = "m") -> None:
    """One sample per GPU per minute from BASE, each GPU at ``profile[m]`` W in minute m."""
    store_gpu_samples(
        site_id=site.pk,
        batch_key=key,
        samples=[
            sample(
                gpu_uuid=f"GPU-h1-{i}",
                hostname="h-1",
                gpu_index=i,
                ts=BASE + timedelta(minutes=m, seconds=10),
                power_w=watts,
                throttle_reasons=throttle,
            )
            for m, watts in enumerate(profile)
            for i in range(4)
        ],
    )
    update_rollups()


def at(minute: int) -> datetime:
    """A moment just after minute ``minute`` completed (it is the newest whole minute then)."""
    return BASE + timedelta(minutes=minute + 1, seconds=20)


def firing(detector: str) -> list[Finding]:
    return list(Finding.objects.filter(source=f"detector:{detector}", status=FindingStatus.FIRING))


def test_a_rack_over_its_budget_fires_holds_above_90_percent_and_clears_below(site_a: Site, rack: Rack) -> None:
    # 110 % (875 W x 4 + 2 kW = 5.5 kW) for six minutes, then 92 % (4.6 kW) twice, then 80 % (4 kW).
    minutes(site_a, [875.0] * 6 + [650.0] * 2 + [500.0] * 2)
    run_detectors(now=at(5), only=POWER)
    (finding,) = firing("power-rack-over-budget")
    assert finding.labels["site"] == "ams-1" and finding.labels["rack"] == "hot-1"
    assert finding.impact["kw_over_budget"] == pytest.approx(0.5)
    assert finding.impact["gpus_affected"] == 4
    assert finding.started_at == BASE
    run_detectors(now=at(7), only=POWER)
    assert firing("power-rack-over-budget"), "92 % is above the hold line: it must not flap"
    run_detectors(now=at(9), only=POWER)
    assert not firing("power-rack-over-budget")


def test_a_rack_at_90_percent_does_not_fire(site_a: Site, rack: Rack) -> None:
    minutes(site_a, [625.0] * 10)  # 4.5 kW of 5 kW
    run_detectors(now=at(9), only=POWER)
    assert not firing("power-rack-over-budget")
    assert not firing("power-site-near-contract")  # 4.5 kW of 500 kW


def test_a_rack_at_95_percent_fires_only_after_n_minutes(site_a: Site, rack: Rack) -> None:
    minutes(site_a, [500.0] * 4 + [700.0] * 6)  # 4.8 kW = 96 % from minute 4
    run_detectors(now=at(7), only=POWER)  # four minutes at 96 %
    assert not firing("power-rack-over-budget")
    run_detectors(now=at(8), only=POWER)  # five
    (finding,) = firing("power-rack-over-budget")
    assert finding.impact["kw_over_budget"] == 0 and finding.impact["utilisation_pct"] == pytest.approx(96.0)


def test_a_site_near_its_contracted_power_fires_after_n_minutes(site_a: Site, rack: Rack) -> None:
    Site.objects.filter(pk=site_a.pk).update(contracted_power_kw=5)
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=None)
    minutes(site_a, [700.0] * 6)  # 4.8 kW of 5 kW contracted
    run_detectors(now=at(5), only=POWER)
    (finding,) = firing("power-site-near-contract")
    assert finding.labels == {"site": "ams-1", "detector": "power-site-near-contract"}
    assert finding.impact["utilisation_pct"] == pytest.approx(96.0)
    assert not firing("power-rack-over-budget")


def test_sustained_capping_across_a_rack_fires_and_a_short_one_does_not(site_a: Site, rack: Rack) -> None:
    Rack.objects.filter(pk=rack.pk).update(power_budget_kw=50)
    minutes(site_a, [600.0] * 3, throttle=0x4, key="a")  # SW power cap, three minutes
    run_detectors(now=at(2), only=POWER)
    assert not firing("power-rack-capping")
    store_gpu_samples(
        site_id=site_a.pk,
        batch_key="b",
        samples=[
            sample(
                gpu_uuid=f"GPU-h1-{i}",
                hostname="h-1",
                gpu_index=i,
                ts=BASE + timedelta(minutes=m, seconds=10),
                power_w=600.0,
                throttle_reasons=0x4 if i < 3 else 0,  # three of four throttled
            )
            for m in range(3, 6)
            for i in range(4)
        ],
    )
    update_rollups()
    run_detectors(now=at(5), only=POWER)
    (finding,) = firing("power-rack-capping")
    assert finding.impact["gpus_affected"] == 3 and finding.impact["gpus"] == 4
    assert finding.labels["rack"] == "hot-1"
