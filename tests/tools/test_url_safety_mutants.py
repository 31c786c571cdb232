"""SSRF rules that ``make mutate`` found unpinned: each test names the mutant of ``tools/url_safety.py`` it kills.
Every case is decided without DNS (a lookup fails the test)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tools.url_safety import UnsafeURLError, check_url, configure_url_safety, resolve_safe


@pytest.fixture(autouse=True)
def _no_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def forbidden(host: object, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"unexpected DNS lookup of {host!r}")

    monkeypatch.setattr(socket, "getaddrinfo", forbidden)
    yield
    configure_url_safety([])


def test_a_bracketed_ipv6_literal_is_read_as_its_address() -> None:
    """Kills _normalize_host's ``host.strip("[]") if (host.startswith("[")) and False``, ``startswith("XX[XX")``
    and ``strip(None)`` (a public ``[v6]`` host would be refused as an invalid address)."""
    assert resolve_safe("[2606:4700:4700::1111]", 443) == ["2606:4700:4700::1111"]
    with pytest.raises(UnsafeURLError, match="loopback"):
        resolve_safe("[::1]", 443)


def test_a_unicode_spelling_of_the_metadata_host_is_still_blocked() -> None:
    """Kills _normalize_host's ``.decode("ascii").upper()`` (a host that IDNA-maps to the metadata endpoint's
    name, here in fullwidth letters, would escape the blocklist and go to DNS)."""
    with pytest.raises(UnsafeURLError, match="metadata"):
        resolve_safe("ｍetadata.google.internal", 80)


def test_octets_of_255_are_valid_and_of_256_are_not() -> None:
    """Kills _parse_ipv4's ``v >= 0xFF`` (a public address with a 255 octet refused) and ``v > 256`` (``1.256.1.1``
    accepted, its 256 carried into the octet before it: ``127.256.0.1`` would read as 128.0.0.1)."""
    assert resolve_safe("8.8.255.1", 80) == ["8.8.255.1"]
    for invalid in ("1.256.1.1", "127.256.0.1"):
        with pytest.raises(UnsafeURLError, match="invalid numeric IPv4"):
            resolve_safe(invalid, 80)


def test_an_out_of_range_port_is_a_malformed_url() -> None:
    """Kills check_url's ``port = None`` (``parts.port`` is what raises on ``:99999``)."""
    with pytest.raises(UnsafeURLError, match="malformed URL"):
        check_url("http://8.8.8.8:99999/")


def test_an_allowlisted_network_may_be_written_with_host_bits() -> None:
    """Kills configure_url_safety's ``strict=True`` and ``strict`` left out (``10.1.2.3/8`` would be refused)."""
    configure_url_safety(["10.1.2.3/8"])
    assert resolve_safe("10.9.9.9", 80) == ["10.9.9.9"]
