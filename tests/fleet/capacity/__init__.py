"""Capacity tests: shared builders for a site's GPU nodes, pools and reservations."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.utils import timezone

from fleet.models import Gpu, Node, Pool, Rack, Reservation, ReservationState, Site, Team, TeamQuota

H100 = "NVIDIA H100 80GB HBM3"


def add_nodes(site: Site, count: int, *, rack: Rack | None = None, model: str = H100, prefix: str = "n") -> list[Node]:
    """``count`` nodes of 8 physical GPUs of ``model`` (one MIG child on the first, which never counts)."""
    nodes = []
    for n in range(count):
        node = Node.objects.create(site=site, rack=rack, hostname=f"{site.name}-{prefix}{n:03d}")
        for i in range(8):
            gpu = Gpu.objects.create(node=node, index=i, uuid=f"GPU-{site.name}-{prefix}{n:03d}-{i}", model=model)
            if n == 0 and i == 0:
                Gpu.objects.create(node=node, index=i, uuid=f"MIG-{site.name}-{prefix}{n:03d}", model=model, parent=gpu)
        nodes.append(node)
    return nodes


def make_pool(site: Site, *, model: str = H100, name: str = "h100") -> Pool:
    return Pool.objects.create(site=site, gpu_model=model, name=name)


def midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def days_ahead(n: int) -> datetime:
    """Midnight UTC, n days after today."""
    return midnight(timezone.localdate(timezone.now(), UTC) + timedelta(days=n))


def team(name: str) -> Team:
    """The team named ``name``, created on first use (teams are records an Admin adds)."""
    return Team.objects.get_or_create(name=name)[0]


def quota(pool: Pool, name: str, nominal: int, borrowing: int | None = None, lending: int | None = None) -> TeamQuota:
    return TeamQuota.objects.create(
        pool=pool, team=team(name), nominal_gpus=nominal, borrowing_limit_gpus=borrowing, lending_limit_gpus=lending
    )


def reserve(pool: Pool, name: str, gpus: int, start: datetime, end: datetime, **extra: Any) -> Reservation:
    extra.setdefault("state", ReservationState.APPROVED)
    return Reservation.objects.create(pool=pool, team=team(name), gpus=gpus, start=start, end=end, **extra)
