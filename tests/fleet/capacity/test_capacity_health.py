"""Healthy capacity follows open incidents: a node drained by XID 79 leaves the pool's healthy
supply, and the preemptible reservations that would then be preempted are listed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.capacity.read import supply
from fleet.choices import PriorityTier
from fleet.models import Site
from incidents.models import Incident
from incidents.services.engine import Actor, clear_finding, raise_finding, resolve_incident
from tests.fleet.capacity import add_nodes, make_pool, reserve

pytestmark = pytest.mark.django_db


@pytest.fixture
def drained(site_a: Site):
    nodes = add_nodes(site_a, 2)
    pool = make_pool(site_a)
    now = timezone.now()
    window = (now - timedelta(hours=1), now + timedelta(hours=5))
    reserve(pool, "alpha", 4, *window, state="active")
    keep = reserve(pool, "spot-a", 4, *window, state="active", tier=PriorityTier.PREEMPTIBLE, priority=5)
    low = reserve(pool, "spot-b", 4, *window, state="active", tier=PriorityTier.PREEMPTIBLE, priority=1)
    mid = reserve(pool, "spot-c", 4, *window, state="active", tier=PriorityTier.PREEMPTIBLE, priority=3)
    node = nodes[0]
    uuids = [g.uuid for g in node.gpus.filter(parent__isnull=True).order_by("index")]
    return {"pool": pool, "node": node, "uuids": uuids, "keep": keep, "low": low, "mid": mid}


def _drain(node, uuids) -> None:
    # As fleet/telemetry/detectors.py raises an XID 79 (GPU fallen off the bus): the whole node must drain.
    raise_finding(
        f"xid79:{node.hostname}",
        {"site": node.site.name, "hostname": node.hostname, "gpu": uuids[3], "xid": "79"},
        "SEV2",
        f"XID 79 on {node.hostname}",
        impact={"gpus": len(uuids), "unit": f"node:{node.hostname}", "gpu_uuids": uuids},
        source="detector",
    )


def test_nothing_is_at_risk_while_every_gpu_is_healthy(drained) -> None:
    figures = supply.pool_figures([drained["pool"]])[drained["pool"].pk]
    assert (figures.energised, figures.healthy, figures.reserved, figures.reserved_preemptible) == (16, 16, 4, 12)
    assert supply.preemptible_at_risk(drained["pool"]) == []


def test_a_node_drained_by_an_open_xid79_incident_lowers_healthy_and_lists_preemptibles_at_risk(drained) -> None:
    _drain(drained["node"], drained["uuids"])
    assert Incident.objects.open().count() == 1
    figures = supply.pool_figures([drained["pool"]])[drained["pool"].pk]
    assert (figures.installed, figures.energised, figures.healthy) == (16, 16, 8)
    assert figures.available == 4
    # 8 healthy: 4 for the firm reservation, 4 for the highest-priority preemptible; the rest go,
    # lowest priority first.
    at_risk = supply.preemptible_at_risk(drained["pool"])
    assert [r.pk for r in at_risk] == [drained["low"].pk, drained["mid"].pk]


def test_a_straggling_jobs_gang_stays_healthy_while_a_gpu_fault_under_a_job_does_not(drained) -> None:
    # A training finding names the gang it slows (unit job:...): those GPUs work, so they stay in
    # healthy supply; a GPU fault on a job's GPU (job_gpus) is a broken GPU, whoever uses it.
    site = drained["node"].site.name
    raise_finding(
        "straggler:job-7",
        {"site": site, "job": "7"},
        "SEV3",
        "Straggler in job 7",
        impact={"gpus": 8, "unit": "job:7", "gpu_uuids": drained["uuids"], "gpu_hours": 0.5},
        source="detector",
    )
    assert supply.pool_figures([drained["pool"]])[drained["pool"].pk].healthy == 16
    raise_finding(
        f"xid48:{drained['uuids'][0]}",
        {"site": site, "gpu": drained["uuids"][0], "xid": "48"},
        "SEV2",
        "Double-bit ECC",
        impact={"gpus": 1, "unit": f"gpu:{drained['uuids'][0]}", "gpu_uuids": [drained["uuids"][0]], "job_gpus": 8},
        source="detector",
    )
    assert supply.pool_figures([drained["pool"]])[drained["pool"].pk].healthy == 15


def test_resolving_the_incident_restores_healthy_capacity(drained) -> None:
    _drain(drained["node"], drained["uuids"])
    resolve_incident(Incident.objects.get(), actor=Actor.system("test"))
    figures = supply.pool_figures([drained["pool"]])[drained["pool"].pk]
    assert figures.healthy == 16
    assert supply.preemptible_at_risk(drained["pool"]) == []


def test_a_cleared_finding_no_longer_takes_gpus_out(drained) -> None:
    _drain(drained["node"], drained["uuids"])
    clear_finding(f"xid79:{drained['node'].hostname}", source="detector")
    assert supply.pool_figures([drained["pool"]])[drained["pool"].pk].healthy == 16


def test_an_incident_on_another_pools_gpus_does_not_touch_this_pool(drained, site_b: Site) -> None:
    other = add_nodes(site_b, 1)[0]
    _drain(other, [g.uuid for g in other.gpus.filter(parent__isnull=True)])
    assert supply.pool_figures([drained["pool"]])[drained["pool"].pk].healthy == 16
