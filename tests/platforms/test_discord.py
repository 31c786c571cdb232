"""The Discord adapter: real discord.py against the gateway/REST simulator, mostly through a real gateway.

No dpytest and no mocks of discord.py: the library logs in over REST, holds a real gateway websocket
(heartbeats, RESUME, op 7/9) and posts through its own rate limiter, all against 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from gateway.adapters import build_adapters, receives_on
from gateway.config import ConfigError, parse_config
from gateway.sim.discord_api import (
    ALICE_ID,
    BOB_ID,
    BOT_ID,
    GENERAL_ID,
    GUILD_ID,
    HELPER_BOT_ID,
    RANDOM_ID,
    AttachmentSpec,
    DiscordSimulator,
)
from gateway.sim.model_server import last_user_text, rules, text, tool_call
from gateway.state_stores import PlatformStateStore
from platforms.base import Accepted, AdapterState, MessageEvent
from platforms.discord import TOKEN_REJECTED, DiscordAdapter, DiscordSettings, DiscordStartupError, delivery_nonce

HEARTBEAT_MS = 500
HEARTBEAT_TIMEOUT = 0.75  # discord.py's zombie detection; 1.5 heartbeat intervals
BACKOFF = 0.05


@pytest.fixture(autouse=True)
def _discord_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter sets discord.py's process-wide URLs; whatever happens, put them back after each test."""
    monkeypatch.setattr(Route, "BASE", Route.BASE)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", DiscordWebSocket.DEFAULT_GATEWAY)


@pytest.fixture
async def sim() -> AsyncIterator[DiscordSimulator]:
    async with DiscordSimulator(heartbeat_interval=HEARTBEAT_MS) as s:
        yield s


def _platform(sim: DiscordSimulator, **overrides: Any) -> dict[str, Any]:
    return {"enabled": True, "token": sim.token, "api_base_url": sim.api_base_url, "guild_ready_timeout": 0.05,
            "heartbeat_timeout": HEARTBEAT_TIMEOUT, "reconnect_backoff": BACKOFF, **overrides}


Start = Callable[..., Awaitable[tuple[Any, DiscordAdapter]]]


@pytest.fixture
def start(sim: DiscordSimulator, make_gateway: Any) -> Start:
    """A gateway with Discord enabled against the simulator (the simulator outlives it), once connected."""

    async def _start(responder: Any = None, *, wait: bool = True, limits: dict[str, Any] | None = None,
                     **platform: Any) -> tuple[Any, DiscordAdapter]:
        h = await make_gateway({"platforms": {"discord": _platform(sim, **platform)},
                                "auth": {"platforms": {"discord": {"allowed_users": [str(ALICE_ID), str(BOB_ID)]}}},
                                "limits": limits or {}},
                               responder=responder)
        adapter = h.gateway.adapters["discord"]
        if wait:
            await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED)
        return h, adapter

    return _start


async def _readyz(h: Any) -> tuple[int, dict[str, Any]]:
    async with h.http.get(f"{h.base_url}/readyz") as r:
        return r.status, await r.json()


def _user_texts(h: Any) -> list[str]:
    return [last_user_text(r) for r in h.model.requests if r["messages"][-1]["role"] == "user"]


def _assert_tool_round_trip(h: Any, reply: dict[str, Any]) -> None:
    """The model called todo, got the tool's result back, and its final answer is what Discord got."""
    call, result = h.model.requests[-1]["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == "todo"
    assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert reply["content"] == "Done: " + result["content"][:200]


# --------------------------------------------------------------------------- round trips


async def test_dm_round_trip_with_a_tool_call(sim: DiscordSimulator, start: Start) -> None:
    h, _ = await start(rules((r"todo", tool_call("todo", {"action": "add", "items": ["buy milk"]}))))
    status, ready = await _readyz(h)
    assert status == 200 and ready["platforms"]["discord"]["state"] == "connected"
    asked = sim.user_sends_dm("please add a todo")
    reply = (await sim.wait_for_bot_messages(1, sim.dm_channel_id()))[0]
    _assert_tool_round_trip(h, reply)
    assert "buy milk" in reply["content"]  # the todo tool really stored the item
    assert reply["message_reference"]["message_id"] == asked["id"]
    body = sim.calls_of("create_message")[0].body
    assert body["allowed_mentions"] == {"parse": []}
    assert body["message_reference"]["fail_if_not_exists"] is False
    runs = (await (await h.http.get(f"{h.base_url}/runs", headers={"Authorization": "Bearer test-api-token"})).json())
    assert body["nonce"] == delivery_nonce(f"run:{runs['runs'][0]['id']}:0") and body["enforce_nonce"] is True
    assert [int(c.path.split("/")[2]) for c in sim.calls_of("typing")][:1] == [sim.dm_channel_id()]
    assert sim.calls_of("gateway_bot"), "without gateway_url the gateway is discovered over REST"


async def test_guild_needs_a_mention_or_a_reply_and_ignores_bots(sim: DiscordSimulator, start: Start) -> None:
    h, _ = await start(rules((r"^what is up$", tool_call("todo", {"action": "list"}))))
    sim.user_sends("talking among ourselves")
    sim.user_sends("bots talking to bots", user_id=HELPER_BOT_ID, mention_bot=True)
    asked = sim.user_sends("what is up", mention_bot=True)  # the rule matches only if the mention was stripped
    reply = (await sim.wait_for_bot_messages(1, GENERAL_ID))[0]
    _assert_tool_round_trip(h, reply)
    assert reply["message_reference"]["message_id"] == asked["id"]
    sim.user_sends("and a follow-up", reply_to=int(reply["id"]), ping_reply=False)  # a reply, no mention
    await sim.wait_for_bot_messages(2, GENERAL_ID)
    await asyncio.sleep(0.2)
    # the bot's own echoed messages started nothing either
    assert _user_texts(h) == ["what is up", "and a follow-up"]
    assert len(sim.bot_messages()) == 2


async def test_thread_sessions_are_separate(sim: DiscordSimulator, start: Start) -> None:
    h, _ = await start()
    thread = sim.create_thread("plans")
    sim.user_sends("remember apples", mention_bot=True)
    await sim.wait_for_bot_messages(1, GENERAL_ID)
    asked = sim.user_sends("what did I say", channel_id=thread, mention_bot=True)
    reply = (await sim.wait_for_bot_messages(1, thread))[0]
    assert reply["message_reference"]["message_id"] == asked["id"]
    in_thread = h.model.requests[-1]["messages"]
    assert not any("apples" in str(m.get("content")) for m in in_thread)
    sim.user_sends("what did I say", mention_bot=True)
    await sim.wait_for_bot_messages(2, GENERAL_ID)
    assert any("apples" in str(m.get("content")) for m in h.model.requests[-1]["messages"])
    whoami = sim.user_sends("/whoami", channel_id=thread, mention_bot=True)
    answer = (await sim.wait_for_bot_messages(2, thread))[1]
    assert f"Chat: {GENERAL_ID} (group)" in answer["content"] and f"Thread: {thread}" in answer["content"]
    assert answer["message_reference"]["message_id"] == whoami["id"]


async def test_text_commands_reach_the_shared_commands(sim: DiscordSimulator, start: Start) -> None:
    h, _ = await start()
    sim.user_sends_dm("my name is Ada")
    await sim.wait_for_bot_messages(1)
    sim.user_sends_dm("/new")
    answer = (await sim.wait_for_bot_messages(2))[1]
    assert answer["content"].startswith("Started a new conversation")
    sim.user_sends_dm("who am I")
    await sim.wait_for_bot_messages(3)
    assert not any("Ada" in str(m.get("content")) for m in h.model.requests[-1]["messages"])
    assert _user_texts(h) == ["my name is Ada", "who am I"]


async def test_a_long_answer_arrives_as_ordered_parts(sim: DiscordSimulator, start: Start) -> None:
    answer = "\n".join(f"line {i:04d} " + "x" * 40 for i in range(100))  # ~5,000 characters
    assert len(answer) > 5000
    await start(rules((r"long", text(answer))))
    asked = sim.user_sends_dm("a long one please")
    parts = await sim.wait_for_bot_messages(3)
    await asyncio.sleep(0.2)
    parts = sim.bot_messages()
    assert len(parts) == 3 and all(len(p["content"]) <= 2000 for p in parts)
    assert "".join(p["content"] for p in parts) == answer
    assert [int(p["id"]) for p in parts] == sorted(int(p["id"]) for p in parts)
    assert parts[0]["message_reference"]["message_id"] == asked["id"]
    assert all("message_reference" not in p for p in parts[1:])


@pytest.mark.parametrize(("allow_mentions", "allowed", "roles"), [
    (False, {"parse": []}, []),
    (True, {"parse": ["users", "roles"], "replied_user": True}, ["123"]),
])
async def test_mentions_in_answers_do_not_ping(sim: DiscordSimulator, start: Start, allow_mentions: bool,
                                               allowed: dict[str, Any], roles: list[str]) -> None:
    await start(rules((r"ping", text(f"@everyone look, <@&123> and <@{BOB_ID}>"))), allow_mentions=allow_mentions)
    sim.user_sends("ping them", mention_bot=True)
    reply = (await sim.wait_for_bot_messages(1, GENERAL_ID))[0]
    assert sim.calls_of("create_message")[0].body["allowed_mentions"] == allowed
    assert reply["mention_everyone"] is False  # never, even with allow_mentions
    assert reply["mention_roles"] == roles
    pinged = {u["id"] for u in reply["mentions"]}
    assert pinged == ({str(BOB_ID), str(ALICE_ID)} if allow_mentions else set())


# --------------------------------------------------------------------------- gateway resilience


async def test_resume_replays_missed_events_exactly_once(sim: DiscordSimulator, start: Start) -> None:
    h, adapter = await start()
    sim.user_sends_dm("first")
    await sim.wait_for_bot_messages(1)
    conn = sim.connections[-1]
    await sim.wait_for(lambda: conn.last_seq == 4)  # READY, GUILD_CREATE, "first", the bot's echoed reply
    cut_at = conn.last_seq
    sim.suspend_delivery()
    missed = [sim.user_sends_dm(f"missed {i}") for i in range(3)]
    sim.replay_overlap = 2  # the replay also repeats "first" and the echo, which were processed already
    sim.cut_connections(abrupt=True)
    resume = await sim.wait_for_op(6)
    assert resume.d["seq"] == cut_at
    replies = await sim.wait_for_bot_messages(4)
    resumed = sim.connections[-1]
    assert resumed.resumed_url and resumed.id == resume.connection
    replayed = [p["d"]["content"] for p in resumed.sent if p.get("t") == "MESSAGE_CREATE"][:5]
    assert replayed == ["first", "Echo: first", "missed 0", "missed 1", "missed 2"]
    await asyncio.sleep(0.3)
    assert _user_texts(h) == ["first", "missed 0", "missed 1", "missed 2"]
    assert [r["message_reference"]["message_id"] for r in sim.bot_messages()[1:]] == [m["id"] for m in missed]
    assert len(replies) == 4 and len(sim.identifies) == 1
    assert adapter.state is AdapterState.CONNECTED


async def test_withheld_acks_reconnect_within_two_heartbeats(sim: DiscordSimulator, start: Start) -> None:
    h, adapter = await start()
    loop = asyncio.get_running_loop()
    zombie_at = loop.time()
    assert sim.withhold_acks() == 1
    during = sim.user_sends_dm("said while the link was dead")  # waits in the session for the RESUME
    await sim.wait_for_op(6, timeout=2 * HEARTBEAT_MS / 1000)
    assert loop.time() - zombie_at < 2 * HEARTBEAT_MS / 1000
    reply = (await sim.wait_for_bot_messages(1))[0]
    assert reply["message_reference"]["message_id"] == during["id"]
    sim.user_sends_dm("and after")
    await sim.wait_for_bot_messages(2)
    assert _user_texts(h) == ["said while the link was dead", "and after"]
    assert len(sim.identifies) == 1 and adapter.state is AdapterState.CONNECTED


async def test_op7_and_resumable_op9_resume_the_session(sim: DiscordSimulator, start: Start) -> None:
    await start()
    sim.send_reconnect()
    await sim.wait_for_op(6, 1)
    await sim.wait_for_ready(2)
    sim.invalidate_sessions(resumable=True)
    await sim.wait_for_op(6, 2)
    await sim.wait_for_ready(3)
    sim.user_sends_dm("still there?")
    await sim.wait_for_bot_messages(1)
    assert len(sim.identifies) == 1
    assert [c.resumed_url for c in sim.connections] == [False, True, True]


async def test_invalid_session_reidentifies_and_backfills_the_gap(sim: DiscordSimulator, start: Start) -> None:
    h, _ = await start()
    sim.user_sends_dm("one")
    await sim.wait_for_bot_messages(1)
    sim.suspend_delivery()
    lost = sim.user_sends_dm("lost when the session ended")
    sim.invalidate_sessions(resumable=False)
    replies = await sim.wait_for_bot_messages(2)
    assert len(sim.identifies) == 2 and not sim.resumes
    assert replies[1]["message_reference"]["message_id"] == lost["id"]
    fetch = sim.calls_of("channel_messages")[-1]
    assert fetch.query["after"] == replies[0]["id"]  # the last message handled before the gap
    await asyncio.sleep(0.2)
    assert _user_texts(h) == ["one", "lost when the session ended"]


async def test_identify_storm_backs_off(sim: DiscordSimulator, start: Start) -> None:
    sim.reject_identify(4)  # op 9 instead of READY, four times
    _, adapter = await start()
    identifies = sim.identifies
    assert len(identifies) == 5
    # Each wait at least doubles the configured backoff's floor (0.75: its jitter). Only floors are asserted: a
    # loaded machine lengthens any gap, so a ratio between two measured gaps failed under load in CI.
    gaps = [b.t - a.t for a, b in itertools.pairwise(identifies)]
    for i, gap in enumerate(gaps):
        assert gap >= 0.75 * BACKOFF * 2**i, gaps
    assert adapter.state is AdapterState.CONNECTED


async def test_readiness_reports_the_gateway_connection_without_gating_on_it(sim: DiscordSimulator,
                                                                              start: Start) -> None:
    h, adapter = await start()
    sim.refuse_connections = True
    sim.cut_connections()
    await sim.wait_for(lambda: adapter.state is AdapterState.DISCONNECTED)
    status, ready = await _readyz(h)
    assert status == 200 and ready["platforms"]["discord"]["state"] == "disconnected"
    sim.refuse_connections = False
    await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED, timeout=5)
    status, ready = await _readyz(h)
    assert status == 200 and ready["platforms"]["discord"]["state"] == "connected"


# --------------------------------------------------------------------------- delivery


async def test_rate_limited_send_is_delivered_once_after_retry_after(sim: DiscordSimulator, start: Start) -> None:
    await start()
    sim.fail_next("create_message", status=429, retry_after=0.3)
    sim.user_sends_dm("hello")
    await sim.wait_for_bot_messages(1)
    await asyncio.sleep(0.2)
    calls = sim.calls_of("create_message")
    assert [c.status for c in calls] == [429, 200]
    assert calls[1].t - calls[0].t >= 0.3
    assert len(sim.bot_messages()) == 1


async def test_a_dropped_response_is_retried_with_the_same_nonce(sim: DiscordSimulator, start: Start) -> None:
    await start()
    sim.drop_next("create_message", after_apply=True)
    sim.user_sends_dm("hello")
    await sim.wait_for(lambda: [c.status for c in sim.calls_of("create_message")] == [None, 200], timeout=5)
    first, retry = sim.calls_of("create_message")
    assert first.outcome == "applied_dropped"
    assert first.body["nonce"] == retry.body["nonce"] and retry.body["enforce_nonce"] is True
    await asyncio.sleep(0.2)
    assert len(sim.bot_messages()) == 1
    assert retry.response["id"] == sim.bot_messages()[0]["id"]


async def test_a_server_error_is_retried(sim: DiscordSimulator, start: Start) -> None:
    await start()
    sim.fail_next("create_message", status=503, code=0)
    sim.user_sends_dm("hello")
    await sim.wait_for_bot_messages(1)
    assert [c.status for c in sim.calls_of("create_message")] == [503, 200]


async def test_a_bad_token_fails_discord_only(sim: DiscordSimulator, start: Start, caplog: pytest.LogCaptureFixture
                                             ) -> None:
    caplog.set_level(logging.ERROR, logger="gateway.app")
    h, adapter = await start(wait=False, token="not-the-token")
    assert adapter.state is AdapterState.FAILED and adapter.status()["last_error"] == TOKEN_REJECTED
    assert f"platform discord failed to start: {TOKEN_REJECTED}" in caplog.text
    status, ready = await _readyz(h)
    assert status == 200 and ready["platforms"]["discord"] == {
        "platform": "discord", "state": "failed", "receiving": False, "last_error": TOKEN_REJECTED}
    code, body = await h.post_webhook()
    assert code == 202
    assert (await h.wait_run(body["run_id"]))["status"] == "completed"
    await h.sink.wait_for(1)
    assert not sim.connections and [c.status for c in sim.calls_of("get_me")] == [401]


async def test_backfill_after_a_restart(sim: DiscordSimulator, start: Start) -> None:
    first, _ = await start()
    sim.user_sends_dm("before the restart")
    before = (await sim.wait_for_bot_messages(1))[0]
    await first.gateway.stop(drain_timeout=1)
    missed = sim.user_sends_dm("while the gateway was down")
    second, _ = await start()
    replies = await sim.wait_for_bot_messages(2)
    assert replies[1]["message_reference"]["message_id"] == missed["id"]
    assert sim.calls_of("channel_messages")[0].query["after"] == before["id"]
    await asyncio.sleep(0.2)
    assert _user_texts(second) == ["while the gateway was down"]  # "before" was not answered twice
    assert len(sim.bot_messages()) == 2
    # the cursors live in the gateway's store, shared by its replicas, not in a file of this one
    adapter = second.gateway.adapters["discord"]
    assert adapter.settings.state_file is not None and not adapter.settings.state_file.exists()
    saved = json.loads(await PlatformStateStore(second.gateway.store).load("discord:backfill-cursors") or "{}")
    assert str(sim.dm_channel_id()) in saved["channels"]


async def test_backfill_reads_every_page_and_goes_before_live_messages(sim: DiscordSimulator, start: Start) -> None:
    many = {"user_messages_per_minute": 1000, "user_burst": 1000}
    first, _ = await start(guild_ready_timeout=0.5, limits=many)  # backfill starts half a second after READY
    sim.user_sends_dm("before the restart")
    await sim.wait_for_bot_messages(1)
    await first.gateway.stop(drain_timeout=1)
    for i in range(130):  # more than one page of channel history
        sim.user_sends_dm(f"missed {i}")
    second, _ = await start(wait=False, guild_ready_timeout=0.5, limits=many)
    await sim.wait_for(lambda: len(sim.identifies) == 2)
    sim.user_sends_dm("live, right after READY")  # arrives before the backfill has run
    await sim.wait_for_bot_messages(132, timeout=30)
    await asyncio.sleep(0.2)
    assert _user_texts(second) == [f"missed {i}" for i in range(130)] + ["live, right after READY"]
    assert len(sim.bot_messages()) == 132


# --------------------------------------------------------------------------- configuration


def test_config_section_and_wiring(tmp_path: Path) -> None:
    env = {"HERMES_GATEWAY_HOME": str(tmp_path)}

    def error(section: dict[str, Any]) -> ConfigError:
        with pytest.raises(ConfigError) as info:
            parse_config({"platforms": {"discord": section}}, env)
        return info.value

    assert error({"enabled": True}).path == "platforms.discord.token"
    assert error({"shard_ids": [0]}).path == "platforms.discord.shard_ids"
    assert "not below shard_count" in str(error({"shard_count": 2, "shard_ids": [1, 2]}))
    assert error({"gateway_url": "https://gateway.discord.gg"}).path == "platforms.discord.gateway_url"
    assert error({"max_ratelimit_timeout": 5}).path == "platforms.discord.max_ratelimit_timeout"
    assert "discord" not in build_adapters(parse_config({}, env))  # off by default
    cfg = parse_config({"platforms": {"discord": {
        "enabled": True, "token": "t0k3n", "api_base_url": "http://127.0.0.1:1/api/v10/", "shard_count": 2,
        "shard_ids": [1], "allowed_guilds": [123], "respond_in_guilds": "always"}}}, env)
    adapter = build_adapters(cfg)["discord"]
    assert isinstance(adapter, DiscordAdapter)
    assert adapter.settings == DiscordSettings(
        token="t0k3n", api_base_url="http://127.0.0.1:1/api/v10", shard_count=2, shard_ids=(1,),
        respond_in_guilds="always", allowed_guilds=frozenset({"123"}), state_file=tmp_path / "discord-state.json")
    assert "t0k3n" in cfg.secret_values() and cfg.masked()["platforms"]["discord"]["token"] == "***"


# --------------------------------------------------------------------------- the adapter alone


class _Inbox:
    """Stands in for the gateway's router: keeps every event, accepts each id once."""

    def __init__(self) -> None:
        self.events: list[MessageEvent] = []
        self._seen: set[str] = set()

    async def __call__(self, event: MessageEvent) -> Accepted:
        duplicate = event.event_id in self._seen
        self._seen.add(event.event_id)
        self.events.append(event)
        return Accepted(run_id=None, duplicate=duplicate)


@pytest.fixture
async def connect(sim: DiscordSimulator) -> AsyncIterator[Callable[..., Awaitable[tuple[DiscordAdapter, _Inbox]]]]:
    adapters: list[DiscordAdapter] = []

    async def _connect(**settings: Any) -> tuple[DiscordAdapter, _Inbox]:
        options = {"token": sim.token, "api_base_url": sim.api_base_url, "gateway_url": sim.gateway_url,
                   "guild_ready_timeout": 0.05, "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                   "reconnect_backoff": BACKOFF, **settings}
        adapter = DiscordAdapter(DiscordSettings(**options))
        adapters.append(adapter)
        inbox = _Inbox()
        await adapter.connect(inbox)
        await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED)
        return adapter, inbox

    yield _connect
    for adapter in adapters:
        await adapter.disconnect()


async def test_events_are_normalized(sim: DiscordSimulator, connect: Any) -> None:
    adapter, inbox = await connect()
    thread = sim.create_thread("ideas")
    dm = sim.user_sends_dm("", attachments=[AttachmentSpec("report.pdf", "application/pdf", 2048),
                                           AttachmentSpec("cat.png", "image/png", 10)])
    mention = sim.user_sends("hi there", mention_bot=True, user_id=BOB_ID)
    in_thread = sim.user_sends("in the thread", channel_id=thread, mention_bot=True)
    await sim.wait_for(lambda: len(inbox.events) == 3)
    e_dm, e_mention, e_thread = inbox.events
    assert (e_dm.chat_type, e_dm.chat_id, e_dm.user_id, e_dm.event_id) == (
        "dm", str(sim.dm_channel_id()), str(ALICE_ID), dm["id"])
    assert [(a.kind, a.name, a.mime_type, a.size) for a in e_dm.attachments] == [
        ("document", "report.pdf", "application/pdf", 2048), ("photo", "cat.png", "image/png", 10)]
    assert e_dm.text == "", "files alone carry no text: the run describes each to the model"
    assert (e_mention.chat_type, e_mention.chat_id, e_mention.thread_id, e_mention.text, e_mention.mentions_bot) == (
        "group", str(GENERAL_ID), None, "hi there", True)
    assert e_mention.user_name == "Bob" and e_mention.metadata == {"channel_id": str(GENERAL_ID),
                                                                   "guild_id": str(GUILD_ID)}
    assert (e_thread.chat_id, e_thread.thread_id, e_thread.message_id) == (str(GENERAL_ID), str(thread),
                                                                          in_thread["id"])
    assert e_mention.event_id == mention["id"] and adapter.bot_username == "hermes"


async def test_guild_filters(sim: DiscordSimulator, connect: Any) -> None:
    adapter, inbox = await connect(respond_in_guilds="always", allowed_channels=frozenset({str(GENERAL_ID)}))
    sim.user_sends("no mention needed")
    sim.user_sends("elsewhere", channel_id=RANDOM_ID, mention_bot=True)
    sim.user_sends_dm("DMs are not filtered")
    await sim.wait_for(lambda: len(inbox.events) == 2)
    await asyncio.sleep(0.1)
    assert [e.text for e in inbox.events] == ["no mention needed", "DMs are not filtered"]
    await adapter.disconnect()
    _, other_guild = await connect(allowed_guilds=frozenset({"42"}))
    sim.user_sends("wrong guild", mention_bot=True)
    sim.user_sends_dm("still fine")
    await sim.wait_for(lambda: other_guild.events)
    await asyncio.sleep(0.1)
    assert [e.text for e in other_guild.events] == ["still fine"]


async def test_send_failures_map_to_outbox_decisions(sim: DiscordSimulator, connect: Any) -> None:
    adapter, _ = await connect()
    chat = str(sim.dm_channel_id())
    loop = asyncio.get_running_loop()
    sim.fail_next("create_message", status=429, retry_after=45)  # beyond max_ratelimit_timeout (30 s)
    began = loop.time()
    limited = await adapter.send(chat, "hi")
    assert (limited.success, limited.retryable, limited.retry_after) == (False, True, 45)
    assert loop.time() - began < 5, "a long rate limit is handed back, not slept on"
    sim.fail_next("create_message", status=403, code=50013, message="Missing Permissions")
    forbidden = await adapter.send(chat, "hi")
    assert not forbidden.retryable and "403" in (forbidden.error or "") and "Missing Permissions" in forbidden.error
    sim.drop_next("create_message")
    dropped = await adapter.send(chat, "hi")
    assert dropped.retryable and not dropped.success
    unknown = await adapter.send("999", "hi")
    assert not unknown.retryable and "10003" in (unknown.error or "")
    assert not (await adapter.edit_message(chat, "12345", "x")).retryable
    assert not (await adapter.send("general", "hi")).retryable
    sim.fail_next("typing", status=403)
    await adapter.send_typing(chat)  # a failed typing indicator is only logged
    ok = await adapter.send(chat, "hi", metadata={"delivery_id": "run:abc:0"})
    edited = await adapter.edit_message(chat, ok.message_id or "", "edited")
    assert ok.success and edited.success and sim.bot_messages()[-1]["content"] == "edited"
    assert sim.calls_of("create_message")[-1].body["nonce"] == delivery_nonce("run:abc:0")
    await adapter.disconnect()
    assert (await adapter.send(chat, "hi")).retryable
    assert not sim.calls_of("gateway_bot"), "an explicit gateway_url is used as is"


async def test_endpoints_are_set_while_connected_and_restored(sim: DiscordSimulator, connect: Any) -> None:
    before = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
    adapter, _ = await connect()
    assert (sim.api_base_url, yarl.URL(sim.gateway_url)) == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
    await adapter.disconnect()
    assert before == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)


async def test_startup_errors_name_the_cause(sim: DiscordSimulator) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/api/v10"
    cases = [("wrong", sim.api_base_url, r"^discord: the bot token was rejected \(401 on /users/@me\)"),
             (sim.token, sim.api_base_url, r"^discord: GET /gateway/bot failed"),
             (sim.token, closed, rf"^discord: cannot reach {closed}")]
    sim.fail_next("gateway_bot", status=400)
    for token, api, error in cases:
        adapter = DiscordAdapter(DiscordSettings(token=token, api_base_url=api))
        try:
            with pytest.raises(DiscordStartupError, match=error):
                await adapter.connect(_Inbox())
            assert adapter.state is AdapterState.FAILED and adapter.status()["last_error"] is not None
        finally:
            await adapter.disconnect()
    assert not sim.connections


async def test_a_refused_intent_fails_with_a_clear_message(sim: DiscordSimulator, connect: Any) -> None:
    adapter, _ = await connect()
    sim.cut_connections(code=4014, reason="Disallowed intent(s).")
    await sim.wait_for(lambda: adapter.state is AdapterState.FAILED)
    assert "message content intent" in (adapter.status()["last_error"] or "")


async def test_sharded_client_identifies_each_shard(sim: DiscordSimulator, connect: Any) -> None:
    _, inbox = await connect(shard_count=2)
    assert sorted(tuple(op.d["shard"]) for op in sim.identifies) == [(0, 2), (1, 2)]
    assert all(op.d["intents"] & (1 << 15) for op in sim.identifies)  # message content
    sim.user_sends_dm("hello shards")
    sim.user_sends("and the guild", mention_bot=True)
    await sim.wait_for(lambda: len(inbox.events) == 2)
    assert {e.text for e in inbox.events} == {"hello shards", "and the guild"}


async def test_replayed_duplicates_reach_the_inbox_with_the_same_id(sim: DiscordSimulator, connect: Any) -> None:
    _, inbox = await connect()
    sim.user_sends_dm("once")
    await sim.wait_for(lambda: inbox.events)
    sim.replay_overlap = 1
    sim.send_reconnect()
    await sim.wait_for(lambda: len(inbox.events) == 2)
    first, again = inbox.events
    assert first.event_id == again.event_id and first.dedupe_key == f"discord:{first.event_id}"
    assert BOT_ID not in {int(e.user_id) for e in inbox.events}


# --------------------------------------------------------------------------- receiving switched on and off


def _adapter(sim: DiscordSimulator) -> DiscordAdapter:
    return DiscordAdapter(DiscordSettings(token=sim.token, api_base_url=sim.api_base_url, gateway_url=sim.gateway_url,
                                          guild_ready_timeout=0.05, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                                          reconnect_backoff=BACKOFF))


class _HoldingInbox(_Inbox):
    """An inbox slow to store: each hand-over waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.holding, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, event: MessageEvent) -> Accepted:
        self.holding.set()
        await asyncio.wait_for(self.release.wait(), 5)
        return await super().__call__(event)


async def test_send_only_until_start_receiving_and_a_stopped_gap_is_backfilled(sim: DiscordSimulator) -> None:
    adapter, inbox = _adapter(sim), _Inbox()
    await adapter.connect(inbox, receive=False)
    try:
        chat = str(sim.dm_channel_id())
        sent = await adapter.send(chat, "sent over REST alone")
        assert sent.success and (await adapter.edit_message(chat, sent.message_id or "", "edited")).success
        sim.user_sends_dm("nobody is listening")
        await asyncio.sleep(0.3)
        assert (adapter.state, adapter.receiving, adapter.status()["receiving"]) == (AdapterState.CONNECTED, False,
                                                                                     False)
        assert not sim.connections and inbox.events == []

        for _ in range(2):
            await adapter.start_receiving()
        await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED and sim.identifies)
        assert len(sim.connections) == 1 and adapter.receiving
        sim.user_sends_dm("hello")
        await sim.wait_for(lambda: [e.text for e in inbox.events] == ["hello"])

        for _ in range(2):
            await adapter.stop_receiving()
        assert not any(c.open for c in sim.connections) and not adapter.receiving
        assert adapter.state is AdapterState.CONNECTED
        sim.user_sends_dm("while stopped")
        assert (await adapter.send(chat, "sent after stop_receiving")).success
        await asyncio.sleep(0.3)
        assert [e.text for e in inbox.events] == ["hello"]

        await adapter.start_receiving()  # a new session: Discord replays nothing, the backfill fetches the gap
        await sim.wait_for(lambda: [e.text for e in inbox.events] == ["hello", "while stopped"])
        assert len(sim.identifies) == 2 and sum(c.open for c in sim.connections) == 1
        assert [m["content"] for m in sim.bot_messages()] == ["edited", "sent after stop_receiving"]
    finally:
        await adapter.disconnect()
    assert not any(c.open for c in sim.connections)


async def test_a_message_in_hand_when_receiving_stops_is_still_handed_over(sim: DiscordSimulator) -> None:
    adapter, inbox = _adapter(sim), _HoldingInbox()
    await adapter.connect(inbox)
    try:
        await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED)
        sim.user_sends_dm("in hand")
        await asyncio.wait_for(inbox.holding.wait(), 5)
        await adapter.stop_receiving()
        inbox.release.set()
        await sim.wait_for(lambda: [e.text for e in inbox.events] == ["in hand"])
    finally:
        await adapter.disconnect()


def test_run_on_config(tmp_path: Path) -> None:
    env = {"HERMES_GATEWAY_HOME": str(tmp_path)}
    base = {"enabled": True, "token": "t0k3n"}

    def discord(**section: Any) -> Any:
        return parse_config({"platforms": {"discord": {**base, **section}}}, env)

    def error(**section: Any) -> ConfigError:
        with pytest.raises(ConfigError) as info:
            discord(**section)
        return info.value

    assert [receives_on(discord(run_on=v), "discord") for v in ("leader", "all")] == ["leader", "all"]
    assert receives_on(discord(), "discord") == "leader" and discord().platforms.discord.shard_ids is None
    cfg = discord(run_on="shard:2, 0", shard_count=3)
    adapter = build_adapters(cfg)["discord"]
    assert isinstance(adapter, DiscordAdapter) and receives_on(cfg, "discord") == "all"
    assert (cfg.platforms.discord.run_on, adapter.settings.shard_ids, adapter.settings.shard_count) == (
        "shard:2,0", (2, 0), 3)
    assert discord(run_on="shard:1", shard_count=2, shard_ids=[1]).platforms.discord.shard_ids == [1]
    assert receives_on(cfg, "webhook") == receives_on(cfg, "callback") == "all"
    for section, path, message in [
        ({"run_on": "shard:1"}, "run_on", "shard:1 needs shard_count (set shard_count"),
        ({"run_on": "shard:1,3", "shard_count": 3}, "run_on", "shard ids [3] are not below shard_count 3"),
        ({"run_on": "shard:1,1", "shard_count": 3}, "run_on", "names a shard twice"),
        ({"run_on": "shards"}, "run_on", "unknown value 'shards' (write leader, all, or shard:<ids>"),
        ({"run_on": "shard:1", "shard_count": 3, "shard_ids": [0]}, "shard_ids", "conflicts with run_on: shard:1"),
    ]:
        err = error(**section)
        assert err.path == f"platforms.discord.{path}" and message in str(err), str(err)
