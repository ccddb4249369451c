"""The ports' and mounts' API (/api/v1/fleet/interfaces/, /api/v1/fleet/mounts/): every role reads;
Operators and Admins PATCH what the ingest door cannot know (a port's kind and fabric, a mount's
purpose), audited; a bad value is a 400 naming the field; nothing is created or deleted here."""

from __future__ import annotations

import pytest
from django.test import Client

from compliance.models import AuditEntry
from fleet.choices import Fabric, InterfaceKind, MountPurpose
from fleet.models import Node, NodeInterface, NodeMount

pytestmark = pytest.mark.django_db


@pytest.fixture
def port(site_a) -> NodeInterface:  # type: ignore[no-untyped-def]
    node = Node.objects.create(site=site_a, hostname="gpu-a-001")
    return NodeInterface.objects.create(node=node, name="eth1", kind=InterfaceKind.ETHERNET)


@pytest.fixture
def mount(port: NodeInterface) -> NodeMount:
    return NodeMount.objects.create(node=port.node, mountpoint="/scratch", fstype="xfs", device="/dev/nvme1n1p1")


def _patch(client: Client, url: str, body: dict) -> object:  # type: ignore[type-arg]
    return client.patch(url, body, content_type="application/json")


def test_a_viewer_lists_ports_and_mounts_with_their_node(viewer_client: Client, port, mount) -> None:  # type: ignore[no-untyped-def]
    ports = viewer_client.get("/api/v1/fleet/interfaces/").json()["results"]
    assert [(p["node"], p["name"], p["kind"], p["fabric"]) for p in ports] == [
        ("gpu-a-001", "eth1", "ethernet", "management")  # the fabric defaulted from the kind
    ]
    mounts = viewer_client.get("/api/v1/fleet/mounts/?hostname=gpu-a-001").json()["results"]
    assert [(m["node"], m["mountpoint"], m["purpose"]) for m in mounts] == [("gpu-a-001", "/scratch", "other")]
    detail = viewer_client.get(f"/api/v1/fleet/interfaces/{port.pk}/").json()
    assert detail["id"] == port.pk and detail["fabric"] == "management"


def test_the_lists_filter_by_fabric_and_purpose(viewer_client: Client, port, mount) -> None:  # type: ignore[no-untyped-def]
    NodeInterface.objects.create(node=port.node, name="mlx5_0/1", kind=InterfaceKind.IB)
    compute = viewer_client.get("/api/v1/fleet/interfaces/?fabric=compute").json()["results"]
    assert [p["name"] for p in compute] == ["mlx5_0/1"]
    assert viewer_client.get("/api/v1/fleet/mounts/?purpose=datasets").json()["results"] == []


def test_a_viewer_may_not_patch(viewer_client: Client, port, mount) -> None:  # type: ignore[no-untyped-def]
    assert _patch(viewer_client, f"/api/v1/fleet/interfaces/{port.pk}/", {"fabric": "storage"}).status_code == 403
    assert _patch(viewer_client, f"/api/v1/fleet/mounts/{mount.pk}/", {"purpose": "datasets"}).status_code == 403
    port.refresh_from_db()
    mount.refresh_from_db()
    assert (port.fabric, mount.purpose) == (Fabric.MANAGEMENT, MountPurpose.OTHER)


def test_anonymous_and_no_role_are_refused(client: Client, norole_client: Client, port) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/api/v1/fleet/interfaces/").status_code == 401
    assert norole_client.get("/api/v1/fleet/interfaces/").status_code == 403
    assert norole_client.get("/api/v1/fleet/mounts/").status_code == 403


def test_an_operator_sets_a_ports_kind_and_fabric_audited(operator_client: Client, operator_user, port) -> None:  # type: ignore[no-untyped-def]
    response = _patch(operator_client, f"/api/v1/fleet/interfaces/{port.pk}/", {"kind": "roce", "fabric": "storage"})
    assert response.status_code == 200, response.content
    assert (response.json()["kind"], response.json()["fabric"]) == ("roce", "storage")
    port.refresh_from_db()
    assert (port.kind, port.fabric) == (InterfaceKind.ROCE, Fabric.STORAGE)
    entry = AuditEntry.objects.get(model="nodeinterface", object_id=str(port.pk), action="update")
    assert entry.actor == operator_user.username and entry.actor_id == operator_user.pk
    assert (entry.before["fabric"], entry.after["fabric"]) == ("management", "storage")
    assert (entry.before["kind"], entry.after["kind"]) == ("ethernet", "roce")


def test_a_blank_fabric_goes_back_to_the_kinds_default(operator_client: Client, port) -> None:  # type: ignore[no-untyped-def]
    port.fabric = Fabric.STORAGE
    port.save()
    response = _patch(operator_client, f"/api/v1/fleet/interfaces/{port.pk}/", {"kind": "ib", "fabric": ""})
    assert response.status_code == 200, response.content
    assert response.json()["fabric"] == "compute"


def test_an_operator_sets_a_mounts_purpose_audited(operator_client: Client, operator_user, mount) -> None:  # type: ignore[no-untyped-def]
    response = _patch(operator_client, f"/api/v1/fleet/mounts/{mount.pk}/", {"purpose": "checkpoints"})
    assert response.status_code == 200, response.content
    mount.refresh_from_db()
    assert mount.purpose == MountPurpose.CHECKPOINTS
    entry = AuditEntry.objects.get(model="nodemount", object_id=str(mount.pk), action="update")
    assert entry.actor == operator_user.username
    assert (entry.before["purpose"], entry.after["purpose"]) == ("other", "checkpoints")


def test_an_admin_may_patch_too(admin_client: Client, port, mount) -> None:  # type: ignore[no-untyped-def]
    assert _patch(admin_client, f"/api/v1/fleet/interfaces/{port.pk}/", {"fabric": "compute"}).status_code == 200
    assert _patch(admin_client, f"/api/v1/fleet/mounts/{mount.pk}/", {"purpose": "datasets"}).status_code == 200
    assert NodeMount.objects.get(pk=mount.pk).purpose == MountPurpose.DATASETS


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("interfaces", {"fabric": "backbone"}, "fabric"),
        ("interfaces", {"kind": "token-ring"}, "kind"),
        ("interfaces", {"fabric": 7}, "fabric"),
        ("mounts", {"purpose": "scratch"}, "purpose"),
        ("mounts", {"purpose": None}, "purpose"),
    ],
)
def test_a_bad_value_is_a_400_naming_the_field(operator_client: Client, port, mount, route, body, field) -> None:  # type: ignore[no-untyped-def]
    pk = port.pk if route == "interfaces" else mount.pk
    response = _patch(operator_client, f"/api/v1/fleet/{route}/{pk}/", body)
    assert response.status_code == 400
    assert field in response.json()
    assert not AuditEntry.objects.filter(model__in=["nodeinterface", "nodemount"], action="update").exists()


def test_what_ingest_found_cannot_be_changed_here(operator_client: Client, port, mount) -> None:  # type: ignore[no-untyped-def]
    response = _patch(
        operator_client, f"/api/v1/fleet/interfaces/{port.pk}/", {"name": "eth9", "rate_bytes_per_second": 1}
    )
    assert response.status_code == 200
    port.refresh_from_db()
    assert (port.name, port.rate_bytes_per_second) == ("eth1", None)
    response = _patch(operator_client, f"/api/v1/fleet/mounts/{mount.pk}/", {"mountpoint": "/elsewhere"})
    assert response.status_code == 200 and NodeMount.objects.get(pk=mount.pk).mountpoint == "/scratch"


def test_ports_and_mounts_are_neither_created_nor_deleted_nor_put(
    operator_client: Client, admin_client: Client, port
) -> None:  # type: ignore[no-untyped-def]
    # An Operator holds no add permission (403); an Admin holds every one, and the route takes no POST.
    assert operator_client.post("/api/v1/fleet/interfaces/", {}, content_type="application/json").status_code == 403
    assert admin_client.post("/api/v1/fleet/mounts/", {}, content_type="application/json").status_code == 405
    assert admin_client.delete(f"/api/v1/fleet/interfaces/{port.pk}/").status_code == 405
    put = admin_client.put(
        f"/api/v1/fleet/interfaces/{port.pk}/", {"fabric": "compute"}, content_type="application/json"
    )
    assert put.status_code == 405
    assert NodeInterface.objects.filter(pk=port.pk).exists()
