"""Requests the console makes to addresses people configured (scrape targets, notification
channels): they must not become a way to probe the console's own network.

1. Only addresses in ``OUTBOUND_ALLOWED_NETWORKS`` are reached. Loopback, link-local (the cloud
   metadata service) and unspecified addresses are refused even inside a broad entry such as
   ``0.0.0.0/0``; only an entry within those ranges (``127.0.0.0/8``, ``169.254.169.254``) opens them.
2. A URL is checked when it is saved (every address its host resolves to) and again when it is
   used, at the moment of connecting: the host is resolved once, every address is checked, and
   the socket connects to a checked address. DNS that changes between the check and the
   connection (rebinding) cannot slip another address in.
3. Callers do not follow redirects and never quote what the far end answered.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
from collections.abc import Iterable
from urllib.parse import urlsplit

import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection as urllib3_connection

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The default when OUTBOUND_ALLOWED_NETWORKS is not configured: every address, less RESERVED_NETWORKS.
DEFAULT_ALLOWED_NETWORKS = ["0.0.0.0/0", "::/0"]
# The console's own host, the link-local range (cloud metadata services at 169.254.169.254) and
# the unspecified address (a connect to 0.0.0.0 reaches the local host on Linux). An allowed
# entry opens an address here only if it lies within the reserved range: 127.0.0.0/8 does,
# 0.0.0.0/0 does not.
RESERVED_NETWORKS = [
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "::1/128",
        "169.254.0.0/16",
        "fe80::/10",
        "0.0.0.0/8",
        "::/128",
        # Cloud metadata services outside link-local: AWS over IPv6, Alibaba, Oracle.
        "fd00:ec2::254/128",
        "100.100.100.200/32",
        "192.0.0.192/32",
    )
]
SETTING_NAME = "GOODPUT_OUTBOUND_ALLOWED_NETWORKS"


class OutboundRefused(Exception):
    """An address the console will not reach; the message says why, for forms, the API and pages."""


class HostNotFound(OutboundRefused):
    """The URL's host does not resolve (yet): accepted when a URL is saved, a failure when used."""


def allowed_networks() -> list[IPNetwork]:
    """The networks the console may reach, from OUTBOUND_ALLOWED_NETWORKS (CIDR strings)."""
    configured = getattr(settings, "OUTBOUND_ALLOWED_NETWORKS", DEFAULT_ALLOWED_NETWORKS)
    return [ipaddress.ip_network(str(entry), strict=False) for entry in configured]


def is_allowed_address(address: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    """True if some allowed network holds the address; for a reserved address, a network inside
    the reserved range (an explicit opening, never a catch-all)."""
    address = embedded_ipv4(address)
    reserved = _reserved_network(address)
    for network in networks:
        if network.version != address.version or address not in network:
            continue
        if reserved is None or network.subnet_of(reserved):  # type: ignore[arg-type]
            return True
    return False


def _reserved_network(address: IPAddress) -> IPNetwork | None:
    return next((r for r in RESERVED_NETWORKS if r.version == address.version and address in r), None)


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form carries to the wire, else the address itself: IPv4-mapped
    (::ffff:127.0.0.1), IPv4-compatible (::127.0.0.1), NAT64 (64:ff9b::7f00:1), 6to4 (2002:7f00:1::)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _parse_address(text: str) -> IPAddress:
    return embedded_ipv4(ipaddress.ip_address(text.split("%", 1)[0]))  # drop an IPv6 zone (fe80::1%eth0)


def resolve_allowed(host: str, port: int | None) -> list[str]:
    """Resolve ``host`` and return its addresses, all of them checked; raise OutboundRefused if any
    is outside the allowed networks (HostNotFound if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise HostNotFound(f"cannot resolve {host}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    networks = allowed_networks()
    for address in addresses:
        parsed = _parse_address(address)
        if not is_allowed_address(parsed, networks):
            shown = address if address == host else f"{host} resolves to {address}, which"
            hint = ""
            if _reserved_network(parsed) is not None:
                hint = "; loopback, link-local and unspecified addresses must be listed there explicitly"
            raise OutboundRefused(f"{shown} is not in the allowed networks ({SETTING_NAME}{hint})")
    return addresses


def check_url(url: str) -> None:
    """Raise OutboundRefused if the URL's host is, or resolves to, an address the console may not reach.

    A host that does not resolve passes: its DNS record may come later, and every scrape checks
    again before it connects.
    """
    host = urlsplit(url).hostname
    if not host:
        return  # not a URL at all: the URL validator says so
    with contextlib.suppress(HostNotFound):
        resolve_allowed(host, None)


# --- the checked connection ------------------------------------------------------------------


class _CheckedConnectionMixin:
    """Connect only to an address resolve_allowed() checked, at the moment of connecting.

    Replaces urllib3's _new_conn (resolve and connect in one call) with: resolve once, check
    every address, connect to the checked addresses in turn. TLS still verifies the certificate
    against the URL's host name.
    """

    _dns_host: str
    host: str
    port: int
    timeout: float | None
    source_address: tuple[str, int] | None
    socket_options: list | None  # type: ignore[type-arg]

    def _new_conn(self) -> socket.socket:
        addresses = resolve_allowed(self._dns_host, self.port)
        last_error: OSError | None = None
        for address in addresses:
            try:
                sock = urllib3_connection.create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except OSError as exc:
                last_error = exc
                continue
            sys.audit("http.client.connect", self, self.host, self.port)
            return sock
        if isinstance(last_error, TimeoutError):
            raise ConnectTimeoutError(self, f"Connection to {self.host} timed out.") from last_error
        raise NewConnectionError(self, f"Failed to establish a new connection: {last_error}") from last_error  # type: ignore[arg-type]


class _CheckedHTTPConnection(_CheckedConnectionMixin, HTTPConnection):
    pass


class _CheckedHTTPSConnection(_CheckedConnectionMixin, HTTPSConnection):
    pass


class _CheckedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


class CheckedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _CheckedHTTPConnectionPool,
            "https": _CheckedHTTPSConnectionPool,
        }


def session() -> requests.Session:
    """A requests session whose connections go only to checked addresses, never through a proxy."""
    session = requests.Session()
    # No proxies from the environment (the check would then see the proxy, not the target) and
    # no credentials from ~/.netrc.
    session.trust_env = False
    session.mount("http://", CheckedAdapter())
    session.mount("https://", CheckedAdapter())
    return session


def validate_url(url: str) -> None:
    """A model-field validator: the URL's host is, or resolves to, only addresses the console may
    reach. On the field, it holds for every form, the admin and the API alike."""
    from django.core.exceptions import ValidationError

    try:
        check_url(url)
    except OutboundRefused as exc:
        raise ValidationError(str(exc), code="outbound_refused") from None
