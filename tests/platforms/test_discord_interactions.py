"""Discord buttons and slash commands: real discord.py against the simulator's interactions.

Buttons are message components; a press is an INTERACTION_CREATE the adapter acknowledges (deferred update)
and hands over as a message. Slash commands are registered through discord.py's CommandTree; an invocation is
acknowledged with a deferred response that the reply replaces, also after a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest

import tests.platforms.test_discord as discord_suite
from gateway.sim.discord_api import ALICE_ID, BOB_ID, BOT_ID, GENERAL_ID, GUILD_ID, RANDOM_ID, DiscordSimulator
from gateway.state_stores import PlatformStateStore
from gateway.store import Store
from platforms.base import Accepted, AdapterState, Choice, GatewayClosing, MenuCommand, MessageEvent
from platforms.discord import DiscordAdapter, DiscordSettings, delivery_nonce
from tests.platforms.test_discord import BACKOFF, HEARTBEAT_TIMEOUT, _Inbox

# the Discord fixtures of test_discord.py
sim, connect, _discord_endpoints = discord_suite.sim, discord_suite.connect, discord_suite._discord_endpoints

LONG_COMMAND = "/approve once " + "x" * 120  # too long for a custom id (100)
CHOICES = [Choice("Approve once", "/approve once 3f2a", "primary"), Choice("Deny", "/deny 3f2a", "danger"),
           Choice("Later"), Choice("Approve everything like this", LONG_COMMAND)]
MENU = [MenuCommand("status", "Show the session status"), MenuCommand("model", "Switch the model " + "m" * 120),
        MenuCommand("Bad Name", "refused: upper case and a space"), MenuCommand("approve", "Approve a tool call"),
        MenuCommand("x" * 33, "refused: too long")]


class _Gate(_Inbox):
    """The inbox stand-in, refusing events (None, as the gateway does for one it will not take), or shutting down
    (GatewayClosing) once ``closing`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    async def __call__(self, event: MessageEvent) -> Accepted | None:  # type: ignore[override]
        await super().__call__(event)
        if self.closing:
            raise GatewayClosing("the gateway is shutting down")
        return None


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[PlatformStateStore]:
    store = await Store.open(f"sqlite:///{tmp_path}/state.db")
    yield PlatformStateStore(store)
    await store.close()


def _settings(sim: DiscordSimulator, **overrides: Any) -> DiscordSettings:
    return DiscordSettings(**{"token": sim.token, "api_base_url": sim.api_base_url, "gateway_url": sim.gateway_url,
                              "guild_ready_timeout": 0.05, "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                              "reconnect_backoff": BACKOFF, **overrides})


async def _started(sim: DiscordSimulator, inbox: Any, state: PlatformStateStore | None = None,
                   **settings: Any) -> DiscordAdapter:
    adapter = DiscordAdapter(_settings(sim, **settings))
    adapter.state_store = state
    await adapter.connect(inbox)
    await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED and sim.connections)
    await sim.wait_for_ready()
    return adapter


def _buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for row in message["components"] for b in row["components"]]


# --------------------------------------------------------------------------- buttons


async def test_send_choices_renders_buttons_exactly_once(sim: DiscordSimulator, connect: Any) -> None:
    adapter, _ = await connect()
    assert adapter.can_buttons
    meta = {"delivery_id": "run:r1:0", "part_index": "0", "parts_total": "1"}
    sim.drop_next("create_message", after_apply=True)  # posted, answer lost: the retry must not post twice
    lost = await adapter.send_choices(str(GENERAL_ID), "Run `rm -rf build`?", CHOICES, metadata=meta)
    sent = await adapter.send_choices(str(GENERAL_ID), "Run `rm -rf build`?", CHOICES,
                                      metadata={**meta, "in_doubt": "1"})
    assert lost.retryable and sent.success
    [message] = sim.bot_messages(GENERAL_ID)
    assert message["id"] == sent.message_id and message["content"] == "Run `rm -rf build`?"
    body = sim.calls_of("create_message")[-1].body
    assert (body["nonce"], body["enforce_nonce"]) == (delivery_nonce("run:r1:0"), True)
    assert [row["type"] for row in message["components"]] == [1]  # one action row
    buttons = _buttons(message)
    assert [(b["type"], b["label"], b["style"]) for b in buttons] == [
        (2, "Approve once", 1), (2, "Deny", 4), (2, "Later", 2), (2, "Approve everything like this", 2)]
    assert [b["custom_id"] for b in buttons[:3]] == ["hermes:/approve once 3f2a", "hermes:/deny 3f2a", "hermes:Later"]
    assert buttons[3]["custom_id"].startswith("hermes#") and len(buttons[3]["custom_id"]) <= 100
    six = await adapter.send_choices(str(GENERAL_ID), "pick", [Choice(f"option {n}") for n in range(6)])
    rows = sim.bot_messages(GENERAL_ID)[-1]["components"]
    assert six.success and [len(row["components"]) for row in rows] == [5, 1]  # five buttons a row at most


async def test_a_press_arrives_as_a_message_from_the_presser(sim: DiscordSimulator, connect: Any) -> None:
    adapter, inbox = await connect()
    sent = await adapter.send_choices(str(GENERAL_ID), "Run it?", CHOICES)
    press = sim.user_presses(int(sent.message_id or 0), "hermes:/approve once 3f2a", user_id=BOB_ID)
    await sim.wait_for(lambda: inbox.events)
    iid = int(press["id"])
    callback = await sim.wait_for_callback(iid)
    assert callback.type == 6  # DEFERRED_UPDATE_MESSAGE
    [event] = inbox.events
    assert event == MessageEvent(
        platform="discord", event_id=f"press:{iid}", chat_id=str(GENERAL_ID), chat_type="group",
        user_id=str(BOB_ID), user_name="Bob", text="/approve once 3f2a", message_id=None, thread_id=None,
        reply_to_message_id=None, mentions_bot=True, attachments=(),
        received_at=discord.utils.snowflake_time(iid),
        metadata={"pressed_message_id": sent.message_id or "", "channel_id": str(GENERAL_ID),
                  "guild_id": str(GUILD_ID)})
    assert event.dedupe_key == f"discord:press:{iid}"
    # the long command comes back whole, from the adapter's memory (no state store here)
    sim.user_presses(int(sent.message_id or 0), label="Approve everything like this")
    await sim.wait_for(lambda: len(inbox.events) == 2)
    assert inbox.events[1].text == LONG_COMMAND
    # a new process without a state store has only the pressed button's label to go by
    await adapter.disconnect()
    _, fresh = await connect()
    sim.user_presses(int(sent.message_id or 0), label="Approve everything like this")
    await sim.wait_for(lambda: fresh.events)
    assert fresh.events[0].text == "Approve everything like this"


async def test_presses_in_threads_and_dms_are_placed_like_messages(sim: DiscordSimulator, connect: Any) -> None:
    adapter, inbox = await connect()
    thread = sim.create_thread("ideas")
    await asyncio.sleep(0.05)  # THREAD_CREATE reaches the client's cache
    in_thread = await adapter.send_choices(str(GENERAL_ID), "Which?", [Choice("A"), Choice("B")],
                                           metadata={"thread_id": str(thread)})
    dm = str(sim.dm_channel_id())
    in_dm = await adapter.send_choices(dm, "Which?", [Choice("A"), Choice("B")])
    sim.user_presses(int(in_thread.message_id or 0), "hermes:B")
    await sim.wait_for(lambda: inbox.events)
    sim.user_presses(int(in_dm.message_id or 0), "hermes:A")
    await sim.wait_for(lambda: len(inbox.events) == 2)
    e_thread, e_dm = inbox.events
    assert (e_thread.chat_id, e_thread.thread_id, e_thread.chat_type, e_thread.text) == (
        str(GENERAL_ID), str(thread), "group", "B")
    assert e_thread.metadata["pressed_message_id"] == in_thread.message_id
    assert (e_dm.chat_id, e_dm.thread_id, e_dm.chat_type, e_dm.user_id, e_dm.user_name, e_dm.text) == (
        dm, None, "dm", str(ALICE_ID), "Alice", "A")
    assert e_dm.metadata == {"pressed_message_id": in_dm.message_id, "channel_id": dm}
    # the gateway answers a press by editing the pressed message: that removes its buttons
    edited = await adapter.edit_message(str(GENERAL_ID), e_thread.metadata["pressed_message_id"], "Chose B",
                                        metadata={"thread_id": str(thread)})
    message = sim.messages(thread)[-1]
    assert edited.success and message["content"] == "Chose B" and message["components"] == []
    assert sim.calls_of("edit_message")[-1].body["components"] == []


async def test_refused_and_failed_presses_are_still_acknowledged(sim: DiscordSimulator) -> None:
    inbox = _Gate()
    adapter = await _started(sim, inbox, allowed_channels=frozenset({str(GENERAL_ID)}))
    rejected: list[str] = []
    adapter.on_rejected = lambda platform, reason: rejected.append(reason)
    try:
        sent = await adapter.send_choices(str(GENERAL_ID), "Sure?", [Choice("Yes", "/yes")])
        elsewhere = await adapter.send_choices(str(RANDOM_ID), "Sure?", [Choice("Yes", "/yes")])
        refused = sim.user_presses(int(sent.message_id or 0), "hermes:/yes")
        filtered = sim.user_presses(int(elsewhere.message_id or 0), "hermes:/yes")
        for press in (refused, filtered):
            assert (await sim.wait_for_callback(int(press["id"]))).type == 6
        await sim.wait_for(lambda: inbox.events)
        inbox.closing = True
        closing = sim.user_presses(int(sent.message_id or 0), "hermes:/yes")
        assert (await sim.wait_for_callback(int(closing["id"]))).type == 6
        [note] = await sim.wait_for(lambda: sim.followups(int(closing["id"])))  # Discord will not deliver it again
        assert (note["content"], note["flags"] & 64) == ("The gateway is restarting; press again in a moment.", 64)
        await asyncio.sleep(0.1)
        assert [e.event_id for e in inbox.events] == [f"press:{refused['id']}", f"press:{closing['id']}"]
        assert rejected == ["channel_not_allowed"]
        assert adapter.state is AdapterState.CONNECTED
    finally:
        await adapter.disconnect()


async def test_discord_refuses_a_second_callback(sim: DiscordSimulator, connect: Any) -> None:
    adapter, _ = await connect()
    sent = await adapter.send_choices(str(GENERAL_ID), "Sure?", [Choice("Yes", "/yes")])
    press = sim.user_presses(int(sent.message_id or 0), "hermes:/yes")
    await sim.wait_for_callback(int(press["id"]))
    async with aiohttp.ClientSession() as http:
        url = f"{sim.api_base_url}/interactions/{press['id']}/{press['token']}/callback"
        async with http.post(url, json={"type": 6}) as again:
            assert (again.status, (await again.json())["code"]) == (400, 40060)
        async with http.post(url.replace(press["token"], "forged"), json={"type": 6}) as forged:
            assert (forged.status, (await forged.json())["code"]) == (404, 10062)
    assert len(sim.callbacks(int(press["id"]))) == 1


# --------------------------------------------------------------------------- slash commands


async def test_set_commands_registers_globally_and_skips_refused_names(sim: DiscordSimulator, connect: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    adapter, _ = await connect()
    with caplog.at_level(logging.WARNING, "platforms.discord_interactions"):
        await adapter.set_commands(MENU)
    registered = sim.application_commands()
    assert [c["name"] for c in registered] == ["status", "model", "approve"]
    assert registered[0]["description"] == "Show the session status"
    assert len(registered[1]["description"]) == 100 and registered[1]["description"].endswith("…")
    assert all(c["type"] == 1 and c["options"] == [{"type": 3, "name": "args", "required": False,
                                                     "description": "the rest of the command line"}]
               for c in registered)
    assert "'Bad Name'" in caplog.text and repr("x" * 33) in caplog.text
    assert [c.route for c in sim.rest_calls if "commands" in c.route] == ["put_global_commands"]
    assert sim.application_commands(GUILD_ID) == []
    await adapter.set_commands(MENU[:1])  # a bulk overwrite: what is no longer listed goes
    assert [c["name"] for c in sim.application_commands()] == ["status"]


async def test_set_commands_per_guild_and_before_connect(sim: DiscordSimulator) -> None:
    adapter = DiscordAdapter(_settings(sim, command_guilds=(str(GUILD_ID),)))
    await adapter.set_commands(MENU)  # not connected yet: published once logged in
    assert not sim.rest_calls
    await adapter.connect(_Inbox(), receive=False)
    try:
        assert [c["name"] for c in sim.application_commands(GUILD_ID)] == ["status", "model", "approve"]
        assert all(c["guild_id"] == str(GUILD_ID) for c in sim.application_commands(GUILD_ID))
        assert sim.application_commands() == []
        assert [c.path for c in sim.calls_of("put_guild_commands")] == [f"/applications/{BOT_ID}/guilds/"
                                                                        f"{GUILD_ID}/commands"]
    finally:
        await adapter.disconnect()


async def test_a_slash_command_becomes_a_message_and_its_reply_edits_the_response(sim: DiscordSimulator,
                                                                                  connect: Any) -> None:
    adapter, inbox = await connect()
    await adapter.set_commands(MENU)
    invoked = sim.user_invokes("status", user_id=BOB_ID)
    iid = int(invoked["id"])
    await sim.wait_for(lambda: inbox.events)
    assert (await sim.wait_for_callback(iid)).type == 5  # DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE
    [event] = inbox.events
    assert event == MessageEvent(
        platform="discord", event_id=f"command:{iid}", chat_id=str(GENERAL_ID), chat_type="group",
        user_id=str(BOB_ID), user_name="Bob", text="/status", message_id=f"interaction:{iid}", thread_id=None,
        mentions_bot=True, received_at=discord.utils.snowflake_time(iid),
        metadata={"channel_id": str(GENERAL_ID), "guild_id": str(GUILD_ID)})
    assert (await adapter.set_reaction(str(GENERAL_ID), event.message_id or "", "👀")).success
    assert not sim.calls_of("add_reaction")  # nothing to react on: ignored

    meta = {"delivery_id": "run:r1:0"}
    reply = await adapter.send(str(GENERAL_ID), "**All good**", reply_to=event.message_id, metadata=meta)
    original = sim.original_response(iid)
    assert original is not None and reply.success and reply.message_id == original["id"]
    assert original["content"] == "**All good**" and not original["flags"] & 128  # no longer "thinking..."
    again = await adapter.send(str(GENERAL_ID), "**All good**", reply_to=event.message_id,
                               metadata={**meta, "in_doubt": "1"})  # a retried part edits again
    assert again.message_id == original["id"] and len(sim.bot_messages(GENERAL_ID)) == 1
    assert not sim.calls_of("create_message")
    # another delivery naming the same command posts in the channel, replying to the answer
    other = await adapter.send(str(GENERAL_ID), "later news", reply_to=event.message_id,
                               metadata={"delivery_id": "run:r2:0"})
    assert other.success and sim.original_response(iid)["content"] == "**All good**"  # type: ignore[index]
    assert sim.bot_messages(GENERAL_ID)[-1]["message_reference"]["message_id"] == original["id"]

    sim.user_invokes("model", {"args": "gpt-5  fast "}, channel_id=sim.dm_channel_id())
    await sim.wait_for(lambda: len(inbox.events) == 2)
    assert (inbox.events[1].text, inbox.events[1].chat_type) == ("/model gpt-5  fast", "dm")


async def test_the_reply_reaches_the_response_after_a_restart(sim: DiscordSimulator, state: PlatformStateStore,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    inbox = _Inbox()
    first = await _started(sim, inbox, state)
    caplog.set_level(logging.DEBUG)
    try:
        await first.set_commands(MENU)
        invoked = sim.user_invokes("status")
        await sim.wait_for(lambda: inbox.events)
        long_choice = await first.send_choices(str(GENERAL_ID), "Sure?", CHOICES)
    finally:
        await first.disconnect()
    second = await _started(sim, inbox, state)  # a new process: nothing in memory, the same store
    try:
        reply = await second.send(str(GENERAL_ID), "after the restart", reply_to=inbox.events[0].message_id,
                                  metadata={"delivery_id": "run:r1:0"})
        assert reply.success and sim.original_response(int(invoked["id"]))["content"] == "after the restart"  # type: ignore[index]
        assert not sim.calls_of("create_message")[1:]  # only the choices were posted in the channel
        sim.user_presses(int(long_choice.message_id or 0), label="Approve everything like this")
        await sim.wait_for(lambda: len(inbox.events) == 2)
        assert inbox.events[1].text == LONG_COMMAND  # the long text comes back from the store
    finally:
        await second.disconnect()
    assert invoked["token"] not in caplog.text  # never logged, discord.py's request logs included
    assert any("/webhooks/" in r.getMessage() for r in caplog.records)


async def test_unknown_expired_or_refused_commands(sim: DiscordSimulator) -> None:
    inbox = _Gate()
    adapter = await _started(sim, inbox)
    try:
        await adapter.set_commands(MENU)
        unknown = await adapter.send(str(GENERAL_ID), "to nobody", reply_to="interaction:123456789012345678")
        assert unknown.success and sim.bot_messages(GENERAL_ID)[-1]["content"] == "to nobody"
        assert "message_reference" not in sim.bot_messages(GENERAL_ID)[-1]

        refused = sim.user_invokes("approve", {"args": "once"})
        await sim.wait_for(lambda: inbox.events)
        iid = int(refused["id"])
        await sim.wait_for(lambda: sim.calls_of("delete_original"))
        assert sim.callbacks(iid)[0].type == 5 and sim.original_response(iid) is None  # "thinking..." taken away
        inbox.closing = True  # shutting down: the invoker is told to try again
        closing = int(sim.user_invokes("status")["id"])
        note = "The gateway is restarting; run the command again in a moment."
        await sim.wait_for(lambda: (sim.original_response(closing) or {}).get("content") == note)
        assert sim.callbacks(closing)[0].type == 5 and len(sim.calls_of("delete_original")) == 1

        sim.expire_interaction(iid)  # as 15 minutes later: the token answers 401
        late = await adapter.send(str(GENERAL_ID), "too late", reply_to=f"interaction:{iid}")
        assert late.success and sim.bot_messages(GENERAL_ID)[-1]["content"] == "too late"
        assert sim.calls_of("edit_original")[-1].status == 401
    finally:
        await adapter.disconnect()


async def test_choices_can_answer_a_slash_command(sim: DiscordSimulator, connect: Any) -> None:
    adapter, inbox = await connect()
    await adapter.set_commands(MENU)
    iid = int(sim.user_invokes("approve")["id"])
    await sim.wait_for(lambda: inbox.events)
    sent = await adapter.send_choices(str(GENERAL_ID), "Approve `ls`?", CHOICES[:2], reply_to=f"interaction:{iid}",
                                      metadata={"delivery_id": "run:r1:0"})
    original = sim.original_response(iid)
    assert original is not None and sent.message_id == original["id"] and not sim.calls_of("create_message")
    assert [b["custom_id"] for b in _buttons(original)] == ["hermes:/approve once 3f2a", "hermes:/deny 3f2a"]
    press = sim.user_presses(int(original["id"]), "hermes:/deny 3f2a")
    await sim.wait_for(lambda: len(inbox.events) == 2)
    assert (inbox.events[1].text, inbox.events[1].metadata["pressed_message_id"]) == ("/deny 3f2a", original["id"])
    assert sim.callbacks(int(press["id"]))[0].type == 6


async def test_simulator_webhooks_and_command_rules(sim: DiscordSimulator, connect: Any) -> None:
    """What the adapter does not use but Discord does: GET @original, follow-ups (the first one after a deferred
    response replaces it), and the command rules Discord enforces on a bulk overwrite."""
    adapter, _ = await connect()
    await adapter.set_commands(MENU)
    invoked = sim.user_invokes("status")
    iid = int(invoked["id"])
    await sim.wait_for_callback(iid)
    hook = f"{sim.api_base_url}/webhooks/{BOT_ID}/{invoked['token']}"
    bot = {"Authorization": f"Bot {sim.token}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{hook}/messages/@original") as r:
            assert r.status == 200 and (await r.json())["flags"] & 128  # still "thinking..."
        async with http.post(hook, params={"wait": "true"}, json={"content": "first"}) as r:
            assert r.status == 200 and (await r.json())["id"] == sim.original_response(iid)["id"]  # type: ignore[index]
        async with http.post(hook, params={"wait": "true"}, json={"content": "second"}) as r:
            assert r.status == 200 and [m["content"] for m in sim.followups(iid)] == ["second"]
        async with http.post(f"{sim.api_base_url}/webhooks/{BOT_ID}/forged", json={"content": "x"}) as r:
            assert (r.status, (await r.json())["code"]) == (404, 10015)
        commands = f"{sim.api_base_url}/applications/{BOT_ID}/commands"
        for bad in ({"name": "Status", "description": "upper case"}, {"name": "x" * 33, "description": "long"},
                    {"name": "ok", "description": ""}, {"name": "ok", "description": "d" * 101}):
            async with http.put(commands, json=[bad], headers=bot) as r:
                assert (r.status, (await r.json())["code"]) == (400, 50035), bad
        async with http.put(commands, json=[{"name": "état-2", "description": "unicode letters are fine"}],
                            headers=bot) as r:
            assert r.status == 200
        async with http.get(commands, headers=bot) as r:
            assert [c["name"] for c in await r.json()] == ["état-2"]
        async with http.put(f"{sim.api_base_url}/applications/{BOT_ID}/guilds/42/commands", json=[],
                            headers=bot) as r:
            assert (r.status, (await r.json())["code"]) == (404, 10004)
    sim.expire_interaction(iid)
    async with aiohttp.ClientSession() as http, http.get(f"{hook}/messages/@original") as r:
        assert (r.status, (await r.json())["code"]) == (401, 50027)
