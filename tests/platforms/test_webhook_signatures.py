"""Webhook signature schemes: sign/verify round trips, tampering, timestamps, key rotation, headers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from platforms.webhook_signatures import SCHEMES as ALL_SCHEMES
from platforms.webhook_signatures import (
    SIGNERS,
    VERIFIERS,
    Delivery,
    SignatureError,
    sign,
    standard_webhooks_key,
    verify,
)

NOW = 1_700_000_000.0
BODY = b'{"event": "push", "ref": "refs/heads/main"}'
OLD_SECRET = "whsec_" + base64.b64encode(b"old-key-0123456789abcdef").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"new-key-0123456789abcdef").decode()
# Header carrying the signature and (where signed) the timestamp, per scheme.
SIGNATURE_HEADER = {
    "github": "X-Hub-Signature-256",
    "standard-webhooks": "webhook-signature",
    "hmac-sha256": "X-Webhook-Signature",
    "hmac-sha256-v2": "X-Webhook-Signature-V2",
}
TIMESTAMP_HEADER = {"standard-webhooks": "webhook-timestamp", "hmac-sha256": "X-Webhook-Timestamp",
                    "hmac-sha256-v2": "X-Webhook-Timestamp"}
TIMED = sorted(TIMESTAMP_HEADER)
SCHEMES = tuple(SIGNATURE_HEADER)  # gitlab (a token, not a signature): tests/platforms/test_webhook_senders.py

schemes = pytest.mark.parametrize("scheme", SCHEMES)


def _reason(scheme: str, body: bytes, headers: dict[str, str], secrets: list[str] | None = None) -> str:
    with pytest.raises(SignatureError) as info:
        verify(scheme, secrets or [NEW_SECRET], body, headers, now=NOW)
    return info.value.reason


def test_registries_cover_the_same_schemes() -> None:
    assert set(VERIFIERS) == set(SIGNERS) == set(ALL_SCHEMES) == {
        "github", "standard-webhooks", "hmac-sha256", "hmac-sha256-v2", "gitlab"}


@schemes
def test_sign_then_verify_returns_the_delivery_id(scheme: str) -> None:
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="delivery-1")
    assert verify(scheme, [NEW_SECRET], BODY, headers, now=NOW).id == "delivery-1"


@schemes
def test_headers_are_case_insensitive(scheme: str) -> None:
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="d")
    for variant in ({k.upper(): v for k, v in headers.items()}, {k.lower(): v for k, v in headers.items()}):
        assert verify(scheme, [NEW_SECRET], BODY, variant, now=NOW).id == "d"


def test_generated_delivery_ids() -> None:
    github = sign("github", NEW_SECRET, BODY)
    assert verify("github", NEW_SECRET, BODY, github).id == github["X-GitHub-Delivery"]
    standard = sign("standard-webhooks", NEW_SECRET, BODY, now=NOW)
    assert standard["webhook-id"].startswith("msg_")
    first, second = sign("hmac-sha256", NEW_SECRET, BODY, now=NOW), sign("hmac-sha256", NEW_SECRET, BODY, now=NOW)
    assert first["X-Webhook-Id"] != second["X-Webhook-Id"]
    assert verify("hmac-sha256", NEW_SECRET, BODY, first, now=NOW).key == first["X-Webhook-Id"]


def test_standard_webhooks_published_test_vector() -> None:
    headers = sign(
        "standard-webhooks",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        b'{"test": 2432232314}',
        now=1614265330,
        delivery_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
    )
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_standard_webhooks_accepts_any_listed_signature_and_raw_secrets() -> None:
    headers = sign("standard-webhooks", NEW_SECRET, BODY, now=NOW, delivery_id="m")
    headers["webhook-signature"] = "v1,bm9wZQ== v1a,ignored " + headers["webhook-signature"]
    assert verify("standard-webhooks", [NEW_SECRET], BODY, headers, now=NOW).id == "m"
    raw = sign("standard-webhooks", "plain-text-secret", BODY, now=NOW, delivery_id="r")
    assert verify("standard-webhooks", ["plain-text-secret"], BODY, raw, now=NOW).id == "r"


def test_hmac_sha256_accepts_optional_prefix() -> None:
    headers = sign("hmac-sha256", NEW_SECRET, BODY, now=NOW, delivery_id="p")
    headers["X-Webhook-Signature"] = "sha256=" + headers["X-Webhook-Signature"]
    assert verify("hmac-sha256", [NEW_SECRET], BODY, headers, now=NOW).id == "p"


# --- tampering -----------------------------------------------------------------------------------------


def _mutate(value: bytes, index: int, delta: int) -> bytes:
    i = index % len(value)
    return value[:i] + bytes([(value[i] + delta) % 256]) + value[i + 1 :]


@settings(max_examples=40)
@given(
    scheme=st.sampled_from(SCHEMES),
    body=st.binary(min_size=1, max_size=64),
    index=st.integers(min_value=0),
    delta=st.integers(1, 255),
)
def test_any_one_byte_body_change_fails(scheme: str, body: bytes, index: int, delta: int) -> None:
    headers = sign(scheme, NEW_SECRET, body, now=NOW, delivery_id="d")
    assert verify(scheme, [NEW_SECRET], body, headers, now=NOW).id == "d"
    assert _reason(scheme, _mutate(body, index, delta), headers) == "signature mismatch"


def _as_aiohttp_reads(raw: bytes) -> str:
    """Header bytes as aiohttp hands them over: UTF-8, bytes that are not as lone surrogates."""
    return raw.decode("utf-8", "surrogateescape")


def _as_latin1(raw: bytes) -> str:
    """Header bytes as WSGI servers hand them over (PEP 3333)."""
    return raw.decode("latin-1")


def _mutate_header(headers: dict[str, str], name: str, index: int, delta: int,
                   read: Callable[[bytes], str]) -> dict[str, str]:
    raw = headers[name].encode()
    return {**headers, name: read(_mutate(raw, index, delta))}


@settings(max_examples=60)
@given(scheme=st.sampled_from(SCHEMES), index=st.integers(min_value=0), delta=st.integers(1, 255))
@example(scheme="standard-webhooks", index=10, delta=128)  # a byte that is not UTF-8 inside the signature
def test_any_one_byte_signature_change_fails(scheme: str, index: int, delta: int) -> None:
    """Refused as a signature mismatch or a malformed signature header, never accepted, never another error.

    Fails on the mutant ``s.encode("utf-8")`` for ``s.encode("utf-8", "surrogateescape")`` in ``_utf8`` (the
    example: UnicodeEncodeError instead of a refusal)."""
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="d")
    name = SIGNATURE_HEADER[scheme]
    reason = _reason(scheme, BODY, _mutate_header(headers, name, index, delta, _as_aiohttp_reads))
    assert reason in ("signature mismatch", f"malformed header {name}")


_HEX = "0123456789abcdefABCDEF"
_PRINTABLE = "".join(map(chr, range(0x21, 0x7F)))  # a Standard Webhooks signature is all after "v1,"
# Per scheme: what precedes the signature in its header, and the characters that keep the header well formed.
_DIGEST = {"github": ("sha256=", _HEX), "hmac-sha256": ("", _HEX), "hmac-sha256-v2": ("", _HEX),
           "standard-webhooks": ("v1,", _PRINTABLE)}


@settings(max_examples=80)
@given(scheme=st.sampled_from(SCHEMES), position=st.integers(min_value=0),
       char=st.characters(min_codepoint=0x21, max_codepoint=0x7E))
@example(scheme="standard-webhooks", position=7, char=",")
def test_a_changed_signature_character_is_a_mismatch(scheme: str, position: int, char: str) -> None:
    """One character of the signature replaced by another that keeps the header well formed: exactly a mismatch.

    Fails on the mutant ``entry.rpartition(",")`` for ``entry.partition(",")`` in ``verify_standard_webhooks``
    (the example: a comma inside the signature makes the header "malformed")."""
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="d")
    name = SIGNATURE_HEADER[scheme]
    prefix, alphabet = _DIGEST[scheme]
    value = headers[name]
    i = len(prefix) + position % (len(value) - len(prefix))
    if char not in alphabet:
        char = alphabet[ord(char) % len(alphabet)]
    if char == value[i]:
        char = alphabet[(alphabet.index(char) + 1) % len(alphabet)]
    changed = {**headers, name: value[:i] + char + value[i + 1:]}
    assert _reason(scheme, BODY, changed) == "signature mismatch"


def _timestamp_reason(value: str) -> str:
    """What a changed timestamp must be refused for (the signature covers it: within the tolerance, a mismatch)."""
    if not (value.isascii() and value.isdigit()):
        return "timestamp not numeric"
    if int(value) < NOW - 300:
        return "timestamp too old"
    return "timestamp in the future" if int(value) > NOW + 300 else "signature mismatch"


@settings(max_examples=60)
@given(scheme=st.sampled_from(TIMED), index=st.integers(min_value=0), delta=st.integers(1, 255),
       read=st.sampled_from([_as_aiohttp_reads, _as_latin1]))
@example(scheme="hmac-sha256", index=0, delta=0x81, read=_as_latin1)  # "1" -> "\xb2", a superscript two
def test_any_one_byte_timestamp_change_fails(scheme: str, index: int, delta: int,
                                             read: Callable[[bytes], str]) -> None:
    """Refused for exactly the reason the changed value calls for.

    Fails on the mutant ``if not raw.isdigit():`` for ``if not (raw.isascii() and raw.isdigit()):`` in
    ``_check_timestamp`` (the example: "timestamp in the future" for a non-ASCII digit)."""
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="d")
    changed = _mutate_header(headers, TIMESTAMP_HEADER[scheme], index, delta, read)
    assert _reason(scheme, BODY, changed) == _timestamp_reason(changed[TIMESTAMP_HEADER[scheme]])


def test_changing_a_timestamp_within_tolerance_is_a_mismatch() -> None:
    for scheme in TIMED:
        headers = sign(scheme, NEW_SECRET, BODY, now=NOW)
        headers[TIMESTAMP_HEADER[scheme]] = str(int(NOW) + 1)
        assert _reason(scheme, BODY, headers) == "signature mismatch"


def test_standard_webhooks_signs_the_id() -> None:
    headers = sign("standard-webhooks", NEW_SECRET, BODY, now=NOW, delivery_id="msg_1")
    assert _reason("standard-webhooks", BODY, {**headers, "webhook-id": "msg_2"}) == "signature mismatch"


@schemes
def test_reserialized_json_fails(scheme: str) -> None:
    body = json.dumps({"a": 1, "b": [1, 2]}).encode()
    headers = sign(scheme, NEW_SECRET, body, now=NOW)
    compact = json.dumps(json.loads(body), separators=(",", ":")).encode()
    assert compact != body and json.loads(compact) == json.loads(body)
    assert _reason(scheme, compact, headers) == "signature mismatch"


@schemes
def test_non_utf8_body_is_verified_over_raw_bytes(scheme: str) -> None:
    body = b"\xff\xfe\x00binary\x80payload"
    headers = sign(scheme, NEW_SECRET, body, now=NOW, delivery_id="bin")
    assert verify(scheme, [NEW_SECRET], body, headers, now=NOW).id == "bin"
    assert _reason(scheme, body.replace(b"\xff", b"\xfd"), headers) == "signature mismatch"


# --- timestamps ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", TIMED)
def test_timestamp_tolerance(scheme: str) -> None:
    for skew in (-300, 300):
        headers = sign(scheme, NEW_SECRET, BODY, now=NOW + skew)
        verify(scheme, [NEW_SECRET], BODY, headers, now=NOW)
    assert _reason(scheme, BODY, sign(scheme, NEW_SECRET, BODY, now=NOW - 301)) == "timestamp too old"
    assert _reason(scheme, BODY, sign(scheme, NEW_SECRET, BODY, now=NOW + 301)) == "timestamp in the future"
    stale = sign(scheme, NEW_SECRET, BODY, now=NOW - 3600)
    assert verify(scheme, [NEW_SECRET], BODY, stale, now=NOW, tolerance=7200)


@pytest.mark.parametrize("scheme", TIMED)
@pytest.mark.parametrize("value", ["", "abc", "1.5", "-1", " 1700000000", "１７００"])
def test_non_numeric_timestamp(scheme: str, value: str) -> None:
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW)
    headers[TIMESTAMP_HEADER[scheme]] = value
    expected = f"missing header {TIMESTAMP_HEADER[scheme]}" if not value else "timestamp not numeric"
    assert _reason(scheme, BODY, headers) == expected


def test_github_ignores_time() -> None:
    headers = sign("github", NEW_SECRET, BODY, delivery_id="g")
    assert verify("github", [NEW_SECRET], BODY, headers, now=0.0).id == "g"


# --- key rotation --------------------------------------------------------------------------------------


@schemes
def test_rotated_secrets(scheme: str) -> None:
    old = sign(scheme, OLD_SECRET, BODY, now=NOW, delivery_id="old")
    new = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="new")
    assert verify(scheme, [NEW_SECRET, OLD_SECRET], BODY, old, now=NOW).id == "old"
    assert verify(scheme, [NEW_SECRET, OLD_SECRET], BODY, new, now=NOW).id == "new"
    assert verify(scheme, NEW_SECRET, BODY, new, now=NOW).id == "new"
    assert _reason(scheme, BODY, old, secrets=[NEW_SECRET]) == "signature mismatch"


# --- headers and configuration -------------------------------------------------------------------------

_REQUIRED = {
    "github": ["X-Hub-Signature-256", "X-GitHub-Delivery"],
    "standard-webhooks": ["webhook-id", "webhook-timestamp", "webhook-signature"],
    "hmac-sha256": ["X-Webhook-Signature", "X-Webhook-Timestamp", "X-Webhook-Id"],
}


@pytest.mark.parametrize(("scheme", "header"), [(s, h) for s, hs in _REQUIRED.items() for h in hs])
def test_missing_header(scheme: str, header: str) -> None:
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="d")
    del headers[header]
    assert _reason(scheme, BODY, headers) == f"missing header {header}"


@pytest.mark.parametrize(
    ("scheme", "value"),
    [
        ("github", "sha1=" + "0" * 40),
        ("github", "sha256=zz"),
        ("github", "0" * 64),
        ("standard-webhooks", "v1"),
        ("standard-webhooks", "v2,abc"),
        ("hmac-sha256", "not-hex"),
        ("hmac-sha256", "sha256=" + "0" * 63),
    ],
)
def test_malformed_signature_header(scheme: str, value: str) -> None:
    headers = sign(scheme, NEW_SECRET, BODY, now=NOW)
    headers[SIGNATURE_HEADER[scheme]] = value
    assert _reason(scheme, BODY, headers) == f"malformed header {SIGNATURE_HEADER[scheme]}"


def test_failure_reasons_are_distinct() -> None:
    headers = sign("hmac-sha256", NEW_SECRET, BODY, now=NOW)
    cases = {
        "missing": {k: v for k, v in headers.items() if k != "X-Webhook-Timestamp"},
        "malformed": {**headers, "X-Webhook-Signature": "nope"},
        "mismatch": {**headers, "X-Webhook-Signature": "0" * 64},
        "stale": sign("hmac-sha256", NEW_SECRET, BODY, now=NOW - 1000),
        "future": sign("hmac-sha256", NEW_SECRET, BODY, now=NOW + 1000),
        "numeric": {**headers, "X-Webhook-Timestamp": "soon"},
    }
    reasons = {name: _reason("hmac-sha256", BODY, h) for name, h in cases.items()}
    assert len(set(reasons.values())) == len(cases), reasons


def test_configuration_errors_are_value_errors() -> None:
    headers = sign("github", NEW_SECRET, BODY)
    with pytest.raises(ValueError, match="unknown webhook signature scheme"):
        verify("nope", [NEW_SECRET], BODY, headers)
    with pytest.raises(ValueError, match="unknown webhook signature scheme"):
        sign("nope", NEW_SECRET, BODY)
    with pytest.raises(ValueError, match="secret"):
        verify("github", [], BODY, headers)
    with pytest.raises(ValueError, match="secret"):
        verify("github", [""], BODY, headers)
    with pytest.raises(ValueError, match="base64"):
        verify("standard-webhooks", ["whsec_!!!"], BODY, sign("standard-webhooks", NEW_SECRET, BODY))


# --- dedupe keys: bound to signed content ---------------------------------------------------------------


def _body_key(body: bytes, bucket: int) -> str:
    return f"body:{hashlib.sha256(body).hexdigest()}:{bucket}"


def test_signed_ids_are_the_keys() -> None:
    for scheme in ("standard-webhooks", "hmac-sha256"):
        headers = sign(scheme, NEW_SECRET, BODY, now=NOW, delivery_id="evt-1")
        assert verify(scheme, [NEW_SECRET], BODY, headers, now=NOW) == Delivery("evt-1", "evt-1")


def test_hmac_sha256_signs_id_timestamp_and_body() -> None:
    """The documented string to sign, computed by hand as a sender would."""
    digest = hmac.new(b"s3cret", b"evt-1.1700000000." + BODY, hashlib.sha256).hexdigest()
    headers = {"X-Webhook-Id": "evt-1", "X-Webhook-Timestamp": "1700000000", "X-Webhook-Signature": digest}
    assert sign("hmac-sha256", "s3cret", BODY, now=NOW, delivery_id="evt-1") == headers
    assert verify("hmac-sha256", "s3cret", BODY, headers, now=NOW).key == "evt-1"


def test_hmac_sha256_id_cannot_be_changed_or_dropped() -> None:
    headers = sign("hmac-sha256", NEW_SECRET, BODY, now=NOW, delivery_id="evt-1")
    assert _reason("hmac-sha256", BODY, {**headers, "X-Webhook-Id": "evt-2"}) == "signature mismatch"
    assert _reason("hmac-sha256", BODY, _without_id(headers)) == "missing header X-Webhook-Id"


def _without_id(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != "X-Webhook-Id"}


def _unsigned_id(secret: str, body: bytes, timestamp: int, msg_id: str | None = None) -> dict[str, str]:
    """An older sender's headers: the signature covers ``"<timestamp>." + body`` only."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Webhook-Signature": digest, "X-Webhook-Timestamp": str(timestamp),
            **({"X-Webhook-Id": msg_id} if msg_id else {})}


def test_hmac_sha256_unsigned_id_needs_the_compatibility_option() -> None:
    old = _unsigned_id(NEW_SECRET, BODY, int(NOW), "evt-1")
    assert _reason("hmac-sha256", BODY, old) == "signature mismatch"
    delivery = verify("hmac-sha256", NEW_SECRET, BODY, old, now=NOW, tolerance=300, allow_unsigned_id=True)
    assert delivery == Delivery("evt-1", _body_key(BODY, int(NOW) // 300))
    # any other id, or none, leaves the key alone: the id is not signed
    for other in (_unsigned_id(NEW_SECRET, BODY, int(NOW), "evt-2"), _unsigned_id(NEW_SECRET, BODY, int(NOW))):
        assert verify("hmac-sha256", NEW_SECRET, BODY, other, now=NOW, allow_unsigned_id=True).key == delivery.key
    # a sender that signs the id keeps its signed id as the key with the option on
    signed = sign("hmac-sha256", NEW_SECRET, BODY, now=NOW, delivery_id="evt-3")
    assert verify("hmac-sha256", NEW_SECRET, BODY, signed, now=NOW, allow_unsigned_id=True).key == "evt-3"


def test_hmac_sha256_unsigned_id_window_follows_the_signed_timestamp() -> None:
    """Keyed by the signed timestamp's window, not the arrival time: a replay carries the same timestamp, so it
    keeps its key even when it arrives in the next window; an identical body signed in a later window runs."""
    sent = int(NOW) - int(NOW) % 300 + 299  # the last second of a window
    original = _unsigned_id(NEW_SECRET, BODY, sent)
    key = verify("hmac-sha256", NEW_SECRET, BODY, original, now=sent, tolerance=300, allow_unsigned_id=True).key
    replayed = verify("hmac-sha256", NEW_SECRET, BODY, original, now=sent + 200, tolerance=300,
                      allow_unsigned_id=True)
    assert replayed.key == key
    later = _unsigned_id(NEW_SECRET, BODY, sent + 1)
    assert verify("hmac-sha256", NEW_SECRET, BODY, later, now=sent + 1, tolerance=300,
                  allow_unsigned_id=True).key != key


def test_github_keys_by_the_delivery_id_and_replays_by_the_body_hash() -> None:
    first = verify("github", NEW_SECRET, BODY, sign("github", NEW_SECRET, BODY, delivery_id="a"), now=NOW,
                   window=3600)
    body_hash = f"body:{hashlib.sha256(BODY).hexdigest()}"
    assert first == Delivery("a", "delivery:a", (body_hash, 3600))
    again = verify("github", NEW_SECRET, BODY, sign("github", NEW_SECRET, BODY, delivery_id="b"), now=NOW + 9999,
                   window=60)
    assert (again.key, again.replay) == ("delivery:b", (body_hash, 60))  # the same body, whatever the id or time
    other = b'{"event": "push", "ref": "refs/heads/dev"}'
    assert verify("github", NEW_SECRET, other, sign("github", NEW_SECRET, other), now=NOW).replay[0] != body_hash


@pytest.mark.parametrize("secret", ["whsec_!!!", "whsec_caf\u00e9", "whsec_"])
def test_undecodable_whsec_secret_is_a_value_error(secret: str) -> None:
    with pytest.raises(ValueError, match="whsec_"):
        standard_webhooks_key(secret)
