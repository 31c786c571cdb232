"""SSRF rules of tools.url_safety: every case is decided without network access."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.url_safety import UnsafeURLError, check_url, configure_url_safety, resolve_safe

FakeDNS = Callable[[dict[str, list[str]]], list[str]]


@pytest.fixture(autouse=True)
def _no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any real lookup fails the test (AssertionError is not caught by url_safety)."""

    def forbidden(host: object, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"unexpected DNS lookup of {host!r}")

    monkeypatch.setattr(socket, "getaddrinfo", forbidden)


@pytest.fixture(autouse=True)
def _reset_allowlist() -> Iterator[None]:
    yield
    configure_url_safety([])


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    """Install a name -> addresses table as getaddrinfo; returns the list of names looked up."""

    def install(table: dict[str, list[str]]) -> list[str]:
        looked_up: list[str] = []

        def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> list[tuple]:
            looked_up.append(host)
            if host not in table:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            infos = []
            for address in table[host]:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sockaddr = (address, port, 0, 0) if ":" in address else (address, port)
                infos += [(family, socket.SOCK_STREAM, 6, "", sockaddr)] * 2  # duplicates, as real DNS gives
            return infos

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return looked_up

    return install


DENIED = [
    ("http://127.0.0.1/", "loopback"),
    ("http://localhost/", "loopback"),
    ("http://app.localhost:8080/", "loopback"),
    ("http://0x7f000001/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://0177.0.0.1/", "loopback"),
    ("http://127.1/", "loopback"),
    ("http://127.0.0.1./", "loopback"),
    ("http://127。0。0。1/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "metadata"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://169.254.1.1/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://10.0.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://[::]/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://[fd00::1]/", "unique local"),
    ("http://[fd00:ec2::254]/", "unique local"),
    ("http://[fec0::1]/", "site-local"),
    ("http://[64:ff9b::7f00:1]/", "embeds IPv4 127.0.0.1"),
    ("http://[64:ff9b:1::1]/", "NAT64"),
    ("http://[2002:a00:1::1]/", "embeds IPv4 10.0.0.1"),  # 6to4
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "embeds IPv4 127.0.0.1"),  # Teredo client
    ("http://metadata.google.internal/", "metadata"),
    ("http://METADATA.Google.Internal./computeMetadata/v1/", "metadata"),
    ("http://metadata/", "metadata"),
    ("http://1.2.3.256/", "invalid numeric"),
    ("http://0x7f.1.2.3.4/", "invalid numeric"),
    ("http://1.2.3.4.0/", "invalid numeric"),
    ("http://127.0.0.1 x/", "invalid host"),
    ("http://[::1/", "malformed"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("ftp://x/", "scheme 'ftp'"),
    ("gopher://127.0.0.1:70/", "scheme"),
    ("//example.com/", "scheme"),
    ("http:///path", "no host"),
    ("http://user:pass@example.com/", "credentials"),
    ("http://user@example.com/", "credentials"),
]


@pytest.mark.parametrize(("url", "reason"), DENIED)
def test_denied_without_any_lookup(url: str, reason: str) -> None:
    with pytest.raises(UnsafeURLError) as info:
        check_url(url)
    assert reason.lower() in str(info.value).lower()


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.216.34/",
        "https://93.184.216.34:8443/a?b=c",
        "http://1.1.1.1/",
        "http://[2606:4700:4700::1111]/",
        "http://[::ffff:93.184.216.34]/",  # mapped public address
        "http://[64:ff9b::5db8:d822]/",  # NAT64 of 93.184.216.34
    ],
)
def test_public_literals_allowed_without_lookup(url: str) -> None:
    check_url(url)


def test_numeric_forms_resolve_to_the_address_inet_aton_gives() -> None:
    for host in ("0x5db8d822", "1572395042", "93.184.55330", "0135.0270.0330.042"):
        assert resolve_safe(host) == ["93.184.216.34"]


def test_names_are_resolved_and_every_address_checked(fake_dns: FakeDNS) -> None:
    looked_up = fake_dns(
        {
            "public.test": ["93.184.216.34", "2606:2800:220:1::1"],
            "mixed.test": ["93.184.216.34", "10.0.0.5"],
            "mapped.test": ["::ffff:127.0.0.1"],
        }
    )
    assert resolve_safe("public.test") == ["93.184.216.34", "2606:2800:220:1::1"]
    check_url("https://PUBLIC.test/page")
    with pytest.raises(UnsafeURLError, match=r"mixed\.test \(10\.0\.0\.5\).*private"):
        check_url("http://mixed.test/")
    with pytest.raises(UnsafeURLError, match="loopback"):
        check_url("http://mapped.test/")
    with pytest.raises(UnsafeURLError, match=r"cannot resolve host nowhere\.test"):
        check_url("http://nowhere.test/")
    assert looked_up == ["public.test", "public.test", "mixed.test", "mapped.test", "nowhere.test"]


def test_allowlist_admits_only_the_listed_networks(fake_dns: FakeDNS) -> None:
    fake_dns({"wiki.corp": ["10.1.2.3"]})
    configure_url_safety(["127.0.0.1", "10.0.0.0/8"])
    check_url("http://127.0.0.1:8080/x")
    check_url("http://localhost:8080/x")
    check_url("http://[::ffff:127.0.0.1]/")
    check_url("http://2130706433/")
    assert resolve_safe("wiki.corp") == ["10.1.2.3"]
    for url in ("http://127.0.0.2/", "http://192.168.1.1/", "http://[::1]/", "http://169.254.169.254/"):
        with pytest.raises(UnsafeURLError):
            check_url(url)
    configure_url_safety([])
    with pytest.raises(UnsafeURLError):
        check_url("http://127.0.0.1:8080/x")


def test_allowlist_does_not_admit_metadata_names_or_bad_schemes() -> None:
    configure_url_safety(["0.0.0.0/0", "::/0"])
    with pytest.raises(UnsafeURLError, match="metadata"):
        check_url("http://metadata.google.internal/")
    with pytest.raises(UnsafeURLError, match="scheme"):
        check_url("file:///etc/passwd")


def test_allowlist_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        configure_url_safety(["not-a-network"])


# -- properties ------------------------------------------------------------

_BAD_V4_NETWORKS = [
    ipaddress.IPv4Network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")
]


def _encodings(number: int) -> list[str]:
    octets = ipaddress.IPv4Address(number).packed
    return [
        ".".join(str(o) for o in octets),
        str(number),
        hex(number),
        hex(number).upper().replace("0X", "0x"),
        ".".join(f"0{o:o}" for o in octets),
        ".".join(hex(o) for o in octets),
        f"{octets[0]}.{octets[1]}.{int.from_bytes(octets[2:], 'big')}",
        f"{octets[0]}.{int.from_bytes(octets[1:], 'big')}",
        f"[::ffff:{ipaddress.IPv4Address(number)}]",
    ]


_bad_v4 = st.sampled_from(_BAD_V4_NETWORKS).flatmap(
    lambda n: st.integers(int(n.network_address), int(n.broadcast_address))
)
_no_fixture_check = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)


@_no_fixture_check
@given(number=_bad_v4, form=st.integers(0, 8))
def test_internal_ipv4_refused_in_every_encoding(number: int, form: int) -> None:
    with pytest.raises(UnsafeURLError):
        check_url(f"http://{_encodings(number)[form]}/")


def _verdict(url: str) -> str:
    try:
        check_url(url)
    except UnsafeURLError:
        return "refused"
    return "allowed"


@_no_fixture_check
@given(number=st.integers(0, 2**32 - 1))
def test_verdict_does_not_depend_on_encoding(number: int) -> None:
    verdicts = {_verdict(f"http://{host}/") for host in _encodings(number)}
    assert len(verdicts) == 1


def _part(value: int, style: int) -> str:
    return [str(value), f"0{value:o}", f"0x{value:x}", f"0X{value:X}", f"0{value}"][style]


_numeric_host = st.lists(
    st.one_of(
        st.builds(_part, st.one_of(st.integers(0, 300), st.integers(0, 2**33)), st.integers(0, 4)),
        st.sampled_from(["08", "09", "0x", "0"]),
    ),
    min_size=1,
    max_size=5,
).map(".".join)


@_no_fixture_check
@given(host=_numeric_host)
def test_numeric_hosts_parse_exactly_like_inet_aton(host: str) -> None:
    configure_url_safety(["0.0.0.0/0"])  # isolate parsing from policy
    try:
        expected = socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        with pytest.raises(UnsafeURLError, match="invalid numeric"):
            resolve_safe(host)
    else:
        assert resolve_safe(host) == [expected]
