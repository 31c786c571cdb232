"""Live tool progress end to end: the real gateway and its Telegram and Slack adapters against the simulators, the
scripted model calling real tools."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.logs import REDACTED
from gateway.session_settings import SettingsStore
from gateway.sim.model_server import ScriptedModel, Turn, text, tool_call, tool_calls
from gateway.sim.slack_api import DEFAULT_CHANNEL, SlackSimulator
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from platforms.base import utf16_len
from tests.conftest import WEBHOOK_SECRET, Harness
from tests.gateway.conftest import StartTelegramGateway

CHAT = DEFAULT_USER_ID  # a DM: the chat id is the user's
SLOW = 0.3  # model latency between tool turns, well above the edit interval (0.05 s), so each line is shown
TWO_TOOLS = (tool_call("todo", {"action": "list"}), tool_call("search_files", {"pattern": "TODO"}, latency=SLOW),
             text("All done.", latency=SLOW))

StartTelegram = Callable[..., Awaitable[tuple[Gateway, ScriptedModel]]]


@pytest.fixture
async def telegram(telegram_gateway: StartTelegramGateway) -> AsyncIterator[tuple[TelegramSimulator, StartTelegram]]:
    """The Telegram simulator and a factory starting a gateway with the real Telegram adapter against it."""
    async with TelegramSimulator() as sim, ScriptedModel() as model:
        async def start(*turns: Turn, **progress: str) -> tuple[Gateway, ScriptedModel]:
            model.push(*turns)
            overrides = {"platforms": {"telegram": {"tool_progress_delay": 0, **progress}}}
            return await telegram_gateway(sim, model, overrides), model

        yield sim, start


async def _answered(sim: TelegramSimulator, answer: str = "All done.") -> list[str]:
    """Wait for ``answer``; every text the bot sent or edited to, in order."""
    await sim.wait_for(lambda: any(s.text == answer for s in sim.sent_messages(CHAT)), timeout=10)
    return [c.params["text"] for c in sim.calls if c.method in ("sendMessage", "editMessageText")]


async def test_telegram_status_message_shows_each_call_then_collapses(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    await start(*TWO_TOOLS)
    sim.user_sends("what is left to do?")
    await _answered(sim)
    status, answer = sim.sent_messages(CHAT)
    assert status.text == "📋 todo: list"
    assert answer.text == "All done." and answer.message_id != status.message_id
    edits = sim.edits(CHAT)
    assert {e.message_id for e in edits} == {status.message_id}
    assert [e.text for e in edits] == ["📋 todo: list\n🔎 search_files: TODO", "🔧 2 tools: todo, search_files"]
    assert edits[-1].t < answer.t  # collapsed before the answer went out


async def test_flood_control_on_an_edit_is_waited_out(telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    await start(*TWO_TOOLS[:2], text("All done.", latency=1.5))
    sim.fail_next("editMessageText", retry_after=1)
    sim.user_sends("what is left to do?")
    await _answered(sim)
    refused, shown, collapsed = sim.calls_of("editMessageText")
    assert [c.outcome for c in (refused, shown, collapsed)] == ["error", "ok", "ok"]
    assert shown.params["text"] == refused.params["text"]  # the two lines, again once Telegram allows it
    assert shown.t - refused.t >= 1.0
    assert collapsed.params["text"] == "🔧 2 tools: todo, search_files"


async def test_telegram_off_sends_no_status_message(telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    await start(*TWO_TOOLS, tool_progress="off")
    sim.user_sends("what is left to do?")
    assert await _answered(sim) == ["All done."]


async def test_a_run_quicker_than_the_delay_gets_no_status_message(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    await start(tool_call("todo", {"action": "list"}), text("Quick."), tool_call("todo", {"action": "list"}),
                text("All done.", latency=0.6), tool_progress_delay="0.4")
    sim.user_sends("quick?")
    assert await _answered(sim, "Quick.") == ["Quick."]
    sim.user_sends("slow?")  # the tools have been in use for 0.4 s while the model still works: it appears
    await _answered(sim)
    assert [s.text for s in sim.sent_messages(CHAT)] == ["Quick.", "📋 todo: list", "All done."]


@pytest.mark.parametrize(("mode", "lines"), [
    ("all", ["📋 todo: list", "📋 todo: add, [\"x\"]", "🔎 search_files: TODO"]),
    ("new", ["📋 todo: list", "🔎 search_files: TODO"]),
])
async def test_new_shows_a_line_only_when_the_tool_changes(
        telegram: tuple[TelegramSimulator, StartTelegram], mode: str, lines: list[str]) -> None:
    sim, start = telegram
    await start(tool_call("todo", {"action": "list"}), tool_call("todo", {"action": "add", "items": ["x"]}),
                *TWO_TOOLS[1:], tool_progress=mode, tool_progress_done="keep")
    sim.user_sends("plan")
    await _answered(sim)
    status, _answer = sim.sent_messages(CHAT)
    assert sim.chat_history(CHAT)[1]["text"] == "\n".join(lines)  # the status message as the chat shows it now
    assert status.text == lines[0]


async def test_verbose_arguments_are_cut_and_a_configured_secret_redacted(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    pattern = f"token={WEBHOOK_SECRET} " + "x" * 1000
    await start(tool_call("search_files", {"pattern": pattern}), text("All done.", latency=SLOW),
                tool_progress="verbose")
    sim.user_sends("find it")
    sent = await _answered(sim)
    shown = sim.sent_messages(CHAT)[0].text
    assert shown.startswith('🔎 search_files: {"pattern": "token=' + REDACTED)
    assert shown.endswith("…") and len(shown) < 450
    assert not [t for t in sent if WEBHOOK_SECRET in t]


async def test_lines_that_do_not_fit_one_message_leave_out_the_oldest(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    calls = [("search_files", {"pattern": f"{i:02d} " + "y" * 500}) for i in range(15)]  # 15 x ~420 characters
    await start(tool_calls(calls), text("All done.", latency=SLOW), tool_progress="verbose",
                tool_progress_done="keep")
    sim.user_sends("find them all")
    await _answered(sim)
    kept = sim.chat_history(CHAT)[1]["text"]
    assert utf16_len(kept) <= 4096 and kept.startswith("… ")
    left_out = int(kept.split()[1])
    assert 0 < left_out < 15 and len(kept.splitlines()) == 1 + 15 - left_out


async def test_delete_removes_the_status_message(telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    await start(*TWO_TOOLS, tool_progress_done="delete")
    sim.user_sends("what is left to do?")
    await _answered(sim)
    status, _answer = sim.sent_messages(CHAT)
    assert sim.deleted_messages == [(CHAT, status.message_id)]
    assert [m["text"] for m in sim.chat_history(CHAT) if m["from"]["id"] == sim.bot_id] == ["All done."]


async def test_slash_verbose_sets_and_cycles_the_chat_mode(telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, _ = await start(*TWO_TOOLS)
    sim.user_sends("/help")
    [help_text] = [s.text for s in await sim.wait_for_messages(1, CHAT)]
    assert "/verbose - tool progress in this chat" in help_text
    sim.user_sends("/verbose off")
    await sim.wait_for(lambda: any(s.text.startswith("Tool progress here: off") for s in sim.sent_messages(CHAT)))
    sim.user_sends("what is left to do?")
    await _answered(sim)
    assert sim.edits(CHAT) == [] and len(sim.sent_messages(CHAT)) == 3  # help, /verbose, the answer
    sim.user_sends("/verbose")  # the next mode after off
    await sim.wait_for(lambda: any(s.text.startswith("Tool progress here: new") for s in sim.sent_messages(CHAT)))
    sim.user_sends("/verbose loud")
    await sim.wait_for(lambda: any(s.text.startswith("Usage: /verbose") for s in sim.sent_messages(CHAT)))
    assert (await SettingsStore(gateway.store).session(f"telegram:dm:{CHAT}")).verbose == "new"


# ------------------------------------------------------------------------------------------------------ Slack


@pytest.fixture
async def slack() -> AsyncIterator[SlackSimulator]:
    async with SlackSimulator() as sim:
        yield sim


def _slack_overrides(sim: SlackSimulator, **progress: str) -> dict[str, Any]:
    return {
        "platforms": {
            "slack": {"enabled": True, "bot_token": sim.bot_token, "app_token": sim.app_token,
                      "signing_secret": sim.signing_secret, "api_base_url": sim.base_url, "ping_interval": 0.2,
                      "tool_progress_delay": 0, **progress},
            "webhook": {"routes": {"github": {"deliver_to": f"slack:{DEFAULT_CHANNEL}"}}},
        },
        "auth": {"platforms": {"slack": {"allowed_users": ["U0USER1"]}}},
    }


async def test_slack_status_message_is_updated_then_collapsed(slack: SlackSimulator, make_gateway: Any) -> None:
    h: Harness = await make_gateway(_slack_overrides(slack))
    h.model.push(*TWO_TOOLS)
    action = await slack.user_mentions_bot("what is left to do?")
    status, answer = await slack.wait_for_messages(2, DEFAULT_CHANNEL, timeout=10)
    assert status.thread_ts == answer.thread_ts == action.ts
    assert status.text == "📋 todo: `list`"  # mrkdwn: the arguments as code
    assert status.edits == ["📋 todo: `list`\n🔎 search_files: `TODO`", "🔧 2 tools: todo, search_files"]
    assert answer.final_text == "All done."


async def test_slack_delete_uses_chat_delete(slack: SlackSimulator, make_gateway: Any) -> None:
    h: Harness = await make_gateway(_slack_overrides(slack, tool_progress_done="delete"))
    h.model.push(*TWO_TOOLS)
    await slack.user_mentions_bot("what is left to do?")
    await slack.wait_for(lambda: any(m.final_text == "All done." for m in slack.messages(DEFAULT_CHANNEL)), 10)
    [deleted] = slack.deleted
    assert deleted.text.startswith("📋 todo")
    assert [m.final_text for m in slack.messages(DEFAULT_CHANNEL)] == ["All done."]


async def test_a_webhook_run_gets_no_progress(slack: SlackSimulator, make_gateway: Any) -> None:
    h: Harness = await make_gateway(_slack_overrides(slack))
    h.model.push(*TWO_TOOLS)
    status, body = await h.post_webhook()
    assert status == 202
    run = await h.wait_run(body["run_id"])
    assert run["status"] == "completed"
    [answer] = await slack.wait_for_messages(1, DEFAULT_CHANNEL, timeout=10)
    assert answer.text == "All done." and slack.calls_of("chat.update") == []
