"""Authorization, DM pairing, inbound rate limits and run/user budgets, through the gateway."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auth import Authorizer, Decision
from gateway.config import _CHAT_PLATFORMS, AuthSettings
from gateway.pairing import ALPHABET, CODE_LENGTH, PairingStore
from gateway.sim.model_server import rules, tool_call
from gateway.store import Store
from platforms.base import MessageEvent

PAIRING = {"auth": {"dm_pairing": True, "admins": ["telegram:9000"],
                    "platforms": {"telegram": {"allowed_users": ["1001"], "denied_users": ["6660"]}}}}
CODE = re.compile(r"code: ([A-Z0-9]{4})-([A-Z0-9]{4})")


def _codes(h) -> list[str]:
    return ["".join(m.groups()) for s in h.chat.sent if (m := CODE.search(s.text))]


async def _settle(h, n_sent: int) -> None:
    await h.chat.wait_for(lambda: len(h.chat.sent) >= n_sent)
    await asyncio.sleep(0.15)  # nothing more arrives


async def test_stranger_gets_no_model_call_and_no_reply_without_pairing(make_gateway) -> None:
    h = await make_gateway()
    for text in ("hello", "/status", "/new"):
        assert await h.chat.user_says(text, user_id="5555", chat_id="5555") is None
    await asyncio.sleep(0.2)
    assert h.model.requests == [] and h.chat.sent == []
    metrics = h.gateway.metrics.render().decode()
    assert 'hermes_events_total{outcome="unauthorized",platform="telegram"} 3.0' in metrics


async def test_pairing_code_once_per_user_and_at_most_three_pending(make_gateway) -> None:
    h = await make_gateway(PAIRING)
    for user in ("2001", "2002", "2003"):
        await h.chat.user_says("hi", user_id=user, chat_id=user)
        await h.chat.user_says("hello again?", user_id=user, chat_id=user)  # ignored silently
    await _settle(h, 3)
    codes = _codes(h)
    assert len(codes) == 3 and len(set(codes)) == 3
    assert all(len(c) == CODE_LENGTH and set(c) <= set(ALPHABET) for c in codes)
    assert [s.chat_id for s in h.chat.sent] == ["2001", "2002", "2003"]
    await h.chat.user_says("me too", user_id="2004", chat_id="2004")  # a 4th pending code is not issued
    await asyncio.sleep(0.2)
    assert len(h.chat.sent) == 3 and h.model.requests == []


async def test_pairing_never_in_groups_and_never_for_denylisted(make_gateway) -> None:
    h = await make_gateway(PAIRING)
    await h.chat.user_says("hi all", user_id="2001", chat_id="-100", chat_type="group")
    await h.chat.user_says("let me in", user_id="6660", chat_id="6660")
    await asyncio.sleep(0.2)
    assert h.chat.sent == [] and h.model.requests == []


async def test_admin_approves_and_user_can_chat_nonadmin_refused(make_gateway) -> None:
    h = await make_gateway(PAIRING)
    await h.chat.user_says("hi", user_id="2001", chat_id="2001")
    await _settle(h, 1)
    (code,) = _codes(h)
    # an allowed user who is not an admin cannot approve
    await h.chat.user_says(f"/pair approve {code}", user_id="1001", chat_id="1001")
    await _settle(h, 2)
    assert h.chat.sent[1].text == "Only gateway admins can approve pairing codes."
    await h.chat.user_says("still me", user_id="2001", chat_id="2001")
    await asyncio.sleep(0.2)
    assert h.model.requests == []
    # the admin approves (dashes and case do not matter)
    await h.chat.user_says(f"/pair approve {code[:4].lower()}-{code[4:]}", user_id="9000", chat_id="9000")
    await _settle(h, 4)
    by_chat = {s.chat_id: s.text for s in h.chat.sent[2:]}
    assert by_chat["9000"].startswith("Approved telegram user 2001")
    assert by_chat["2001"] == "You're approved: you can chat with me now."
    await h.chat.user_says("now can I talk?", user_id="2001", chat_id="2001")
    await h.chat.wait_for(lambda: h.chat.final_texts("2001")[-1] == "Echo: now can I talk?")
    assert len(h.model.requests) == 1


async def test_expired_code_rejected_and_lockout_after_five_failures(make_gateway) -> None:
    h = await make_gateway()
    pairing = PairingStore(h.gateway.store, ttl=60, max_pending=3)
    now = time.time()
    code = await pairing.issue("telegram", "3001", "ana", "3001", now=now - 120)
    assert code is not None
    expired = await pairing.approve(code, "cli", now=now)
    assert not expired.ok and "expired" in expired.message
    assert not await pairing.is_approved("telegram", "3001")
    for _ in range(4):
        assert not (await pairing.approve("ZZZZZZZZ", "cli", now=now)).ok
    fresh = await PairingStore(h.gateway.store, ttl=7200).issue("telegram", "3002", "bo", "3002", now=now)
    assert fresh is not None
    locked = await pairing.approve(fresh, "cli", now=now)
    assert not locked.ok and "locked" in locked.message
    assert (await pairing.approve(fresh, "cli", now=now + 3601)).ok
    assert await pairing.is_approved("telegram", "3002")
    assert await pairing.revoke("telegram", "3002") and not await pairing.is_approved("telegram", "3002")


async def test_cli_pairing_list_and_approve(make_gateway, tmp_path: Path) -> None:
    h = await make_gateway(PAIRING)
    await h.chat.user_says("hi", user_id="2001", chat_id="2001")
    await _settle(h, 1)
    (code,) = _codes(h)
    config = tmp_path / "cli.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": f"sqlite:///{tmp_path}/state.db"}}))
    env = {**os.environ, "HERMES_GATEWAY_HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", "pairing", *args, "--config", str(config)],
                              capture_output=True, text=True, timeout=60, env=env)

    listed = await asyncio.to_thread(cli, "list")
    assert f"{code[:4]}-{code[4:]}  telegram:2001" in listed.stdout
    approved = await asyncio.to_thread(cli, "approve", code)
    assert approved.returncode == 0, approved.stderr
    # the running gateway delivers the approval notice the CLI queued
    await h.chat.wait_for(lambda: any(s.text.startswith("You're approved") for s in h.chat.sent))
    assert (await asyncio.to_thread(cli, "approve", code)).returncode == 1


async def test_inbound_rate_limit_with_one_polite_notice(make_gateway) -> None:
    h = await make_gateway({"limits": {"user_messages_per_minute": 1, "user_burst": 2}})
    results = [await h.chat.user_says(f"msg {i}") for i in range(5)]
    assert [r is not None for r in results] == [True, True, False, False, False]
    await h.chat.wait_for(lambda: len(h.chat.sent) == 3)
    await asyncio.sleep(0.2)
    notices = [s.text for s in h.chat.sent if "faster than I can answer" in s.text]
    assert len(notices) == 1 and len(h.chat.sent) == 3
    assert len(h.model.requests) == 2
    # another user is not affected
    assert await h.chat.user_says("hi", user_id="1002", chat_id="200") is not None


async def test_run_tool_call_budget_ends_the_run_with_a_clear_message(make_gateway) -> None:
    h = await make_gateway({"limits": {"run_max_tool_calls": 2}},
                           responder=lambda req: tool_call("todo", {"action": "list"}))
    await h.chat.user_says("loop forever")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.sent[0].text == "I stopped: this request needed more than 2 tool calls."
    run = (await h.gateway.store.list_runs())[0]
    assert run.status == "completed" and len(run.tool_calls) == 2


async def test_user_hourly_budget_refuses_new_runs(make_gateway) -> None:
    h = await make_gateway({"limits": {"user_max_model_calls_per_hour": 2}},
                           responder=rules((r"tool", tool_call("todo", {"action": "list"}))))
    await h.chat.user_says("use a tool")  # two model calls: tool turn + answer
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    await h.chat.user_says("and again")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    assert "this hour's limit of model calls" in h.chat.sent[1].text
    assert len(h.model.requests) == 2
    await h.chat.user_says("other user", user_id="1002", chat_id="200")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 3)
    assert h.chat.sent[2].text == "Echo: other user"


# -- the authorizer on its own, case by case (each test names the one-line bug it catches) -------------------

ALLOW, DENY, PAIR = Decision.ALLOW, Decision.DENY, Decision.PAIR


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _authorizer(auth: dict[str, Any], pairing: PairingStore | None = None,
                clock: _Clock | None = None) -> Authorizer:
    return Authorizer(AuthSettings.model_validate(auth), pairing, clock or _Clock())


async def _decide(auth: Authorizer, platform: str, user: str, chat: str | None = None) -> Decision:
    """The decision for ``user`` writing in a DM, or in the group ``chat``."""
    event = MessageEvent(platform=platform, event_id=uuid.uuid4().hex, chat_id=chat or user,
                         chat_type="group" if chat else "dm", user_id=user, user_name=None, text="hi")
    return await auth.check(event)


@pytest.fixture
async def pairing(tmp_path: Path) -> AsyncIterator[PairingStore]:
    store = await Store.open(f"sqlite:///{tmp_path}/auth.db")
    yield PairingStore(store)
    await store.close()


async def _approve(pairing: PairingStore, platform: str, user: str) -> None:
    code = await pairing.issue(platform, user, None, user)
    assert code is not None and (await pairing.approve(code, "test")).ok


@pytest.mark.parametrize("platform", _CHAT_PLATFORMS)
@pytest.mark.parametrize("dm_pairing", [False, True])
async def test_a_chat_platform_without_an_auth_entry_denies_everyone(platform: str, dm_pairing: bool,
                                                                     pairing: PairingStore) -> None:
    """Deny by default, whatever the other platforms allow: a stranger in a DM is at most offered a code.

    Fails on the mutant ``if pa is None or (pa.allow_all or ...)`` for ``if pa is not None and (...)`` in
    ``Authorizer.check`` (no entry: allow)."""
    others = {p: {"allow_all": True, "allowed_users": ["2001"], "allowed_chats": ["-100"]}
              for p in _CHAT_PLATFORMS if p != platform}
    auth = _authorizer({"platforms": others, "dm_pairing": dm_pairing}, pairing)
    assert await _decide(auth, platform, "2001", chat="-100") == DENY
    assert await _decide(auth, platform, "2001") == (PAIR if dm_pairing else DENY)
    assert [await _decide(auth, other, "2001") for other in others] == [ALLOW] * len(others)


async def test_a_stranger_in_a_dm_is_offered_a_code_only_with_dm_pairing(pairing: PairingStore) -> None:
    """Fails on the mutant ``if self.cfg.dm_pairing or event.chat_type == "dm" ...`` in ``Authorizer.check``."""
    off, on = _authorizer({}, pairing), _authorizer({"dm_pairing": True}, pairing)
    assert [await _decide(off, "telegram", "2001"), await _decide(on, "telegram", "2001")] == [DENY, PAIR]
    assert await _decide(on, "telegram", "2001", chat="-100") == DENY


async def test_webhook_and_cron_events_pass_on_their_signature_or_origin() -> None:
    """Fails on the mutant ``if event.platform == "webhook":`` for ``if event.platform in SIGNED_PLATFORMS:``."""
    auth = _authorizer({"admins": ["telegram:1"]})
    assert [await _decide(auth, p, "github") for p in ("webhook", "cron")] == [ALLOW, ALLOW]


async def test_allowlists_admit_their_users_and_chats_on_their_platform_only() -> None:
    """Fails on the mutant ``event.user_id in pa.allowed_chats`` for ``event.chat_id in pa.allowed_chats``."""
    auth = _authorizer({"platforms": {"telegram": {"allowed_users": ["1001"], "allowed_chats": ["-100"]}}})
    assert await _decide(auth, "telegram", "1001") == ALLOW
    assert await _decide(auth, "telegram", "1001", chat="-200") == ALLOW  # the user, in any chat
    assert await _decide(auth, "telegram", "3003", chat="-100") == ALLOW  # anyone, in the chat
    assert await _decide(auth, "telegram", "3003", chat="-200") == DENY
    assert await _decide(auth, "telegram", "3003") == DENY
    assert [await _decide(auth, p, "1001", chat="-100") for p in ("discord", "slack")] == [DENY, DENY]


async def test_the_denylist_wins_over_allowlists_admins_and_allow_all(pairing: PairingStore) -> None:
    """Fails on the mutant ``if self.is_denied(event) and not self.is_admin(event.platform, event.user_id):``
    (an admin exempt from the denylist) in ``Authorizer.check``."""
    await _approve(pairing, "telegram", "6660")
    auth = _authorizer({"admins": ["telegram:6660"], "dm_pairing": True, "platforms": {"telegram": {
        "allow_all": True, "allowed_users": ["6660"], "allowed_chats": ["-100"], "denied_users": ["6660"]}}},
        pairing)
    assert await _decide(auth, "telegram", "6660") == DENY  # not even a pairing code
    assert await _decide(auth, "telegram", "6660", chat="-100") == DENY
    assert await _decide(auth, "telegram", "1001") == ALLOW
    assert await _decide(auth, "discord", "6660") == PAIR  # the denylist is the platform's own


async def test_admins_are_allowed_on_their_platform_only() -> None:
    """Fails on the mutant ``return any(a.endswith(f":{user_id}") for a in self._admins)`` in ``is_admin``."""
    auth = _authorizer({"admins": ["telegram:9000"]})
    assert [await _decide(auth, "telegram", "9000"), await _decide(auth, "telegram", "9000", chat="-1")] == [
        ALLOW, ALLOW]
    assert [await _decide(auth, p, "9000") for p in ("discord", "slack")] == [DENY, DENY]
    assert auth.is_admin("telegram", "9000") and not auth.is_admin("discord", "9000")


async def test_allow_all_admits_everyone_on_its_platform_only() -> None:
    """Fails on the mutant ``any(p.allow_all for p in self.cfg.platforms.values())`` for ``pa.allow_all``."""
    auth = _authorizer({"platforms": {"discord": {"allow_all": True}, "slack": {"allowed_users": ["U1"]}}})
    assert [await _decide(auth, "discord", "7777"), await _decide(auth, "discord", "7777", chat="C9")] == [
        ALLOW, ALLOW]
    assert [await _decide(auth, p, "7777") for p in ("telegram", "slack")] == [DENY, DENY]


async def test_a_pairing_approval_admits_that_user_on_that_platform_only(pairing: PairingStore) -> None:
    """The approval is remembered per platform and user: the same id on another platform is someone else.

    Fails on the mutant ``key = ("", user_id)`` for ``key = (platform, user_id)`` in ``_is_approved`` (the
    cached approval leaks to the other platform)."""
    await _approve(pairing, "telegram", "2001")
    auth = _authorizer({"dm_pairing": True}, pairing)
    assert await _decide(auth, "telegram", "2001") == ALLOW
    assert await _decide(auth, "telegram", "2001", chat="-100") == ALLOW
    assert await _decide(auth, "discord", "2001") == PAIR
    assert await _decide(auth, "discord", "2001", chat="-100") == DENY
    assert await _decide(auth, "telegram", "2002") == PAIR


async def test_a_revoked_approval_stops_working_within_the_cache_ttl(pairing: PairingStore) -> None:
    """Approvals are cached for 30 s: a revocation takes effect by then, not at the next restart.

    Fails on the mutant ``if seen is not None:`` for ``if seen is not None and self.clock() - seen <
    _APPROVED_CACHE_SECONDS:`` in ``_is_approved`` (the cache never expires)."""
    clock = _Clock()
    await _approve(pairing, "telegram", "2001")
    auth = _authorizer({}, pairing, clock)
    assert await _decide(auth, "telegram", "2001") == ALLOW
    assert await pairing.revoke("telegram", "2001")
    clock.now += 29.9
    assert await _decide(auth, "telegram", "2001") == ALLOW  # cached
    clock.now += 0.1
    assert await _decide(auth, "telegram", "2001") == DENY
    clock.now += 100
    assert await _decide(auth, "telegram", "2001") == DENY


class _CountingPairing(PairingStore):
    """The real pairing store, counting the authorizer's lookups in it."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.lookups: list[str] = []

    async def is_approved(self, platform: str, user_id: str) -> bool:
        self.lookups.append(user_id)
        return await super().is_approved(platform, user_id)


async def test_the_approval_cache_keeps_the_latest_approvals_up_to_its_size(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is bounded and evicts the approval cached longest ago: a user approved within 30 s is not looked
    up again while the cache has room for them.

    Fails on the mutants ``while len(self._approved) >= _APPROVED_CACHE_SIZE:`` (one short: the first user is
    evicted as soon as the cache is full) and ``self._approved.popitem(last=True)`` (the approval just cached is
    the one evicted) in ``Authorizer._is_approved``."""
    monkeypatch.setattr("gateway.auth._APPROVED_CACHE_SIZE", 2)
    store = await Store.open(f"sqlite:///{tmp_path}/auth.db")
    try:
        pairing = _CountingPairing(store)
        for user in ("a", "b", "c"):
            await _approve(pairing, "telegram", user)
        auth = _authorizer({}, pairing)

        async def lookups(*users: str) -> list[str]:
            pairing.lookups.clear()
            assert [await _decide(auth, "telegram", u) for u in users] == [ALLOW] * len(users)
            return pairing.lookups

        assert await lookups("a", "b", "a", "b") == ["a", "b"]
        assert await lookups("c", "c", "b") == ["c"]  # c evicts a, the oldest
        assert await lookups("a") == ["a"]
    finally:
        await store.close()
