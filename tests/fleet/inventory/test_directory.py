"""The in-process directory of GPU and node ids: what it answers from memory, and when it reads
the database again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.inventory import directory
from fleet.inventory.models import Gpu, Node
from fleet.models import Site

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpus(site_a: Site) -> list[Gpu]:
    node = Node.objects.create(site=site_a, hostname="dir-node-1")
    return [Gpu.objects.create(node=node, uuid=f"GPU-dir-{i}", index=i) for i in range(3)]


def test_known_ids_are_answered_from_memory_until_the_ttl(gpus: list[Gpu], site_a: Site, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    clock = [1000.0]
    monkeypatch.setattr(directory.time, "monotonic", lambda: clock[0])
    uuids = [g.uuid for g in gpus]
    first = directory.gpus([*uuids, "GPU-unknown"])
    assert first == {g.uuid: (g.pk, site_a.pk) for g in gpus}  # the unknown one is absent
    with CaptureQueriesContext(connection) as queries:
        assert directory.gpus(uuids[:2]) == {g.uuid: (g.pk, site_a.pk) for g in gpus[:2]}
    assert len(queries) == 0
    clock[0] += directory.TTL_SECONDS + 1
    with CaptureQueriesContext(connection) as queries:
        assert directory.gpus(uuids[:1]) == {gpus[0].uuid: (gpus[0].pk, site_a.pk)}
    assert len(queries) == 1  # expired: read again


def test_a_forgotten_entry_is_read_again_and_sees_a_move(gpus: list[Gpu], site_a: Site, site_b: Site) -> None:
    assert directory.nodes(["dir-node-1"])["dir-node-1"][1] == site_a.pk
    Node.objects.filter(hostname="dir-node-1").update(site=site_b)
    assert directory.nodes(["dir-node-1"])["dir-node-1"][1] == site_a.pk  # cached
    directory.forget(hostnames=["dir-node-1"])
    assert directory.nodes(["dir-node-1"])["dir-node-1"][1] == site_b.pk


def test_rows_read_without_remembering_are_not_kept(gpus: list[Gpu]) -> None:
    directory.gpus([gpus[0].uuid], remember=False)
    with CaptureQueriesContext(connection) as queries:
        directory.gpus([gpus[0].uuid])
    assert len(queries) == 1
