"""Restarting the demo leaves its compliance records as they were: one lineage row per dataset of
the demo model, however many times it starts and whichever training job comes first."""

from __future__ import annotations

import pytest
from django.utils import timezone

from compliance.demo import DATASETS, MODEL, seed_compliance
from compliance.models import GpaiModel, Lineage
from fleet.models import Job, Site

pytestmark = pytest.mark.django_db


def _start(site: Site, n: int) -> dict[str, int]:
    """One `make demo` start: the compliance seed, then the simulator registering its jobs."""
    added = seed_compliance(today=timezone.localdate())
    Job.objects.create(site=site, scheduler_id=f"demo-{n}", name=f"demo-{n}", team="nlp", gang_size=8)
    return added


def test_every_restart_of_the_demo_keeps_one_lineage_row_per_dataset(site_a: Site) -> None:
    first = _start(site_a, 0)  # no job yet on the very first start
    for n in range(1, 4):
        again = _start(site_a, n)
        assert again["lineage"] == 0, f"start {n + 1} added lineage"
    model = GpaiModel.objects.get(name=MODEL[0], version=MODEL[1])
    assert first["lineage"] == len(DATASETS)
    assert Lineage.objects.filter(model=model).count() == len(DATASETS)
    assert sorted(Lineage.objects.filter(model=model).values_list("dataset__name", flat=True)) == sorted(DATASETS)
