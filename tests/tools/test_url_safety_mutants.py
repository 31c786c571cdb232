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
    assert resolve_safe("[2606:4700:4700::1111]") == ["2606:4700:4700::1111"]
    with pytest.raises(UnsafeURLError, match="loopback"):
        resolve_safe("[::1]")


def test_a_unicode_spelling_of_the_metadata_host_is_still_blocked() -> None:
    """Kills _normalize_host's ``.decode("ascii").upper()`` (a host that IDNA-maps to the metadata endpoint's
    name, here in fullwidth letters, would escape the blocklist and go to DNS)."""
    with pytest.raises(UnsafeURLError, match="metadata"):
        resolve_safe("ｍetadata.google.internal")


def test_octets_of_255_are_valid_and_of_256_are_not() -> None:
    """Kills _parse_ipv4's ``v >= 0xFF`` (a public address with a 255 octet refused) and ``v > 256`` (``1.256.1.1``
    accepted, its 256 carried into the octet before it: ``127.256.0.1`` would read as 128.0.0.1)."""
    assert resolve_safe("8.8.255.1") == ["8.8.255.1"]
    for invalid in ("1.256.1.1", "127.256.0.1"):
        with pytest.raises(UnsafeURLError, match="invalid numeric IPv4"):
            resolve_safe(invalid)


def test_an_out_of_range_port_is_a_malformed_url() -> None:
    """check_url reads ``parts.port`` for this check alone (it raises on ``:99999``): nothing else would notice
    the read going."""
    with pytest.raises(UnsafeURLError, match="malformed URL"):
        check_url("http://8.8.8.8:99999/")


def test_an_allowlisted_network_may_be_written_with_host_bits() -> None:
    """Kills configure_url_safety's ``strict=True`` and ``strict`` left out (``10.1.2.3/8`` would be refused)."""
    configure_url_safety(["10.1.2.3/8"])
    assert resolve_safe("10.9.9.9") == ["10.9.9.9"]


# -- refusals in words: the model is told why a URL was refused, and says so to the user ------------------------

@pytest.mark.parametrize(("url", "message"), [
    ("http://0.0.0.0/", "host 0.0.0.0 is not allowed: the unspecified address"),
    ("http://127.0.0.1/", "host 127.0.0.1 is not allowed: loopback"),
    ("http://127.1/", "host 127.1 (127.0.0.1) is not allowed: loopback"),
    ("http://localhost:8080/", "host localhost (127.0.0.1) is not allowed: loopback"),
    ("http://169.254.169.254/", "host 169.254.169.254 is not allowed: the cloud metadata endpoint (link-local)"),
    ("http://169.254.1.1/", "host 169.254.1.1 is not allowed: link-local"),
    ("http://224.0.0.1/", "host 224.0.0.1 is not allowed: multicast"),
    ("http://100.64.0.1/", "host 100.64.0.1 is not allowed: carrier-grade NAT space (100.64.0.0/10)"),
    ("http://10.1.2.3/", "host 10.1.2.3 is not allowed: private (RFC 1918)"),
    ("http://[fc00:0::1]/", "host fc00:0::1 is not allowed: unique local (fc00::/7)"),
    ("http://[fec0::1]/", "host fec0::1 is not allowed: site-local"),
    ("http://[64:ff9b:1::1]/", "host 64:ff9b:1::1 is not allowed: local-use NAT64 (64:ff9b:1::/48)"),
    ("http://240.0.0.1/", "host 240.0.0.1 is not allowed: reserved"),
    ("http://192.0.2.1/", "host 192.0.2.1 is not allowed: not globally routable"),
    ("ftp://example.com/", "scheme 'ftp' is not allowed (only http and https)"),
    ("//example.com/x", "scheme '(none)' is not allowed (only http and https)"),
    ("http://user:pw@example.com/", "credentials (user:password@) in URLs are not allowed"),
    ("http:///path", "URL has no host"),
])
def test_a_refused_url_says_why_in_words(url: str, message: str) -> None:
    """The refusal names the host as written (with the address it stands for when that differs, never for an
    IPv6 literal) and the rule it breaks.

    Kills _category's wording mutants (each reason's text, ``"XX..XX"`` or its case changed), check_url's
    (the scheme's ``'(none)'``, the credentials and no-host messages) and resolve_safe's ``shown`` mutants
    (``and False``, ``str(address) == host and ":" in host``, ``str(None)``, ``"XX:XX" in host``)."""
    with pytest.raises(UnsafeURLError) as refused:
        check_url(url)
    assert str(refused.value) == message


@pytest.mark.parametrize(("host", "message"), [
    ("fe80::zz", "invalid IPv6 address 'fe80::zz'"),
    pytest.param("ü" * 70, f"invalid host name {'ü' * 70!r}", id="label-too-long"),
])
def test_a_host_that_is_not_one_says_so(host: str, message: str) -> None:
    """Kills _normalize_host's ``UnsafeURLError(None)`` for an IPv6 literal that does not parse and for a name
    IDNA cannot encode (a label over 63 characters): the refusal would read "None"."""
    with pytest.raises(UnsafeURLError) as refused:
        resolve_safe(host)
    assert str(refused.value) == message


def test_a_name_that_resolves_to_nothing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills _getaddrinfo's ``UnsafeURLError(None)`` (a resolver answering with no address)."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [])
    with pytest.raises(UnsafeURLError) as refused:
        resolve_safe("empty.example")
    assert str(refused.value) == "host empty.example resolves to no address"
