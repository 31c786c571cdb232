"""Signature rules that ``make mutate`` found unpinned: each test names the mutant of
``platforms/webhook_signatures.py`` it kills."""

from __future__ import annotations

import pytest

from platforms.webhook_signatures import SCHEMES, sign, verify

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
