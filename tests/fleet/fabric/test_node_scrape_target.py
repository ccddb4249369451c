"""A scrape target of kind ``node``: the console pulls node_exporter's /metrics and stores its port
and storage series under the target's hostname (node_exporter names no host itself)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleet.models import DiskSample, MountSample, NodeInterface, NodeMount, PortSample, ScrapeTarget
from fleet.tasks import schedule_scrapes
from tests.fleet.fabric.node_exporter import FIXTURE

pytestmark = pytest.mark.django_db


@pytest.fixture
def node_exporter_url(settings) -> Iterator[str]:
    """A local node_exporter /metrics (loopback allowed for the scraper)."""
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = FIXTURE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_a_node_target_stores_ports_mounts_and_disks_under_its_hostname(site_a, node_exporter_url) -> None:
    target = ScrapeTarget.objects.create(
        site=site_a, name="node-17", url=node_exporter_url, kind="node", hostname="gpu-a-017"
    )
    schedule_scrapes()
    target.refresh_from_db()
    # 30 port values, 10 disk values, 6 file system values and the NFS mount's 4 mountstats values.
    assert (target.health, target.last_error, target.last_samples) == ("up", "", 30 + 10 + 6 + 4)
    assert NodeInterface.objects.filter(node__hostname="gpu-a-017", node__site=site_a).count() == 3
    assert NodeMount.objects.filter(node__hostname="gpu-a-017").count() == 3
    assert PortSample.objects.count() == 30 and DiskSample.objects.count() == 10
    assert MountSample.objects.count() == 6 + 4
    assert set(MountSample.objects.filter(quantity__startswith="nfs_").values_list("mount__mountpoint", flat=True)) == {
        "/mnt/datasets"
    }


def test_a_node_target_without_a_hostname_is_down_saying_so(site_a, node_exporter_url) -> None:
    target = ScrapeTarget.objects.create(site=site_a, name="node-x", url=node_exporter_url, kind="node")
    schedule_scrapes()
    target.refresh_from_db()
    assert target.health == "down" and "set this target's hostname" in target.last_error
    assert "?hostname" not in target.last_error
    assert not PortSample.objects.exists() and not NodeInterface.objects.exists()
