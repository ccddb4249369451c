"""A node's interfaces and mounts: created once, on first sighting by the ingest door, with the
fabric defaulting from the kind unless an Operator set it."""

from __future__ import annotations

from fleet.choices import Fabric, InterfaceKind, MountPurpose
from fleet.models import Node, NodeInterface, NodeMount
from tests.fleet.fabric.node_exporter import FIXTURE, HOST, push


def test_interfaces_and_mounts_are_created_once(client, site_a, token_a) -> None:
    for _ in range(3):  # three scrapes of the same node, no idempotency key: three observations
        assert push(client, token_a, FIXTURE).status_code == 202
    node = Node.objects.get(hostname=HOST)
    assert node.site == site_a and Node.objects.count() == 1
    assert sorted(node.interfaces.values_list("name", flat=True)) == ["eth0", "mlx5_0/1", "mlx5_1/1"]
    mounts = {m.mountpoint: m for m in node.mounts.all()}
    assert set(mounts) == {"/", "/mnt/datasets", "/mnt/checkpoints"}
    assert (mounts["/mnt/datasets"].fstype, mounts["/mnt/datasets"].device) == ("nfs4", "10.0.4.20:/datasets")
    assert all(m.purpose == MountPurpose.OTHER for m in mounts.values())


def test_a_fabric_or_purpose_set_by_an_operator_survives_the_next_scrape(client, token_a) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    NodeInterface.objects.filter(name="eth0").update(fabric=Fabric.STORAGE, kind=InterfaceKind.ROCE)
    NodeMount.objects.filter(mountpoint="/mnt/checkpoints").update(purpose=MountPurpose.CHECKPOINTS)
    assert push(client, token_a, FIXTURE).status_code == 202
    eth0 = NodeInterface.objects.get(name="eth0")
    assert (eth0.fabric, eth0.kind) == (Fabric.STORAGE, InterfaceKind.ROCE)
    assert NodeMount.objects.get(mountpoint="/mnt/checkpoints").purpose == MountPurpose.CHECKPOINTS


def test_the_fabric_defaults_from_the_kind_when_left_unset(site_a) -> None:
    node = Node.objects.create(site=site_a, hostname="gpu-a-099")
    kinds = {
        InterfaceKind.IB: Fabric.COMPUTE,
        InterfaceKind.ROCE: Fabric.COMPUTE,
        InterfaceKind.ETHERNET: Fabric.MANAGEMENT,
    }
    for n, (kind, fabric) in enumerate(kinds.items()):
        assert NodeInterface.objects.create(node=node, name=f"if{n}", kind=kind).fabric == fabric
    assert (
        NodeInterface.objects.create(node=node, name="if9", kind="ib", fabric=Fabric.STORAGE).fabric == Fabric.STORAGE
    )


def test_a_rate_change_updates_the_interface(client, token_a) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    slower = FIXTURE.replace(
        'node_infiniband_rate_bytes_per_second{device="mlx5_1",port="1"} 5e+10',
        'node_infiniband_rate_bytes_per_second{device="mlx5_1",port="1"} 2.5e+10',
    )
    assert push(client, token_a, slower).status_code == 202
    assert NodeInterface.objects.get(name="mlx5_1/1").rate_bytes_per_second == 2.5e10
    assert NodeInterface.objects.get(name="mlx5_0/1").rate_bytes_per_second == 5e10
