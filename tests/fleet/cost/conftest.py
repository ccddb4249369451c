"""A small priced world for the cost figures: an owned H100 pool and a rented L40S pool at ams-1,
each with a node of GPUs, and helpers that write the figures the other rooms keep (a job's
hourly goodput account, a GPU's hour rollup) as those rooms would have."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from fleet.models import Gpu, GpuRollup1h, Job, JobAccount, Node, Pool, PoolPrice, PriceMode, Site
from fleet.telemetry.partitions import GPU_ROLLUP_1H, ensure_partitions_for

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"


def at(day: int, hour: int = 0, month: int = 1) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


@pytest.fixture
def h100_pool(site_a: Site) -> Pool:
    return Pool.objects.create(site=site_a, gpu_model=H100, name="h100")


@pytest.fixture
def l40s_pool(site_a: Site) -> Pool:
    return Pool.objects.create(site=site_a, gpu_model=L40S, name="l40s")


def owned_price(
    pool: Pool, *, valid_from: date = date(2025, 1, 1), valid_to: date | None = None, **figures: Any
) -> PoolPrice:
    """25,000 EUR over 48 months, 0.20 EUR/kWh at PUE 1.3, 2,000 EUR a year; cloud 2.00."""
    values = {
        "purchase_price_per_gpu": Decimal("25000"),
        "depreciation_months": 48,
        "energy_price_per_kwh": Decimal("0.20"),
        "pue": Decimal("1.3"),
        "yearly_operations_per_gpu": Decimal("2000"),
        "cloud_rate_per_gpu_hour": Decimal("2.00"),
    } | figures
    return PoolPrice.objects.create(
        pool=pool, valid_from=valid_from, valid_to=valid_to, currency="EUR", mode=PriceMode.OWNED, **values
    )


def rate_price(
    pool: Pool, rate: str, *, valid_from: date = date(2025, 1, 1), valid_to: date | None = None
) -> PoolPrice:
    return PoolPrice.objects.create(
        pool=pool, valid_from=valid_from, valid_to=valid_to, currency="EUR", mode=PriceMode.RATE,
        rate_per_gpu_hour=Decimal(rate),
    )  # fmt: skip


def node_with_gpus(site: Site, model: str, count: int, hostname: str) -> list[Gpu]:
    node = Node.objects.create(site=site, hostname=hostname)
    return [Gpu.objects.create(node=node, index=i, uuid=f"GPU-{hostname}-{i}", model=model) for i in range(count)]


def job_on(site: Site, gpus: list[Gpu], *, name: str = "llm", team: str = "research") -> Job:
    job = Job.objects.create(site=site, name=name, team=team, gang_size=len(gpus), scheduler_id=name)
    job.gpus.set(gpus)
    return job


def account(job: Job, hour: datetime, **gpu_seconds: float) -> JobAccount:
    """One hour of a job's account, in GPU-seconds per category (allocated is their sum)."""
    allocated = sum(gpu_seconds.values())
    return JobAccount.objects.create(job=job, hour=hour, allocated_s=allocated, **gpu_seconds)


def rollup(gpu: Gpu, hour: datetime, *, util: float, power: float) -> None:
    ensure_partitions_for(GPU_ROLLUP_1H, [hour])
    GpuRollup1h.objects.create(
        gpu=gpu, bucket=hour, samples=60, util_mean=util, util_max=util, power_mean=power, power_max=power,
        energy_j=power * 3600,
    )  # fmt: skip
