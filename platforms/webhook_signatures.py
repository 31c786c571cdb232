"""Authentication schemes for incoming webhooks: GitHub, Standard Webhooks (and Svix), timestamped HMAC-SHA256
(ours and the reference gateway's V2 header) and GitLab's shared token.

Each ``verify_*`` returns a `Delivery` (the sender's id and the dedupe key, which is bound to signed content, or
for GitLab's unsigned bodies to the body itself) or raises SignatureError (401) or MalformedDelivery (400); each
``sign_*`` returns the headers a sender adds. Signatures cover the raw body bytes; comparisons are constant-time.
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
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

DEFAULT_TOLERANCE = 300.0
"""Seconds a signed timestamp may lie in the past or the future."""

DEFAULT_REPLAY_WINDOW = 86400.0
"""GitHub: seconds for which a delivery whose body was seen before is a duplicate, whatever its delivery id."""

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class SignatureError(Exception):
    """A delivery failed verification; `reason` is short and safe to send back to the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MalformedDelivery(Exception):
    """An authenticated delivery lacks a header the scheme needs; `field` names it (a 400, not a 401)."""

    def __init__(self, reason: str, field: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True, slots=True)
class Delivery:
    """A verified delivery.

    `id` is the sender's delivery id ("" if it sent none; unsigned for GitHub and for hmac-sha256 senders that do
    not sign it, so only for logs). `key` is what the inbox dedupes it by: a signed id, or a hash of the signed body
    with the time window it fell in, so neither a replay under a new id nor a forged id can change it. `replay`
    (GitHub): a hash of the signed body and a window in seconds; the delivery is also a duplicate of any delivery of
    the same body accepted within that window before it (a sliding window: `gateway.store.Replay`).
    """

    id: str
    key: str
    replay: tuple[str, float] | None = None


class Verifier(Protocol):
    """Checks one delivery; `window` and `allow_unsigned_id` are for the schemes that use them."""

    def __call__(
        self,
        secrets: str | Sequence[str],
        body: bytes,
        headers: Mapping[str, str],
        now: float | None = None,
        tolerance: float = DEFAULT_TOLERANCE,
        *,
        window: float = DEFAULT_REPLAY_WINDOW,
        allow_unsigned_id: bool = False,
    ) -> Delivery: ...


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


def _body_key(body: bytes, at: float, window: float) -> str:
    """Dedupe key of a body whose sender's id cannot be trusted: its hash within a fixed window of time."""
    return f"body:{hashlib.sha256(body).hexdigest()}:{int(at // window)}"


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
    *,
    window: float = DEFAULT_REPLAY_WINDOW,
    allow_unsigned_id: bool = False,
) -> Delivery:
    """Check ``X-Hub-Signature-256: sha256=<hex>``; dedupe by the delivery id and, within `window` seconds, by the
    body's hash.

    GitHub signs neither a timestamp nor ``X-GitHub-Delivery``: the id (a random GUID) catches GitHub's own
    redeliveries however late; a captured request replayed under a new id is caught by its body, within the window.
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
    return Delivery(delivery_id, f"delivery:{delivery_id}", (f"body:{hashlib.sha256(body).hexdigest()}", window))


# --- Standard Webhooks (standardwebhooks.com) -----------------------------------------------------------


def standard_webhooks_key(secret: str) -> bytes:
    """Key bytes: base64 after a ``whsec_`` prefix, otherwise the secret's UTF-8 bytes; ValueError if it does not
    decode (the config loader calls this so that such a secret is refused at load, not at every delivery)."""
    if not secret.startswith("whsec_"):
        return _utf8(secret)
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
        raise ValueError("a whsec_ webhook secret must be base64 after the prefix") from None
    if not key:
        raise ValueError("a whsec_ webhook secret must have base64 key bytes after the prefix")
    return key


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
        "webhook-signature": "v1," + _standard_signature(standard_webhooks_key(secret), msg_id, timestamp, body),
    }


def verify_standard_webhooks(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    window: float = DEFAULT_REPLAY_WINDOW,
    allow_unsigned_id: bool = False,
) -> Delivery:
    """Check a Standard Webhooks delivery against any secret and any ``v1`` signature; the key is the signed
    ``webhook-id``. Svix's ``svix-id``, ``svix-timestamp`` and ``svix-signature`` are the same scheme under other
    names: they are read when no ``webhook-signature`` header is present."""
    keys = [standard_webhooks_key(s) for s in _secrets(secrets)]
    h = _lower(headers)
    prefix = "svix-" if "webhook-signature" not in h and "svix-signature" in h else "webhook-"
    msg_id = _require(h, prefix + "id")
    timestamp = _require(h, prefix + "timestamp")
    header = _require(h, prefix + "signature")
    provided: list[str] = []
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if not signature:
            raise SignatureError(f"malformed header {prefix}signature")
        if version == "v1":  # other versions (e.g. asymmetric v1a) are not ours to check
            provided.append(signature)
    if not provided:
        raise SignatureError(f"malformed header {prefix}signature")
    _check_timestamp(timestamp, now, tolerance)
    if not _any_equal([_standard_signature(k, msg_id, timestamp, body) for k in keys], provided):
        raise SignatureError("signature mismatch")
    return Delivery(msg_id, msg_id)


# --- timestamped HMAC-SHA256 ----------------------------------------------------------------------------


def _hmac_payload(msg_id: str, timestamp: str, body: bytes) -> bytes:
    return _utf8(f"{msg_id}.{timestamp}.") + body


def _unsigned_id_payload(timestamp: str, body: bytes) -> bytes:
    # What senders signed before the id was signed (and still may with ``allow_unsigned_id``).
    return _utf8(f"{timestamp}.") + body


def sign_hmac_sha256(
    secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """``X-Webhook-Id`` (a new one unless given), ``X-Webhook-Timestamp`` and ``X-Webhook-Signature``, the hex
    HMAC-SHA256 of ``"<id>.<timestamp>." + body``."""
    msg_id = delivery_id or uuid.uuid4().hex
    timestamp = _timestamp(now)
    return {
        "X-Webhook-Id": msg_id,
        "X-Webhook-Timestamp": timestamp,
        "X-Webhook-Signature": _hex_hmac(secret, _hmac_payload(msg_id, timestamp, body)),
    }


def verify_hmac_sha256(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    window: float = DEFAULT_REPLAY_WINDOW,
    allow_unsigned_id: bool = False,
) -> Delivery:
    """Check the hex HMAC-SHA256 of ``"<X-Webhook-Id>.<X-Webhook-Timestamp>." + body``; the key is that signed id.

    With `allow_unsigned_id`, a signature of ``"<timestamp>." + body`` (senders that cannot sign the id) is also
    accepted; its id is then ignored and the key is the body's hash within the `tolerance`-long window its signed
    timestamp falls in, so a replay (same timestamp) always dedupes and an identical body in a later window runs.
    """
    keys = _secrets(secrets)
    h = _lower(headers)
    header = _require(h, "X-Webhook-Signature")
    timestamp = _require(h, "X-Webhook-Timestamp")
    msg_id = h.get("x-webhook-id", "") if allow_unsigned_id else _require(h, "X-Webhook-Id")
    provided = _hex_signature(header, "X-Webhook-Signature")
    _check_timestamp(timestamp, now, tolerance)
    if msg_id and _any_equal([_hex_hmac(k, _hmac_payload(msg_id, timestamp, body)) for k in keys], [provided]):
        return Delivery(msg_id, msg_id)
    if allow_unsigned_id and _any_equal([_hex_hmac(k, _unsigned_id_payload(timestamp, body)) for k in keys],
                                        [provided]):
        return Delivery(msg_id, _body_key(body, int(timestamp), tolerance))
    raise SignatureError("signature mismatch")


# --- the reference gateway's V2 header: HMAC-SHA256 of "<timestamp>." + body -----------------------------


def sign_hmac_sha256_v2(
    secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """``X-Webhook-Timestamp``, ``X-Webhook-Signature-V2`` (hex HMAC-SHA256 of ``"<timestamp>." + body``) and an
    unsigned ``X-Request-ID``."""
    timestamp = _timestamp(now)
    return {
        "X-Request-ID": delivery_id or uuid.uuid4().hex,
        "X-Webhook-Timestamp": timestamp,
        "X-Webhook-Signature-V2": _hex_hmac(secret, _unsigned_id_payload(timestamp, body)),
    }


def verify_hmac_sha256_v2(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    window: float = DEFAULT_REPLAY_WINDOW,
    allow_unsigned_id: bool = False,
) -> Delivery:
    """Check ``X-Webhook-Signature-V2``, the hex HMAC-SHA256 of ``"<X-Webhook-Timestamp>." + body``.

    The id (``X-Request-ID``) is not signed, so the key is the body's hash within the `tolerance`-long window its
    signed timestamp falls in: a replay (same timestamp) dedupes under any id until it goes stale.
    """
    keys = _secrets(secrets)
    h = _lower(headers)
    header = _require(h, "X-Webhook-Signature-V2")
    timestamp = _require(h, "X-Webhook-Timestamp")
    provided = _hex_signature(header, "X-Webhook-Signature-V2")
    _check_timestamp(timestamp, now, tolerance)
    if not _any_equal([_hex_hmac(k, _unsigned_id_payload(timestamp, body)) for k in keys], [provided]):
        raise SignatureError("signature mismatch")
    return Delivery(h.get("x-request-id", ""), _body_key(body, int(timestamp), tolerance))


# --- GitLab: a shared token, no signature ---------------------------------------------------------------


def sign_gitlab(secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None) -> dict[str, str]:
    """GitLab's headers, as for a push (replace ``X-Gitlab-Event`` for other events); `body` and `now` are unused."""
    return {"X-Gitlab-Token": secret, "X-Gitlab-Event": "Push Hook",
            "X-Gitlab-Event-UUID": delivery_id or str(uuid.uuid4())}


def verify_gitlab(
    secrets: str | Sequence[str],
    body: bytes,
    headers: Mapping[str, str],
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    window: float = DEFAULT_REPLAY_WINDOW,
    allow_unsigned_id: bool = False,
) -> Delivery:
    """Check ``X-Gitlab-Token`` against the secrets; the key is ``X-Gitlab-Event-UUID`` with the body's hash.

    The token is a password, not a signature: nothing binds the body, the event or the UUID to it, so anyone who
    sees one request can send anything. The key only makes GitLab's resend of the same UUID and body a duplicate
    (recursive hooks share a UUID with different bodies, and stay distinct).
    """
    keys = _secrets(secrets)
    h = _lower(headers)
    token = _require(h, "X-Gitlab-Token")
    if not _any_equal(keys, [token]):
        raise SignatureError("token mismatch")
    for name in ("X-Gitlab-Event", "X-Gitlab-Event-UUID"):
        if not h.get(name.lower()):
            raise MalformedDelivery(f"missing header {name}", name)
    event_uuid = h["x-gitlab-event-uuid"]
    return Delivery(event_uuid, f"gitlab:{hashlib.sha256(_utf8(event_uuid)).hexdigest()}:"
                                f"{hashlib.sha256(body).hexdigest()}")


# --- by scheme name -------------------------------------------------------------------------------------

VERIFIERS: Mapping[str, Verifier] = MappingProxyType(
    {
        "github": verify_github,
        "standard-webhooks": verify_standard_webhooks,
        "hmac-sha256": verify_hmac_sha256,
        "hmac-sha256-v2": verify_hmac_sha256_v2,
        "gitlab": verify_gitlab,
    }
)
SIGNERS: Mapping[str, Signer] = MappingProxyType(
    {
        "github": sign_github,
        "standard-webhooks": sign_standard_webhooks,
        "hmac-sha256": sign_hmac_sha256,
        "hmac-sha256-v2": sign_hmac_sha256_v2,
        "gitlab": sign_gitlab,
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
    *,
    window: float = DEFAULT_REPLAY_WINDOW,
    allow_unsigned_id: bool = False,
) -> Delivery:
    """Verify with the named scheme; returns the Delivery or raises SignatureError or MalformedDelivery
    (ValueError: config)."""
    if scheme not in VERIFIERS:
        raise _unknown_scheme(scheme)
    return VERIFIERS[scheme](secrets, body, headers, now=now, tolerance=tolerance, window=window,
                             allow_unsigned_id=allow_unsigned_id)


def sign(
    scheme: str, secret: str, body: bytes, now: float | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """Headers for `body` under the named scheme (for tests, the demo and simulators)."""
    if scheme not in SIGNERS:
        raise _unknown_scheme(scheme)
    return SIGNERS[scheme](secret, body, now=now, delivery_id=delivery_id)
