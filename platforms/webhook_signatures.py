"""Signature schemes for incoming webhooks: GitHub, Standard Webhooks and plain timestamped HMAC-SHA256.

Each ``verify_*`` returns the delivery id (the dedupe key) or raises SignatureError; each ``sign_*``
returns the headers a sender adds. Signatures cover the raw body bytes; comparisons are constant-time.
Stdlib only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

DEFAULT_TOLERANCE = 300.0
"""Seconds a signed timestamp may lie in the past or the future."""

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class SignatureError(Exception):
    """A delivery failed verification; `reason` is short and safe to send back to the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Verifier(Protocol):
    """Checks one delivery and returns its id."""

    def __call__(
        self,
        secrets: str | Sequence[str],
        body: bytes,
        headers: Mapping[str, str],
        now: float | None = None,
        tolerance: float = DEFAULT_TOLERANCE,
    ) -> str: ...


class Signer(Protocol):
    """Headers that authenticate `body`."""

    def __call__(
        self, secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
    ) -> dict[str, str]: ...


def _secrets(secrets: str | Sequence[str]) -> tuple[str, ...]:
    # A bare string is one secret, not a sequence of one-character secrets.
    found = (secrets,) if isinstance(secrets, str) else tuple(secrets)
    if not found or not all(found):
        raise ValueError("webhook verification needs at least one non-empty secret")
    return found


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _require(headers: dict[str, str], name: str) -> str:
    value = headers.get(name.lower())
    if not value:
        raise SignatureError(f"missing header {name}")
    return value


def _utf8(s: str) -> bytes:
    # surrogateescape gives back the original bytes of a header decoded with it.
    return s.encode("utf-8", "surrogateescape")


def _check_timestamp(raw: str, now: float | None, tolerance: float) -> None:
    if not (raw.isascii() and raw.isdigit()):
        raise SignatureError("timestamp not numeric")
    current = time.time() if now is None else now
    try:
        ts = int(raw)
    except ValueError:  # more digits than int() accepts: far in the future
        raise SignatureError("timestamp in the future") from None
    if ts < current - tolerance:
        raise SignatureError("timestamp too old")
    if ts > current + tolerance:
        raise SignatureError("timestamp in the future")


def _any_equal(expected: Sequence[str], provided: Sequence[str]) -> bool:
    # Compare every pair so timing does not reveal which secret or signature matched.
    matched = False
    for want in expected:
        for got in provided:
            matched |= hmac.compare_digest(_utf8(want), _utf8(got))
    return matched


def _hex_hmac(secret: str, payload: bytes) -> str:
    return hmac.new(_utf8(secret), payload, hashlib.sha256).hexdigest()


def _hex_signature(value: str, header: str) -> str:
    digest = value.removeprefix("sha256=")
    if not _HEX_SHA256.fullmatch(digest):
        raise SignatureError(f"malformed header {header}")
    return digest


def _timestamp(now: float | None) -> str:
    return str(int(time.time() if now is None else now))


# --- GitHub ---------------------------------------------------------------------------------------------


def sign_github(secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None) -> dict[str, str]:
    """GitHub's headers; `now` is unused (GitHub signs no timestamp)."""
    return {
        "X-Hub-Signature-256": "sha256=" + _hex_hmac(secret, body),
        "X-GitHub-Delivery": delivery_id or str(uuid.uuid4()),
    }


def verify_github(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """Check ``X-Hub-Signature-256: sha256=<hex>``; return ``X-GitHub-Delivery``.

    GitHub signs neither a timestamp nor the delivery id, so `now` and `tolerance` are unused and a
    captured request can be replayed under a new delivery id.
    """
    keys = _secrets(secrets)
    h = _lower(headers)
    header = _require(h, "X-Hub-Signature-256")
    delivery_id = _require(h, "X-GitHub-Delivery")
    if not header.startswith("sha256="):
        raise SignatureError("malformed header X-Hub-Signature-256")
    provided = _hex_signature(header, "X-Hub-Signature-256")
    if not _any_equal([_hex_hmac(k, body) for k in keys], [provided]):
        raise SignatureError("signature mismatch")
    return delivery_id


# --- Standard Webhooks (standardwebhooks.com) -----------------------------------------------------------


def _standard_key(secret: str) -> bytes:
    """Key bytes: base64 after a ``whsec_`` prefix, otherwise the secret's UTF-8 bytes."""
    if not secret.startswith("whsec_"):
        return _utf8(secret)
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise ValueError("a whsec_ webhook secret must be base64 after the prefix") from None


def _standard_signature(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    signed = _utf8(f"{msg_id}.{timestamp}.") + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def sign_standard_webhooks(
    secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and a ``v1,`` ``webhook-signature``."""
    msg_id = delivery_id or f"msg_{uuid.uuid4().hex}"
    timestamp = _timestamp(now)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + _standard_signature(_standard_key(secret), msg_id, timestamp, body),
    }


def verify_standard_webhooks(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """Check a Standard Webhooks delivery against any secret and any ``v1`` signature; return webhook-id."""
    keys = [_standard_key(s) for s in _secrets(secrets)]
    h = _lower(headers)
    msg_id = _require(h, "webhook-id")
    timestamp = _require(h, "webhook-timestamp")
    header = _require(h, "webhook-signature")
    provided: list[str] = []
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if not signature:
            raise SignatureError("malformed header webhook-signature")
        if version == "v1":  # other versions (e.g. asymmetric v1a) are not ours to check
            provided.append(signature)
    if not provided:
        raise SignatureError("malformed header webhook-signature")
    _check_timestamp(timestamp, now, tolerance)
    if not _any_equal([_standard_signature(k, msg_id, timestamp, body) for k in keys], provided):
        raise SignatureError("signature mismatch")
    return msg_id


# --- timestamped HMAC-SHA256 ----------------------------------------------------------------------------


def _hmac_payload(timestamp: str, body: bytes) -> bytes:
    return _utf8(f"{timestamp}.") + body


def sign_hmac_sha256(
    secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """``X-Webhook-Signature`` (hex) and ``X-Webhook-Timestamp``, plus ``X-Webhook-Id`` if given."""
    timestamp = _timestamp(now)
    headers = {
        "X-Webhook-Signature": _hex_hmac(secret, _hmac_payload(timestamp, body)),
        "X-Webhook-Timestamp": timestamp,
    }
    if delivery_id:
        headers["X-Webhook-Id"] = delivery_id
    return headers


def verify_hmac_sha256(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """Check hex HMAC-SHA256 over ``b"<timestamp>." + body``.

    Returns ``X-Webhook-Id`` if present (it is not signed), else the hex SHA-256 of the signed payload,
    which makes a replay inside the tolerance window dedupe to the same id.
    """
    keys = _secrets(secrets)
    h = _lower(headers)
    header = _require(h, "X-Webhook-Signature")
    timestamp = _require(h, "X-Webhook-Timestamp")
    provided = _hex_signature(header, "X-Webhook-Signature")
    _check_timestamp(timestamp, now, tolerance)
    payload = _hmac_payload(timestamp, body)
    if not _any_equal([_hex_hmac(k, payload) for k in keys], [provided]):
        raise SignatureError("signature mismatch")
    return h.get("x-webhook-id") or hashlib.sha256(payload).hexdigest()


# --- by scheme name -------------------------------------------------------------------------------------

VERIFIERS: Mapping[str, Verifier] = MappingProxyType(
    {
        "github": verify_github,
        "standard-webhooks": verify_standard_webhooks,
        "hmac-sha256": verify_hmac_sha256,
    }
)
SIGNERS: Mapping[str, Signer] = MappingProxyType(
    {
        "github": sign_github,
        "standard-webhooks": sign_standard_webhooks,
        "hmac-sha256": sign_hmac_sha256,
    }
)
SCHEMES: tuple[str, ...] = tuple(VERIFIERS)


def _unknown_scheme(scheme: str) -> ValueError:
    return ValueError(f"unknown webhook signature scheme {scheme!r} (expected one of {', '.join(SCHEMES)})")


def verify(
    scheme: str,
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """Verify with the named scheme; returns the delivery id or raises SignatureError (ValueError: config)."""
    if scheme not in VERIFIERS:
        raise _unknown_scheme(scheme)
    return VERIFIERS[scheme](secrets, body, headers, now=now, tolerance=tolerance)


def sign(
    scheme: str, secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """Headers for `body` under the named scheme (for tests, the demo and simulators)."""
    if scheme not in SIGNERS:
        raise _unknown_scheme(scheme)
    return SIGNERS[scheme](secret, body, now=now, delivery_id=delivery_id)
