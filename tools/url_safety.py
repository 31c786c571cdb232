"""SSRF protection for tools that fetch URLs chosen by the model (stdlib only).

``check_url`` refuses anything but http(s) URLs without credentials whose host
resolves only to public addresses. ``resolve_safe`` returns the validated
addresses so the caller connects to exactly what was checked (no DNS rebinding
between check and connect). Numeric host forms (``2130706433``, ``0x7f.1``,
``0177.0.0.1``) are parsed with inet_aton's rules, as getaddrinfo would, and
IPv6 addresses embedding an IPv4 one (mapped, NAT64, 6to4, Teredo) are judged
by the embedded address too. Operators can allow internal networks explicitly
with ``configure_url_safety``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_SCHEMES = frozenset({"http", "https"})

# Cloud metadata names; they resolve to link-local addresses, but refusing the
# name means we never even look them up.
BLOCKED_HOSTNAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)

_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_CLOUD_METADATA = ipaddress.IPv4Address("169.254.169.254")
_RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_ULA = ipaddress.IPv6Network("fc00::/7")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: local-use, embedding not fixed

# inet_aton: 1-4 parts, each decimal, octal (leading 0) or hex (0x); the last
# part fills the remaining bytes.
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")
# A host whose last label looks numeric is an IPv4 address or invalid, never a
# DNS name (the WHATWG URL rule); this stops "1.2.3.256" reaching the resolver.
_NUMERIC_LABEL = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")
_HOSTNAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")

_allow_networks: tuple[IPNetwork, ...] = ()


class UnsafeURLError(ValueError):
    """The URL or host may not be fetched; the message says why."""


def configure_url_safety(allow_networks: Iterable[str]) -> None:
    """Allow these networks (CIDRs or single IPs) despite the rules; an empty iterable resets.

    Raises ValueError on an entry that is not an address or network.
    """
    global _allow_networks
    _allow_networks = tuple(ipaddress.ip_network(n.strip(), strict=False) for n in allow_networks)


def check_url(url: str) -> None:
    """Raise UnsafeURLError unless ``url`` is http(s), has no credentials and resolves only to safe hosts."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - read for its check alone: ValueError unless a number from 0 to 65535
    except ValueError as exc:
        raise UnsafeURLError(f"malformed URL: {exc}") from None
    if parts.scheme not in ALLOWED_SCHEMES:
        raise UnsafeURLError(f"scheme {parts.scheme or '(none)'!r} is not allowed (only http and https)")
    if "@" in parts.netloc:
        raise UnsafeURLError("credentials (user:password@) in URLs are not allowed")
    if not parts.hostname:
        raise UnsafeURLError("URL has no host")
    resolve_safe(parts.hostname)


def resolve_safe(host: str) -> list[str]:
    """The addresses ``host`` resolves to, all validated; raises UnsafeURLError if any is unsafe.

    IP literals (any inet_aton form, IPv6 with or without brackets) are checked
    without DNS; names go through getaddrinfo. Connect only to the returned addresses
    (on the URL's port: which addresses a name has does not depend on it).
    """
    name, literal = _normalize_host(host)
    if literal is not None:
        addresses = [literal]
    elif name == "localhost" or name.endswith(".localhost"):
        addresses = [ipaddress.IPv4Address("127.0.0.1")]  # RFC 6761: never sent to DNS
    else:
        addresses = _getaddrinfo(name)
    for address in addresses:
        problem = _address_problem(address)
        if problem is not None:
            shown = host if str(address) == host or ":" in host else f"{host} ({address})"
            raise UnsafeURLError(f"host {shown} is not allowed: {problem}")
    return [str(a) for a in addresses]


def _normalize_host(host: str) -> tuple[str, IPAddress | None]:
    """Lowercase ASCII form of ``host`` and, for IP literals, the address it denotes."""
    host = host.strip("[]") if host.startswith("[") else host
    if ":" in host:
        try:
            return host, ipaddress.IPv6Address(unquote(host))
        except ValueError:
            raise UnsafeURLError(f"invalid IPv6 address {host!r}") from None
    try:
        name = host.encode("idna").decode("ascii").lower() if not host.isascii() else host.lower()
    except UnicodeError:
        raise UnsafeURLError(f"invalid host name {host!r}") from None
    if name.endswith("."):
        name = name[:-1]
    if not _HOSTNAME.fullmatch(name):
        raise UnsafeURLError(f"invalid host name {host!r}")
    if name in BLOCKED_HOSTNAMES:
        raise UnsafeURLError(f"host {name} is a cloud metadata endpoint")
    if _NUMERIC_LABEL.fullmatch(name.rsplit(".", 1)[-1]):
        address = _parse_ipv4(name)
        if address is None:
            raise UnsafeURLError(f"invalid numeric IPv4 address {host!r}")
        return name, address
    return name, None


def _parse_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """Parse ``text`` the way inet_aton does (``127.1``, ``0x7f000001``, ``0177.0.0.1``), or None."""
    parts = text.split(".")
    if len(parts) > 4 or not all(_IPV4_PART.fullmatch(p) for p in parts):
        return None
    values = [int(p, 16) if p[:2].lower() == "0x" else int(p, 8 if p.startswith("0") else 10) for p in parts]
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (5 - len(values))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (24 - 8 * i)
    return ipaddress.IPv4Address(number)


def _getaddrinfo(name: str) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UnsafeURLError(f"cannot resolve host {name}: {exc}") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    if not addresses:
        raise UnsafeURLError(f"host {name} resolves to no address")
    return addresses


def _address_problem(address: IPAddress) -> str | None:
    """Why ``address`` must not be contacted, or None when it may."""
    if any(address in network for network in _allow_networks if network.version == address.version):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        translated = address.ipv4_mapped or (
            ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in _NAT64 else None
        )
        if translated is not None:  # the packets really go to the IPv4 address
            problem = _address_problem(translated)
            return None if problem is None else f"embeds IPv4 {translated}, which is {problem}"
        tunnelled = [address.sixtofour, *(address.teredo or ())]
        for embedded in filter(None, tunnelled):
            problem = _address_problem(embedded)
            if problem is not None:
                return f"embeds IPv4 {embedded}, which is {problem}"
    return _category(address)


def _category(address: IPAddress) -> str | None:
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "loopback"
    if address == _CLOUD_METADATA:
        return "the cloud metadata endpoint (link-local)"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv4Address):
        if address in _CGNAT:
            return "carrier-grade NAT space (100.64.0.0/10)"
        if any(address in n for n in _RFC1918):
            return "private (RFC 1918)"
    else:
        if address in _ULA:
            return "unique local (fc00::/7)"
        if address.is_site_local:
            return "site-local"
        if address in _NAT64_LOCAL:
            return "local-use NAT64 (64:ff9b:1::/48)"
    if address.is_reserved:
        return "reserved"
    if address.is_private or not address.is_global:
        return "not globally routable"
    return None
