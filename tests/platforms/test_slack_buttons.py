"""Slack buttons: send_choices as Block Kit, presses as messages, edits that remove the buttons.

The real slack-bolt / slack_sdk against the Slack simulator, in Socket Mode (``interactive`` envelopes) and in
HTTP mode (signed ``payload=`` form posts to the events URL).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

import tests.platforms.test_slack as slack_suite
from gateway.sim.slack_api import DEFAULT_CHANNEL, DEFAULT_USER, SlackSimulator, UserAction
from platforms.base import Accepted, Choice, GatewayClosing, MessageEvent, choices_as_text
from platforms.slack import RESTARTING_NOTE, SlackAdapter, to_mrkdwn
from tests.platforms.test_slack import Start, _adapter, _Inbox, _settings

sim, start = slack_suite.sim, slack_suite.start  # the Slack fixtures of test_slack.py

APPROVE = Choice("Approve once", "/approve once 3f2a", "primary")
DENY = Choice("Deny", "/deny 3f2a", "danger")
DETAILS = Choice("Show details")
BOTH_MODES = pytest.mark.parametrize("slack", ["socket", "http"], indirect=True)


class _Gate(_Inbox):
    """The inbox stand-in, which can also refuse events (None) or be shutting down (GatewayClosing)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = "accept"

    async def __call__(self, event: MessageEvent) -> Accepted | None:
        accepted = await super().__call__(event)
        if self.answer == "closing":
            raise GatewayClosing("the gateway is shutting down")
        return None if self.answer == "refuse" else accepted


@dataclass
class _Slack:
    adapter: SlackAdapter
    inbox: _Gate
    mode: str


@pytest.fixture
async def slack(sim: SlackSimulator, request: pytest.FixtureRequest) -> AsyncIterator[_Slack]:
    """A connected adapter (Socket Mode unless parametrized with "http", then served on its own aiohttp app)."""
    mode = getattr(request, "param", "socket")
    inbox = _Gate()
    runner: web.AppRunner | None = None
    if mode == "http":
        adapter = SlackAdapter(_settings(sim, mode="http", app_token=None))
        app = web.Application()
        app.add_routes(adapter.http_routes())
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        sim.request_url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    else:
        adapter = SlackAdapter(_settings(sim))
    await adapter.connect(inbox)
    try:
        yield _Slack(adapter, inbox, mode)
    finally:
        await adapter.disconnect()
        if runner is not None:
            await runner.cleanup()


async def _press(sim: SlackSimulator, slack: _Slack, button: str, chat: str, **send: Any) -> UserAction:
    """Post APPROVE / DENY / DETAILS in ``chat`` and have DEFAULT_USER press ``button``."""
    sent = await slack.adapter.send_choices(chat, "Run `make clean`?", [APPROVE, DENY, DETAILS], **send)
    assert sent.success
    [message] = [m for m in sim.messages(chat) if m.ts == sent.message_id]
    return await sim.user_presses_button(message, button)


def _acked_as_interaction(action: UserAction, mode: str) -> None:
    delivery = action.delivery
    assert delivery.kind == "interactive" and delivery.acked and delivery.attempts == 1
    assert delivery.ack_seconds is not None and delivery.ack_seconds < 1.0
    if mode == "socket":
        [envelope] = delivery.envelopes
        assert envelope.type == "interactive" and envelope.ack_payload is None  # an empty ack
    else:
        [post] = delivery.http
        assert post.headers["Content-Type"] == "application/x-www-form-urlencoded"
        assert post.body.startswith(b"payload=") and (post.status, post.response_body) == (200, "")


# ------------------------------------------------------------------ sending


async def test_send_choices_posts_a_button_per_choice_under_the_text(sim: SlackSimulator, slack: _Slack) -> None:
    content = "Run **this** command?\n`rm -rf build/`"
    result = await slack.adapter.send_choices(DEFAULT_CHANNEL, content, [APPROVE, DENY, DETAILS],
                                              metadata={"thread_id": "5.000001", "delivery_id": "run:r1:0"})
    [message] = sim.messages(DEFAULT_CHANNEL)
    assert SlackAdapter.can_buttons and result.success and result.message_id == message.ts
    assert (message.text, message.thread_ts) == (to_mrkdwn(content), "5.000001")  # text: the notification fallback
    assert message.metadata == {"event_type": "hermes_delivery", "event_payload": {"delivery_id": "run:r1:0"}}
    assert message.blocks == [
        {"type": "section", "text": {"type": "mrkdwn", "text": to_mrkdwn(content)}},
        {"type": "actions", "block_id": "hermes_choices", "elements": [
            {"type": "button", "action_id": "hermes_choice_0", "value": "/approve once 3f2a", "style": "primary",
             "text": {"type": "plain_text", "text": "Approve once", "emoji": True}},
            {"type": "button", "action_id": "hermes_choice_1", "value": "/deny 3f2a", "style": "danger",
             "text": {"type": "plain_text", "text": "Deny", "emoji": True}},
            {"type": "button", "action_id": "hermes_choice_2", "value": "Show details",
             "text": {"type": "plain_text", "text": "Show details", "emoji": True}},
        ]},
    ]
    # the blocks travel with the message: in the thread's history and in the echo of the bot's own post
    [listed] = (await AsyncWebClient(token=sim.bot_token, base_url=sim.base_url).conversations_replies(
        channel=DEFAULT_CHANNEL, ts="5.000001"))["messages"]
    [echo] = await sim.wait_for(lambda: [d.event for d in sim.deliveries if d.kind == "events_api"])
    assert listed["blocks"] == echo["blocks"] == message.blocks


async def test_send_choices_keeps_within_block_kit_limits(sim: SlackSimulator, slack: _Slack) -> None:
    long_text = "word " * 700  # 3,500 characters: more than one section holds
    label = "A label far longer than the seventy-five characters a Slack button can show at all"
    assert (await slack.adapter.send_choices(DEFAULT_CHANNEL, long_text, [Choice(label)])).success
    sections, actions = sim.messages()[-1].blocks[:-1], sim.messages()[-1].blocks[-1]
    assert len(sections) == 2 and all(len(s["text"]["text"]) <= 3000 for s in sections)
    assert " ".join(s["text"]["text"].strip() for s in sections) == long_text.strip()
    [button] = actions["elements"]
    assert len(button["text"]["text"]) == 75 and button["text"]["text"].endswith("…") and button["value"] == label
    # a choice whose text a button's value cannot hold: every choice offered as text, as without buttons
    huge = Choice("Answer", "x" * 2001)
    assert (await slack.adapter.send_choices(DEFAULT_CHANNEL, "Pick", [huge, DENY])).success
    assert (sim.messages()[-1].text, sim.messages()[-1].blocks) == (
        to_mrkdwn(f"Pick\n\n{choices_as_text([huge, DENY])}"), None)


@pytest.mark.parametrize("thread", [None, "5.000001"])
async def test_send_choices_in_doubt_is_looked_up_and_never_posted_twice(sim: SlackSimulator, slack: _Slack,
                                                                        thread: str | None) -> None:
    meta = {"delivery_id": "run:r1:0", **({"thread_id": thread} if thread else {})}
    first = await slack.adapter.send_choices(DEFAULT_CHANNEL, "Approve?", [APPROVE, DENY], metadata=meta)
    again = await slack.adapter.send_choices(DEFAULT_CHANNEL, "Approve?", [APPROVE, DENY],
                                             metadata={**meta, "in_doubt": "1"})
    assert (again.success, again.message_id) == (True, first.message_id)
    assert len(sim.messages()) == 1 and len(sim.calls_of("chat.postMessage")) == 1
    # in doubt but never posted: posted now, with its buttons
    other = await slack.adapter.send_choices(DEFAULT_CHANNEL, "Approve?", [APPROVE, DENY],
                                             metadata={**meta, "delivery_id": "run:r1:1", "in_doubt": "1"})
    assert other.success and len(sim.messages()) == 2 and sim.messages()[-1].blocks == sim.messages()[0].blocks
    lookups = [c.method for c in sim.calls if c.method.startswith("conversations.")]
    assert lookups == ["conversations.replies" if thread else "conversations.history"] * 2


# ------------------------------------------------------------------ presses


@BOTH_MODES
async def test_a_press_is_acked_first_and_arrives_as_the_pressers_message(sim: SlackSimulator,
                                                                         slack: _Slack) -> None:
    dm = sim.dm_channel(DEFAULT_USER)
    slack.inbox.hold = asyncio.Event()  # the gateway is slow to take it: Slack has the ack anyway
    action = await _press(sim, slack, "Approve once", dm)
    await asyncio.wait_for(slack.inbox.holding.wait(), 5)
    await sim.wait_for_ack(action.delivery)
    assert slack.inbox.events == []
    slack.inbox.hold.set()
    [event] = await sim.wait_for(lambda: slack.inbox.events)
    _acked_as_interaction(action, slack.mode)
    payload = action.delivery.payload
    assert payload["type"] == "block_actions" and payload["container"]["message_ts"] == action.ts
    assert event == MessageEvent(
        platform="slack", event_id=f"press:{payload['actions'][0]['action_ts']}:{action.ts}:{DEFAULT_USER}",
        chat_id=dm, chat_type="dm", user_id=DEFAULT_USER, user_name=DEFAULT_USER.lower(),
        text="/approve once 3f2a", message_id=None, thread_id=None, reply_to_message_id=None, mentions_bot=False,
        attachments=(), received_at=event.received_at, metadata={"pressed_message_id": action.ts})
    # another press of the same button is another event
    await sim.user_presses_button(action.message, "hermes_choice_0")
    await sim.wait_for(lambda: len(slack.inbox.events) == 2)
    assert slack.inbox.events[1].event_id != event.event_id and slack.inbox.events[1].text == event.text


@BOTH_MODES
async def test_a_press_in_a_channel_thread_keeps_the_thread(sim: SlackSimulator, slack: _Slack) -> None:
    action = await _press(sim, slack, "Show details", DEFAULT_CHANNEL, metadata={"thread_id": "7.000001"})
    [event] = await sim.wait_for(lambda: slack.inbox.events)
    assert action.delivery.payload["container"]["thread_ts"] == "7.000001"
    assert (event.chat_id, event.chat_type, event.thread_id, event.text) == (
        DEFAULT_CHANNEL, "group", "7.000001", "Show details")
    assert event.metadata == {"pressed_message_id": action.ts}
    _acked_as_interaction(action, slack.mode)
    # buttons on a top-level message that has since become a thread's parent: still the channel, no thread
    top = await slack.adapter.send_choices(DEFAULT_CHANNEL, "Which one?", [DETAILS])
    await sim.user_replies_in_thread(top.message_id, "hmm")
    [parent] = [m for m in sim.messages(DEFAULT_CHANNEL) if m.ts == top.message_id]
    pressed = await sim.user_presses_button(parent, "Show details")
    assert pressed.delivery.payload["message"]["thread_ts"] == top.message_id
    await sim.wait_for(lambda: len(slack.inbox.events) == 2)
    assert (slack.inbox.events[1].thread_id, slack.inbox.events[1].metadata) == (
        None, {"pressed_message_id": top.message_id})


@BOTH_MODES
async def test_a_refused_press_is_still_acked_and_nothing_is_said(sim: SlackSimulator, slack: _Slack) -> None:
    slack.inbox.answer = "refuse"
    action = await _press(sim, slack, "Deny", DEFAULT_CHANNEL)
    await sim.wait_for(lambda: slack.inbox.events)
    _acked_as_interaction(action, slack.mode)
    await asyncio.sleep(0.1)
    assert slack.inbox.texts == ["/deny 3f2a"] and sim.responses.posts == [] and len(sim.messages()) == 1


@BOTH_MODES
async def test_a_press_while_the_gateway_closes_tells_the_presser_to_press_again(
        sim: SlackSimulator, slack: _Slack, caplog: pytest.LogCaptureFixture) -> None:
    slack.inbox.answer = "closing"
    with caplog.at_level(logging.WARNING, logger="platforms.slack"):
        action = await _press(sim, slack, "Approve once", DEFAULT_CHANNEL)
        [note] = await sim.wait_for(lambda: sim.responses.posts)
    _acked_as_interaction(action, slack.mode)  # acked (Slack would show an error otherwise), never redelivered
    assert note.url == action.delivery.payload["response_url"] and (note.status, note.answer) == (200, "ok")
    assert note.body == {"text": RESTARTING_NOTE, "response_type": "ephemeral", "replace_original": False}
    assert note.text == "The gateway is restarting; press again in a moment." and note.ephemeral
    assert "arrived while the gateway was closing; it is lost" in caplog.text
    assert len(sim.messages()) == 1  # nothing in the channel: the note is for the presser only


# ------------------------------------------------------------------ editing


async def test_an_edit_removes_the_buttons(sim: SlackSimulator, slack: _Slack) -> None:
    sent = await slack.adapter.send_choices(DEFAULT_CHANNEL, "Approve?", [APPROVE, DENY])
    [message] = sim.messages()
    assert (await slack.adapter.edit_message(DEFAULT_CHANNEL, sent.message_id, "Approved **once**.")).success
    assert sim.calls_of("chat.update")[-1].params["blocks"] == []
    assert (message.final_text, message.blocks) == (to_mrkdwn("Approved **once**."), None)
    with pytest.raises(LookupError, match="no button 'Deny'"):
        await sim.user_presses_button(message, "Deny")
    await asyncio.sleep(0.1)
    assert slack.inbox.events == []


async def test_the_simulator_keeps_blocks_on_an_update_without_them_and_checks_them(sim: SlackSimulator) -> None:
    """As Slack documents chat.update: omitted ``blocks`` are kept, ``[]`` removes them; bad blocks are refused."""
    client = AsyncWebClient(token=sim.bot_token, base_url=sim.base_url)
    button = {"type": "button", "action_id": "a", "text": {"type": "plain_text", "text": "Go"}}
    posted = await client.chat_postMessage(channel=DEFAULT_CHANNEL, text="go?",
                                           blocks=[{"type": "actions", "elements": [button]}])
    await client.chat_update(channel=DEFAULT_CHANNEL, ts=posted["ts"], text="text only")
    [message] = sim.messages()
    assert message.final_text == "text only" and message.blocks == [{"type": "actions", "elements": [button]}]
    assert (await sim.user_presses_button(message, "Go")).delivery.payload["actions"][0]["block_id"] == "sim-block-0"
    for blocks in ([{"type": "actions", "elements": [{**button, "text": {"type": "plain_text", "text": "x" * 76}}]}],
                   [{"type": "actions", "elements": [button, button]}],  # one action_id twice
                   [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}],
                   "not json"):
        with pytest.raises(SlackApiError) as info:
            await client.chat_update(channel=DEFAULT_CHANNEL, ts=posted["ts"], text="t", blocks=blocks)
        assert info.value.response["error"] in ("invalid_blocks", "invalid_blocks_format")
    await client.chat_update(channel=DEFAULT_CHANNEL, ts=posted["ts"], text="plain", blocks=[])
    assert message.blocks is None


# ------------------------------------------------------------------ through the gateway


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_a_press_reaches_the_gateway_as_the_pressers_message(sim: SlackSimulator, start: Start,
                                                                   mode: str) -> None:
    h = await start(mode=mode)
    dm = sim.dm_channel(DEFAULT_USER)
    await _adapter(h).send_choices(dm, "What shall I say?", [Choice("Say hi"), Choice("Say bye")])
    [question] = sim.messages(dm)
    action = await sim.user_presses_button(question, "Say hi")
    await sim.wait_for_ack(action.delivery)
    replies = await sim.wait_for_messages(2, dm)
    assert replies[1].text == "Echo: Say hi" and replies[1].blocks is None
    assert h.model.requests[0]["messages"][-1] == {"role": "user", "content": "Say hi"}
    assert await h.gateway.store.count_runs() == 1 and await h.gateway.store.count_inbox() == 1
