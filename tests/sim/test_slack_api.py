"""The Slack simulator, exercised with the real slack-sdk and slack-bolt (no mocks)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from gateway.sim.slack_api import DEFAULT_CHANNEL, DEFAULT_USER, SlackSimulator


@pytest.fixture
async def sim() -> AsyncIterator[SlackSimulator]:
    async with SlackSimulator(echo_bot_messages=False) as s:
        yield s


@pytest.fixture
async def web_client(sim: SlackSimulator) -> AsyncIterator[AsyncWebClient]:
    async with aiohttp.ClientSession() as session:
        yield AsyncWebClient(token=sim.bot_token, base_url=sim.base_url, session=session, retry_handlers=[])


class _SocketApp:
    """A Socket Mode client that records requests and acks each one unless told to hold it."""

    def __init__(self, sim: SlackSimulator, web_client: AsyncWebClient, *, ping_interval: float = 0.2) -> None:
        self.requests: list[SocketModeRequest] = []
        self.hold = False
        self.client = SocketModeClient(app_token=sim.app_token, web_client=web_client, ping_interval=ping_interval)
        self.client.socket_mode_request_listeners.append(self._on_request)

    async def _on_request(self, client: SocketModeClient, req: SocketModeRequest) -> None:
        self.requests.append(req)
        if not self.hold:
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))


@pytest.fixture
async def socket_app(sim: SlackSimulator, web_client: AsyncWebClient) -> AsyncIterator[_SocketApp]:
    app = _SocketApp(sim, web_client)
    await asyncio.wait_for(app.client.connect(), 5)
    await sim.wait_for_sockets(1)
    yield app
    await app.client.close()


# ------------------------------------------------------------------ web api


async def test_auth_test_and_token_checks(sim: SlackSimulator, web_client: AsyncWebClient) -> None:
    auth = await web_client.auth_test()
    assert (auth["user_id"], auth["bot_id"], auth["team_id"]) == ("U0BOT", "B0BOT", "T0TEAM")
    call = sim.calls[0]
    assert (call.method, call.token, call.ok) == ("auth.test", sim.bot_token, True)

    with pytest.raises(SlackApiError) as info:
        await AsyncWebClient(token="xoxb-wrong", base_url=sim.base_url).auth_test()
    assert info.value.response["error"] == "invalid_auth"
    with pytest.raises(SlackApiError) as info:
        await AsyncWebClient(base_url=sim.base_url).auth_test()
    assert info.value.response["error"] == "not_authed"
    with pytest.raises(SlackApiError) as info:  # the bot token cannot open sockets
        await web_client.apps_connections_open(app_token=sim.bot_token)
    assert info.value.response["error"] == "not_allowed_token_type"
    opened = await web_client.apps_connections_open(app_token=sim.app_token)
    assert opened["url"].startswith(f"ws://127.0.0.1:{sim.port}/link/?ticket=")


async def test_json_form_and_query_bodies_and_unknown_method(sim: SlackSimulator) -> None:
    api = sim.base_url
    async with aiohttp.ClientSession() as http:
        async with http.post(api + "chat.postMessage", json={"channel": DEFAULT_CHANNEL, "text": "json"},
                             headers={"Authorization": f"Bearer {sim.bot_token}"}) as r:
            assert (await r.json())["ok"] is True
        async with http.post(api + "chat.postMessage",
                             data={"token": sim.bot_token, "channel": DEFAULT_CHANNEL, "text": "form"}) as r:
            assert (await r.json())["ok"] is True
        async with http.get(api + "chat.postMessage",
                            params={"token": sim.bot_token, "channel": DEFAULT_CHANNEL, "text": "query"}) as r:
            assert (await r.json())["ok"] is True
        async with http.post(api + "chat.postMessage", data={"token": sim.bot_token, "channel": DEFAULT_CHANNEL}) as r:
            assert (await r.json())["error"] == "no_text"
        async with http.post(api + "chat.nope", data={"token": sim.bot_token}) as r:
            assert (r.status, (await r.json())["error"]) == (404, "unknown_method")
    assert [m.text for m in sim.messages(DEFAULT_CHANNEL)] == ["json", "form", "query"]
    assert [c.http_method for c in sim.calls] == ["POST", "POST", "GET", "POST", "POST"]


async def test_post_update_and_message_errors(sim: SlackSimulator, web_client: AsyncWebClient) -> None:
    posted = await web_client.chat_postMessage(channel=DEFAULT_CHANNEL, text="hello", thread_ts="1.000001",
                                               unfurl_links=False)
    await web_client.chat_update(channel=DEFAULT_CHANNEL, ts=posted["ts"], text="hello, edited")
    [message] = sim.messages(DEFAULT_CHANNEL)
    assert (message.ts, message.thread_ts, message.final_text) == (posted["ts"], "1.000001", "hello, edited")
    assert message.params["unfurl_links"] is False
    with pytest.raises(SlackApiError) as info:
        await web_client.chat_update(channel=DEFAULT_CHANNEL, ts="9.9", text="x")
    assert info.value.response["error"] == "message_not_found"
    user = await sim.user_sends_dm("mine")
    with pytest.raises(SlackApiError) as info:  # nobody edits someone else's message
        await web_client.chat_update(channel=user.message.channel, ts=user.ts, text="x")
    assert info.value.response["error"] == "cant_update_message"
    with pytest.raises(SlackApiError) as info:
        await web_client.chat_postMessage(channel=DEFAULT_CHANNEL, text="x" * 40_001)
    assert info.value.response["error"] == "msg_too_long"


async def test_rate_limit_and_server_error_injection(sim: SlackSimulator, web_client: AsyncWebClient) -> None:
    sim.rate_limit_next("chat.postMessage", retry_after=2)
    sim.server_error_next("chat.postMessage", status=503)
    with pytest.raises(SlackApiError) as info:
        await web_client.chat_postMessage(channel=DEFAULT_CHANNEL, text="a")
    assert info.value.response.status_code == 429
    assert info.value.response.headers["Retry-After"] == "2"
    assert info.value.response["error"] == "ratelimited"
    with pytest.raises(SlackApiError) as info:
        await web_client.chat_postMessage(channel=DEFAULT_CHANNEL, text="a")
    assert info.value.response.status_code == 503
    await web_client.chat_postMessage(channel=DEFAULT_CHANNEL, text="a")
    assert [c.status for c in sim.calls_of("chat.postMessage")] == [429, 503, 200]
    assert len(sim.messages()) == 1


# ------------------------------------------------------------------ socket mode


async def test_hello_envelopes_and_acks(sim: SlackSimulator, socket_app: _SocketApp) -> None:
    hello = sim.sockets[0]
    action = await sim.user_mentions_bot("hi there")
    await sim.wait_for(lambda: all(d.acked for d in action.deliveries))
    mention, message = (d.payload for d in action.deliveries)
    assert mention["type"] == "event_callback" and mention["api_app_id"] == "A0HERMES"
    assert mention["authorizations"][0]["user_id"] == "U0BOT" and mention["team_id"] == "T0TEAM"
    assert isinstance(mention["event_time"], int) and mention["event_id"] != message["event_id"]
    assert mention["event"] == {**mention["event"], "type": "app_mention", "text": "<@U0BOT> hi there",
                                "user": DEFAULT_USER, "channel": DEFAULT_CHANNEL, "ts": action.ts}
    assert message["event"]["type"] == "message" and message["event"]["channel_type"] == "channel"
    frames = [r.envelope_id for r in socket_app.requests]
    assert frames == [e.envelope_id for e in sim.envelopes] and hello.live
    first = sim.envelopes[0].to_wire()
    assert (first["type"], first["retry_attempt"], first["retry_reason"]) == ("events_api", 0, "")
    assert first["accepts_response_payload"] is False


async def test_disconnect_refresh_reconnects_with_a_new_ticket(sim: SlackSimulator, socket_app: _SocketApp) -> None:
    await sim.send_disconnect()
    second = await sim.wait_for_sockets(2)
    await sim.wait_for(lambda: not sim.sockets[0].live)
    assert len(sim.calls_of("apps.connections.open")) == 2
    await sim.user_sends_dm("after refresh")
    await sim.wait_for(lambda: sim.envelopes and sim.envelopes[-1].acked_t)
    assert sim.envelopes[-1].socket_id == second.id


@pytest.mark.parametrize("hard", [False, True])
async def test_dropped_socket_reconnects(sim: SlackSimulator, socket_app: _SocketApp, hard: bool) -> None:
    await sim.drop_sockets(hard=hard)
    await sim.wait_for_sockets(2)
    action = await sim.user_sends_dm("still there?")
    await sim.wait_for_ack(action.delivery)


async def test_unacked_envelope_is_redelivered_after_the_socket_dies(sim: SlackSimulator,
                                                                    socket_app: _SocketApp) -> None:
    socket_app.hold = True
    action = await sim.user_sends_dm("do not lose me")
    await sim.wait_for(lambda: socket_app.requests)
    await sim.drop_sockets()
    await sim.wait_for(lambda: len(action.delivery.envelopes) == 2)
    socket_app.hold = False
    old, new = action.delivery.envelopes
    # the client answers the first envelope late, on the new socket: recorded, not counted
    await socket_app.client.send_socket_mode_response(SocketModeResponse(envelope_id=old.envelope_id))
    await sim.wait_for(lambda: old.late_acks)
    await socket_app.client.send_socket_mode_response(SocketModeResponse(envelope_id=new.envelope_id))
    await sim.wait_for_ack(action.delivery)
    assert (new.retry_attempt, new.retry_reason, new.payload) == (1, "timeout", old.payload)
    assert old.acked_t is None and new.acked_t is not None and new.socket_id == 2


async def test_lost_ack_with_socket_drop_is_redelivered(sim: SlackSimulator, socket_app: _SocketApp) -> None:
    sim.lose_acks(1, drop_socket=True)
    action = await sim.user_sends_dm("ack gets lost")
    await sim.wait_for_ack(action.delivery)
    first, second = action.delivery.envelopes
    assert first.lost_acks == 1 and first.acked_t is None and second.retry_attempt == 1
    assert [r.envelope_id for r in socket_app.requests] == [first.envelope_id, second.envelope_id]


async def test_slash_command_envelope_and_ack_payload(sim: SlackSimulator, web_client: AsyncWebClient) -> None:
    client = SocketModeClient(app_token=sim.app_token, web_client=web_client)

    async def on_request(c: SocketModeClient, req: SocketModeRequest) -> None:
        await c.send_socket_mode_response(SocketModeResponse(req.envelope_id, payload={"text": "on it"}))

    client.socket_mode_request_listeners.append(on_request)
    await asyncio.wait_for(client.connect(), 5)
    try:
        action = await sim.user_runs_command("/hermes", "new")
        await sim.wait_for_ack(action.delivery)
        envelope = action.delivery.envelopes[0]
        assert envelope.type == "slash_commands" and envelope.to_wire()["accepts_response_payload"] is True
        assert envelope.payload["command"] == "/hermes" and envelope.payload["text"] == "new"
        assert action.delivery.response == {"text": "on it"}
    finally:
        await client.close()


async def test_bot_posts_are_echoed_as_message_events() -> None:
    async with SlackSimulator() as sim:
        client = AsyncWebClient(token=sim.bot_token, base_url=sim.base_url)
        posted = await client.chat_postMessage(channel=DEFAULT_CHANNEL, text="from the bot", thread_ts="5.000001")
        await client.chat_update(channel=DEFAULT_CHANNEL, ts=posted["ts"], text="edited")
        await sim.wait_for(lambda: len(sim.deliveries) == 2)
        echo, changed = (d.event for d in sim.deliveries)
        assert (echo["bot_id"], echo["user"], echo["thread_ts"]) == ("B0BOT", "U0BOT", "5.000001")
        assert changed["subtype"] == "message_changed" and changed["message"]["text"] == "edited"


# ------------------------------------------------------------------ signed http delivery


@pytest.fixture
async def bolt_endpoint(sim: SlackSimulator) -> AsyncIterator[list[dict[str, Any]]]:
    """A real bolt app on aiohttp behind ``sim.request_url``; yields the events it handled."""
    seen: list[dict[str, Any]] = []
    app = AsyncApp(client=AsyncWebClient(token=sim.bot_token, base_url=sim.base_url),
                   signing_secret=sim.signing_secret, process_before_response=True)

    @app.event("message")
    async def on_message(body: dict[str, Any]) -> None:
        seen.append(body)

    async def endpoint(request: web.Request) -> web.Response:
        return await to_aiohttp_response(await app.async_dispatch(await to_bolt_request(request)))

    server = web.Application()
    server.router.add_post("/slack/events", endpoint)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sim.request_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/slack/events"
    yield seen
    await runner.cleanup()


async def test_signed_delivery_retries_and_url_verification(sim: SlackSimulator,
                                                            bolt_endpoint: list[dict[str, Any]]) -> None:
    action = await sim.user_sends_dm("over http")
    await sim.redeliver(action.delivery)
    first, retry = action.delivery.http
    assert first.ok and retry.ok and len(bolt_endpoint) == 2
    assert "X-Slack-Retry-Num" not in first.headers
    assert (retry.headers["X-Slack-Retry-Num"], retry.headers["X-Slack-Retry-Reason"]) == ("1", "http_timeout")
    verifier = SignatureVerifier(sim.signing_secret)
    assert verifier.is_valid_request(first.body, first.headers)
    challenge = await sim.verify_url()
    assert challenge.ok and challenge.json()["challenge"] == json.loads(challenge.body)["challenge"]


async def test_tampering_helpers_are_rejected_by_bolt(sim: SlackSimulator,
                                                      bolt_endpoint: list[dict[str, Any]]) -> None:
    body = json.dumps(sim.event_callback({"type": "message", "channel": "D0USER1", "channel_type": "im",
                                          "user": DEFAULT_USER, "text": "x", "ts": "1.1"})).encode()
    changed = body.replace(b'"x"', b'"y"')
    attempts = [await sim.post_signed(changed, signed_body=body),
                await sim.post_signed(body, timestamp=int(time.time()) - 301),
                await sim.post_signed(body, omit_signature=True),
                await sim.post_signed(body, timestamp=int(time.time()) - 290)]
    assert [a.status for a in attempts] == [401, 401, 401, 200]
    assert len(bolt_endpoint) == 1


async def test_reactions_add_and_remove(sim: SlackSimulator, web_client: AsyncWebClient) -> None:
    user = await sim.user_sends_dm("hello")
    channel = user.message.channel
    await web_client.reactions_add(channel=channel, timestamp=user.ts, name="eyes")
    await web_client.reactions_add(channel=channel, timestamp=user.ts, name="white_check_mark")
    assert sim.bot_reactions(channel, user.ts) == ["eyes", "white_check_mark"]  # Slack keeps every one
    assert sim.calls_of("reactions.add")[0].params == {"channel": channel, "timestamp": user.ts, "name": "eyes"}
    await web_client.reactions_remove(channel=channel, timestamp=user.ts, name="eyes")
    assert sim.bot_reactions(channel, user.ts) == ["white_check_mark"]
    for call, error in ((web_client.reactions_add(channel=channel, timestamp=user.ts, name="white_check_mark"),
                         "already_reacted"),
                        (web_client.reactions_remove(channel=channel, timestamp=user.ts, name="eyes"), "no_reaction"),
                        (web_client.reactions_add(channel=channel, timestamp=user.ts, name=":tada:"), "invalid_name"),
                        (web_client.reactions_add(channel=channel, timestamp="9.9", name="tada"),
                         "message_not_found")):
        with pytest.raises(SlackApiError) as info:
            await call
        assert info.value.response["error"] == error
    sim.scopes.discard("reactions:write")
    with pytest.raises(SlackApiError) as info:
        await web_client.reactions_add(channel=channel, timestamp=user.ts, name="tada")
    assert (info.value.response["error"], info.value.response["needed"]) == ("missing_scope", "reactions:write")


async def test_assistant_thread_status(sim: SlackSimulator, web_client: AsyncWebClient) -> None:
    mention = await sim.user_mentions_bot("hello")
    await web_client.assistant_threads_setStatus(channel_id=DEFAULT_CHANNEL, thread_ts=mention.ts,
                                                 status="is thinking…")
    [call] = sim.calls_of("assistant.threads.setStatus")
    assert call.params == {"channel_id": DEFAULT_CHANNEL, "thread_ts": mention.ts, "status": "is thinking…"}
    with pytest.raises(SlackApiError) as info:
        await web_client.assistant_threads_setStatus(channel_id=DEFAULT_CHANNEL, thread_ts="9.9", status="x")
    assert info.value.response["error"] == "thread_not_found"
    sim.scopes.discard("assistant:write")
    with pytest.raises(SlackApiError) as info:
        await web_client.assistant_threads_setStatus(channel_id=DEFAULT_CHANNEL, thread_ts=mention.ts, status="x")
    assert info.value.response["error"] == "missing_scope"
