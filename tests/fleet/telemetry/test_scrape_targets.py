"""Scrape targets: the console pulls /metrics URLs on a schedule, like Prometheus."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleet.ingest.scraping import claim_due_targets
from fleet.models import Endpoint, Gpu, ScrapeTarget, ServingSample
from fleet.tasks import schedule_scrapes
from tests.fleet.telemetry.test_prometheus_ingest import DCGM, FIXTURES, GPU1, VLLM

TRITON = (FIXTURES / "triton.prom").read_text()
# The networks listed as a deployment lists its exporters': 10.0.0.0/8 for the targets these tests
# only save, and loopback, where the stand-in exporters listen (scrapes reach nothing unlisted).
EXPORTER_NETWORKS = ["10.0.0.0/8", "127.0.0.0/8"]


class Exporter:
    """A local HTTP server playing dcgm-exporter, vLLM and Triton: /dcgm, /vllm, /triton, /broken, /slow."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/slow":
                    threading.Event().wait(2)
                body = {"/dcgm": DCGM, "/vllm": VLLM, "/slow": DCGM, "/triton": TRITON}.get(self.path)
                if self.path == "/garbage":
                    body = "this is not { prometheus\n"
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"


@pytest.fixture(autouse=True)
def _exporter_networks(settings) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = EXPORTER_NETWORKS


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    server = Exporter()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_due_targets_are_scraped_and_stored_like_a_push(exporter, site_a) -> None:
    dcgm = ScrapeTarget.objects.create(site=site_a, name="dcgm-a-001", url=exporter.url("/dcgm"), kind="dcgm")
    vllm = ScrapeTarget.objects.create(site=site_a, name="llama", url=exporter.url("/vllm"), kind="vllm")
    assert schedule_scrapes() == 2  # eager: the scrapes run now
    dcgm.refresh_from_db()
    vllm.refresh_from_db()
    assert (dcgm.health, dcgm.last_samples, dcgm.last_error) == ("up", 2, "")
    assert dcgm.last_duration_ms is not None and dcgm.last_scrape_at is not None
    assert Gpu.objects.get(uuid=GPU1).state.xid == 79
    assert Gpu.objects.get(uuid=GPU1).state.memory_temp_c is None
    assert (vllm.health, vllm.last_samples) == ("up", 76)
    assert ServingSample.objects.filter(endpoint=Endpoint.objects.get()).count() == 76


def test_a_target_is_claimed_once_per_interval(exporter, site_a) -> None:
    ScrapeTarget.objects.create(site=site_a, name="t", url=exporter.url("/dcgm"), interval_seconds=60)
    assert len(claim_due_targets()) == 1
    assert claim_due_targets() == []  # the next scrape is a minute away


@pytest.mark.parametrize(
    ("path", "timeout", "shown", "logged"),
    [
        ("/missing", 5, "unreachable", "HTTP 404 from the target"),
        ("/slow", 0.5, "unreachable", "timed out after 0.5 s"),
        ("/closed", 5, "unreachable", "connection failed"),
        ("/garbage", 5, "not a Prometheus exposition", "line 1: cannot parse"),
    ],
)
def test_a_failing_target_shows_only_unreachable_or_not_an_exposition(
    exporter, site_a, caplog, path, timeout, shown, logged
) -> None:
    url = exporter.url(path)
    if path == "/closed":  # a port nothing listens on
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{probe.getsockname()[1]}/metrics"
    target = ScrapeTarget.objects.create(site=site_a, name="t", url=url, timeout_seconds=timeout)
    with caplog.at_level(logging.WARNING, logger="fleet.ingest.scraping"):
        schedule_scrapes()
    target.refresh_from_db()
    assert (target.health, target.last_error) == ("down", shown)
    assert target.last_duration_ms is None  # a timeout's length would tell it from a refusal
    assert logged in caplog.text  # the detail is the server's
    assert Gpu.objects.count() == 0


def test_the_targets_page_shows_health_and_operators_can_add_targets(
    exporter, site_a, viewer_client, operator_client
) -> None:
    ScrapeTarget.objects.create(site=site_a, name="dcgm-a-001", url=exporter.url("/dcgm"))
    ScrapeTarget.objects.create(site=site_a, name="broken", url=exporter.url("/missing"))
    schedule_scrapes()
    page = viewer_client.get("/fleet/targets/").content.decode()
    assert "1 up · 1 down" in page and "unreachable" in page and "dcgm-a-001" in page
    assert "HTTP 404" not in page  # the far end's answer is the server log's
    assert "Add a target" not in page
    form = {
        "site": site_a.pk,
        "name": "vllm-1",
        "url": exporter.url("/vllm"),
        "kind": "auto",
        "interval_seconds": 15,
        "timeout_seconds": 5,
    }
    assert viewer_client.post("/fleet/targets/", form).status_code == 403
    assert not ScrapeTarget.objects.filter(name="vllm-1").exists()
    response = operator_client.post("/fleet/targets/", form)
    assert response.status_code == 302
    assert ScrapeTarget.objects.get(name="vllm-1").health == "unknown"
    bad = operator_client.post("/fleet/targets/", {**form, "name": "x", "url": "ftp://nope", "interval_seconds": 1})
    assert bad.status_code == 200 and not ScrapeTarget.objects.filter(name="x").exists()
    assert "Enter a valid URL" in bad.content.decode() and "greater than or equal to 5" in bad.content.decode()


def test_the_scrape_target_api_follows_roles(site_a, viewer_client, operator_client) -> None:
    body = {"site": "ams-1", "name": "api-target", "url": "http://10.0.0.1:9400/metrics", "kind": "dcgm"}
    assert viewer_client.post("/api/v1/fleet/scrape-targets/", body, content_type="application/json").status_code == 403
    response = operator_client.post("/api/v1/fleet/scrape-targets/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    listed = viewer_client.get("/api/v1/fleet/scrape-targets/").json()
    assert listed["count"] == 1 and listed["results"][0]["health"] == "unknown"
