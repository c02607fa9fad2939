"""Refuse callbacks to addresses inside the service's own networks (SSRF).

The check runs on the resolved address at connect time, and the connection
goes to that very address (DNS rebinding cannot swap it in between). Networks
in WEBHOOK_ALLOWED_NETWORKS are exempt (a receiver on the same host, a lab).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
CGNAT = ipaddress.ip_network("100.64.0.0/10")


class RefusedAddress(ValueError):
    """The callback URL points somewhere gpusched must not call."""


class HostNotResolved(OSError):
    """The callback's host name did not resolve; usually a passing DNS failure."""


def allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(cidr, strict=False) for cidr in settings.WEBHOOK_ALLOWED_NETWORKS]


def refusal(address: IPAddress) -> str | None:
    """Why `address` is refused, or None when it may be called."""
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if any(address in network for network in allowed_networks()):
        return None
    v6 = isinstance(address, ipaddress.IPv6Address)
    for label, refused in (
        ("loopback", address.is_loopback),
        ("private", address.is_private),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("unspecified", address.is_unspecified),
        ("carrier-grade NAT", not v6 and address in CGNAT),
        # `is_global` misses these on some Pythons (3.11 here): 6to4 wraps an
        # IPv4 address (2002:7f00:1:: is 127.0.0.1), fec0::/10 is site-local.
        ("6to4", isinstance(address, ipaddress.IPv6Address) and address.sixtofour is not None),
        ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
        ("non-global", not address.is_global),
    ):
        if refused:
            return f"{address} is a {label} address"
    return None


def check_literal(url: str) -> None:
    """At submission: refuse a URL whose host is an IP literal gpusched must not call."""
    host = urlsplit(url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: checked when it is resolved, at delivery
    reason = refusal(address)
    if reason:
        raise RefusedAddress(f"{reason}; callbacks there are refused")


def resolve_allowed(host: str, port: int) -> str:
    """The first address of `host` that may be called; RefusedAddress if none,
    HostNotResolved when the name does not resolve (worth a retry)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise HostNotResolved(f"{host} does not resolve: {exc}") from exc
    except UnicodeError as exc:  # not a valid host name at all: no retry helps
        raise RefusedAddress(f"{host!r} is not a valid host name: {exc}") from exc
    reasons = []
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        reason = refusal(address)
        if reason is None:
            return str(address)
        reasons.append(reason)
    raise RefusedAddress(f"{host} resolves only to refused addresses ({'; '.join(reasons)})")
