"""Scrape targets of Prometheus expositions that cannot name their endpoint: a TGI target (TGI's
metrics carry no model label) is refused at save without an endpoint name, naming the field, on
the targets page, in the API and in the model; a scrape that still cannot tell its endpoint says
to set the target's endpoint name, not the push door's ``?endpoint=``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from fleet.models import Endpoint, ScrapeTarget
from fleet.tasks import schedule_scrapes

pytestmark = pytest.mark.django_db

TGI = (Path(__file__).resolve().parents[2] / "fixtures" / "tgi.prom").read_text()
API = "/api/v1/fleet/scrape-targets/"
URL = "http://10.0.0.7:8080/metrics"


@pytest.fixture(autouse=True)
def _exporter_networks(settings) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8", "127.0.0.0/8"]  # URL's network, and loopback


@pytest.fixture
def tgi_url() -> Iterator[str]:
    """A local TGI /metrics."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = TGI.encode()
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


def test_the_targets_page_refuses_a_tgi_target_without_an_endpoint_name(site_a, operator_client) -> None:
    form = {"site": site_a.pk, "name": "tgi-1", "url": URL, "kind": "tgi", "interval_seconds": 15, "timeout_seconds": 5}
    response = operator_client.post("/fleet/targets/", form)
    assert response.status_code == 200  # the form again, with the error on its field
    assert "endpoint_name" in response.context["form"].errors
    assert "A TGI target needs an endpoint name" in response.content.decode()
    assert not ScrapeTarget.objects.exists()
    assert operator_client.post("/fleet/targets/", {**form, "endpoint_name": "mistral-7b"}).status_code == 302
    assert ScrapeTarget.objects.get().endpoint_name == "mistral-7b"


def test_the_api_refuses_a_tgi_target_without_an_endpoint_name_naming_the_field(site_a, operator_client) -> None:
    body = {"site": "ams-1", "name": "tgi-1", "url": URL, "kind": "tgi"}
    for extra in ({}, {"endpoint_name": ""}, {"endpoint_name": "   "}):
        response = operator_client.post(API, {**body, **extra}, content_type="application/json")
        assert response.status_code == 400, response.content
        assert list(response.json()) == ["endpoint_name"]
    assert not ScrapeTarget.objects.exists()
    response = operator_client.post(API, {**body, "endpoint_name": "mistral-7b"}, content_type="application/json")
    assert response.status_code == 201, response.content
    target = ScrapeTarget.objects.get()
    # A PATCH that would leave it without one is refused the same way, and so is turning an auto
    # target without one into a TGI target.
    response = operator_client.patch(f"{API}{target.pk}/", {"endpoint_name": ""}, content_type="application/json")
    assert response.status_code == 400 and "endpoint_name" in response.json()
    auto = ScrapeTarget.objects.create(site=site_a, name="auto-1", url=URL)
    response = operator_client.patch(f"{API}{auto.pk}/", {"kind": "tgi"}, content_type="application/json")
    assert response.status_code == 400 and "endpoint_name" in response.json()
    target.refresh_from_db()
    auto.refresh_from_db()
    assert (target.endpoint_name, auto.kind) == ("mistral-7b", "auto")


def test_the_model_names_the_field(site_a) -> None:
    target = ScrapeTarget(site=site_a, name="tgi-1", url=URL, kind="tgi")
    with pytest.raises(ValidationError) as caught:
        target.full_clean()
    assert list(caught.value.message_dict) == ["endpoint_name"]
    ScrapeTarget(site=site_a, name="vllm-1", url=URL, kind="vllm").full_clean()  # vLLM names its model


def test_a_scrape_that_cannot_name_its_endpoint_says_to_set_the_targets_endpoint_name(site_a, tgi_url) -> None:
    # An auto target (saved before the rule, or pointed at TGI by mistake): the scrape says what to do.
    target = ScrapeTarget.objects.create(site=site_a, name="tgi-auto", url=tgi_url)
    schedule_scrapes()
    target.refresh_from_db()
    assert target.health == "down"
    assert "set this target's endpoint name" in target.last_error and "?endpoint" not in target.last_error
    named = ScrapeTarget.objects.create(site=site_a, name="tgi-named", url=tgi_url, kind="tgi", endpoint_name="m")
    schedule_scrapes()
    named.refresh_from_db()
    assert (named.health, named.last_error) == ("up", "")
    assert Endpoint.objects.get(site=site_a).name == "m"
