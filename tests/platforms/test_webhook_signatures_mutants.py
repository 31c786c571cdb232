"""Signature rules that ``make mutate`` found unpinned: each test names the mutant of
``platforms/webhook_signatures.py`` it kills."""

from __future__ import annotations

import hashlib

import pytest

from platforms.webhook_signatures import (
    SCHEMES,
    MalformedDelivery,
    SignatureError,
    sign,
    standard_webhooks_key,
    verify,
    verify_hmac_sha256,
)

SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQ="  # base64 after the prefix: every scheme accepts it
BODY = b'{"event": "push"}'


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_fresh_delivery_verifies_on_the_real_clock(scheme: str) -> None:
    """Kills _check_timestamp's ``time.time() if (now is None) and False else now`` (without an explicit ``now``,
    as the gateway calls it, every timestamped delivery would fail with a TypeError)."""
    headers = sign(scheme, SECRET, BODY, delivery_id="d-1")
    assert verify(scheme, [SECRET], BODY, headers).id == "d-1"


def test_github_deliveries_signed_without_an_id_get_distinct_ids() -> None:
    """Kills sign_github's ``delivery_id or str(None)`` (every generated delivery would share the id "None", so
    the receiver's dedupe would drop all but the first)."""
    first, second = sign("github", SECRET, BODY), sign("github", SECRET, BODY)
    assert first["X-GitHub-Delivery"] != second["X-GitHub-Delivery"]
    assert verify("github", [SECRET], BODY, first).id == first["X-GitHub-Delivery"]


# -- found by the run of 2026-12-04 ----------------------------------------------------------------------------

NOW = 1_700_000_000


def _refusal(error: type[Exception], scheme: str, headers: dict[str, str], secrets: list[str] | None = None,
             **options: bool) -> Exception:
    with pytest.raises(error) as info:
        verify(scheme, secrets or [SECRET], BODY, headers, now=NOW, **options)
    return info.value


def test_gitlab_headers_are_gitlabs_own() -> None:
    """Kills sign_gitlab's header names in another case, the event's wording and ``str(None)`` for a generated
    UUID (every delivery signed without an id would share one)."""
    assert sign("gitlab", "tok", BODY, delivery_id="u-1") == {
        "X-Gitlab-Token": "tok", "X-Gitlab-Event": "Push Hook", "X-Gitlab-Event-UUID": "u-1"}
    assert sign("gitlab", "tok", BODY)["X-Gitlab-Event-UUID"] != sign("gitlab", "tok", BODY)["X-Gitlab-Event-UUID"]


def test_gitlab_token_event_and_uuid_are_checked_and_keyed() -> None:
    """Kills verify_gitlab's ``_require(h, ...)`` names in another case (the missing header's name in the 401),
    ``SignatureError(None)`` / wording of "token mismatch", the MalformedDelivery of a missing event header with
    its reason or field dropped (and MalformedDelivery's own ``reason``/``field`` = None), and the dedupe key
    replaced by None."""
    headers = {"X-Gitlab-Token": "tok", "X-Gitlab-Event": "Note Hook", "X-Gitlab-Event-UUID": "u-1"}
    delivery = verify("gitlab", ["tok"], BODY, headers)
    assert (delivery.id, delivery.key) == ("u-1", f"gitlab:{hashlib.sha256(b'u-1').hexdigest()}:"
                                                  f"{hashlib.sha256(BODY).hexdigest()}")
    assert _refusal(SignatureError, "gitlab", headers, ["other"]).reason == "token mismatch"
    assert _refusal(SignatureError, "gitlab", {}).reason == "missing header X-Gitlab-Token"
    for name in ("X-Gitlab-Event", "X-Gitlab-Event-UUID"):
        missing = _refusal(MalformedDelivery, "gitlab", {**headers, name: ""}, ["tok"])
        assert isinstance(missing, MalformedDelivery)
        assert (missing.reason, missing.field, str(missing)) == (f"missing header {name}", name,
                                                                  f"missing header {name}")


def test_hmac_sha256_v2_headers_id_and_key() -> None:
    """Kills sign_hmac_sha256_v2's ``X-Request-ID`` in another case, verify_hmac_sha256_v2's
    ``_require(h, "X-Webhook-Signature-V2")`` in another case (the missing header's name), and its Delivery's
    id default (``None``, ``"XXXX"``, left out) and key (None)."""
    headers = sign("hmac-sha256-v2", SECRET, BODY, now=NOW, delivery_id="r-1")
    assert sorted(headers) == ["X-Request-ID", "X-Webhook-Signature-V2", "X-Webhook-Timestamp"]
    assert verify("hmac-sha256-v2", [SECRET], BODY, headers, now=NOW).id == "r-1"
    del headers["X-Request-ID"]
    delivery = verify("hmac-sha256-v2", [SECRET], BODY, headers, now=NOW)
    assert (delivery.id, delivery.key) == ("", f"body:{hashlib.sha256(BODY).hexdigest()}:{NOW // 300}")
    del headers["X-Webhook-Signature-V2"]
    assert _refusal(SignatureError, "hmac-sha256-v2", headers).reason == "missing header X-Webhook-Signature-V2"


def test_hmac_sha256_accepts_an_unsigned_id_only_when_allowed() -> None:
    """A signature over ``"<timestamp>." + body`` (no id) passes only with allow_unsigned_id, and then the id is
    empty when none was sent.

    Kills verify_hmac_sha256's ``allow_unsigned_id: bool = True`` (its default: every route would accept
    deliveries whose id nobody signed) and ``h.get("x-webhook-id", None)`` / ``"XXXX"`` / no default."""
    unsigned = sign("hmac-sha256-v2", SECRET, BODY, now=NOW)
    headers = {"X-Webhook-Timestamp": unsigned["X-Webhook-Timestamp"],
               "X-Webhook-Signature": unsigned["X-Webhook-Signature-V2"]}
    with pytest.raises(SignatureError):
        verify_hmac_sha256([SECRET], BODY, {**headers, "X-Webhook-Id": "evt-1"}, now=NOW)
    assert verify("hmac-sha256", [SECRET], BODY, headers, now=NOW, allow_unsigned_id=True).id == ""


def test_svix_headers_are_read_when_no_standard_ones_are_sent() -> None:
    """Kills verify_standard_webhooks' prefix choice mutants: ``svix-`` never chosen (``and False``, the names
    misspelt or in capitals: "missing header webhook-id" or "SVIX-id"), and ``"webhook-signature" in h`` (svix-
    read instead of the standard headers when both are sent)."""
    standard = sign("standard-webhooks", SECRET, BODY, now=NOW, delivery_id="msg_1")
    svix = {name.replace("webhook-", "svix-"): value for name, value in standard.items()}
    assert verify("standard-webhooks", [SECRET], BODY, svix, now=NOW).id == "msg_1"
    del svix["svix-id"]
    assert _refusal(SignatureError, "standard-webhooks", svix).reason == "missing header svix-id"
    other = sign("standard-webhooks", SECRET, b"another body", now=NOW, delivery_id="msg_2")
    both = {**standard, **{name.replace("webhook-", "svix-"): value for name, value in other.items()}}
    assert verify("standard-webhooks", [SECRET], BODY, both, now=NOW).id == "msg_1"


def test_a_whsec_secret_must_be_strict_base64() -> None:
    """Kills standard_webhooks_key's ``b64decode(..., validate=False)`` and the argument left out (characters
    outside base64 silently dropped: a mistyped secret accepted as another key), and the wording of both errors."""
    with pytest.raises(ValueError, match=r"^a whsec_ webhook secret must be base64 after the prefix$"):
        standard_webhooks_key("whsec_c2Vj$cmV0")
    with pytest.raises(ValueError, match=r"^a whsec_ webhook secret must have base64 key bytes after the prefix$"):
        standard_webhooks_key("whsec_")
    with pytest.raises(ValueError, match=r"^webhook verification needs at least one non-empty secret$"):
        verify("github", [""], BODY, {})


def test_refusal_reasons_name_what_failed() -> None:
    """The reason goes back to the sender in the 401 and into the log: kills ``SignatureError(None)`` and the
    wording mutants of "timestamp in the future" for a timestamp longer than int() reads, and
    ``_unknown_scheme(None)`` in verify and sign (the error would not name the scheme asked for)."""
    headers = sign("hmac-sha256", SECRET, BODY, now=NOW, delivery_id="e-1")
    assert _refusal(SignatureError, "hmac-sha256", {**headers, "X-Webhook-Timestamp": "9" * 5000}).reason == (
        "timestamp in the future")
    with pytest.raises(ValueError, match="'nope'"):
        verify("nope", [SECRET], BODY, headers)
    with pytest.raises(ValueError, match="'nope'"):
        sign("nope", SECRET, BODY)


def test_an_unknown_scheme_in_the_config_is_told_with_the_ones_there_are() -> None:
    """A ``webhooks.routes[].signature`` the gateway does not know fails its start with every scheme it does,
    and a refusal reads as its reason wherever it is logged. Kills _unknown_scheme's ``'XX, XX'.join`` and
    SignatureError's ``super().__init__(None)`` (the exception's text "None")."""
    with pytest.raises(ValueError) as unknown:
        verify("nope", [SECRET], BODY, {})
    assert str(unknown.value) == ("unknown webhook signature scheme 'nope' (expected one of github, "
                                  "standard-webhooks, hmac-sha256, hmac-sha256-v2, gitlab)")
    headers = sign("hmac-sha256", SECRET, BODY, now=NOW, delivery_id="e-1")
    refusal = _refusal(SignatureError, "hmac-sha256", {**headers, "X-Webhook-Timestamp": "9" * 5000})
    assert str(refusal) == "timestamp in the future"
