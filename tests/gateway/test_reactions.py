"""Reactions as status end to end: the real gateway and its Telegram, Slack and Discord adapters against the
simulators (received → working → done / failed), Slack's assistant status as its typing indicator, and Discord's
message delete for tool progress."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route

from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.sim.discord_api import ALICE_ID, DiscordSimulator, RestCall
from gateway.sim.model_server import ScriptedModel, Turn, text, tool_call
from gateway.sim.slack_api import DEFAULT_CHANNEL, SlackSimulator
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from platforms.base import AdapterState
from tests.conftest import Harness, base_config, deep_merge
from tests.gateway.conftest import StartTelegramGateway

CHAT = DEFAULT_USER_ID  # a Telegram DM: the chat id is the user's
IDLE_TIMEOUT = 10.0

StartTelegram = Callable[..., Awaitable[tuple[Gateway, ScriptedModel]]]


async def _idle(gateway: Gateway) -> None:
    """Wait until every run ended: a run's end waits for its message's reactions, so all were made."""
    assert gateway.router is not None
    assert await gateway.router.lanes.wait_idle(IDLE_TIMEOUT)


# ----------------------------------------------------------------------------------------------------- Telegram


@pytest.fixture
async def telegram(telegram_gateway: StartTelegramGateway) -> AsyncIterator[tuple[TelegramSimulator, StartTelegram]]:
    """The Telegram simulator and a factory starting a gateway with the real Telegram adapter against it."""
    async with TelegramSimulator() as sim, ScriptedModel() as model:
        async def start(*turns: Turn, **platform: Any) -> tuple[Gateway, ScriptedModel]:
            model.push(*turns)
            overrides = {"platforms": {"telegram": {"reactions": True, **platform}}}
            return await telegram_gateway(sim, model, overrides), model

        yield sim, start


def _telegram_reactions(sim: TelegramSimulator) -> list[tuple[int, list[str]]]:
    """(message id, the bot's reaction after the call) for every setMessageReaction, in order."""
    return [(int(c.params["message_id"]), [r["emoji"] for r in c.params.get("reaction") or []])
            for c in sim.reaction_calls(CHAT)]


async def test_telegram_message_is_received_then_working_then_done(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, _ = await start(text("Hello!", latency=0.2))
    mid = sim.user_sends("hi")["message"]["message_id"]
    await sim.wait_for(lambda: any(s.text == "Hello!" for s in sim.sent_messages(CHAT)), timeout=10)
    await _idle(gateway)
    assert _telegram_reactions(sim) == [(mid, ["👀"]), (mid, ["✍"]), (mid, ["👍"])]
    assert sim.bot_reaction(CHAT, mid) == ["👍"]


async def test_telegram_model_error_ends_with_the_failed_reaction(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, model = await start()
    model.fail_next(status=400, message="This model does not take that request.")
    mid = sim.user_sends("hi")["message"]["message_id"]
    await sim.wait_for_messages(1, CHAT, timeout=10)  # the error notice
    await _idle(gateway)
    assert _telegram_reactions(sim) == [(mid, ["👀"]), (mid, ["✍"]), (mid, ["😢"])]


async def test_a_message_queued_behind_a_busy_session_shows_received_until_its_run_starts(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, _ = await start(text("First.", latency=0.6), text("Second."))
    first = sim.user_sends("one")["message"]["message_id"]
    await sim.wait_for(lambda: (first, ["✍"]) in _telegram_reactions(sim), timeout=10)
    second = sim.user_sends("two")["message"]["message_id"]
    await sim.wait_for(lambda: any(s.text == "Second." for s in sim.sent_messages(CHAT)), timeout=10)
    await _idle(gateway)
    assert _telegram_reactions(sim) == [(first, ["👀"]), (first, ["✍"]), (second, ["👀"]), (first, ["👍"]),
                                        (second, ["✍"]), (second, ["👍"])]


async def test_stop_removes_the_reaction(telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, _ = await start(text("Too late.", latency=3))
    mid = sim.user_sends("take your time")["message"]["message_id"]
    await sim.wait_for(lambda: (mid, ["✍"]) in _telegram_reactions(sim), timeout=10)
    sim.user_sends("/stop")
    await _idle(gateway)
    assert _telegram_reactions(sim) == [(mid, ["👀"]), (mid, ["✍"]), (mid, [])]


async def test_refused_reactions_never_fail_the_run(telegram: tuple[TelegramSimulator, StartTelegram],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.reactions")
    sim, start = telegram
    gateway, _ = await start(text("Hello!"))
    sim.fail_next("setMessageReaction", 3, error_code=400, description="Bad Request: REACTION_INVALID")
    mid = sim.user_sends("hi")["message"]["message_id"]
    await sim.wait_for(lambda: any(s.text == "Hello!" for s in sim.sent_messages(CHAT)), timeout=10)
    await _idle(gateway)
    assert [c.outcome for c in sim.calls_of("setMessageReaction")] == ["error"] * 3
    assert sim.bot_reaction(CHAT, mid) == []
    assert [r.levelname for r in caplog.records if r.name == "gateway.reactions"] == ["INFO"] * 3


async def test_reactions_off_makes_no_reaction_call(telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, _ = await start(text("Hello!"), reactions="off")
    sim.user_sends("hi")
    await sim.wait_for(lambda: any(s.text == "Hello!" for s in sim.sent_messages(CHAT)), timeout=10)
    await _idle(gateway)
    assert sim.calls_of("setMessageReaction") == []


async def test_configured_emoji_are_used_and_checked_against_the_platform(
        telegram: tuple[TelegramSimulator, StartTelegram], tmp_path: Path) -> None:
    sim, start = telegram
    gateway, _ = await start(text("Hello!"), reaction_emoji={"done": "🎉"})
    mid = sim.user_sends("hi")["message"]["message_id"]
    await sim.wait_for(lambda: any(s.text == "Hello!" for s in sim.sent_messages(CHAT)), timeout=10)
    await _idle(gateway)
    assert _telegram_reactions(sim)[-1] == (mid, ["🎉"])
    with pytest.raises(ConfigError) as info:
        parse_config(deep_merge(base_config(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/results"),
                                {"platforms": {"slack": {"reaction_emoji": {"done": ":tada:"}}}}),
                     env={"HERMES_GATEWAY_HOME": str(tmp_path)})
    assert "platforms.slack.reaction_emoji.done" in str(info.value)


# ------------------------------------------------------------------------------------------------------- Slack


@pytest.fixture
async def slack() -> AsyncIterator[SlackSimulator]:
    async with SlackSimulator() as sim:
        yield sim


def _slack_overrides(sim: SlackSimulator, **platform: Any) -> dict[str, Any]:
    return {
        "platforms": {"slack": {"enabled": True, "bot_token": sim.bot_token, "app_token": sim.app_token,
                                "signing_secret": sim.signing_secret, "api_base_url": sim.base_url,
                                "ping_interval": 0.2, "reactions": True, **platform}},
        "auth": {"platforms": {"slack": {"allowed_users": ["U0USER1"]}}},
    }


async def test_slack_message_is_received_then_working_then_done(slack: SlackSimulator, make_gateway: Any) -> None:
    h: Harness = await make_gateway(_slack_overrides(slack))
    h.model.push(text("Hello!", latency=0.2))
    action = await slack.user_mentions_bot("hi")
    await slack.wait_for(lambda: any(m.final_text == "Hello!" for m in slack.messages(DEFAULT_CHANNEL)), 10)
    await _idle(h.gateway)
    calls = [(c.method, c.params["name"]) for c in slack.calls if c.method.startswith("reactions.")]
    assert calls == [("reactions.add", "eyes"),
                     ("reactions.add", "hourglass_flowing_sand"), ("reactions.remove", "eyes"),
                     ("reactions.add", "white_check_mark"), ("reactions.remove", "hourglass_flowing_sand")]
    assert {(c.params["channel"], c.params["timestamp"]) for c in slack.calls if c.method.startswith("reactions.")} \
        == {(DEFAULT_CHANNEL, action.ts)}
    assert slack.bot_reactions(DEFAULT_CHANNEL, action.ts) == ["white_check_mark"]


async def test_slack_typing_is_the_assistant_status_in_the_thread(slack: SlackSimulator, make_gateway: Any) -> None:
    h: Harness = await make_gateway(_slack_overrides(slack))
    h.model.push(text("Hello!", latency=0.2), text("Hi in the DM."))
    action = await slack.user_mentions_bot("hi")
    await slack.wait_for(lambda: any(m.final_text == "Hello!" for m in slack.messages(DEFAULT_CHANNEL)), 10)
    [status] = slack.calls_of("assistant.threads.setStatus")
    assert status.ok and status.params == {"channel_id": DEFAULT_CHANNEL, "thread_ts": action.ts,
                                           "status": "is thinking…"}
    await slack.user_sends_dm("hi")  # no thread to show a status in: nothing
    await slack.wait_for(lambda: any(m.final_text == "Hi in the DM." for m in slack.messages()), 10)
    await _idle(h.gateway)
    assert len(slack.calls_of("assistant.threads.setStatus")) == 1


async def test_slack_stops_asking_for_the_assistant_status_after_missing_scope(
        slack: SlackSimulator, make_gateway: Any) -> None:
    slack.scopes.discard("assistant:write")
    h: Harness = await make_gateway(_slack_overrides(slack))
    h.model.push(text("One."), text("Two."))
    for question, answer in (("one?", "One."), ("two?", "Two.")):
        await slack.user_mentions_bot(question)
        await slack.wait_for(lambda a=answer: any(m.final_text == a for m in slack.messages(DEFAULT_CHANNEL)), 10)
        await _idle(h.gateway)
    [refused] = slack.calls_of("assistant.threads.setStatus")
    assert refused.error == "missing_scope"


async def test_slack_assistant_status_off(slack: SlackSimulator, make_gateway: Any) -> None:
    h: Harness = await make_gateway(_slack_overrides(slack, assistant_status=False, reactions=False))
    h.model.push(text("Hello!"))
    await slack.user_mentions_bot("hi")
    await slack.wait_for(lambda: any(m.final_text == "Hello!" for m in slack.messages(DEFAULT_CHANNEL)), 10)
    await _idle(h.gateway)
    assert [c.method for c in slack.calls if c.method.startswith(("assistant.", "reactions."))] == []


# ----------------------------------------------------------------------------------------------------- Discord


@pytest.fixture(autouse=True)
def _discord_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Discord adapter sets discord.py's process-wide URLs; put them back after each test."""
    monkeypatch.setattr(Route, "BASE", Route.BASE)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", DiscordWebSocket.DEFAULT_GATEWAY)


@pytest.fixture
async def discord_sim() -> AsyncIterator[DiscordSimulator]:
    async with DiscordSimulator(heartbeat_interval=500) as sim:
        yield sim


async def _start_discord(sim: DiscordSimulator, make_gateway: Any, **platform: Any) -> Harness:
    h: Harness = await make_gateway({
        "platforms": {"discord": {"enabled": True, "token": sim.token, "api_base_url": sim.api_base_url,
                                  "guild_ready_timeout": 0.05, "reactions": True, **platform}},
        "auth": {"platforms": {"discord": {"allowed_users": [str(ALICE_ID)]}}}})
    adapter = h.gateway.adapters["discord"]
    await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED)
    return h


def _emoji(call: RestCall) -> str:
    return unquote(call.path.split("/")[-2])


async def test_discord_message_is_received_then_working_then_done(
        discord_sim: DiscordSimulator, make_gateway: Any) -> None:
    sim = discord_sim
    h = await _start_discord(sim, make_gateway)
    h.model.push(text("Hello!", latency=0.2))
    asked = sim.user_sends_dm("hi")
    await sim.wait_for_bot_messages(1, sim.dm_channel_id(), timeout=10)
    await _idle(h.gateway)
    calls = [c for c in sim.rest_calls if c.route in ("add_reaction", "remove_own_reaction")]
    assert [(c.route, _emoji(c)) for c in calls] == [
        ("add_reaction", "👀"), ("add_reaction", "⏳"), ("remove_own_reaction", "👀"),
        ("add_reaction", "✅"), ("remove_own_reaction", "⏳")]
    message_path = f"/channels/{sim.dm_channel_id()}/messages/{asked['id']}"
    assert {c.path.split("/reactions/")[0] for c in calls} == {message_path}
    assert all(c.status == 204 for c in calls)
    assert sim.bot_reactions(int(asked["id"])) == ["✅"]


async def test_discord_tool_progress_delete_removes_the_status_message(
        discord_sim: DiscordSimulator, make_gateway: Any) -> None:
    sim = discord_sim
    h = await _start_discord(sim, make_gateway, tool_progress_done="delete", tool_progress_delay=0)
    h.model.push(tool_call("todo", {"action": "list"}), text("All done.", latency=0.3))
    sim.user_sends_dm("what is left to do?")
    await sim.wait_for(lambda: any(m["content"] == "All done." for m in sim.bot_messages()), timeout=10)
    await _idle(h.gateway)
    [delete] = sim.calls_of("delete_message")
    assert delete.status == 204 and sim.deleted == [int(delete.path.rsplit("/", 1)[-1])]
    assert [m["content"] for m in sim.bot_messages()] == ["All done."]
