"""Requests the console makes to addresses people configured (scrape targets, notification
channels): they must not become a way to probe the console's own network.

1. Closed by default: only addresses in ``OUTBOUND_ALLOWED_NETWORKS`` are reached, and in
   production the setting lists nothing until an administrator lists the exporters' and the
   chat and paging services' networks (the embedded demo lists loopback, where its own
   exporters listen).
2. A broad entry such as ``0.0.0.0/0`` opens the public internet only. Three kinds of address
   open only to an entry inside them, never to a catch-all:
   - reserved ranges: loopback, link-local (the cloud metadata service), unspecified, and the
     metadata addresses outside link-local (``127.0.0.0/8`` or ``169.254.169.254/32`` opens them);
   - private ranges: RFC 1918, shared address space (100.64.0.0/10) and IPv6 ULA (fc00::/7)
     (``10.20.0.0/16`` opens that part of 10.0.0.0/8; ``0.0.0.0/0`` opens none of it);
   - the console's own addresses, on any of its interfaces or its hostname's (own_addresses):
     only an entry of exactly that address (``10.20.0.5/32``) opens one; a network that merely
     contains it, however narrow, does not, since listing the exporters' subnet must not also
     hand out the console's host. Loopback is the reserved rule's, so ``127.0.0.0/8`` opens it.
3. A URL is checked when it is saved (every address its host resolves to) and again when it is
   used, at the moment of connecting: the host is resolved once, every address is checked, and
   the socket connects to a checked address. DNS that changes between the check and the
   connection (rebinding) cannot slip another address in.
4. Callers do not follow redirects and never quote what the far end answered; what a failure
   shows to people tells no port, protocol or timing apart (fleet.ingest.scraping).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
import time
from collections.abc import Collection, Iterable
from pathlib import Path
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

# The default when OUTBOUND_ALLOWED_NETWORKS is not configured: nothing (settings.py gives the
# embedded demo loopback).
DEFAULT_ALLOWED_NETWORKS: list[str] = []
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
# Internal networks: opened only by an entry within them, so that the 0.0.0.0/0 a webhook to a
# SaaS chat service needs does not open the exporters' networks and everything beside them.
PRIVATE_NETWORKS = [
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
]
SETTING_NAME = "GOODPUT_OUTBOUND_ALLOWED_NETWORKS"
# Interfaces change rarely (DHCP, a new container network); reading them again every half
# minute keeps a scrape from reading /proc on every connection.
OWN_ADDRESSES_TTL_SECONDS = 30.0


class OutboundRefused(Exception):
    """An address the console will not reach; the message says why, for forms, the API and pages."""


class HostNotFound(OutboundRefused):
    """The URL's host does not resolve (yet): accepted when a URL is saved, a failure when used."""


def allowed_networks() -> list[IPNetwork]:
    """The networks the console may reach, from OUTBOUND_ALLOWED_NETWORKS (CIDR strings)."""
    configured = getattr(settings, "OUTBOUND_ALLOWED_NETWORKS", DEFAULT_ALLOWED_NETWORKS)
    return [ipaddress.ip_network(str(entry), strict=False) for entry in configured]


def is_allowed_address(
    address: IPAddress, networks: Iterable[IPNetwork], *, own: Collection[IPAddress] = frozenset()
) -> bool:
    """True if some allowed network holds the address; for a reserved or private address, a
    network inside that range; for one of ``own`` (the console's addresses), exactly that address."""
    address = embedded_ipv4(address)
    protected = _protected_range(address, own)
    for network in networks:
        if network.version != address.version or address not in network:
            continue
        if protected is None or network.subnet_of(protected[0]):  # type: ignore[arg-type]
            return True
    return False


def _protected_range(address: IPAddress, own: Collection[IPAddress]) -> tuple[IPNetwork, str] | None:
    """The range a broad entry does not open for this address, and its kind (reserved, own or
    private); None for an address that any entry holding it opens. Reserved first: loopback is
    the console's own too, and 127.0.0.0/8 opens it."""
    if reserved := _within(RESERVED_NETWORKS, address):
        return reserved, "reserved"
    if address in own:
        return ipaddress.ip_network(address), "own"
    if private := _within(PRIVATE_NETWORKS, address):
        return private, "private"
    return None


def _within(ranges: list[IPNetwork], address: IPAddress) -> IPNetwork | None:
    return next((r for r in ranges if r.version == address.version and address in r), None)


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


# --- the console's own addresses -----------------------------------------------------------------

_own_cache: tuple[float, frozenset[IPAddress]] | None = None


def own_addresses() -> frozenset[IPAddress]:
    """The addresses of the console's own host: every interface's (Linux: the kernel's local
    routing table and its IPv6 address list) and what its hostname resolves to (elsewhere, that
    alone). Read again after OWN_ADDRESSES_TTL_SECONDS."""
    global _own_cache
    now = time.monotonic()
    if _own_cache is None or now - _own_cache[0] > OWN_ADDRESSES_TTL_SECONDS:
        _own_cache = (now, frozenset(_read_own_addresses()))
    return _own_cache[1]


def _read_own_addresses() -> set[IPAddress]:
    found: set[str] = set()
    # IPv4: each local address is a leaf ("|-- 10.20.0.5") whose route reads "/32 host LOCAL".
    with contextlib.suppress(OSError):
        leaf = ""
        for line in Path("/proc/net/fib_trie").read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["|--"] and len(parts) > 1:
                leaf = parts[1]
            elif parts[:3] == ["/32", "host", "LOCAL"] and leaf:
                found.add(leaf)
    # IPv6: one line per address, the address first as 32 hex digits.
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            if line.split() and len(digits := line.split()[0]) == 32:
                found.add(str(ipaddress.IPv6Address(int(digits, 16))))
    with contextlib.suppress(OSError, UnicodeError):
        found.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    addresses = set()
    for text in found:
        with contextlib.suppress(ValueError):
            addresses.add(_parse_address(text))
    return addresses


# --- checking a host -------------------------------------------------------------------------------


def resolve_allowed(host: str, port: int | None) -> list[str]:
    """Resolve ``host`` and return its addresses, all of them checked; raise OutboundRefused if any
    is outside the allowed networks (HostNotFound if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise HostNotFound(f"cannot resolve {host}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    networks = allowed_networks()
    own = own_addresses()
    for address in addresses:
        parsed = _parse_address(address)
        if not is_allowed_address(parsed, networks, own=own):
            shown = address if address == host else f"{host} resolves to {address}, which"
            hint = _hint(parsed, networks, own)
            raise OutboundRefused(f"{shown} is not in the allowed networks ({SETTING_NAME}; {hint})")
    return addresses


def _hint(address: IPAddress, networks: list[IPNetwork], own: Collection[IPAddress]) -> str:
    """What an administrator would change: list a network, or list this address more narrowly."""
    protected, kind = _protected_range(address, own) or (None, "")
    if kind == "reserved":
        return "loopback, link-local and unspecified addresses must be listed there explicitly"
    if kind == "own":
        return f"it is the console's own address, which only an entry of exactly {protected} opens"
    if not networks:
        return "it lists no network: an administrator lists the exporters' networks there"
    if kind == "private" and any(n.version == address.version and address in n for n in networks):
        return f"a private range opens only to an entry within {protected}, never to a broader one"
    return "an administrator can list its network there"


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
