"""The Discord simulator: its REST and gateway wire by hand, then the real discord.py against it."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from gateway.sim.discord_api import (
    ALICE_ID,
    BOT_ID,
    GENERAL_ID,
    GUILD_ID,
    MESSAGE_CONTENT_INTENT,
    RANDOM_ID,
    DiscordSimulator,
    snowflake,
)

JSON = dict[str, Any]


@pytest.fixture
async def sim() -> AsyncIterator[DiscordSimulator]:
    async with DiscordSimulator(heartbeat_interval=250) as s:
        yield s


@pytest.fixture
async def http(sim: DiscordSimulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bot {sim.token}"}) as session:
        yield session


async def _call(http: aiohttp.ClientSession, sim: DiscordSimulator, method: str, path: str,
                body: Any = None, **kwargs: Any) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with http.request(method, sim.api_base_url + path, json=body, **kwargs) as r:
        data = await r.json(content_type=None) if r.status != 204 else None
        return r.status, data, r.headers


# --------------------------------------------------------------------------- REST


async def test_rest_answers_are_exact_json_and_authenticated(sim: DiscordSimulator, http: aiohttp.ClientSession
                                                             ) -> None:
    status, me, headers = await _call(http, sim, "GET", "/users/@me")
    assert status == 200 and headers["Content-Type"] == "application/json"  # no "; charset=utf-8"
    assert (me["id"], me["username"], me["bot"]) == (str(BOT_ID), "hermes", True)
    assert headers["X-RateLimit-Limit"] == "5" and "X-RateLimit-Bucket" in headers
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(sim.api_base_url + "/users/@me", headers={"Authorization": "Bot wrong"}) as r:
            assert (r.status, await r.json()) == (401, {"message": "401: Unauthorized", "code": 0})
        async with anonymous.get(sim.api_base_url + "/gateway") as r:  # no auth needed
            assert await r.json() == {"url": sim.gateway_url}
    status, body, _ = await _call(http, sim, "GET", "/no/such/route")
    assert (status, body) == (404, {"message": "404: Not Found", "code": 0})
    _, bot_gateway, _ = await _call(http, sim, "GET", "/gateway/bot")
    assert bot_gateway["url"] == sim.gateway_url and bot_gateway["shards"] == 1
    assert [c.route for c in sim.rest_calls] == ["get_me", "get_me", "gateway", "unknown", "gateway_bot"]


async def test_message_create_honours_enforced_nonces(sim: DiscordSimulator, http: aiohttp.ClientSession) -> None:
    body = {"content": "once", "nonce": "n-1", "enforce_nonce": True}
    _, first, _ = await _call(http, sim, "POST", f"/channels/{GENERAL_ID}/messages", body)
    _, again, _ = await _call(http, sim, "POST", f"/channels/{GENERAL_ID}/messages", body)
    assert again["id"] == first["id"] and first["nonce"] == "n-1"
    await _call(http, sim, "POST", f"/channels/{GENERAL_ID}/messages", {"content": "twice", "nonce": "n-2"})
    await _call(http, sim, "POST", f"/channels/{GENERAL_ID}/messages", {"content": "twice", "nonce": "n-2"})
    assert [m["content"] for m in sim.bot_messages(GENERAL_ID)] == ["once", "twice", "twice"]


async def test_message_create_validation(sim: DiscordSimulator, http: aiohttp.ClientSession) -> None:
    path = f"/channels/{GENERAL_ID}/messages"
    status, body, _ = await _call(http, sim, "POST", path, {"content": "x" * 2001})
    assert (status, body["code"]) == (400, 50035) and "content" in body["errors"]
    assert (await _call(http, sim, "POST", path, {"content": ""}))[1]["code"] == 50006
    assert (await _call(http, sim, "POST", "/channels/42/messages", {"content": "x"}))[1] == {
        "message": "Unknown Channel", "code": 10003}
    missing = {"content": "re", "message_reference": {"message_id": "42"}}
    assert (await _call(http, sim, "POST", path, missing))[0] == 400
    status, posted, _ = await _call(http, sim, "POST", path, {**missing, "message_reference": {
        "message_id": "42", "fail_if_not_exists": False}})
    assert status == 200 and "message_reference" not in posted


async def test_allowed_mentions_decide_who_is_pinged(sim: DiscordSimulator, http: aiohttp.ClientSession) -> None:
    asked = sim.user_sends("hi", mention_bot=True)
    content = f"@everyone <@&77> <@{ALICE_ID}>"
    path = f"/channels/{GENERAL_ID}/messages"
    _, default, _ = await _call(http, sim, "POST", path, {"content": content})
    _, none, _ = await _call(http, sim, "POST", path, {"content": content, "allowed_mentions": {"parse": []},
                                                       "message_reference": {"message_id": asked["id"]}})
    assert (default["mention_everyone"], default["mention_roles"], [u["id"] for u in default["mentions"]]) == (
        True, ["77"], [str(ALICE_ID)])
    assert (none["mention_everyone"], none["mention_roles"], none["mentions"]) == (False, [], [])
    assert none["referenced_message"]["id"] == asked["id"] and none["type"] == 19


async def test_edits_history_dms_and_users(sim: DiscordSimulator, http: aiohttp.ClientSession) -> None:
    user_message = sim.user_sends("first", channel_id=RANDOM_ID)
    _, mine, _ = await _call(http, sim, "POST", f"/channels/{RANDOM_ID}/messages", {"content": "second"})
    status, edited, _ = await _call(http, sim, "PATCH", f"/channels/{RANDOM_ID}/messages/{mine['id']}",
                                    {"content": "second, edited"})
    assert status == 200 and edited["edited_timestamp"] is not None
    assert sim.edits == [(int(mine["id"]), "second, edited")]
    assert (await _call(http, sim, "PATCH", f"/channels/{RANDOM_ID}/messages/{user_message['id']}",
                        {"content": "x"}))[1]["code"] == 50005
    assert (await _call(http, sim, "PATCH", f"/channels/{RANDOM_ID}/messages/1", {"content": "x"}))[0] == 404
    sim.user_sends("third", channel_id=RANDOM_ID)
    _, newest, _ = await _call(http, sim, "GET", f"/channels/{RANDOM_ID}/messages", params={"limit": "2"})
    assert [m["content"] for m in newest] == ["third", "second, edited"]  # newest first
    _, after, _ = await _call(http, sim, "GET", f"/channels/{RANDOM_ID}/messages",
                              params={"after": "0", "limit": "2"})
    assert [m["content"] for m in after] == ["second, edited", "first"]  # the oldest two, newest first
    _, before, _ = await _call(http, sim, "GET", f"/channels/{RANDOM_ID}/messages",
                               params={"before": mine["id"]})
    assert [m["content"] for m in before] == ["first"]
    assert (await _call(http, sim, "GET", f"/channels/{RANDOM_ID}/messages", params={"limit": "0"}))[0] == 400
    _, dm, _ = await _call(http, sim, "POST", "/users/@me/channels", {"recipient_id": str(ALICE_ID)})
    assert int(dm["id"]) == sim.dm_channel_id(ALICE_ID) and dm["type"] == 1
    assert (await _call(http, sim, "GET", f"/users/{ALICE_ID}"))[1]["username"] == "alice"
    assert (await _call(http, sim, "GET", "/users/5"))[1]["code"] == 10013
    assert (await _call(http, sim, "GET", f"/channels/{GENERAL_ID}"))[1]["name"] == "general"
    assert (await _call(http, sim, "POST", f"/channels/{GENERAL_ID}/typing"))[0] == 204


async def test_rest_faults(sim: DiscordSimulator, http: aiohttp.ClientSession) -> None:
    path = f"/channels/{GENERAL_ID}/messages"
    sim.fail_next("create_message", status=429, retry_after=1.5, is_global=True)
    status, body, headers = await _call(http, sim, "POST", path, {"content": "x"})
    assert (status, body["retry_after"], body["global"]) == (429, 1.5, True)
    assert (headers["Retry-After"], headers["X-RateLimit-Remaining"], headers["Via"]) == ("2", "0", "1.1 google")
    assert headers["X-RateLimit-Global"] == "true" and float(headers["X-RateLimit-Reset-After"]) == 1.5
    sim.fail_next("*", status=502)
    assert (await _call(http, sim, "GET", "/users/@me"))[0] == 502
    sim.drop_next("create_message")
    with pytest.raises(aiohttp.ClientError):
        await _call(http, sim, "POST", path, {"content": "lost"})
    sim.drop_next("create_message", after_apply=True)
    with pytest.raises(aiohttp.ClientError):
        await _call(http, sim, "POST", path, {"content": "applied"})
    assert [m["content"] for m in sim.bot_messages()] == ["applied"]
    assert [c.outcome for c in sim.calls_of("create_message")] == ["error", "dropped", "applied_dropped"]
    sim.fail_next("typing", status=500)
    sim.clear_faults()
    assert (await _call(http, sim, "POST", f"/channels/{GENERAL_ID}/typing"))[0] == 204
    with pytest.raises(ValueError, match="unknown route"):
        sim.fail_next("sendMessage")


# --------------------------------------------------------------------------- gateway by hand


class _Raw:
    """A gateway client driven by hand."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, compressed: bool = False) -> None:
        self.ws = ws
        self._inflate = zlib.decompressobj() if compressed else None

    async def recv(self) -> JSON:
        msg = await asyncio.wait_for(self.ws.receive(), 2)
        if msg.type is aiohttp.WSMsgType.BINARY:
            assert self._inflate is not None and msg.data.endswith(b"\x00\x00\xff\xff")
            return json.loads(self._inflate.decompress(msg.data))
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        return json.loads(msg.data)

    async def until(self, event: str) -> JSON:
        while (payload := await self.recv()).get("t") != event:
            pass
        return payload

    async def send(self, op: int, d: Any) -> None:
        await self.ws.send_str(json.dumps({"op": op, "d": d}))

    async def identify(self, token: str, intents: int = MESSAGE_CONTENT_INTENT) -> JSON:
        await self.send(2, {"token": token, "intents": intents, "properties": {}})
        return await self.until("READY")


@pytest.fixture
async def raw(sim: DiscordSimulator) -> AsyncIterator[Any]:
    async with aiohttp.ClientSession() as session:

        async def _open(url: str | None = None, *, compressed: bool = False) -> _Raw:
            query = "?v=10&encoding=json" + ("&compress=zlib-stream" if compressed else "")
            client = _Raw(await session.ws_connect((url or sim.gateway_url) + query), compressed=compressed)
            hello = await client.recv()
            assert hello == {"op": 10, "d": {"heartbeat_interval": 250}}
            return client

        yield _open


async def test_identify_ready_heartbeat_and_dispatch(sim: DiscordSimulator, raw: Any) -> None:
    client = await raw()
    await client.send(1, None)
    assert await client.recv() == {"op": 11}
    ready = await client.identify(sim.token)
    assert ready["s"] == 1 and ready["d"]["resume_gateway_url"] == sim.resume_gateway_url
    assert ready["d"]["user"]["id"] == str(BOT_ID) and ready["d"]["guilds"] == [
        {"id": str(GUILD_ID), "unavailable": True}]
    guild = await client.recv()
    assert guild["t"] == "GUILD_CREATE" and guild["s"] == 2
    assert {c["name"] for c in guild["d"]["channels"]} == {"general", "random"}
    message = sim.user_sends("hello", mention_bot=True)
    created = await client.recv()
    assert (created["t"], created["s"], created["d"]["id"], created["d"]["guild_id"]) == (
        "MESSAGE_CREATE", 3, message["id"], str(GUILD_ID))
    sim.withhold_acks()
    await client.send(1, 3)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(client.ws.receive(), 0.3)
    await client.send(2, {"token": sim.token, "intents": 0, "properties": {}})
    closing = await asyncio.wait_for(client.ws.receive(), 2)
    assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 4005  # already identified


@pytest.mark.parametrize(("frame", "code"), [
    (json.dumps({"op": 2, "d": {"token": "wrong", "intents": 0, "properties": {}}}), 4004),
    (json.dumps({"op": 6, "d": {"token": "wrong", "session_id": "s", "seq": 1}}), 4004),
    (json.dumps({"op": 99, "d": None}), 4001),
    ("not json", 4002),
])
async def test_bad_payloads_close_the_connection(sim: DiscordSimulator, raw: Any, frame: str, code: int) -> None:
    client = await raw()
    await client.ws.send_str(frame)
    closing = await asyncio.wait_for(client.ws.receive(), 2)
    assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == code
    await sim.wait_for(lambda: not sim.connections[0].open)
    assert sim.connections[0].close_code == code


async def test_resume_replays_what_the_session_missed(sim: DiscordSimulator, raw: Any) -> None:
    client = await raw()
    ready = await client.identify(sim.token)
    await client.until("GUILD_CREATE")
    sim.cut_connections(abrupt=True)
    await sim.wait_for(lambda: not sim.connections[0].open)
    missed = [sim.user_sends_dm(f"missed {i}")["id"] for i in range(3)]
    again = await raw(sim.resume_gateway_url)
    await again.send(6, {"token": sim.token, "session_id": ready["d"]["session_id"], "seq": 2})
    replayed = [await again.recv() for _ in range(4)]
    assert [(p["s"], p["t"]) for p in replayed] == [(3, "MESSAGE_CREATE"), (4, "MESSAGE_CREATE"),
                                                    (5, "MESSAGE_CREATE"), (6, "RESUMED")]
    assert [p["d"]["id"] for p in replayed[:3]] == missed
    assert sim.connections[1].resumed_url and sim.connections[1].last_seq == 6
    stranger = await raw()
    await stranger.send(6, {"token": sim.token, "session_id": "nope", "seq": 1})
    assert await stranger.recv() == {"op": 9, "d": False}


async def test_expired_detached_sessions_cannot_resume(sim: DiscordSimulator, raw: Any) -> None:
    client = await raw()
    ready = await client.identify(sim.token)
    live = await raw()
    await live.identify(sim.token)
    sim.cut_connections(abrupt=True)
    await sim.wait_for(lambda: not any(c.open for c in sim.connections))
    again = await raw()
    await again.identify(sim.token)
    assert sim.expire_detached_sessions() == 2  # the two cut sessions; the new one has its connection
    await again.until("GUILD_CREATE")
    sim.user_sends_dm("still delivered")
    assert (await again.until("MESSAGE_CREATE"))["d"]["content"] == "still delivered"
    late = await raw(sim.resume_gateway_url)
    await late.send(6, {"token": sim.token, "session_id": ready["d"]["session_id"], "seq": 2})
    assert await late.recv() == {"op": 9, "d": False}


async def test_closing_normally_ends_the_session(sim: DiscordSimulator, raw: Any) -> None:
    client = await raw()
    ready = await client.identify(sim.token)
    await client.ws.close(code=1000)
    await sim.wait_for(lambda: not sim.connections[0].open)
    again = await raw()
    await again.send(6, {"token": sim.token, "session_id": ready["d"]["session_id"], "seq": 2})
    assert await again.recv() == {"op": 9, "d": False}


async def test_gateway_controls(sim: DiscordSimulator, raw: Any) -> None:
    sim.reject_identify()
    client = await raw()
    await client.send(2, {"token": sim.token, "intents": 0, "properties": {}})
    assert await client.recv() == {"op": 9, "d": False}
    await client.identify(sim.token)
    await client.until("GUILD_CREATE")
    assert sim.send_reconnect() == 1
    assert await client.recv() == {"op": 7, "d": None}
    assert sim.invalidate_sessions(resumable=True) == 1
    assert await client.recv() == {"op": 9, "d": True}
    sim.suspend_delivery()
    sim.user_sends_dm("held back")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(client.ws.receive(), 0.2)
    sim.cut_connections(code=4000, reason="bye")
    closing = await asyncio.wait_for(client.ws.receive(), 2)
    assert closing.type is aiohttp.WSMsgType.CLOSE and (closing.data, closing.extra) == (4000, "bye")


async def test_content_needs_the_message_content_intent(sim: DiscordSimulator, raw: Any) -> None:
    client = await raw()
    await client.identify(sim.token, intents=0)
    await client.until("GUILD_CREATE")
    sim.user_sends("private chatter")
    sim.user_sends("for the bot", mention_bot=True)
    sim.user_sends_dm("a DM")
    contents = [(await client.until("MESSAGE_CREATE"))["d"]["content"] for _ in range(3)]
    assert contents == ["", f"<@{BOT_ID}> for the bot", "a DM"]


async def test_zlib_stream() -> None:
    async with DiscordSimulator(zlib=True, heartbeat_interval=250) as compressed, aiohttp.ClientSession() as session:
        ws = await session.ws_connect(compressed.gateway_url + "?v=10&encoding=json&compress=zlib-stream")
        client = _Raw(ws, compressed=True)
        assert (await client.recv())["op"] == 10
        assert (await client.identify(compressed.token))["d"]["session_id"]
        assert compressed.connections[0].compressed


def test_snowflakes_encode_time() -> None:
    ms = 1_700_000_000_000
    assert discord.utils.snowflake_time(snowflake(ms)).timestamp() == ms / 1000


# --------------------------------------------------------------------------- discord.py against it


async def test_discord_py_end_to_end(sim: DiscordSimulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Route, "BASE", sim.api_base_url)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(sim.gateway_url))
    thread = sim.create_thread("before login")  # announced in GUILD_CREATE, not as THREAD_CREATE
    intents = discord.Intents(guilds=True, guild_messages=True, dm_messages=True, message_content=True)
    client = discord.Client(intents=intents, guild_ready_timeout=0.05)
    ready = asyncio.Event()
    received: list[discord.Message] = []
    client.event(_on(ready.set))
    client.event(_collect(received))
    task = asyncio.create_task(client.start(sim.token))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        assert [c.name for c in client.get_guild(GUILD_ID).text_channels] == ["general", "random"]
        assert isinstance(client.get_channel(thread), discord.Thread)
        sim.user_sends_dm("hello bot")
        await sim.wait_for(lambda: received)
        assert isinstance(received[0].channel, discord.DMChannel) and received[0].guild is None
        channel = await client.fetch_channel(GENERAL_ID)
        async with channel.typing():
            sent = await channel.send("hi all", nonce="abc")
        assert sent.nonce == "abc" and sim.calls_of("create_message")[0].body["enforce_nonce"] is True
        edited = await sent.edit(content="hi everyone")
        assert edited.content == "hi everyone" and sim.bot_messages()[0]["content"] == "hi everyone"
        dm = await (await client.fetch_user(ALICE_ID)).create_dm()
        assert dm.id == sim.dm_channel_id(ALICE_ID)
        history = [m.content async for m in dm.history(oldest_first=True)]
        assert history == ["hello bot"]
        assert sim.calls_of("typing") and len(sim.identifies) == 1
    finally:
        await client.close()
        await asyncio.wait_for(task, 5)


def _on(callback: Any) -> Any:
    async def on_ready() -> None:
        callback()
    return on_ready


def _collect(into: list[discord.Message]) -> Any:
    async def on_message(message: discord.Message) -> None:
        if message.author.id != BOT_ID:
            into.append(message)
    return on_message


async def test_reactions_and_deletes(sim: DiscordSimulator, http: aiohttp.ClientSession) -> None:
    user_message = sim.user_sends("react to me", channel_id=RANDOM_ID)
    path = f"/channels/{RANDOM_ID}/messages/{user_message['id']}/reactions"
    for emoji in ("👀", "✅", "✅"):
        assert (await _call(http, sim, "PUT", f"{path}/{quote(emoji)}/@me"))[0] == 204
    assert sim.bot_reactions(int(user_message["id"])) == ["👀", "✅"]
    assert (await _call(http, sim, "DELETE", f"{path}/{quote('👀')}/@me"))[0] == 204
    assert (await _call(http, sim, "DELETE", f"{path}/{quote('👀')}/@me"))[0] == 204  # already gone: no error
    assert sim.bot_reactions(int(user_message["id"])) == ["✅"]
    assert (await _call(http, sim, "PUT", f"{path}/eyes/@me"))[1]["code"] == 10014  # Unknown Emoji
    status, body, _ = await _call(http, sim, "PUT", f"/channels/{RANDOM_ID}/messages/1/reactions/{quote('👀')}/@me")
    assert (status, body["code"]) == (404, 10008)

    _, mine, _ = await _call(http, sim, "POST", f"/channels/{RANDOM_ID}/messages", {"content": "status"})
    assert (await _call(http, sim, "DELETE", f"/channels/{RANDOM_ID}/messages/{mine['id']}"))[0] == 204
    assert sim.deleted == [int(mine["id"])] and sim.bot_messages(RANDOM_ID) == []
    assert [m["content"] for m in sim.messages(RANDOM_ID)] == ["react to me"]
    status, body, _ = await _call(http, sim, "DELETE", f"/channels/{RANDOM_ID}/messages/{mine['id']}")
    assert (status, body["code"]) == (404, 10008)
    status, body, _ = await _call(http, sim, "DELETE", f"/channels/{RANDOM_ID}/messages/{user_message['id']}")
    assert (status, body["code"]) == (403, 50013)
