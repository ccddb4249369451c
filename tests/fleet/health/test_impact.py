"""What a GPU-health incident takes out of service: each physical GPU once, whatever mix of node
and GPU findings names it; a MIG instance counts as its physical GPU."""

from __future__ import annotations

import pytest

from fleet.models import Gpu
from incidents.detectors import run_detectors
from incidents.models import Finding, Incident
from tests.fleet.health.test_detectors import gpu_sample, now, put, sample

pytestmark = pytest.mark.django_db

HOST = "gpu-b-001"
GPU0, GPU1 = "GPU-b0000000-0000", "GPU-b0000000-0001"
HEALTH = ["critical-xid", "ecc-double-bit", "thermal-throttling"]


def test_a_drained_node_and_findings_on_its_gpus_count_each_gpu_once(site_a) -> None:
    put(
        site_a,
        gpu_sample(60, gpu_uuid=GPU0, hostname=HOST, gpu_index=0, xid=79, ecc_dbe_total=0),
        gpu_sample(0, gpu_uuid=GPU0, hostname=HOST, gpu_index=0, xid=79, ecc_dbe_total=1),
        gpu_sample(0, gpu_uuid=GPU1, hostname=HOST, gpu_index=1, gpu_temp_c=89, gpu_util=98, throttle_reasons=0x40),
    )
    run_detectors(only=HEALTH)
    incident = Incident.objects.get()
    kinds = sorted(f.split(":")[0] for f in incident.findings.values_list("fingerprint", flat=True))
    assert kinds == ["ecc-dbe", "thermal", "xid"]  # the drain, plus a finding on each of its GPUs
    assert incident.affected_gpus == 2
    drain = Finding.objects.get(fingerprint__startswith="xid:")
    assert sorted(drain.impact["gpu_uuids"]) == [GPU0, GPU1]


def test_a_mig_partitioned_node_drains_its_physical_gpus_and_an_instance_counts_as_its_parent(site_a) -> None:
    instances = [f"MIG-b0000000-0000-gi{n}" for n in (1, 2, 3)]
    put(
        site_a,
        sample(gpu_uuid=GPU0, hostname=HOST, gpu_index=0, ts=now(), xid=79),
        sample(gpu_uuid=GPU1, hostname=HOST, gpu_index=1, ts=now()),
        *[
            sample(gpu_uuid=uuid, hostname=HOST, gpu_index=0, ts=now(), parent_uuid=GPU0, mig_profile="2g.20gb")
            for uuid in instances
        ],
    )
    assert Gpu.objects.filter(node__hostname=HOST).count() == 5
    assert Gpu.objects.filter(node__hostname=HOST).physical().count() == 2
    run_detectors(only=["critical-xid"])
    incident = Incident.objects.get()
    assert incident.affected_gpus == 2  # two physical GPUs, not five rows
    assert Finding.objects.get().impact == {"gpus": 2, "unit": f"node:{HOST}", "gpu_uuids": [GPU0, GPU1]}
    # A fault on one instance takes out its physical GPU, already counted in the drain.
    put(site_a, sample(gpu_uuid=instances[1], hostname=HOST, gpu_index=0, ts=now(), xid=94))
    run_detectors(only=["critical-xid"])
    instance_finding = Finding.objects.get(fingerprint=f"xid:{instances[1]}:94")
    assert instance_finding.impact["gpu_uuids"] == [GPU0]
    incident.refresh_from_db()
    assert incident.findings.count() == 2 and incident.affected_gpus == 2
