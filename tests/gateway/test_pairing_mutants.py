"""Pairing rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/pairing.py`` it
kills. The store is SQLite; every clock is explicit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pairing import (
    CODE_MESSAGE_INTERVAL,
    LOCKOUT_SECONDS,
    MAX_FAILED_APPROVALS,
    PairingStore,
    approve_command,
    format_code,
)
from gateway.store import Store

T0 = 1_700_000_000.0


@pytest.fixture
def pairing(store: Store) -> PairingStore:
    return PairingStore(store)


async def test_the_defaults_are_an_hour_and_three_codes_per_platform(store: Store) -> None:
    """Kills __init__'s ``ttl = 3601.0`` and ``max_pending = 4``."""
    pairing = PairingStore(store)
    first = await pairing.issue("telegram", "1", "ann", "c1", now=T0)
    assert first is not None
    (pending,) = await pairing.pending(now=T0)
    assert pending.expires_at == T0 + 3600.0
    for user in ("2", "3"):
        assert await pairing.issue("telegram", user, None, f"c{user}", now=T0) is not None
    assert await pairing.issue("telegram", "4", None, "c4", now=T0) is None


async def test_one_code_message_per_user_and_platform_per_hour(pairing: PairingStore) -> None:
    """Kills issue's rate-limit mutants: the platform condition dropped (a user's code on one platform would
    silence them on another), the time condition dropped (one code per user for ever) and ``created_at >=``
    (the hour boundary)."""
    assert await pairing.issue("telegram", "7", None, "c7", now=T0) is not None
    assert await pairing.issue("telegram", "7", None, "c7", now=T0 + 10) is None
    assert await pairing.issue("discord", "7", None, "d7", now=T0 + 10) is not None
    again = await pairing.issue("telegram", "7", None, "c7", now=T0 + CODE_MESSAGE_INTERVAL)
    assert again is not None


async def test_the_pending_cap_counts_live_codes_of_the_platform_only(pairing: PairingStore) -> None:
    """Kills issue's capacity mutants: the platform condition dropped (another platform's codes counted),
    the expiry condition dropped or ``expires_at >= now`` (expired codes counted), and the status condition
    dropped (approved codes counted)."""
    pairing.max_pending = 1
    assert await pairing.issue("discord", "9", None, "d9", now=T0) is not None  # another platform
    code = await pairing.issue("telegram", "1", None, "c1", now=T0)
    assert code is not None
    assert await pairing.issue("telegram", "2", None, "c2", now=T0 + 1) is None  # the cap: one live code
    assert (await pairing.approve(code, "admin", now=T0 + 2)).ok  # approved: no longer pending
    assert await pairing.issue("telegram", "2", None, "c2", now=T0 + 3) is not None
    # the second code expires exactly at T0 + 3 + ttl: from then on it does not count
    assert await pairing.issue("telegram", "3", None, "c3", now=T0 + 3 + pairing.ttl) is not None


async def test_a_code_keeps_the_users_name(pairing: PairingStore) -> None:
    """Kills issue's ``user_name=None`` and ``user_name`` left out, and approve's ``"XXuser_nameXX"`` /
    ``"USER_NAME"`` (the approved user's name dropped) and ``PendingCode(..., None, ...)`` mutants."""
    code = await pairing.issue("telegram", "11", "ann", "chat-11", now=T0)
    assert code is not None
    (pending,) = await pairing.pending(now=T0)
    assert pending.user_name == "ann"
    approval = await pairing.approve(code, "admin", now=T0 + 1)
    assert approval.ok and approval.code is not None
    assert (approval.code.code, approval.code.platform, approval.code.user_id, approval.code.user_name,
            approval.code.chat_id, approval.code.expires_at) == (code, "telegram", "11", "ann", "chat-11",
                                                                 T0 + pairing.ttl)
    assert approval.message == "Approved telegram user 11 (ann)."
    assert await pairing.approved() == [("telegram", "11", "ann", "admin")]


async def test_approving_one_code_leaves_the_others_pending(pairing: PairingStore) -> None:
    """Kills approve's ``where(None)`` and ``code != code`` (every other code marked approved) and
    ``status="XXapprovedXX"`` / ``"APPROVED"`` (the code left pending-looking)."""
    first = await pairing.issue("telegram", "1", None, "c1", now=T0)
    second = await pairing.issue("telegram", "2", None, "c2", now=T0)
    assert first is not None and second is not None
    assert (await pairing.approve(format_code(first).lower(), "admin", now=T0 + 1)).ok
    assert [p.code for p in await pairing.pending(now=T0 + 1)] == [second]
    again = await pairing.approve(first, "admin", now=T0 + 2)
    assert (again.ok, again.message) == (False, "That code was already approved.")
    assert await pairing.is_approved("telegram", "1") and not await pairing.is_approved("telegram", "2")


async def test_a_refused_approval_is_false_not_none(pairing: PairingStore) -> None:
    """Kills approve's ``Approval(None, ...)`` (a falsy ok that is not False) and ``problem = None`` for a used
    code (which would approve it a second time)."""
    code = await pairing.issue("telegram", "1", None, "c1", now=T0)
    assert code is not None
    missing = await pairing.approve("ZZZZ-ZZZZ", "admin", now=T0)
    assert missing.ok is False and missing.code is None
    assert (await pairing.approve(code, "admin", now=T0)).ok
    used = await pairing.approve(code, "admin", now=T0)
    assert used.ok is False and used.code is None


async def test_a_code_expires_at_its_expiry_time(pairing: PairingStore) -> None:
    """Kills approve's ``expires_at < now`` (a code approved at the very second it expires)."""
    code = await pairing.issue("telegram", "1", None, "c1", now=T0)
    assert code is not None
    expired = await pairing.approve(code, "admin", now=T0 + pairing.ttl)
    assert expired.ok is False and "expired" in expired.message


async def test_the_lockout_lasts_an_hour_from_the_failures(store: Store) -> None:
    """Kills approve's ``at >= now - LOCKOUT_SECONDS`` and ``Approval(None, ...)`` when locked."""
    pairing = PairingStore(store, ttl=2 * LOCKOUT_SECONDS)
    code = await pairing.issue("telegram", "1", None, "c1", now=T0)
    assert code is not None
    for _ in range(MAX_FAILED_APPROVALS):
        assert not (await pairing.approve("WRONGCOD", "admin", now=T0)).ok
    locked = await pairing.approve(code, "admin", now=T0 + 1)
    assert locked.ok is False and "locked" in locked.message
    assert (await pairing.approve(code, "admin", now=T0 + LOCKOUT_SECONDS)).ok


async def test_a_user_approved_twice_keeps_the_first_approval(pairing: PairingStore) -> None:
    """Kills approve's ``insert_ignoring_conflicts(None, ...)`` and the conflict columns in capitals (the second
    approval of a user, through a new code, would fail instead of keeping the first)."""
    first = await pairing.issue("telegram", "1", "ann", "c1", now=T0)
    assert first is not None and (await pairing.approve(first, "alice", now=T0 + 1)).ok
    second = await pairing.issue("telegram", "1", "ann", "c1", now=T0 + CODE_MESSAGE_INTERVAL + 1)
    assert second is not None and (await pairing.approve(second, "bob", now=T0 + CODE_MESSAGE_INTERVAL + 2)).ok
    assert await pairing.approved() == [("telegram", "1", "ann", "alice")]


async def test_pending_lists_live_codes_oldest_first_on_the_real_clock(pairing: PairingStore) -> None:
    """Kills pending's ``now = None`` and ``time.time() if (now is None) and False`` (the CLI lists without a
    clock) and ``if (now is None) or True`` (an explicit clock ignored)."""
    import time

    now = time.time()
    late = await pairing.issue("telegram", "2", None, "c2", now=now - 10)
    early = await pairing.issue("telegram", "1", None, "c1", now=now - 20)
    gone = await pairing.issue("telegram", "3", None, "c3", now=now - 2 * pairing.ttl)
    assert late and early and gone
    assert [p.code for p in await pairing.pending()] == [early, late]
    assert [p.code for p in await pairing.pending(now=now - 2 * pairing.ttl + 1)] == [gone, early, late]


async def test_approved_lists_users_in_approval_order(pairing: PairingStore) -> None:
    """Kills approved's mutants (the query, its order or the read replaced)."""
    for user, at in (("2", T0 + 20), ("1", T0 + 10)):
        code = await pairing.issue("telegram", user, None, f"c{user}", now=T0)
        assert code is not None and (await pairing.approve(code, f"admin{user}", now=at)).ok
    assert await pairing.approved() == [("telegram", "1", None, "admin1"), ("telegram", "2", None, "admin2")]


# -- found by the run of 2026-12-04 ----------------------------------------------------------------------------

def test_the_approve_command_names_the_code_and_the_config() -> None:
    """Kills approve_command's ``cli_command(None, ...)`` and ``cli_command(..., None)`` (the command a stranger
    is told to pass on would lack the code, or the ``--config`` of a gateway whose config discovery cannot find)."""
    elsewhere = Path("/nonexistent/hermes-elsewhere.yaml")
    assert approve_command("ABCDEFGH", None) == "hermes-gateway pairing approve ABCD-EFGH"
    assert approve_command("ABCDEFGH", elsewhere) == (
        f"hermes-gateway --config {elsewhere} pairing approve ABCD-EFGH")


async def test_refused_approvals_say_why(pairing: PairingStore) -> None:
    """What the admin reads: kills the wording mutants of "No such pairing code.", the expiry message, the
    lockout message and the ``'unknown'`` shown for a user without a name."""
    code = await pairing.issue("telegram", "1", None, "c1", now=T0)
    assert code is not None
    assert (await pairing.approve("ZZZZ-ZZZZ", "admin", now=T0)).message == "No such pairing code."
    assert (await pairing.approve(code, "admin", now=T0 + pairing.ttl)).message == (
        "That code has expired; the user can DM the bot again in an hour for a new one.")
    fresh = await pairing.issue("telegram", "2", None, "c2", now=T0)
    assert fresh is not None
    assert (await pairing.approve(fresh, "admin", now=T0)).message == "Approved telegram user 2 (unknown)."
    for _ in range(MAX_FAILED_APPROVALS):
        await pairing.approve("ZZZZ-ZZZZ", "admin", now=T0 + 1)
    assert (await pairing.approve(fresh, "admin", now=T0 + 1)).message == (
        "Too many failed approvals; pairing is locked for an hour.")


async def test_a_user_approved_through_two_codes_on_either_database(store_url: str) -> None:
    """The second approval of a user leaves the first in place, on SQLite and on PostgreSQL (whose ON CONFLICT
    names the key's columns as they are).

    Kills approve's ``insert_ignoring_conflicts(None, ...)`` (SQLite's INSERT on PostgreSQL) and the key's
    column names in capitals."""
    store = await Store.open(store_url)
    try:
        pairing = PairingStore(store)
        first = await pairing.issue("telegram", "1", "ann", "c1", now=T0)
        assert first is not None and (await pairing.approve(first, "alice", now=T0)).ok
        second = await pairing.issue("telegram", "1", "ann", "c1", now=T0 + CODE_MESSAGE_INTERVAL)
        assert second is not None and (await pairing.approve(second, "bob", now=T0 + CODE_MESSAGE_INTERVAL)).ok
        assert await pairing.approved() == [("telegram", "1", "ann", "alice")]
    finally:
        await store.close()


async def test_pending_codes_end_at_their_expiry_and_keep_their_chat(pairing: PairingStore) -> None:
    """Kills pending's ``expires_at >= now`` (a code listed at the second it expires) and ``PendingCode(...,
    None, ...)`` for the chat (where the approval notice goes)."""
    code = await pairing.issue("telegram", "1", None, "chat-1", now=T0)
    assert code is not None
    (pending,) = await pairing.pending(now=T0 + pairing.ttl - 1)
    assert (pending.code, pending.chat_id) == (code, "chat-1")
    assert await pairing.pending(now=T0 + pairing.ttl) == []


async def test_revoking_a_user_leaves_the_same_id_on_another_platform(pairing: PairingStore) -> None:
    """Kills revoke's platform condition dropped and both conditions dropped (every approval withdrawn)."""
    for platform, user in (("telegram", "1"), ("discord", "1"), ("telegram", "2")):
        code = await pairing.issue(platform, user, None, f"c-{platform}-{user}", now=T0)
        assert code is not None and (await pairing.approve(code, "admin", now=T0)).ok
    assert await pairing.revoke("telegram", "1") is True
    assert await pairing.revoke("telegram", "1") is False
    assert [await pairing.is_approved(p, u) for p, u in (("telegram", "1"), ("discord", "1"), ("telegram", "2"))] == [
        False, True, True]


async def test_a_denied_code_can_no_longer_be_approved(pairing: PairingStore) -> None:
    """``/pairing deny``: the code is refused for good, the other codes stay pending, and only a pending code
    can be denied.

    Kills every mutant of deny: the update replaced or left without its conditions (``where(None)``, ``code !=``,
    ``normalize_code(None)``, ``status != "pending"`` or misspelt), the status written (None, misspelt) and the
    answer (``bool(None)``, nothing written)."""
    first = await pairing.issue("telegram", "1", None, "c1", now=T0)
    second = await pairing.issue("telegram", "2", None, "c2", now=T0)
    third = await pairing.issue("telegram", "3", None, "c3", now=T0)
    assert first is not None and second is not None and third is not None
    assert await pairing.deny(format_code(first).lower()) is True
    assert await pairing.deny(first) is False
    assert (await pairing.approve(third, "admin", now=T0)).ok
    assert await pairing.deny(third) is False
    assert [p.code for p in await pairing.pending(now=T0)] == [second]
    refused = await pairing.approve(first, "admin", now=T0)
    assert (refused.ok, refused.message) == (False, "That code was already denied.")
    assert await pairing.approved() == [("telegram", "3", None, "admin")]
