"""The Telegram adapter end to end: the real gateway and python-telegram-bot against the Bot API simulator."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import sys
import time
import warnings
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from telegram.warnings import PTBDeprecationWarning

from gateway.adapters import receives_on
from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.sim.model_server import ScriptedModel, rules, text, tool_call
from gateway.sim.telegram_api import (
    DEFAULT_CHANNEL_ID,
    DEFAULT_GROUP_ID,
    DEFAULT_SUPERGROUP_ID,
    DEFAULT_USER_ID,
    TelegramSimulator,
)
from platforms import telegram as telegram_platform
from platforms.base import Accepted, Attachment, MessageEvent, utf16_len
from platforms.files import AttachmentTooLarge
from platforms.telegram import TelegramAdapter, TelegramSettings
from platforms.webhook_signatures import sign

ALICE = DEFAULT_USER_ID
BOB = 1002
API_TOKEN = "telegram-test-api-token"
HOOK_SECRET = "telegram_hook-secret-0123456789"
ROUTE_SECRET = "route-secret-0123456789abcdef"


def _config_data(home: Path, model_url: str, sim: TelegramSimulator, telegram: Mapping[str, Any],
                 sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": {"base_url": model_url, "api_key": "test-key", "name": "scripted-model", "max_retries": 0,
                  "stream": False},
        "http": {"port": 0, "api_token": API_TOKEN},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"workspace": str(home / "workspace"), "stream_edit_interval": 0.05, "typing_delay": 0,
                    "drain_timeout": 1},
        "auth": {"platforms": {"telegram": {"allowed_users": [str(ALICE), str(BOB)]}}},
        "platforms": {"telegram": {"enabled": True, "token": sim.token, "base_url": sim.base_url,
                                   "base_file_url": sim.base_file_url, **telegram}},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return data


@dataclass
class World:
    """The simulators, and gateways started against them (all stopped at teardown)."""

    sim: TelegramSimulator
    model: ScriptedModel
    home: Path
    http: aiohttp.ClientSession
    gateways: list[Gateway] = field(default_factory=list)

    async def start(self, telegram: Mapping[str, Any] | None = None, **sections: Mapping[str, Any]) -> Gateway:
        """A real Gateway whose Telegram platform is the real adapter pointed at the simulator."""
        data = _config_data(self.home, self.model.base_url or "", self.sim, telegram or {}, sections)
        gateway = Gateway(parse_config(data, env={"HERMES_GATEWAY_HOME": str(self.home)}))
        self.gateways.append(gateway)
        await gateway.start()
        return gateway

    async def readyz(self, gateway: Gateway) -> dict[str, Any]:
        async with self.http.get(f"http://127.0.0.1:{gateway.port}/readyz") as r:
            return await r.json()

    async def post_update(self, gateway: Gateway, update: Any, secret: str | None) -> int:
        headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret is not None else {}
        async with self.http.post(f"http://127.0.0.1:{gateway.port}/telegram/webhook", json=update,
                                  headers=headers) as r:
            return r.status

    async def wait_run(self, gateway: Gateway, run_id: str) -> dict[str, Any]:
        async def poll() -> dict[str, Any]:
            while True:
                async with self.http.get(f"http://127.0.0.1:{gateway.port}/runs/{run_id}",
                                         headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
                    run = await r.json()
                if run["status"] in ("completed", "failed"):
                    return run
                await asyncio.sleep(0.02)
        return await asyncio.wait_for(poll(), 10)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with TelegramSimulator() as sim, ScriptedModel() as model, aiohttp.ClientSession() as http:
        w = World(sim, model, tmp_path, http)
        yield w
        for gateway in w.gateways:
            await gateway.stop(drain_timeout=1)


def _bot_texts(sim: TelegramSimulator, chat_id: int) -> list[str]:
    """What the user sees from the bot in a chat, oldest first (edits applied)."""
    return [m["text"] for m in sim.chat_history(chat_id) if m["from"]["id"] == sim.bot_id and "text" in m]


async def _quiet(seconds: float = 0.3) -> None:
    """Give a wrong extra reply the time to show up before asserting there is none."""
    await asyncio.sleep(seconds)


# --- direct messages -------------------------------------------------------------------------------

ANSWER = " ".join(["Your plan has 1 item: <buy milk> & call Bob."] * 5)


async def test_dm_round_trip_with_tool_call_typing_and_streamed_edits(world: World) -> None:
    world.model.responder = rules((r"plan my day", tool_call("memory", {"action": "add", "text": "buy milk"})),
                                  fallback=lambda request: text(ANSWER))
    world.model.chunk_size, world.model.chunk_delay = 8, 0.01
    await world.start(model={"stream": True})
    asked = world.sim.user_sends("please plan my day")

    await world.sim.wait_for(lambda: _bot_texts(world.sim, ALICE) == [ANSWER], timeout=10)
    # The memory tool ran and the model saw its result before answering.
    tool_messages = [m for m in world.model.requests[1]["messages"] if m["role"] == "tool"]
    assert "buy milk" in tool_messages[0]["content"]
    # One message: a streamed preview, edited as the text arrived, then edited into the answer.
    [preview] = world.sim.sent_messages(ALICE)
    edits = world.sim.edits(ALICE)
    assert len(edits) >= 2 and any(e.text.endswith("▍") for e in edits[:-1])
    assert edits[-1].text == ANSWER and edits[-1].parse_mode == "HTML"
    assert preview.params["reply_parameters"] == {"message_id": asked["message"]["message_id"],
                                                  "allow_sending_without_reply": True}
    assert preview.params["link_preview_options"] == {"is_disabled": True}
    assert [c.params["action"] for c in world.sim.chat_actions(ALICE)][:1] == ["typing"]


async def test_quick_streamed_answer_is_sent_once_without_preview_or_typing(world: World) -> None:
    world.model.responder = rules(fallback=lambda request: text(ANSWER))
    world.model.chunk_size, world.model.chunk_delay = 8, 0.001
    await world.start(model={"stream": True}, gateway={"stream_edit_interval": 1.0, "typing_delay": 1.0})
    world.sim.user_sends("quick one")
    await world.sim.wait_for(lambda: _bot_texts(world.sim, ALICE) == [ANSWER], timeout=10)
    await _quiet(1.2)  # past both delays: a late preview or typing indicator would show up now
    [sent] = world.sim.sent_messages(ALICE)
    assert sent.text == ANSWER and "▍" not in sent.text
    assert world.sim.edits(ALICE) == [] and world.sim.chat_actions(ALICE) == []
    # A slow answer (a tool call, then a 1.5 s model) gets the typing indicator once it has taken typing_delay.
    world.model.responder = rules((r"slow", tool_call("todo", {"action": "list"})),
                                  fallback=lambda request: text("done", latency=1.5))
    world.sim.user_sends("slow one")
    await world.sim.wait_for(lambda: _bot_texts(world.sim, ALICE)[-1:] == ["done"], timeout=10)
    assert [c.params["action"] for c in world.sim.chat_actions(ALICE)] == ["typing"]


async def test_unauthorized_user_gets_nothing_and_the_update_is_still_confirmed(world: World) -> None:
    gateway = await world.start()
    world.sim.user_sends("let me in", user_id=6666)
    await world.sim.wait_for(lambda: not world.sim.pending_updates)
    assert world.model.requests == [] and world.sim.sent_messages() == []
    assert gateway.store is not None and await gateway.store.count_inbox() == 0


# --- groups and topics -----------------------------------------------------------------------------

async def test_group_answers_mentions_replies_and_commands_only(world: World) -> None:
    gateway = await world.start()
    group = {"chat_type": "group"}
    world.sim.user_sends("just chatting among humans", **group)
    world.sim.user_sends("@hermes_bot, what is up?", **group)
    await world.sim.wait_for_messages(1, DEFAULT_GROUP_ID)
    assert [r["messages"][-1]["content"] for r in world.model.requests] == ["what is up?"]
    assert gateway.store is not None and await gateway.store.count_inbox() == 1

    bot_message = world.sim.sent_messages(DEFAULT_GROUP_ID)[0].message_id
    world.sim.user_sends("and tomorrow?", reply_to_bot_message_id=bot_message, **group)
    await world.sim.wait_for_messages(2, DEFAULT_GROUP_ID)
    world.sim.user_sends("/status@other_bot", **group)
    world.sim.user_sends("/status@hermes_bot", **group)
    world.sim.user_sends("/frobnicate the widgets", **group)
    sent = await world.sim.wait_for_messages(4, DEFAULT_GROUP_ID)
    await _quiet()
    assert [s.text.splitlines()[0] for s in world.sim.sent_messages(DEFAULT_GROUP_ID)] == [
        "Echo: what is up?", "Echo: and tomorrow?", "Model: scripted-model", "Echo: /frobnicate the widgets"]
    assert sent[2].params["reply_parameters"]["message_id"] == world.sim.updates[4]["message"]["message_id"]


async def test_group_trigger_always_answers_every_message(world: World) -> None:
    gateway = await world.start({"group_trigger": "always"})
    world.sim.user_sends("/new@other_bot", chat_type="group")  # for another bot in the group: dropped
    world.sim.user_sends("no mention at all", chat_type="group")
    [reply] = await world.sim.wait_for_messages(1, DEFAULT_GROUP_ID)
    assert reply.text == "Echo: no mention at all"
    await _quiet()
    assert len(world.sim.sent_messages(DEFAULT_GROUP_ID)) == 1 and len(world.model.requests) == 1
    assert gateway.store is not None and await gateway.store.count_inbox() == 1
    assert not world.sim.pending_updates  # confirmed all the same


GROUPS_ALLOWED = {"platforms": {"telegram": {"allowed_chats": [str(DEFAULT_GROUP_ID), str(DEFAULT_SUPERGROUP_ID)]}}}


async def test_messages_from_other_bots_are_ignored(world: World) -> None:
    """Another bot in the group is never answered, even addressed and allowed; its updates are still confirmed.

    Fails on the mutant ``if False:`` for ``if msg.from_user.is_bot and sender_chat is None:`` in ``to_event``."""
    gateway = await world.start({"group_trigger": "always"}, auth=GROUPS_ALLOWED)
    bot = {"chat_type": "group", "user_id": 5005, "username": "other_bot", "is_bot": True}
    world.sim.user_sends("@hermes_bot beep boop", **bot)
    world.sim.user_sends("/status", **bot)
    world.sim.user_sends("and a human", chat_type="group")
    [reply] = await world.sim.wait_for_messages(1, DEFAULT_GROUP_ID)
    assert reply.text == "Echo: and a human"
    await _quiet()
    assert len(world.sim.sent_messages()) == 1 and len(world.model.requests) == 1
    assert gateway.store is not None and await gateway.store.count_inbox() == 1
    assert not world.sim.pending_updates


@pytest.mark.parametrize(("on_behalf_of", "sender"), [
    ("group", DEFAULT_SUPERGROUP_ID), ("channel", DEFAULT_CHANNEL_ID), ("linked_channel", DEFAULT_CHANNEL_ID)])
async def test_anonymous_admins_and_channels_are_answered_as_their_chat(world: World, on_behalf_of: str,
                                                                         sender: int) -> None:
    """Telegram writes these with a bot-shaped stand-in as the author (@GroupAnonymousBot, @Channel_Bot, or
    "Telegram" for a channel post forwarded into its discussion group) and the chat as sender_chat: they are
    answered, and the chat they speak for is the user (its session, limits and auth), not the shared stand-in.

    Fails on the mutant ``if msg.from_user.is_bot:`` (the sender_chat exception dropped: "group" and "channel"),
    and on ``if False`` for ``if sender_chat`` in choosing the user (the stand-in becomes the user: all three)."""
    gateway = await world.start(auth=GROUPS_ALLOWED)
    world.sim.user_sends("@hermes_bot what changed?", chat_type="supergroup", on_behalf_of=on_behalf_of,
                         channel_title="News")
    [reply] = await world.sim.wait_for_messages(1, DEFAULT_SUPERGROUP_ID)
    assert reply.text == "Echo: what changed?"
    assert gateway.store is not None
    [run] = await gateway.store.list_runs()
    assert run.session_key == f"telegram:group:{DEFAULT_SUPERGROUP_ID}:{sender}"


async def test_forum_topics_keep_separate_sessions(world: World) -> None:
    await world.start()
    topic = {"chat_type": "supergroup"}
    world.sim.user_sends("@hermes_bot remember apples", message_thread_id=7, **topic)
    world.sim.user_sends("@hermes_bot remember pears", message_thread_id=9, **topic)
    await world.sim.wait_for_messages(2, DEFAULT_SUPERGROUP_ID)
    world.sim.user_sends("@hermes_bot what did I say?", message_thread_id=7, **topic)
    sent = await world.sim.wait_for_messages(3, DEFAULT_SUPERGROUP_ID)

    history = json.dumps(world.model.requests[-1]["messages"])
    assert "remember apples" in history and "pears" not in history
    # The two topics' first runs go on at once: their answers may come in either order.
    assert sorted(s.message_thread_id for s in sent[:2]) == [7, 9] and sent[2].message_thread_id == 7
    assert {c.params.get("message_thread_id") for c in world.sim.chat_actions(DEFAULT_SUPERGROUP_ID)} <= {7, 9}


# --- outbound --------------------------------------------------------------------------------------

async def test_long_answer_arrives_as_ordered_parts_within_the_limit(world: World) -> None:
    answer = "".join(f"Line {i:04d} 😀 fish & chips <3\n" for i in range(400))[:10_000]
    world.model.responder = rules((r"long", text(answer)))
    await world.start()
    world.sim.user_sends("a long one please")

    # Each part is cut after a line break; Telegram shows it without that trailing whitespace.
    await world.sim.wait_for(lambda: "\n".join(_bot_texts(world.sim, ALICE)) == answer.strip(), timeout=10)
    sent = world.sim.sent_messages(ALICE)
    assert len(sent) == 3 and [s.message_id for s in sent] == sorted(s.message_id for s in sent)
    assert all(utf16_len(s.text or "") <= 4096 for s in sent)
    # Markup does not count towards the limit: the HTML sent is longer than what it shows.
    assert any(len(s.raw_text or "") > 4096 for s in sent)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("finish_reason", "note"), [
    ("length", "(The answer was cut off: it reached the model's output limit.)"),
    ("content_filter", "(The answer was cut off by the model provider's content filter.)")])
async def test_an_answer_cut_off_by_the_model_says_so_and_the_run_records_it(world: World, stream: bool,
                                                                             finish_reason: str, note: str) -> None:
    """The part that came is delivered with one line telling the user, and the run's ``ended_by`` says why.

    Fails on the mutants ``choice.finish_reason`` -> ``None`` in ``Agent._complete`` (not streamed),
    ``finish_reason = chunk.choices[0].finish_reason or finish_reason`` -> ``finish_reason = finish_reason`` in
    ``Agent._stream`` (streamed), and dropping ``done.ended_by = outcome.ended_by`` in ``RunExecutor._execute``."""
    partial = "Step 1: open the valve. " * 12 + "Step 2: turn the"
    world.model.responder = rules(fallback=lambda request: text(partial, finish_reason=finish_reason))
    world.model.chunk_size, world.model.chunk_delay = 40, 0.01
    gateway = await world.start(model={"stream": stream})
    world.sim.user_sends("how do I drain the tank?")

    expected = f"{partial}\n\n{note}"
    await world.sim.wait_for(lambda: _bot_texts(world.sim, ALICE) == [expected], timeout=10)
    assert [bool(r.get("stream")) for r in world.model.requests] == [stream]
    assert gateway.store is not None
    [run] = await gateway.store.list_runs()
    shown = await world.wait_run(gateway, run.id)
    assert (shown["status"], shown["ended_by"], shown["result"]) == ("completed", finish_reason, expected)


async def test_flood_control_and_server_errors_are_retried_without_duplicates(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    await world.start()
    world.sim.fail_next("sendMessage", error_code=429, retry_after=2)
    world.sim.user_sends("first")
    await world.sim.wait_for_messages(1, ALICE, timeout=10)
    failed, ok = world.sim.calls_of("sendMessage")
    assert failed.status == 429 and ok.status == 200 and ok.t - failed.t >= 1.95

    world.sim.fail_next("sendMessage", error_code=502)
    world.sim.user_sends("second")
    await world.sim.wait_for_messages(2, ALICE, timeout=10)
    await _quiet()
    assert [s.text for s in world.sim.sent_messages(ALICE)] == ["Echo: first", "Echo: second"]
    assert [c.status for c in world.sim.calls_of("sendMessage")] == [429, 200, 502, 200]
    # Handled flood control is not reported as an error (PTB's rate limiter would log one, with a traceback).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_rejected_formatting_is_resent_as_plain_text(world: World) -> None:
    answer = "**Done**: see `x`"
    world.model.responder = rules((r"format", text(answer)))
    await world.start()
    world.sim.fail_next("sendMessage", error_code=400,
                        description='Bad Request: can\'t parse entities: Unsupported start tag "x" at byte offset 0')
    world.sim.user_sends("format it")
    [sent] = await world.sim.wait_for_messages(1, ALICE)
    assert (sent.parse_mode, sent.raw_text, sent.text) == (None, "Done: see x", "Done: see x")  # as formatted
    assert [c.params.get("parse_mode") for c in world.sim.calls_of("sendMessage")] == ["HTML", None]


async def test_markdown_mode_that_telegram_cannot_parse_falls_back_to_plain(world: World) -> None:
    world.model.responder = rules((r"file", text("open report_final.txt *now*")))
    await world.start({"parse_mode": "markdown"})
    world.sim.user_sends("which file?")
    [sent] = await world.sim.wait_for_messages(1, ALICE)
    assert sent.text == "open report_final.txt *now*" and sent.parse_mode is None
    first = world.sim.calls_of("sendMessage")[0]
    assert first.params["parse_mode"] == "Markdown" and "can't parse entities" in first.response["description"]


# --- crash safety (hermes-gateway run, killed with SIGKILL) ----------------------------------------

@dataclass
class _Process:
    proc: asyncio.subprocess.Process
    port: int

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def wait_metric(self, http: aiohttp.ClientSession, line: str) -> None:
        async def poll() -> None:
            while True:
                async with http.get(f"http://127.0.0.1:{self.port}/metrics") as r:
                    if line in (await r.text()).splitlines():
                        return
                await asyncio.sleep(0.05)
        await asyncio.wait_for(poll(), 10)


@pytest.fixture
async def spawn(world: World) -> AsyncIterator[Any]:
    """Start ``hermes-gateway run`` on a config pointing at the simulators; all are killed at teardown."""
    config = world.home / "config.yaml"
    data = _config_data(world.home, world.model.base_url or "", world.sim, {}, {})
    config.write_text(yaml.safe_dump(data))
    procs: list[_Process] = []

    async def start() -> _Process:
        log = world.home / f"gateway-{len(procs)}.log"
        with log.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "run", "--config", str(config), stdout=asyncio.subprocess.PIPE,
                stderr=stderr, env={**os.environ, "HERMES_GATEWAY_HOME": str(world.home)})
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        match = re.search(rb"listening on http://[\d.]+:(\d+)", line)
        assert match, log.read_text()
        procs.append(p := _Process(proc, int(match.group(1))))
        return p

    yield start
    for p in procs:
        if p.proc.returncode is None:
            await p.kill()


def _returned(sim: TelegramSimulator, update_id: int) -> bool:
    """Whether a getUpdates answer carried the update to the gateway."""
    return any(c.outcome == "ok" and any(u["update_id"] == update_id for u in (c.response or {}).get("result", []))
               for c in sim.calls_of("getUpdates"))


async def test_kill_9_while_an_update_is_being_stored_redelivers_it(world: World, spawn: Any) -> None:
    first = await spawn()
    await world.sim.wait_for_call("getUpdates")
    lock = sqlite3.connect(world.home / "state.db", timeout=5, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the gateway's inbox write now waits for this lock
    update_id = world.sim.user_sends("in flight")["update_id"]
    await world.sim.wait_for(lambda: _returned(world.sim, update_id))
    await first.kill()
    lock.execute("ROLLBACK")
    lock.close()
    assert [u["update_id"] for u in world.sim.pending_updates] == [update_id]

    await spawn()
    await world.sim.wait_for_messages(1, ALICE, timeout=15)
    await world.sim.wait_for(lambda: not world.sim.pending_updates)
    await _quiet()
    assert [s.text for s in world.sim.sent_messages(ALICE)] == ["Echo: in flight"]
    assert [r["messages"][-1]["content"] for r in world.model.requests] == ["in flight"]


async def test_kill_9_after_storing_before_confirming_answers_once(world: World, spawn: Any) -> None:
    first = await spawn()
    await world.sim.wait_for_call("getUpdates")
    world.sim.slow_next("getUpdates", 60)  # the poll that would confirm the update hangs before confirming
    update_id = world.sim.user_sends("answer me once")["update_id"]
    # Answered, and the answer recorded as delivered (a kill before that would rightly resend it).
    await first.wait_metric(world.http, 'hermes_deliveries_total{outcome="sent",platform="telegram"} 1.0')
    held = await world.sim.wait_for_call("getUpdates", 2)
    assert held.params["offset"] == update_id + 1 and held.outcome == "pending"
    await first.kill()
    assert [u["update_id"] for u in world.sim.pending_updates] == [update_id]

    await spawn()
    await world.sim.wait_for(lambda: not world.sim.pending_updates, timeout=15)
    await _quiet()
    assert _returned(world.sim, update_id) and len(world.sim.calls_of("getMe")) == 2
    assert [s.text for s in world.sim.sent_messages(ALICE)] == ["Echo: answer me once"]
    assert len(world.model.requests) == 1


# --- polling resilience ----------------------------------------------------------------------------

async def test_poll_errors_back_off_and_disconnect_is_fast(world: World) -> None:
    world.sim.fail_next("getUpdates", 2, error_code=502)
    world.sim.fail_next("getUpdates", error_code=429, retry_after=1)
    gateway = await world.start({"poll_timeout": 30})
    await world.sim.wait_for(lambda: [c.status for c in world.sim.calls_of("getUpdates")] == [502])
    assert (await world.readyz(gateway))["platforms"]["telegram"]["state"] == "connecting"
    world.sim.user_sends("still there?")
    await world.sim.wait_for_messages(1, ALICE, timeout=10)
    polls = world.sim.calls_of("getUpdates")
    gaps = [later.t - earlier.t for earlier, later in itertools.pairwise(polls)][:3]
    assert [c.status for c in polls[:4]] == [502, 502, 429, 200]
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95 and gaps[2] >= 0.95  # 0.5 s, 1 s, then retry_after

    await world.sim.wait_for(lambda: world.sim.calls_of("getUpdates")[-1].outcome == "pending")
    started = time.monotonic()
    await gateway.stop(drain_timeout=0)
    world.gateways.remove(gateway)
    assert time.monotonic() - started < 2
    last = world.sim.calls_of("getUpdates")[-1]
    assert last.params["timeout"] == 0 and last.params["offset"] == world.sim.updates[-1]["update_id"] + 1


async def test_unreachable_bot_api_at_startup_is_retried_in_the_background(world: World) -> None:
    world.sim.fail_next("getMe", error_code=502)
    gateway = await world.start()
    assert (await world.readyz(gateway))["platforms"]["telegram"]["state"] == "connecting"
    world.sim.user_sends("hello after a hiccup")
    [reply] = await world.sim.wait_for_messages(1, ALICE, timeout=10)
    assert reply.text == "Echo: hello after a hiccup"
    assert (await world.readyz(gateway))["platforms"]["telegram"]["state"] == "connected"


async def test_edited_messages_are_ignored_by_default_and_handled_when_configured(world: World) -> None:
    await world.start()
    world.sim.user_sends("tpyo")
    await world.sim.wait_for_messages(1, ALICE)
    world.sim.user_edits(1, "typo fixed")
    world.sim.user_sends("next")
    await world.sim.wait_for_messages(2, ALICE)
    assert [s.text for s in world.sim.sent_messages(ALICE)] == ["Echo: tpyo", "Echo: next"]

    await world.gateways.pop().stop(drain_timeout=1)
    await world.start({"edited_messages": "handle"})
    world.sim.user_edits(1, "typo fixed again")
    await world.sim.wait_for_messages(3, ALICE)
    assert world.sim.sent_messages(ALICE)[-1].text == "Echo: typo fixed again"


# --- webhook mode ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_webhook_mode_checks_the_secret_and_processes_each_update_once(world: World) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/telegram/webhook"
    gateway = await world.start({"mode": "webhook", "webhook_url": url, "webhook_secret": HOOK_SECRET},
                                http={"port": port})
    assert gateway.store is not None
    [set_hook] = world.sim.calls_of("setWebhook")
    assert (set_hook.params["url"], set_hook.params["secret_token"]) == (url, HOOK_SECRET)
    assert world.sim.calls_of("getUpdates") == []

    forged = {"update_id": 555, "message": {"message_id": 1, "date": 0, "chat": {"id": ALICE, "type": "private"},
                                            "from": {"id": ALICE, "is_bot": False, "first_name": "A"},
                                            "text": "forged"}}
    assert await world.post_update(gateway, forged, None) == 403
    assert await world.post_update(gateway, forged, "wrong-secret") == 403
    assert await gateway.store.count_inbox() == 0

    update = world.sim.user_sends("hello over the webhook")  # the simulator posts it, with the secret
    await world.sim.wait_for_messages(1, ALICE)
    assert [d.status for d in world.sim.deliveries] == [200]
    assert await world.post_update(gateway, update, HOOK_SECRET) == 200  # Telegram retrying a delivery
    assert await world.post_update(gateway, update, HOOK_SECRET) == 200
    await _quiet()
    assert await gateway.store.count_inbox() == 1
    assert [s.text for s in world.sim.sent_messages(ALICE)] == ["Echo: hello over the webhook"]
    assert await world.post_update(gateway, ["not", "an", "update"], HOOK_SECRET) == 400


async def test_rejected_token_fails_clearly_and_webhooks_keep_working(world: World,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    message = "telegram: the bot token was rejected (getMe returned 401); check platforms.telegram.token"
    caplog.set_level(logging.ERROR)
    route = {"github": {"secret": ROUTE_SECRET, "scheme": "github", "prompt": "Push: {payload.ref}"}}
    gateway = await world.start({"token": "999:revoked-token"}, platforms={"webhook": {"routes": route}})
    assert any(message in r.getMessage() for r in caplog.records)
    ready = await world.readyz(gateway)
    assert ready["ready"] is True  # a platform's state is reported, it does not take webhooks out of service
    assert ready["platforms"]["telegram"] == {"platform": "telegram", "state": "failed", "receiving": False,
                                             "last_error": message}

    body = json.dumps({"ref": "refs/heads/main"}).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
               **sign("github", ROUTE_SECRET, body, delivery_id="d-1")}
    async with world.http.post(f"http://127.0.0.1:{gateway.port}/webhooks/github", data=body,
                               headers=headers) as r:
        assert r.status == 202
        run_id = (await r.json())["run_id"]
    assert (await world.wait_run(gateway, run_id))["status"] == "completed"


# --- the adapter on its own (real PTB, real simulator, events collected from on_message) ------------

@pytest.fixture
async def adapter(world: World) -> AsyncIterator[tuple[TelegramAdapter, list[MessageEvent]]]:
    events: list[MessageEvent] = []

    async def on_message(event: MessageEvent) -> Accepted:
        events.append(event)
        return Accepted(None, False)

    a = TelegramAdapter(_settings(world.sim, max_attachment_bytes=64))
    await a.connect(on_message)
    yield a, events
    await a.disconnect()


async def test_events_carry_ids_mentions_threads_and_attachments(world: World, adapter: Any) -> None:
    bot, events = adapter
    sim = world.sim
    sim.user_sends_photo(caption="look @hermes_bot")
    sim.user_sends_document(b"report body", file_name="report.txt", chat_type="group", caption="@hermes_bot read")
    sim.user_sends_voice(b"OggS voice", duration=2)
    mention = [{"type": "text_mention", "offset": 0, "length": 5, "user": sim.bot_user}]
    sim.user_sends("Hermy, in the topic please", entities=mention, chat_type="supergroup", message_thread_id=3)
    await sim.wait_for(lambda: len(events) == 4)
    photo, doc, voice, topic = events

    assert (photo.event_id, photo.chat_type, photo.text, photo.mentions_bot) == ("10001", "dm", "look @hermes_bot",
                                                                                  True)
    assert (photo.attachments[0].kind, photo.attachments[0].url) == ("photo", None)
    assert (doc.chat_type, doc.text, doc.user_name) == ("group", "read", "alice")
    assert [(a.kind, a.name, a.mime_type, a.size) for a in doc.attachments] == [
        ("document", "report.txt", "text/plain", 11)]
    assert [(a.kind, a.mime_type, a.size) for a in voice.attachments] == [("voice", "audio/ogg", 10)]
    assert (topic.thread_id, topic.mentions_bot, topic.message_id) == ("3", True, "1")
    assert await bot.fetch_attachment(doc.attachments[0], max_bytes=1024) == b"report body"
    assert await bot.fetch_attachment(voice.attachments[0], max_bytes=1024) == b"OggS voice"
    too_big = Attachment("document", sim.add_file(b"x" * 65, "big.bin"))
    with pytest.raises(AttachmentTooLarge):  # max_attachment_bytes (64) caps a larger max_bytes
        await bot.fetch_attachment(too_big, max_bytes=1024)
    assert len(sim.downloads) == 2, "the file over the limit was refused on getFile's file_size, not downloaded"


async def test_send_results_map_telegram_errors_for_the_outbox(world: World, adapter: Any) -> None:
    bot, _ = adapter
    sim = world.sim
    sim.user_sends("hi")
    sent = await bot.send(str(ALICE), "**hello**", metadata={"delivery_id": "x"})
    assert sent.success and sim.sent_messages(ALICE)[-1].text == "hello"
    assert (await bot.edit_message(str(ALICE), sent.message_id or "", "**hello**")).success  # not modified
    sim.fail_next("sendMessage", error_code=429, retry_after=3)
    flood = await bot.send(str(ALICE), "x")
    assert (flood.success, flood.retryable, flood.retry_after) == (False, True, 3.0)
    sim.fail_next("sendMessage", error_code=502)
    assert (await bot.send(str(ALICE), "x")).retryable
    missing = await bot.send("424242", "x")
    assert (missing.retryable, missing.error) == (False, "Chat not found")
    sim.user_blocks_bot(ALICE)
    blocked = await bot.send(str(ALICE), "x")
    assert (blocked.retryable, blocked.error) == (False, "Forbidden: bot was blocked by the user")
    gone = await bot.edit_message(str(BOB), "1", "x")
    assert not gone.success and not gone.retryable


@pytest.mark.parametrize("ptb_timedelta", [None, "false"])
async def test_flood_control_wait_is_read_whichever_type_retry_after_has(
        world: World, adapter: Any, monkeypatch: pytest.MonkeyPatch, ptb_timedelta: str | None) -> None:
    """PTB 22 gives ``RetryAfter.retry_after`` as int seconds, warning on every read (its own included), unless
    PTB_TIMEDELTA opts into the timedelta of its next major version: the adapter opts in, without a warning, and
    reads either type (an operator's PTB_TIMEDELTA=false still works).

    Fails on the mutant ``return float(exc.retry_after)`` in ``_retry_seconds`` (a timedelta is no float), and
    on dropping ``os.environ.setdefault("PTB_TIMEDELTA", "true")`` (PTBDeprecationWarning)."""
    bot, _ = adapter
    world.sim.user_sends("hi")
    world.sim.fail_next("sendMessage", error_code=429, retry_after=3)
    if ptb_timedelta is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            flood = await bot.send(str(ALICE), "x")
    else:
        monkeypatch.setenv("PTB_TIMEDELTA", ptb_timedelta)
        with pytest.warns(PTBDeprecationWarning, match="retry_after"):
            flood = await bot.send(str(ALICE), "x")
    assert (flood.success, flood.retryable, flood.retry_after) == (False, True, 3.0)
    assert flood.error == "flood control: retry in 3 s"


def _settings(sim: TelegramSimulator, **changes: Any) -> TelegramSettings:
    return TelegramSettings(**{"token": sim.token, "base_url": sim.base_url, "base_file_url": sim.base_file_url,
                               **changes})


async def test_an_update_the_gateway_could_not_store_is_offered_again(world: World) -> None:
    offered: list[str] = []

    async def flaky_store(event: MessageEvent) -> Accepted:
        offered.append(event.event_id)
        if len(offered) == 1:
            raise OSError("disk full")
        return Accepted(None, False)

    adapter = TelegramAdapter(_settings(world.sim))
    await adapter.connect(flaky_store)
    try:
        update_id = world.sim.user_sends("keep me")["update_id"]
        await world.sim.wait_for(lambda: not world.sim.pending_updates)
        assert offered == [str(update_id), str(update_id)]
    finally:
        await adapter.disconnect()


async def test_idle_connections_to_the_bot_api_are_bounded_after_a_burst(world: World) -> None:
    sim, cap = world.sim, telegram_platform.IDLE_CONNECTIONS_KEPT
    adapter = TelegramAdapter(_settings(sim, overall_per_second=0, group_per_minute=0))
    await adapter.connect(_Inbox(), receive=False)
    sim.user_sends("hello")  # Alice's chat exists
    sim.slow_next("sendMessage", 0.3, n=3 * cap)  # every send of the burst in flight at once
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, sim.open_connections)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        sent = await asyncio.gather(*(adapter.send(str(ALICE), f"burst {i}") for i in range(3 * cap)))
        assert all(r.success for r in sent), [r for r in sent if not r.success][:2]
        assert peak > cap  # the burst did open more connections than are kept
        async with asyncio.timeout(2):  # well before httpx's 5 s keep-alive expiry
            while sim.open_connections > cap:
                await asyncio.sleep(0.05)
    finally:
        watcher.cancel()
        await adapter.disconnect()


@pytest.mark.parametrize(("changes", "message"), [
    ({"token": "999:revoked"},
     "telegram: the bot token was rejected (getMe returned 401); check platforms.telegram.token"),
    ({"base_url_suffix": "/wrong/bot"},
     "telegram: the Bot API answered 404 Not Found; check platforms.telegram.base_url (and platforms.telegram.token)"),
])
async def test_startup_errors_name_the_setting_to_fix(world: World, changes: dict[str, str], message: str) -> None:
    if suffix := changes.pop("base_url_suffix", None):
        changes["base_url"] = world.sim.url + suffix
    adapter = TelegramAdapter(_settings(world.sim, **changes))
    with pytest.raises(RuntimeError, match=re.escape(message)):
        await adapter.connect(_never_called)
    assert adapter.status() == {"platform": "telegram", "state": "failed", "receiving": False, "last_error": message}
    await adapter.disconnect()


async def test_a_token_revoked_while_polling_stops_the_loop(world: World) -> None:
    world.sim.fail_next("getUpdates", error_code=401, description="Unauthorized")
    adapter = TelegramAdapter(_settings(world.sim))
    await adapter.connect(_never_called)
    await world.sim.wait_for(lambda: adapter.state.value == "failed")
    polls = len(world.sim.calls_of("getUpdates"))
    await _quiet()
    assert len(world.sim.calls_of("getUpdates")) == polls
    await adapter.disconnect()


async def _never_called(event: MessageEvent) -> Accepted:
    raise AssertionError(f"unexpected event {event}")


# --- receiving switched on and off (replicas: every one sends, one receives) ---------------------------

class _Inbox:
    """Stands in for the gateway: keeps the text of every event; ``hold`` makes the next hand-over wait."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.hold: asyncio.Event | None = None
        self.holding = asyncio.Event()

    async def __call__(self, event: MessageEvent) -> Accepted:
        if self.hold is not None:
            self.holding.set()
            await asyncio.wait_for(self.hold.wait(), 5)
            self.hold = None
        self.texts.append(event.text)
        return Accepted(None, False)


async def test_polling_receives_only_between_start_and_stop_receiving(world: World) -> None:
    sim, inbox = world.sim, _Inbox()
    adapter = TelegramAdapter(_settings(sim, poll_timeout=5))
    await adapter.connect(inbox, receive=False)
    try:
        sim.user_sends("while send-only")
        assert (await adapter.send(str(ALICE), "sent while send-only")).success
        await _quiet()
        assert (adapter.state.value, adapter.receiving, inbox.texts) == ("connected", False, [])
        assert adapter.status()["receiving"] is False
        assert sim.calls_of("getUpdates") == [] and sim.calls_of("deleteWebhook") == []

        for _ in range(2):
            await adapter.start_receiving()
        await sim.wait_for(lambda: inbox.texts == ["while send-only"])
        assert adapter.receiving and adapter.status()["receiving"] is True
        assert len(sim.calls_of("deleteWebhook")) == 1

        for _ in range(2):
            await adapter.stop_receiving()
        assert (adapter.state.value, adapter.receiving) == ("connected", False)
        assert sim.calls_of("getUpdates")[-1].params["timeout"] == 0 and sim.pending_updates == []  # confirmed
        polls = len(sim.calls_of("getUpdates"))
        sim.user_sends("while stopped")
        assert (await adapter.send(str(ALICE), "sent while stopped")).success
        await _quiet()
        assert inbox.texts == ["while send-only"] and len(sim.calls_of("getUpdates")) == polls
        assert [u["message"]["text"] for u in sim.pending_updates] == ["while stopped"]  # left with Telegram

        await adapter.start_receiving()
        await sim.wait_for(lambda: inbox.texts == ["while send-only", "while stopped"])
        assert [m.text for m in sim.sent_messages(ALICE)] == ["sent while send-only", "sent while stopped"]
    finally:
        await adapter.disconnect()


async def test_polling_moves_between_replicas_without_losing_or_repeating_an_update(world: World) -> None:
    sim, first_inbox, second_inbox = world.sim, _Inbox(), _Inbox()
    first, second = (TelegramAdapter(_settings(sim, poll_timeout=5)) for _ in range(2))
    await first.connect(first_inbox)
    await second.connect(second_inbox, receive=False)
    try:
        sim.user_sends("to the first leader")
        await sim.wait_for(lambda: first_inbox.texts == ["to the first leader"])
        await first.stop_receiving()  # leadership moves
        sim.user_sends("in between")
        await second.start_receiving()
        sim.user_sends("to the second leader")
        await sim.wait_for(lambda: second_inbox.texts == ["in between", "to the second leader"])
        assert (await first.send(str(ALICE), "the old leader still sends")).success
        await _quiet()
        assert first_inbox.texts == ["to the first leader"] and len(second_inbox.texts) == 2
    finally:
        await first.disconnect()
        await second.disconnect()


async def test_stopping_lets_the_update_being_stored_finish_and_confirms_it(world: World) -> None:
    sim, inbox = world.sim, _Inbox()
    adapter = TelegramAdapter(_settings(sim, poll_timeout=5))
    await adapter.connect(inbox)
    try:
        inbox.hold = asyncio.Event()
        update = sim.user_sends("being stored")
        await asyncio.wait_for(inbox.holding.wait(), 5)
        stopping = asyncio.create_task(adapter.stop_receiving())
        await _quiet(0.1)
        assert not stopping.done()  # waits for the hand-over instead of cutting it off
        inbox.hold.set()
        await asyncio.wait_for(stopping, 5)
        assert inbox.texts == ["being stored"] and sim.pending_updates == []
        assert sim.calls_of("getUpdates")[-1].params["offset"] == update["update_id"] + 1
        await adapter.start_receiving()
        sim.user_sends("next")
        await sim.wait_for(lambda: inbox.texts == ["being stored", "next"])  # never offered twice
    finally:
        await adapter.disconnect()


async def test_webhook_route_refuses_updates_while_not_receiving_and_telegram_delivers_again(world: World) -> None:
    sim, inbox = world.sim, _Inbox()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/telegram/webhook"
    adapter = TelegramAdapter(_settings(sim, mode="webhook", webhook_url=url, webhook_secret=HOOK_SECRET))
    app = web.Application()
    app.add_routes(adapter.http_routes())
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await adapter.connect(inbox, receive=False)
    try:
        sim.add_chat(ALICE)
        assert (await adapter.send(str(ALICE), "sent while send-only")).success
        update = {"update_id": 1, "message": {"message_id": 1, "date": 0, "text": "direct",
                                              "chat": {"id": ALICE, "type": "private"},
                                              "from": {"id": ALICE, "is_bot": False, "first_name": "A"}}}
        async with world.http.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}) as r:
            assert r.status == 503
        assert sim.calls_of("setWebhook") == [] and sim.calls_of("getUpdates") == [] and inbox.texts == []

        for _ in range(2):
            await adapter.start_receiving()
        assert len(sim.calls_of("setWebhook")) == 1 and sim.webhook_url == url and adapter.receiving
        sim.user_sends("first")
        await sim.wait_for(lambda: inbox.texts == ["first"])

        for _ in range(2):
            await adapter.stop_receiving()
        stopped = sim.user_sends("while stopped")["update_id"]
        await sim.wait_for(lambda: len([d for d in sim.deliveries if d.update_id == stopped]) >= 2)
        assert {d.status for d in sim.deliveries if d.update_id == stopped} == {503}  # refused, so redelivered
        assert (await adapter.send(str(ALICE), "sent while stopped")).success
        assert inbox.texts == ["first"] and sim.webhook_url == url  # other replicas may still serve the webhook
        assert sim.calls_of("deleteWebhook") == []

        await adapter.start_receiving()
        await sim.wait_for(lambda: inbox.texts == ["first", "while stopped"], timeout=5)
        assert sim.pending_updates == [] and sim.calls_of("getUpdates") == []
    finally:
        await adapter.disconnect()
        await runner.cleanup()


# --- configuration -----------------------------------------------------------------------------------

def test_run_on_follows_the_mode_and_rejects_what_it_cannot_honour() -> None:
    def telegram(**section: str) -> str:
        cfg = parse_config({"platforms": {"telegram": section}}, {})
        assert receives_on(cfg, "telegram") == cfg.platforms.telegram.run_on
        return cfg.platforms.telegram.run_on

    assert (telegram(), telegram(run_on="leader"), telegram(mode="webhook"), telegram(mode="webhook", run_on="all")
            ) == ("leader", "leader", "all", "all")
    for section, message in [
        ({"run_on": "all"}, "polling mode receives on the leader only (Telegram ends all but one concurrent "
                            "getUpdates with 409 Conflict; write leader, or use mode: webhook"),
        ({"mode": "webhook", "run_on": "leader"}, "webhook mode receives on every replica (Telegram posts each "
                                                  "update to webhook_url"),
        ({"run_on": "everyone"}, "Input should be 'leader' or 'all'"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config({"platforms": {"telegram": section}}, {})
        assert info.value.path == "platforms.telegram.run_on" and message in str(info.value)


def test_config_requires_a_token_and_the_webhook_settings() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"platforms": {"telegram": {"enabled": True, "mode": "webhook",
                                                 "webhook_secret": "has spaces"}}}, {})
    assert [e.path for e in info.value.errors] == [
        "platforms.telegram.token", "platforms.telegram.webhook_url", "platforms.telegram.webhook_secret"]
    assert "has spaces" not in str(info.value)
    cfg = parse_config({}, {}).platforms.telegram
    assert (cfg.enabled, cfg.mode, cfg.parse_mode, cfg.group_trigger, cfg.poll_timeout) == (
        False, "polling", "html", "mention", 30)
