"""The Slack adapter end to end: the real gateway and slack-bolt against the Slack simulator (no mocks)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.adapters import receives_on
from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.sim.model_server import ScriptedModel, Turn, rules, text, tool_call
from gateway.sim.slack_api import DEFAULT_CHANNEL, DEFAULT_USER, SlackSimulator
from platforms.base import Accepted, MessageEvent
from platforms.slack import MAX_PART_LENGTH, SlackAdapter, SlackSettings, to_mrkdwn
from tests.conftest import Harness, base_config, deep_merge

OTHER_USER = "U0USER2"
STRANGER = "U0STRANGER"


def _slack_config(sim: SlackSimulator, **slack: Any) -> dict[str, Any]:
    return {
        "platforms": {"slack": {"enabled": True, "bot_token": sim.bot_token, "app_token": sim.app_token,
                                "signing_secret": sim.signing_secret, "api_base_url": sim.base_url,
                                "ping_interval": 0.2, **slack}},
        "auth": {"platforms": {"slack": {"allowed_users": [DEFAULT_USER, OTHER_USER]}}},
    }


Start = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def sim() -> AsyncIterator[SlackSimulator]:
    async with SlackSimulator() as s:
        yield s


@pytest.fixture
def start(sim: SlackSimulator, make_gateway: Any) -> Start:
    """Start the gateway with Slack enabled against ``sim`` (the simulator outlives the gateway)."""

    async def factory(responder: Any = None, overrides: dict[str, Any] | None = None, **slack: Any) -> Harness:
        h = await make_gateway(deep_merge(_slack_config(sim, **slack), overrides or {}), responder=responder)
        if slack.get("mode") == "http":
            sim.request_url = f"{h.base_url}/slack/events"
        return h

    return factory


async def _all_acked(sim: SlackSimulator) -> None:
    await sim.wait_for(lambda: all(d.acked for d in sim.deliveries))


def _adapter(h: Harness) -> SlackAdapter:
    adapter = h.gateway.adapters["slack"]
    assert isinstance(adapter, SlackAdapter)
    return adapter


# ------------------------------------------------------------------ conversations


async def test_channel_mention_gets_a_threaded_reply_with_a_tool_call(sim: SlackSimulator, start: Start) -> None:
    h = await start(rules((r"^plan the launch$", tool_call("todo", {"action": "add", "items": ["book a venue"]}))))
    action = await sim.user_mentions_bot("plan the launch")
    [reply] = await sim.wait_for_messages(1, DEFAULT_CHANNEL)
    assert reply.thread_ts == action.ts  # answered in a thread started on the user's message
    assert (reply.params["unfurl_links"], reply.params["unfurl_media"]) == (False, False)
    # the leading <@bot> mention was stripped before the model saw the text
    assert h.model.requests[0]["messages"][-1] == {"role": "user", "content": "plan the launch"}
    [run] = await h.gateway.store.list_runs()
    [call] = (await h.get_run(run.id))["tool_calls"]
    assert call["name"] == "todo" and "book a venue" in call["result"] and "error" not in json.loads(call["result"])
    # the tool's result went back to the model, whose answer is the threaded reply (escaped as mrkdwn)
    assert h.model.requests[1]["messages"][-1]["content"] == call["result"]
    assert reply.text == to_mrkdwn(f"Done: {call['result'][:200]}")
    # app_mention and the message event for the same text, and the echo of our own reply: all acked,
    # one run only
    await sim.wait_for(lambda: len(sim.deliveries) == 3)
    await _all_acked(sim)
    assert await h.gateway.store.count_runs() == 1 and await h.gateway.store.count_inbox() == 1


async def test_dm_reply_and_thread_follow_up_continue_one_session(sim: SlackSimulator, start: Start) -> None:
    h = await start()
    await sim.user_sends_dm("hello there")
    [dm_reply] = await sim.wait_for_messages(1, sim.dm_channel(DEFAULT_USER))
    assert (dm_reply.text, dm_reply.thread_ts) == ("Echo: hello there", None)

    mention = await sim.user_mentions_bot("my name is Ada")
    await sim.wait_for_messages(1, DEFAULT_CHANNEL)
    await sim.user_replies_in_thread(mention.ts, "what is my name?")  # no mention needed in the bot's thread
    replies = await sim.wait_for_messages(2, DEFAULT_CHANNEL, thread_ts=mention.ts)
    assert replies[1].text == "Echo: what is my name?"
    history = [m["content"] for m in h.model.requests[-1]["messages"] if m["role"] in ("user", "assistant")]
    assert history == ["my name is Ada", "Echo: my name is Ada", "what is my name?"]  # the DM is another session

    # a mention inside the active thread arrives as app_mention and as message: answered once
    await sim.user_mentions_bot("and again", thread_ts=mention.ts)
    await sim.wait_for_messages(3, DEFAULT_CHANNEL, thread_ts=mention.ts)
    # replies elsewhere need a mention: a thread the bot is not in, and the channel itself
    await sim.user_replies_in_thread("1000.000001", "not my thread")
    await sim.user_replies_in_thread(mention.ts, "x", channel="C0OTHER")
    await sim.deliver_event({"type": "message", "channel": DEFAULT_CHANNEL, "channel_type": "channel",
                             "user": DEFAULT_USER, "text": "chatter", "ts": "1000.000002"})
    await _all_acked(sim)
    await asyncio.sleep(0.1)
    assert await h.gateway.store.count_runs() == 4 and len(h.model.requests) == 4


async def test_streamed_reply_is_edited_in_place(sim: SlackSimulator, start: Start) -> None:
    answer = "Streaming **works** " * 12
    h = await start(rules((r"stream", text(answer))), overrides={"model": {"stream": True}})
    h.model.chunk_size, h.model.chunk_delay = 8, 0.01
    action = await sim.user_mentions_bot("stream please")
    final = to_mrkdwn(answer)
    [message] = await sim.wait_for(lambda: [m for m in sim.messages(DEFAULT_CHANNEL) if m.final_text == final])
    assert message.thread_ts == action.ts and len(sim.messages(DEFAULT_CHANNEL)) == 1
    assert "▍" in message.text and len(message.edits) >= 2  # a preview, edited as text arrived, then final
    assert all("▍" in e for e in message.edits[:-1])
    assert len(sim.calls_of("chat.update")) == len(message.edits)


async def test_ignored_events_are_acked_without_runs(sim: SlackSimulator, start: Start) -> None:
    h = await start()
    dm = await sim.user_sends_dm("first")
    await sim.wait_for_messages(1)
    await sim.user_edits(dm, "first, edited")
    await sim.user_deletes(dm)
    await sim.other_bot_posts(f"<@{sim.bot_user_id}> hello bot")
    await sim.user_mentions_bot("let me in", user=STRANGER)  # not on the allow list
    await _all_acked(sim)
    await asyncio.sleep(0.1)
    assert await h.gateway.store.count_runs() == 1 and len(sim.messages()) == 1
    assert await h.gateway.store.count_inbox() == 1


async def test_top_level_replies_and_file_attachments(sim: SlackSimulator, start: Start) -> None:
    h = await start(rules((r"look", text("seen", latency=0.3))), reply_in_thread=False)
    action = await sim.user_mentions_bot("hello")
    [reply] = await sim.wait_for_messages(1, DEFAULT_CHANNEL)
    assert reply.thread_ts is None and action.message.thread_ts is None
    files = [{"id": "F0PIC", "name": "chart.png", "mimetype": "image/png", "size": 2048,
              "url_private": "https://files.slack.com/chart.png"}, {"id": "F0DOC", "name": "notes.txt"}]
    await sim.deliver_event({"type": "message", "subtype": "file_share", "channel": "D0USER1", "channel_type": "im",
                             "user": DEFAULT_USER, "text": "look at this", "ts": "1000.000001", "files": files})

    async def running() -> list[Any]:
        while not (rows := await h.gateway.store.unfinished_inbox()):
            await asyncio.sleep(0.01)
        return rows

    [row] = await asyncio.wait_for(running(), 5)
    assert [(a["kind"], a["file_id"], a["name"]) for a in row.payload["event"]["attachments"]] == [
        ("photo", "F0PIC", "chart.png"), ("file", "F0DOC", "notes.txt")]
    assert row.payload["event"]["attachments"][0]["url"] == "https://files.slack.com/chart.png"
    await sim.wait_for_messages(2)


async def test_slash_command_maps_to_shared_commands(sim: SlackSimulator, start: Start) -> None:
    h = await start()
    dm = sim.dm_channel(DEFAULT_USER)
    await sim.user_sends_dm("remember this")
    await sim.wait_for_messages(1, dm)
    new = await sim.user_runs_command("/hermes", "new", channel=dm)
    await sim.wait_for_messages(2, dm)
    assert new.delivery.response is None  # an empty ack: nothing shown but the reply itself
    assert sim.messages(dm)[1].text == "Started a new conversation. Earlier messages are forgotten."
    await sim.user_runs_command("/hermes", channel=DEFAULT_CHANNEL)
    [help_reply] = await sim.wait_for_messages(1, DEFAULT_CHANNEL)
    assert help_reply.text.startswith("Commands:")
    await sim.user_sends_dm("after reset")
    await sim.wait_for_messages(3, dm)
    assert "remember this" not in json.dumps(h.model.requests[-1]["messages"])
    refused = await sim.user_runs_command("/hermes", "status", user=STRANGER)
    await sim.wait_for_ack(refused.delivery)
    assert refused.delivery.response == {"text": "You are not allowed to use this assistant here."}
    assert len(h.model.requests) == 2


# ------------------------------------------------------------------ http mode


async def test_http_mode_rejects_forged_requests_and_answers_url_verification(sim: SlackSimulator,
                                                                             start: Start) -> None:
    h = await start(mode="http")
    assert sim.live_sockets == [] and sim.calls_of("apps.connections.open") == []
    challenge = await sim.verify_url()
    assert challenge.status == 200 and challenge.json() == {"challenge": json.loads(challenge.body)["challenge"]}
    event = {"type": "message", "channel": "D0USER1", "channel_type": "im", "user": DEFAULT_USER,
             "text": "forged", "ts": "1700000000.000100"}
    body = json.dumps(sim.event_callback(event)).encode()
    forged = [
        await sim.post_signed(body.replace(b"forged", b"forgeD"), signed_body=body),  # one byte changed
        await sim.post_signed(body, timestamp=int(time.time()) - 301),  # outside the 5-minute window
        await sim.post_signed(body, omit_signature=True),
        await sim.post_signed(body.replace(b"forged", b"forg\xffd")),  # signed, but not UTF-8
    ]
    assert [f.status for f in forged] == [401, 401, 401, 401]
    assert await h.gateway.store.count_inbox() == 0
    action = await sim.user_sends_dm("genuine")
    assert action.delivery.http[0].status == 200
    assert await h.gateway.store.count_inbox() == 1  # the 200 came after the inbox write, not before
    [reply] = await sim.wait_for_messages(1)
    assert reply.text == "Echo: genuine"
    command = await sim.user_runs_command("/hermes", "whoami", channel=reply.channel)  # a signed form post
    assert command.delivery.http[0].status == 200
    replies = await sim.wait_for_messages(2)
    assert replies[1].text.startswith("Platform: slack\nUser: U0USER1")


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_retries_of_one_event_give_one_run_and_one_reply(sim: SlackSimulator, start: Start, mode: str) -> None:
    h = await start(rules((r"slow", text("the slow answer", latency=0.6))), mode=mode)
    action = await sim.user_sends_dm("a slow question")
    for _ in range(3):  # Slack retries while the first run is still going
        await sim.redeliver(action.delivery)
    delivery = action.delivery
    if mode == "socket":
        await sim.wait_for(lambda: all(e.acked_t for e in delivery.envelopes))
        assert [e.retry_attempt for e in delivery.envelopes] == [0, 1, 2, 3]
        assert all(e.acked_t - e.sent_t < 0.5 for e in delivery.envelopes)  # acked after the inbox write only
    else:
        assert [(a.status, a.headers.get("X-Slack-Retry-Num")) for a in delivery.http] == [
            (200, None), (200, "1"), (200, "2"), (200, "3")]
        assert all(a.elapsed < 0.5 for a in delivery.http)
    assert not sim.messages()  # every retry was acknowledged before the run finished
    [reply] = await sim.wait_for_messages(1, timeout=5)
    assert reply.text == "the slow answer"
    await asyncio.sleep(0.2)
    assert len(sim.messages()) == 1 and len(h.model.requests) == 1
    assert await h.gateway.store.count_runs() == 1 and await h.gateway.store.count_inbox() == 1


# ------------------------------------------------------------------ socket mode resilience


async def test_socket_reconnects_and_a_lost_ack_is_redelivered_and_processed_once(sim: SlackSimulator,
                                                                                  start: Start) -> None:
    h = await start()
    dm = sim.dm_channel(DEFAULT_USER)
    await sim.user_sends_dm("one")
    await sim.wait_for_messages(1, dm)
    await sim.drop_sockets(hard=True)  # the TCP connection dies without a close frame
    await sim.wait_for_sockets(2)
    await sim.user_sends_dm("two")
    await sim.wait_for_messages(2, dm)
    await sim.send_disconnect()  # Slack recycling the connection
    await sim.wait_for_sockets(3)
    await sim.user_sends_dm("three")
    await sim.wait_for_messages(3, dm)
    await _all_acked(sim)

    sim.lose_acks(1, drop_socket=True)  # the socket dies before the ack reaches Slack
    four = await sim.user_sends_dm("four")
    await sim.wait_for_ack(four.delivery)
    first, second = four.delivery.envelopes
    assert first.acked_t is None and first.lost_acks == 1 and second.retry_attempt == 1
    await sim.wait_for_messages(4, dm)
    await asyncio.sleep(0.2)
    assert [m.text for m in sim.messages(dm)] == ["Echo: one", "Echo: two", "Echo: three", "Echo: four"]
    assert await h.gateway.store.count_runs() == 4
    assert len(sim.calls_of("apps.connections.open")) == 4


async def test_envelope_unacked_at_shutdown_is_redelivered_and_answered_once(sim: SlackSimulator,
                                                                            tmp_path: Path) -> None:
    """The gateway stops mid-run before Slack saw the ack: the next gateway gets the envelope again."""
    requests = 0

    def responder(_request: dict[str, Any]) -> Turn:
        nonlocal requests
        requests += 1
        return text("answered once", latency=30 if requests == 1 else 0)

    async with ScriptedModel(responder) as model:
        cfg = parse_config(deep_merge(base_config(tmp_path, model.base_url, "http://127.0.0.1:9/results"),
                                      _slack_config(sim)), env={"HERMES_GATEWAY_HOME": str(tmp_path)})
        sim.lose_acks(1)
        first = Gateway(cfg)
        await first.start()
        action = await sim.user_sends_dm("survive a restart")
        await sim.wait_for(lambda: model.requests)  # in the inbox and running
        await first.stop(drain_timeout=0)  # the run is cut off and the envelope was never acked
        assert not action.delivery.acked and await sim.wait_for(lambda: sim.live_sockets == [])
        second = Gateway(cfg)
        await second.start()
        try:
            await sim.wait_for_ack(action.delivery)
            [reply] = await sim.wait_for_messages(1)
            await asyncio.sleep(0.2)
            assert await second.store.count_inbox() == 1 and await second.store.count_runs() == 1
        finally:
            await second.stop(drain_timeout=1)
    assert reply.text == "answered once" and len(sim.messages()) == 1
    first_try, redelivered = action.delivery.envelopes
    assert first_try.acked_t is None and redelivered.retry_attempt == 1 and redelivered.acked_t is not None
    assert requests == 2  # the run was redone once from the inbox; the redelivery was deduplicated


# ------------------------------------------------------------------ outbound and failures


async def test_rate_limited_post_is_delivered_once_after_retry_after(sim: SlackSimulator, start: Start) -> None:
    await start()
    sim.rate_limit_next("chat.postMessage", retry_after=2)
    await sim.user_sends_dm("hi")
    [reply] = await sim.wait_for_messages(1, timeout=10)
    limited, sent = sim.calls_of("chat.postMessage")  # no retry inside slack-sdk: the outbox owns it
    assert (limited.status, sent.status) == (429, 200) and reply.text == "Echo: hi"
    assert sent.t - limited.t >= 1.99


@pytest.mark.parametrize(("token", "expected"), [
    ({"bot_token": "xoxb-revoked"},
     "slack: the bot token was rejected (auth.test: invalid_auth); check platforms.slack.bot_token"),
    ({"app_token": "xapp-1-revoked"},
     "slack: the app token was rejected (apps.connections.open: invalid_auth); check platforms.slack.app_token"),
])
async def test_bad_token_fails_slack_clearly_and_the_rest_keeps_running(
        sim: SlackSimulator, start: Start, caplog: pytest.LogCaptureFixture, token: dict[str, str], expected: str
) -> None:
    with caplog.at_level(logging.ERROR, logger="gateway.app"):
        h = await start(**token)
    assert f"platform slack failed to start: {expected}" in caplog.text
    assert _adapter(h).status() == {"platform": "slack", "state": "failed", "receiving": False, "last_error": expected}
    assert sim.live_sockets == []
    async with h.http.get(f"{h.base_url}/readyz") as r:
        ready = await r.json()
    assert r.status == 200 and ready["platforms"]["slack"]["last_error"] == expected
    status, body = await h.post_webhook()
    assert status == 202
    assert (await h.wait_run(body["run_id"]))["status"] == "completed"
    await h.sink.wait_for(1)


async def test_send_failures_map_to_retryable_results(sim: SlackSimulator, start: Start) -> None:
    adapter = _adapter(await start())
    sim.rate_limit_next("chat.postMessage", retry_after=7)
    limited = await adapter.send(DEFAULT_CHANNEL, "x")
    assert (limited.success, limited.retryable, limited.retry_after) == (False, True, 7.0)
    sim.server_error_next("chat.postMessage")
    assert (await adapter.send(DEFAULT_CHANNEL, "x")).retryable is True
    sim.fail_next("chat.postMessage", "channel_not_found")
    failed = await adapter.send(DEFAULT_CHANNEL, "x")
    assert (failed.retryable, failed.error) == (False, "slack: channel_not_found")
    missing = await adapter.edit_message(DEFAULT_CHANNEL, "1.000001", "x")
    assert (missing.success, missing.retryable) == (False, False)  # the outbox falls back to a new message
    posted = await adapter.send(DEFAULT_CHANNEL, "in a thread", metadata={"thread_id": "5.000001"})
    assert posted.success and sim.messages()[-1].thread_ts == "5.000001" and posted.message_id == sim.messages()[-1].ts


@pytest.mark.parametrize("thread", [None, "5.000001"])
async def test_a_part_in_doubt_is_looked_up_by_its_delivery_id_and_never_posted_twice(
        sim: SlackSimulator, start: Start, thread: str | None) -> None:
    adapter = _adapter(await start())
    meta = {"delivery_id": "run:r1:0", **({"thread_id": thread} if thread else {})}
    first = await adapter.send(DEFAULT_CHANNEL, "the answer", metadata=meta)
    assert sim.messages()[-1].metadata == {"event_type": "hermes_delivery",
                                           "event_payload": {"delivery_id": "run:r1:0"}}
    # the gateway died before recording the send; the restarted sender marks the part in doubt
    again = await adapter.send(DEFAULT_CHANNEL, "the answer", metadata={**meta, "in_doubt": "1"})
    assert (again.success, again.message_id) == (True, first.message_id)
    assert [m.text for m in sim.messages()] == ["the answer"]
    # in doubt, but never posted (it died before the post): posted now
    other = await adapter.send(DEFAULT_CHANNEL, "part two", metadata={**meta, "delivery_id": "run:r1:1",
                                                                       "in_doubt": "1"})
    assert other.success and [m.text for m in sim.messages()] == ["the answer", "part two"]
    lookups = [c.method for c in sim.calls if c.method.startswith("conversations.")]
    assert lookups == ["conversations.replies" if thread else "conversations.history"] * 2


async def test_a_failed_lookup_posts_again_rather_than_lose_the_part(sim: SlackSimulator, start: Start) -> None:
    adapter = _adapter(await start())
    sim.fail_next("conversations.history", "missing_scope")
    result = await adapter.send(DEFAULT_CHANNEL, "answer", metadata={"delivery_id": "run:r2:0", "in_doubt": "1"})
    assert result.success and [m.text for m in sim.messages()] == ["answer"]


# ------------------------------------------------------------------ receiving switched on and off


class _Inbox:
    """Stands in for the gateway: keeps every event; ``hold`` makes the next hand-over wait."""

    def __init__(self) -> None:
        self.events: list[MessageEvent] = []
        self.hold: asyncio.Event | None = None
        self.holding = asyncio.Event()

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.events]

    async def __call__(self, event: MessageEvent) -> Accepted:
        if self.hold is not None:
            self.holding.set()
            await asyncio.wait_for(self.hold.wait(), 5)
            self.hold = None
        self.events.append(event)
        return Accepted(None, False)


def _settings(sim: SlackSimulator, **changes: Any) -> SlackSettings:
    return SlackSettings(**{"bot_token": sim.bot_token, "app_token": sim.app_token,
                            "signing_secret": sim.signing_secret, "api_base_url": sim.base_url,
                            "ping_interval": 0.2, **changes})


async def test_socket_mode_receives_only_between_start_and_stop_receiving(sim: SlackSimulator) -> None:
    inbox = _Inbox()
    adapter = SlackAdapter(_settings(sim))
    await adapter.connect(inbox, receive=False)
    try:
        early = await sim.user_sends_dm("while send-only")  # Slack holds it until a connection opens
        assert (await adapter.send(DEFAULT_CHANNEL, "sent while send-only")).success
        await asyncio.sleep(0.3)
        assert (adapter.state.value, adapter.status()["receiving"], inbox.texts) == ("connected", False, [])
        assert sim.sockets == [] and sim.calls_of("apps.connections.open") == []

        for _ in range(2):
            await adapter.start_receiving()
        assert len(sim.live_sockets) == 1 and len(sim.calls_of("apps.connections.open")) == 1
        await sim.wait_for_ack(early.delivery)
        assert inbox.texts == ["while send-only"] and adapter.receiving

        for _ in range(2):
            await adapter.stop_receiving()
        assert sim.live_sockets == [] and not adapter.receiving and adapter.state.value == "connected"
        late = await sim.user_sends_dm("while stopped")
        assert (await adapter.send(DEFAULT_CHANNEL, "sent while stopped")).success
        await asyncio.sleep(0.3)
        assert inbox.texts == ["while send-only"] and not late.delivery.acked

        await adapter.start_receiving()
        await sim.wait_for_ack(late.delivery)
        assert inbox.texts == ["while send-only", "while stopped"]
        assert [m.text for m in sim.messages(DEFAULT_CHANNEL)] == ["sent while send-only", "sent while stopped"]
    finally:
        await adapter.disconnect()


async def test_an_envelope_in_hand_when_receiving_stops_is_redelivered_not_lost(sim: SlackSimulator) -> None:
    inbox = _Inbox()
    adapter = SlackAdapter(_settings(sim))
    await adapter.connect(inbox)
    try:
        inbox.hold = asyncio.Event()
        action = await sim.user_sends_dm("in hand")
        await asyncio.wait_for(inbox.holding.wait(), 5)
        await adapter.stop_receiving()  # the socket closes before the envelope could be acknowledged
        inbox.hold.set()
        await sim.wait_for(lambda: inbox.texts == ["in hand"])
        await asyncio.sleep(0.2)
        assert not action.delivery.acked  # acknowledged only after on_message, and that socket is gone
        await adapter.start_receiving()
        await sim.wait_for_ack(action.delivery)
        first, again = inbox.events  # the same event again: the gateway's inbox drops the repeat
        assert first.event_id == again.event_id == action.delivery.event_id
        assert [e.retry_attempt for e in action.delivery.envelopes] == [0, 1]
    finally:
        await adapter.disconnect()


async def test_http_events_get_503_while_not_receiving_and_slack_retries(sim: SlackSimulator) -> None:
    inbox = _Inbox()
    adapter = SlackAdapter(_settings(sim, mode="http", app_token=None))
    app = web.Application()
    app.add_routes(adapter.http_routes())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sim.request_url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    await adapter.connect(inbox, receive=False)
    try:
        early = await sim.user_sends_dm("while send-only")
        assert (await adapter.send(DEFAULT_CHANNEL, "sent while send-only")).success
        for _ in range(2):
            await adapter.start_receiving()
        await sim.redeliver(early.delivery)  # Slack's retry of the refused request
        assert [a.status for a in early.delivery.http] == [503, 200] and inbox.texts == ["while send-only"]

        for _ in range(2):
            await adapter.stop_receiving()
        late = await sim.user_sends_dm("while stopped")
        assert (await adapter.send(DEFAULT_CHANNEL, "sent while stopped")).success
        await adapter.start_receiving()
        await sim.redeliver(late.delivery)
        assert [a.status for a in late.delivery.http] == [503, 200]
        assert inbox.texts == ["while send-only", "while stopped"] and sim.live_sockets == []
    finally:
        await adapter.disconnect()
        await runner.cleanup()


def test_run_on_is_leader_or_all_and_http_mode_receives_everywhere() -> None:
    def slack(**section: str) -> str:
        cfg = parse_config({"platforms": {"slack": section}}, {})
        assert receives_on(cfg, "slack") == cfg.platforms.slack.run_on
        return cfg.platforms.slack.run_on

    assert (slack(), slack(run_on="all"), slack(mode="http"), slack(mode="http", run_on="all")) == (
        "leader", "all", "all", "all")
    for section, message in [
        ({"mode": "http", "run_on": "leader"}, "http mode receives on every replica (Slack posts each event"),
        ({"run_on": "one"}, "Input should be 'leader' or 'all'"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config({"platforms": {"slack": section}}, {})
        assert info.value.path == "platforms.slack.run_on" and message in str(info.value)


def test_config_requires_the_tokens_of_the_chosen_mode() -> None:
    def errors(**slack: Any) -> list[str]:
        with pytest.raises(ConfigError) as info:
            parse_config({"platforms": {"slack": {"enabled": True, **slack}}}, {})
        return [str(e) for e in info.value.errors]

    assert [e.split(":")[0] for e in errors()] == ["platforms.slack.bot_token", "platforms.slack.app_token"]
    assert errors(bot_token="xoxb-1", mode="http") == [
        "platforms.slack.signing_secret: required in http mode (Basic Information > App Credentials > "
        "Signing Secret in the Slack app settings)"]
    assert "app-level token" in errors(bot_token="xapp-1-x", app_token="xapp-1-y")[0]
    assert "slash command" in errors(bot_token="xoxb-1", app_token="xapp-1", slash_command="hermes")[0]
    cfg = parse_config({"platforms": {"slack": {"api_base_url": "http://127.0.0.1:1/api"}}}, {})
    assert cfg.platforms.slack.api_base_url == "http://127.0.0.1:1/api/" and cfg.platforms.slack.enabled is False
    masked = parse_config({"platforms": {"slack": {"bot_token": "xoxb-secret"}}}, {}).masked()
    assert masked["platforms"]["slack"]["bot_token"] == "***"


# ------------------------------------------------------------------ mrkdwn


def test_long_answers_split_into_readable_parts() -> None:
    parts = SlackAdapter(SlackSettings(bot_token="xoxb-1")).split("word " * 2000)
    assert len(parts) == 3 and all(len(p) <= MAX_PART_LENGTH for p in parts)


async def test_reactions_replace_and_remove_and_stop_after_missing_scope(sim: SlackSimulator) -> None:
    adapter = SlackAdapter(_settings(sim))
    await adapter.connect(_Inbox(), receive=False)
    try:
        action = await sim.user_sends_dm("react")
        channel = action.message.channel
        assert (await adapter.set_reaction(channel, action.ts, "eyes")).success
        assert (await adapter.set_reaction(channel, action.ts, "eyes")).success  # already_reacted is no failure
        assert (await adapter.set_reaction(channel, action.ts, None, "eyes")).success  # only removes
        assert sim.bot_reactions(channel, action.ts) == []
        sim.scopes.discard("reactions:write")
        refused = await adapter.set_reaction(channel, action.ts, "tada")
        assert not refused.success and refused.error == "slack: reactions.add: missing_scope"
        assert not (await adapter.set_reaction(channel, action.ts, "tada")).success
        assert [c.error for c in sim.calls_of("reactions.add")] == [None, "already_reacted", "missing_scope"]
    finally:
        await adapter.disconnect()
