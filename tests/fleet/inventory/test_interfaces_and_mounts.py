"""A node's interfaces and mounts: created once, on first sighting by the ingest door, with the
fabric defaulting from the kind unless an Operator set it."""

from __future__ import annotations

from compliance.models import AuditEntry
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
    # The purpose guessed from the path, until an Admin says otherwise.
    assert {k: m.purpose for k, m in mounts.items()} == {
        "/": MountPurpose.OTHER,
        "/mnt/datasets": MountPurpose.DATASETS,
        "/mnt/checkpoints": MountPurpose.CHECKPOINTS,
    }


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


def test_an_admin_sets_a_mounts_purpose_and_a_ports_fabric_in_the_admin_audited(
    client, token_a, admin_client, operator_client
) -> None:
    assert push(client, token_a, FIXTURE).status_code == 202
    mount = NodeMount.objects.get(mountpoint="/mnt/checkpoints")
    port = NodeInterface.objects.get(name="eth0")
    url = f"/admin/fleet/nodemount/{mount.pk}/change/"
    refused = operator_client.post(url, {"purpose": MountPurpose.OTHER})  # not staff: the admin's login
    assert refused.status_code == 302 and refused.url.startswith("/admin/login/")
    assert admin_client.post(url, {"purpose": MountPurpose.OTHER, "fstype": "ext4"}).status_code == 302
    mount.refresh_from_db()
    assert (mount.purpose, mount.fstype) == (MountPurpose.OTHER, "lustre")  # what the node reports stays
    entry = AuditEntry.objects.get(model="nodemount", object_id=str(mount.pk), action="update")
    assert entry.actor == "ada" and (entry.before["purpose"], entry.after["purpose"]) == ("checkpoints", "other")
    port_url = f"/admin/fleet/nodeinterface/{port.pk}/change/"
    assert admin_client.post(port_url, {"kind": InterfaceKind.ROCE, "fabric": Fabric.STORAGE}).status_code == 302
    port.refresh_from_db()
    assert (port.kind, port.fabric) == (InterfaceKind.ROCE, Fabric.STORAGE)
    assert admin_client.get("/admin/fleet/nodemount/add/").status_code == 403  # the door creates them
