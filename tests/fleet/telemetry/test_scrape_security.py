"""Scrape targets cannot probe the console's own network: an allow-list of networks, closed by
default, checked when a target is saved and again when the scrape connects; private ranges and
the console's own addresses that a broad entry does not open; no redirects; and errors that show
"unreachable" or "not a Prometheus exposition", never what answered (the detail is the log's)."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from console import outbound
from fleet.ingest.scraping import NOT_AN_EXPOSITION, OUTSIDE_THE_ALLOWED_NETWORKS, UNREACHABLE
from fleet.models import Gpu, ScrapeTarget
from fleet.tasks import scrape_target
from tests.fleet.telemetry.test_prometheus_ingest import DCGM
from tests.fleet.telemetry.test_scrape_targets import EXPORTER_NETWORKS

SECRET = "s3cret-internal-token"
API = "/api/v1/fleet/scrape-targets/"


class Internal:
    """A local HTTP server playing an internal service: it counts requests and keeps their Host headers."""

    def __init__(self, bind: str = "127.0.0.1") -> None:
        self.hosts: list[str] = []
        hosts = self.hosts

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hosts.append(self.headers.get("Host", ""))
                status, headers, body = {
                    "/metrics": (200, {}, DCGM),
                    "/redirect": (302, {"Location": "http://169.254.169.254/latest/meta-data/"}, ""),
                    "/admin": (404, {}, f"{SECRET} not found\n"),
                    "/page": (200, {}, f"<html><title>{SECRET}</title></html>\n"),
                    "/label": (
                        200,
                        {},
                        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{SECRET}",UUID="GPU-1234567890",hostname="n1"}} 5\n',
                    ),
                }[self.path]
                data = body.encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((bind, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
def internal() -> Iterator[Internal]:
    server = Internal()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def default_networks(settings: Any) -> None:
    """The shipped production default (nothing), whatever the environment running the tests sets."""
    settings.OUTBOUND_ALLOWED_NETWORKS = outbound.DEFAULT_ALLOWED_NETWORKS


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host names that resolve to the addresses given here; every other name resolves as usual."""
    names: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in names:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port or 0))
                for a in names[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names


def _scraped(site: Any, url: str) -> ScrapeTarget:
    """A target saved without the save-time check (as one saved before it), scraped once."""
    target = ScrapeTarget.objects.create(site=site, name="t", url=url)
    scrape_target(target.pk)
    target.refresh_from_db()
    return target


def _form(site: Any, url: str) -> dict[str, Any]:
    return {"site": site.pk, "name": "t", "url": url, "kind": "auto", "interval_seconds": 15, "timeout_seconds": 5}


def _own(version: int) -> str:
    """A non-loopback address of this host's own interfaces (as the kernel lists them)."""
    found = sorted(
        str(a) for a in outbound.own_addresses() if a.version == version and not (a.is_loopback or a.is_link_local)
    )
    if not found:
        pytest.skip(f"this host has no non-loopback IPv{version} address")
    return found[0]


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


# --- the allow-list ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "networks", "allowed"),
    [
        ("8.8.8.8", ["0.0.0.0/0", "::/0"], True),
        ("2001:4860::8888", ["0.0.0.0/0", "::/0"], True),
        ("10.1.2.3", ["0.0.0.0/0", "::/0"], False),  # private: a catch-all does not open it
        ("172.16.5.4", ["0.0.0.0/0", "::/0"], False),
        ("192.168.1.1", ["192.0.0.0/8"], False),  # holds 192.168.0.0/16, but is broader than it
        ("100.64.0.1", ["0.0.0.0/0", "::/0"], False),
        ("fd00::7", ["0.0.0.0/0", "::/0"], False),
        ("fd00::7", ["fd00::/8"], True),
        ("::ffff:10.1.2.3", ["0.0.0.0/0", "::/0"], False),
        ("192.168.1.1", ["192.168.1.0/24"], True),
        ("127.0.0.1", ["0.0.0.0/0", "::/0"], False),
        ("::1", ["0.0.0.0/0", "::/0"], False),
        ("::ffff:127.0.0.1", ["0.0.0.0/0", "::/0"], False),
        ("169.254.169.254", ["0.0.0.0/0", "::/0"], False),
        ("fe80::1", ["0.0.0.0/0", "::/0"], False),
        ("0.0.0.0", ["0.0.0.0/0", "::/0"], False),
        ("::", ["0.0.0.0/0", "::/0"], False),
        ("127.0.0.1", ["127.0.0.0/8"], True),
        ("127.0.0.1", ["126.0.0.0/7"], False),  # covers loopback, but is not an explicit opening
        ("169.254.169.254", ["169.254.169.254/32"], True),
        ("169.254.0.1", ["169.254.169.254/32"], False),
        ("10.1.2.3", ["10.0.0.0/8"], True),
        ("192.168.1.1", ["10.0.0.0/8"], False),
        ("2001:db8::1", ["10.0.0.0/8"], False),
    ],
)
def test_an_address_is_allowed_by_a_network_and_reserved_or_private_ranges_only_by_one_within_them(
    address, networks, allowed
) -> None:
    nets = [ipaddress.ip_network(n) for n in networks]
    assert outbound.is_allowed_address(ipaddress.ip_address(address), nets) is allowed


@pytest.mark.parametrize("host", ["localhost", "127.1", "2130706433", "0x7f000001", "::ffff:7f00:1"])
def test_every_spelling_of_loopback_is_refused(default_networks, host) -> None:
    # The URL validator refuses some of these at save time; a scrape of an older row gets here.
    with pytest.raises(outbound.OutboundRefused, match="not in the allowed networks"):
        outbound.resolve_allowed(host, 80)


@pytest.mark.parametrize(
    ("address", "networks", "allowed"),
    [
        ("10.20.0.5", ["10.20.0.0/16"], False),  # the exporters' subnet, which holds the console
        ("10.20.0.5", ["10.0.0.0/8"], False),
        ("10.20.0.5", ["10.20.0.5/32"], True),
        ("10.20.0.6", ["10.20.0.0/16"], True),  # its neighbour is an exporter like any other
        ("192.0.2.2", ["0.0.0.0/0"], False),
        ("192.0.2.2", ["192.0.2.2/32"], True),
        ("fd00::2", ["fd00::/8"], False),
        ("fd00::2", ["fd00::2/128"], True),
        ("127.0.0.1", ["127.0.0.0/8"], True),  # loopback is the reserved rule's: an entry within it
    ],
)
def test_the_consoles_own_address_opens_only_to_an_entry_of_exactly_that_address(address, networks, allowed) -> None:
    own = {ipaddress.ip_address(a) for a in ("10.20.0.5", "192.0.2.2", "fd00::2", "127.0.0.1")}
    nets = [ipaddress.ip_network(n) for n in networks]
    assert outbound.is_allowed_address(ipaddress.ip_address(address), nets, own=own) is allowed


def test_the_consoles_own_addresses_are_every_interfaces() -> None:
    own = outbound.own_addresses()
    assert ipaddress.ip_address("127.0.0.1") in own
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # picks the address this host sends from; sends nothing
        except OSError:
            pytest.skip("this host has no IPv4 route")
        assert ipaddress.ip_address(probe.getsockname()[0]) in own


# --- closed by default ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["10.0.0.7", "[fd00::7]", "own IPv4", "own IPv6"])
def test_by_default_a_private_a_ula_and_the_consoles_own_address_are_refused_naming_the_setting(
    site_a, operator_client, default_networks, where
) -> None:
    host = _host(_own(4 if "4" in where else 6)) if where.startswith("own") else where
    response = operator_client.post(
        API, _form(site_a, f"http://{host}:9400/metrics") | {"site": "ams-1"}, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["url"]
    assert "not in the allowed networks (GOODPUT_OUTBOUND_ALLOWED_NETWORKS;" in response.json()["url"][0]
    assert not ScrapeTarget.objects.exists()


@pytest.mark.parametrize("where", ["10.0.0.7", "[fd00::7]", "own IPv4", "own IPv6"])
def test_a_catch_all_opens_neither_private_ranges_nor_the_consoles_own_address(
    site_a, operator_client, settings, where
) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["0.0.0.0/0", "::/0"]  # as a SaaS webhook needs
    host = _host(_own(4 if "4" in where else 6)) if where.startswith("own") else where
    response = operator_client.post(
        API, _form(site_a, f"http://{host}:9400/metrics") | {"site": "ams-1"}, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    error = response.json()["url"][0]
    assert "GOODPUT_OUTBOUND_ALLOWED_NETWORKS" in error
    assert ("console's own address" if where.startswith("own") else "private range opens only") in error


def test_a_public_address_is_open_to_a_catch_all(site_a, operator_client, settings) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["0.0.0.0/0", "::/0"]
    for url in ["http://8.8.8.8:9400/metrics", "http://[2001:4860::8888]:9400/metrics"]:
        body = _form(site_a, url) | {"site": "ams-1", "name": url}
        assert operator_client.post(API, body, content_type="application/json").status_code == 201


def test_listed_private_networks_open_their_targets(site_a, operator_client, settings) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.20.0.0/16", "fd00:20::/48"]
    for url, status in [
        ("http://10.20.30.40:9400/metrics", 201),
        ("http://[fd00:20::7]:9400/metrics", 201),
        ("http://10.21.0.1:9400/metrics", 400),
        ("http://[fd00:21::7]:9400/metrics", 400),
    ]:
        body = _form(site_a, url) | {"site": "ams-1", "name": url}
        response = operator_client.post(API, body, content_type="application/json")
        assert response.status_code == status, (url, response.content)


def test_a_scrape_of_the_consoles_own_address_needs_exactly_that_address_listed(site_a, settings) -> None:
    own = _own(4)
    server = Internal(bind=own)
    try:
        # Its subnet and the catch-all hold it; neither opens it, and no request leaves.
        settings.OUTBOUND_ALLOWED_NETWORKS = [str(ipaddress.ip_network(f"{own}/24", strict=False)), "0.0.0.0/0"]
        target = _scraped(site_a, server.url("/metrics", host=own))
        assert (target.health, target.last_error) == ("down", OUTSIDE_THE_ALLOWED_NETWORKS)
        assert server.hosts == []
        settings.OUTBOUND_ALLOWED_NETWORKS = [f"{own}/32"]
        scrape_target(target.pk)
        target.refresh_from_db()
        assert (target.health, target.last_error) == ("up", "")
        assert len(server.hosts) == 1
    finally:
        server.server.shutdown()
        server.server.server_close()


def test_the_embedded_demo_scrapes_its_own_exporters_on_loopback(site_a, internal) -> None:
    """Under the settings as loaded (no test override): the demo's default lists loopback."""
    from django.conf import settings

    if not settings.EMBEDDED_DATABASE or "GOODPUT_OUTBOUND_ALLOWED_NETWORKS" in os.environ:
        pytest.skip("not the embedded demo's default")
    target = _scraped(site_a, internal.url("/metrics"))
    assert (target.health, target.last_error) == ("up", "")


# --- when a target is saved -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/healthz",
        "http://localhost:8000/metrics",
        "http://[::1]:9400/metrics",
        "http://[::ffff:127.0.0.1]:9400/metrics",
        "http://0.0.0.0:8000/metrics",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]:9400/metrics",
    ],
)
def test_the_api_refuses_loopback_and_link_local_naming_the_url_field(
    site_a, operator_client, default_networks, url
) -> None:
    response = operator_client.post(API, _form(site_a, url) | {"site": "ams-1"}, content_type="application/json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["url"]
    assert "not in the allowed networks (GOODPUT_OUTBOUND_ALLOWED_NETWORKS" in response.json()["url"][0]
    assert not ScrapeTarget.objects.exists()


def test_the_form_refuses_loopback(site_a, operator_client, default_networks) -> None:
    response = operator_client.post("/fleet/targets/", _form(site_a, "http://localhost:8000/healthz"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "resolves to" in page and "not in the allowed networks" in page
    assert not ScrapeTarget.objects.exists()


def test_the_api_refuses_an_edit_onto_loopback(site_a, operator_client, default_networks) -> None:
    target = ScrapeTarget.objects.create(site=site_a, name="t", url="http://10.0.0.1:9400/metrics")
    response = operator_client.patch(
        f"{API}{target.pk}/", {"url": "http://127.0.0.1:8000/"}, content_type="application/json"
    )
    assert response.status_code == 400 and "url" in response.json()
    target.refresh_from_db()
    assert target.url == "http://10.0.0.1:9400/metrics"


def test_a_host_is_refused_if_any_of_its_addresses_is_outside_the_networks(
    site_a, operator_client, settings, fake_dns
) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    fake_dns["exporter.example"] = ["10.0.0.7", "127.0.0.1"]
    url = "http://exporter.example:9400/metrics"
    response = operator_client.post(API, _form(site_a, url) | {"site": "ams-1"}, content_type="application/json")
    assert response.status_code == 400
    assert "exporter.example resolves to 127.0.0.1" in response.json()["url"][0]


def test_only_the_configured_networks_are_accepted(site_a, operator_client, settings) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8", "127.0.0.1/32"]
    for url, status in [
        ("http://10.20.30.40:9400/metrics", 201),
        ("http://127.0.0.1:9400/metrics", 201),  # listed explicitly
        ("http://192.168.1.10:9400/metrics", 400),
        ("http://127.0.0.2:9400/metrics", 400),
    ]:
        body = _form(site_a, url) | {"site": "ams-1", "name": url}
        response = operator_client.post(API, body, content_type="application/json")
        assert response.status_code == status, (url, response.content)


def test_a_host_that_does_not_resolve_is_saved_and_fails_when_scraped(
    site_a, operator_client, default_networks
) -> None:
    url = "http://no-such-exporter.invalid:9400/metrics"
    response = operator_client.post(API, _form(site_a, url) | {"site": "ams-1"}, content_type="application/json")
    assert response.status_code == 201, response.content
    target = ScrapeTarget.objects.get()
    scrape_target(target.pk)
    target.refresh_from_db()
    assert (target.health, target.last_error) == ("down", UNREACHABLE)


# --- when a target is scraped -----------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_target_on_loopback_is_refused_at_scrape_time_without_a_request(
    site_a, internal, settings, caplog, scheme
) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["0.0.0.0/0", "::/0"]
    with caplog.at_level(logging.WARNING, logger="fleet.ingest.scraping"):
        target = _scraped(site_a, internal.url("/metrics").replace("http:", f"{scheme}:"))
    assert (target.health, target.last_error) == ("down", "unreachable (outside GOODPUT_OUTBOUND_ALLOWED_NETWORKS)")
    assert (
        "127.0.0.1 is not in the allowed networks (GOODPUT_OUTBOUND_ALLOWED_NETWORKS; loopback, "
        "link-local and unspecified addresses must be listed there explicitly)"
    ) in caplog.text
    assert internal.hosts == []


def test_a_name_that_resolves_to_loopback_by_scrape_time_is_refused(
    site_a, internal, settings, fake_dns, caplog
) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    # Saved while the name pointed elsewhere; by the scrape it points at the console's host.
    fake_dns["exporter.example"] = ["10.0.0.7"]
    outbound.check_url(internal.url("/metrics", host="exporter.example"))
    fake_dns["exporter.example"] = ["127.0.0.1"]
    with caplog.at_level(logging.WARNING, logger="fleet.ingest.scraping"):
        target = _scraped(site_a, internal.url("/metrics", host="exporter.example"))
    assert target.last_error == OUTSIDE_THE_ALLOWED_NETWORKS
    assert "exporter.example resolves to 127.0.0.1" in caplog.text
    assert internal.hosts == []


def test_the_scrape_connects_to_the_checked_address_and_names_the_host(site_a, internal, settings, fake_dns) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = EXPORTER_NETWORKS
    fake_dns["exporter.example"] = ["127.0.0.1"]
    target = _scraped(site_a, internal.url("/metrics", host="exporter.example"))
    assert (target.health, target.last_error) == ("up", "")
    assert internal.hosts == [f"exporter.example:{internal.port}"]


def test_a_redirect_is_not_followed(site_a, internal, settings, caplog) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = EXPORTER_NETWORKS
    with caplog.at_level(logging.WARNING, logger="fleet.ingest.scraping"):
        target = _scraped(site_a, internal.url("/redirect"))
    assert (target.health, target.last_error) == ("down", UNREACHABLE)
    assert "redirects are not followed (HTTP 302, Location: http://169.254.169.254/latest/meta-data/)" in caplog.text
    assert len(internal.hosts) == 1


@pytest.mark.parametrize(
    ("path", "shown", "logged"),
    [
        ("/admin", UNREACHABLE, "HTTP 404 from the target"),
        ("/page", NOT_AN_EXPOSITION, "the body is not a Prometheus exposition (line 1: cannot parse)"),
        ("/label", NOT_AN_EXPOSITION, "line 1: label gpu is '…'; a GPU index from 0 to 1023."),
    ],
)
def test_an_error_does_not_echo_the_body(site_a, internal, settings, caplog, path, shown, logged) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = EXPORTER_NETWORKS
    with caplog.at_level(logging.WARNING, logger="fleet.ingest.scraping"):
        target = _scraped(site_a, internal.url(path))
    assert (target.health, target.last_error) == ("down", shown)
    assert logged in caplog.text
    assert SECRET not in target.last_error and SECRET not in caplog.text
    assert Gpu.objects.count() == 0


def test_a_closed_port_and_a_filtered_one_read_the_same(site_a, settings, monkeypatch) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = EXPORTER_NETWORKS
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert _scraped(site_a, f"http://127.0.0.1:{closed}/metrics").last_error == UNREACHABLE

    def silent(*args: Any, **kwargs: Any) -> socket.socket:  # a firewall that drops the SYN
        raise TimeoutError("timed out")

    monkeypatch.setattr(outbound.urllib3_connection, "create_connection", silent)
    ScrapeTarget.objects.all().delete()
    assert _scraped(site_a, "http://10.0.0.7:9400/metrics").last_error == UNREACHABLE


def test_the_admin_refuses_loopback_too(admin_client, site_a, default_networks) -> None:
    """The check is the model field's validator, so the admin's own form applies it as well."""
    response = admin_client.post(
        "/admin/fleet/scrapetarget/add/",
        {
            "site": site_a.pk,
            "name": "sneaky",
            "url": "http://127.0.0.1:8000/healthz",
            "kind": "dcgm",
            "interval_seconds": 15,
            "timeout_seconds": 5,
            "enabled": "on",
        },
    )
    assert response.status_code == 200 and b"not in the allowed networks" in response.content
    assert not ScrapeTarget.objects.filter(name="sneaky").exists()
