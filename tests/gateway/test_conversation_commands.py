"""The conversation commands end to end, through the Telegram Bot API simulator and the real python-telegram-bot:
/model switching, /retry, /undo, /title, /compress, /sethome (with a cron job delivering home), the commands
config (off, admins only), and a command's effects stored exactly once with its reply."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.session_settings import HomeChannel, SettingsStore
from gateway.session_summary import COMPRESS_PROMPT, SUMMARY_PREFIX
from gateway.sim.model_server import JSON, ScriptedModel, Turn, last_user_text, tool_call
from gateway.sim.telegram_api import DEFAULT_GROUP_ID, DEFAULT_USER_ID, TelegramSimulator
from platforms.base import MessageEvent
from tests.conftest import deep_merge
from tests.gateway.conftest import StartTelegramGateway

CHAT = DEFAULT_USER_ID  # a DM: the chat id is the user's
SESSION = f"telegram:dm:{CHAT}"
SLOW = 1.0  # a model answer held this long keeps a run busy while a command arrives

Start = Callable[..., Awaitable[Gateway]]


class Model:
    """A scripted model answering ``Answer N to: <text>`` (N counts the answers), ``A summary.`` to compression
    requests, and with a tool call to the texts in ``tools``."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)
        self.latency: dict[str, float] = {}
        self.tools: dict[str, Turn] = {}
        """User texts answered with a tool call (once: the request after the tool's result gets an answer)."""

    async def __call__(self, request: JSON) -> Turn:
        if request["messages"][0]["content"] == COMPRESS_PROMPT:
            return Turn(content="A summary.")
        text = last_user_text(request)
        if request["messages"][-1]["role"] == "user" and text in self.tools:
            return self.tools[text]
        await asyncio.sleep(self.latency.get(text, 0))
        return Turn(content=f"Answer {next(self.counter)} to: {text}")


@pytest.fixture
async def tg(telegram_gateway: StartTelegramGateway) -> AsyncIterator[tuple[TelegramSimulator, ScriptedModel, Start]]:
    """The Telegram simulator, the scripted model, and a factory starting a gateway against both."""
    async with TelegramSimulator() as sim, ScriptedModel(Model()) as model:
        async def start(overrides: dict[str, Any] | None = None) -> Gateway:
            return await telegram_gateway(sim, model, deep_merge({
                "platforms": {"telegram": {"group_trigger": "always"}},
                "auth": {"platforms": {"telegram": {"allowed_users": [str(DEFAULT_USER_ID), "1002"]}},
                         "admins": ["telegram:1002"]}}, overrides or {}))

        yield sim, model, start


async def _say(sim: TelegramSimulator, text: str, *, chat_id: int = CHAT, **origin: Any) -> str:
    """Send ``text`` and return the next message the bot sends to the chat."""
    before = len(sim.sent_messages(chat_id))
    sim.user_sends(text, **origin)
    sent = await sim.wait_for_messages(before + 1, chat_id, timeout=10)
    return sent[before].text


async def _exchange(sim: TelegramSimulator, text: str) -> str:
    """Send a message and wait for its answer (the first bot message mentioning it)."""
    sim.user_sends(text)
    found = await sim.wait_for(lambda: next((s.text for s in sim.sent_messages(CHAT)
                                             if s.text.endswith(f"to: {text}")), None), timeout=10)
    return found


async def _history(gateway: Gateway) -> list[tuple[str, str | None]]:
    assert gateway.store is not None
    epoch = await gateway.store.session_epoch(SESSION, "telegram", str(CHAT), str(CHAT), None)
    return [(m.role, m.content) for m in await gateway.store.history(SESSION, epoch, 100)]


async def _settings(gateway: Gateway) -> SettingsStore:
    assert gateway.store is not None
    return SettingsStore(gateway.store)


# -- /model ---------------------------------------------------------------------------------------------------


async def test_model_lists_switches_this_conversation_and_the_next_request_uses_it(tg) -> None:
    sim, model, start = tg
    gateway = await start({"model": {"allowed": ["small-model", "big-model"]}})
    listing = await _say(sim, "/model")
    assert listing == ("Model: scripted-model\nAvailable: scripted-model (default), small-model, big-model\n"
                       "Switch with /model NAME; /model default goes back.")
    assert await _say(sim, "/model huge-model") == (
        "Unknown model 'huge-model'. Available: scripted-model, small-model, big-model.")
    assert await _say(sim, "/model big-model") == "Model for this conversation: big-model."
    assert (await (await _settings(gateway)).session(SESSION)).model == "big-model"
    await _exchange(sim, "hello")
    assert model.requests[-1]["model"] == "big-model"
    assert (await _say(sim, "/status")).startswith("Model: big-model\n")

    # Another chat keeps the default.
    sim.user_sends("hi from the group", chat_type="group", user_id=1002)
    await sim.wait_for(lambda: len(model.requests) == 2, timeout=10)
    assert model.requests[-1]["model"] == "scripted-model"

    assert await _say(sim, "/model default") == "Model for this conversation: scripted-model."
    await _exchange(sim, "again")
    assert model.requests[-1]["model"] == "scripted-model"
    assert (await (await _settings(gateway)).session(SESSION)).model is None


async def test_a_background_task_asks_the_chats_model(tg) -> None:
    sim, model, start = tg
    await start({"model": {"allowed": ["big-model"]}})
    await _say(sim, "/model big-model")
    assert (await _say(sim, "/background summarise the news")).startswith("Background task ")
    await sim.wait_for(lambda: any(s.text.endswith("to: summarise the news") for s in sim.sent_messages(CHAT)),
                       timeout=10)
    assert model.requests[-1]["model"] == "big-model"


async def test_a_model_taken_off_model_allowed_is_no_longer_used(tg, tmp_path: Path) -> None:
    sim, model, start = tg
    gateway = await start({"model": {"allowed": ["big-model"]}})
    assert await _say(sim, "/model big-model") == "Model for this conversation: big-model."
    await gateway.stop(drain_timeout=1)
    await start({"model": {"allowed": ["small-model"]}})  # the operator changed the list
    await _exchange(sim, "still there?")
    assert model.requests[-1]["model"] == "scripted-model"


# -- /retry and /undo -----------------------------------------------------------------------------------------


async def test_retry_runs_the_last_message_again_without_its_previous_answer(tg) -> None:
    sim, model, start = tg
    gateway = await start()
    assert await _exchange(sim, "first question") == "Answer 1 to: first question"
    assert await _exchange(sim, "second question") == "Answer 2 to: second question"
    assert await _say(sim, "/retry") == "Retrying “second question”"
    await sim.wait_for(lambda: any(s.text == "Answer 3 to: second question" for s in sim.sent_messages(CHAT)))
    retried = model.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in retried[1:]] == [
        ("user", "first question"), ("assistant", "Answer 1 to: first question"), ("user", "second question")]
    await asyncio.sleep(0.1)  # the retried run's transcript is stored with its completion
    assert await _history(gateway) == [
        ("user", "first question"), ("assistant", "Answer 1 to: first question"),
        ("user", "second question"), ("assistant", "Answer 3 to: second question")]


async def test_undo_takes_back_the_last_exchange_and_the_next_request_lacks_it(tg) -> None:
    sim, model, start = tg
    gateway = await start()
    assert await _say(sim, "/undo") == "Nothing to undo in this conversation."
    await _exchange(sim, "keep this")
    await _exchange(sim, "drop this")
    assert await _say(sim, "/undo") == "Removed your last message “drop this” and its answer from this conversation."
    assert await _history(gateway) == [("user", "keep this"), ("assistant", "Answer 1 to: keep this")]
    await _exchange(sim, "next")
    assert [m["content"] for m in model.requests[-1]["messages"][1:]] == [
        "keep this", "Answer 1 to: keep this", "next"]


async def test_retry_and_undo_wait_for_a_running_reply(tg) -> None:
    sim, model, start = tg
    gateway = await start()
    model.responder.latency["slow one"] = SLOW
    sim.user_sends("slow one")
    await sim.wait_for(lambda: len(model.requests) == 1)
    assert await _say(sim, "/undo") == "A reply is still being written. Wait for it, or /stop it first."
    assert await _say(sim, "/retry") == "A reply is still being written. Wait for it, or /stop it first."
    await sim.wait_for(lambda: any(s.text == "Answer 1 to: slow one" for s in sim.sent_messages(CHAT)), timeout=10)
    await asyncio.sleep(0.1)
    assert len(await _history(gateway)) == 2


async def test_a_replayed_command_applies_its_effects_once(tg) -> None:
    """A command event handled twice (a crash before its reply was recorded is redone; a second replica that
    took it too) takes back one exchange, not two: the effect is stored with the reply and closes the event."""
    sim, _model, start = tg
    gateway = await start()
    await _exchange(sim, "one")
    await _exchange(sim, "two")
    router, store = gateway.router, gateway.store
    assert router is not None and store is not None
    event = MessageEvent(platform="telegram", event_id="replayed-undo", chat_id=str(CHAT), chat_type="dm",
                         user_id=str(CHAT), user_name="alice", text="/undo", message_id="1")
    accepted = await store.accept(event.dedupe_key, "telegram", "command", SESSION, {"event": event.to_dict()})
    await router._handle_command(accepted.inbox_id, SESSION, event)
    await router._handle_command(accepted.inbox_id, SESSION, event)
    assert await _history(gateway) == [("user", "one"), ("assistant", "Answer 1 to: one")]
    replies = [r for r in await store.outbox_rows() if r.dedupe_key.startswith("cmd:telegram:replayed-undo")]
    assert len(replies) == 1


# -- /title and /new ------------------------------------------------------------------------------------------


async def test_title_is_set_shown_in_status_and_cleared_by_reset(tg) -> None:
    sim, _model, start = tg
    gateway = await start()
    assert await _say(sim, "/title") == "This conversation has no title. Set one with /title TEXT."
    assert await _say(sim, "/title   Trip  to Lisbon ") == "Title: Trip to Lisbon"
    assert (await (await _settings(gateway)).session(SESSION)).title == "Trip to Lisbon"
    assert "\nTitle: Trip to Lisbon\n" in await _say(sim, "/status")
    assert await _say(sim, "/title " + "x" * 121) == "A title has at most 120 characters."
    await _exchange(sim, "remember me")
    assert await _say(sim, "/reset") == "Started a new conversation. Earlier messages are forgotten."  # /new's alias
    assert await _say(sim, "/title") == "This conversation has no title. Set one with /title TEXT."
    assert await _history(gateway) == []  # the next conversation (epoch) is empty
    assert gateway.store is not None
    assert await gateway.store.session_epoch(SESSION, "telegram", str(CHAT), str(CHAT), None) == 1


# -- /compress ------------------------------------------------------------------------------------------------


async def test_compress_summarises_now_and_the_next_request_starts_from_the_summary(tg) -> None:
    sim, model, start = tg
    await start({"model": {"context_tokens": 100000, "keep_recent_turns": 2}})
    for i in range(3):
        await _exchange(sim, f"turn {i}")
    assert await _say(sim, "/compress") == (
        "Compressed the earlier conversation into a summary; the next request starts from it and the "
        "2 most recent messages.")
    summary_request = model.requests[-1]
    assert summary_request["messages"][0]["content"] == COMPRESS_PROMPT
    assert "turn 0" in summary_request["messages"][1]["content"]
    await _exchange(sim, "after")
    sent = model.requests[-1]["messages"]
    assert sent[1] == {"role": "system", "content": SUMMARY_PREFIX + "A summary."}
    assert [m["content"] for m in sent[2:]] == ["turn 2", "Answer 3 to: turn 2", "after"]


async def test_compress_says_so_when_the_summary_fails_and_changes_nothing(tg) -> None:
    sim, model, start = tg
    await start({"model": {"context_tokens": 100000, "keep_recent_turns": 2}})
    assert await _say(sim, "/compress") == "Nothing to compress yet: the conversation is only its most recent turns."
    for i in range(3):
        await _exchange(sim, f"turn {i}")
    model.fail_next(1, status=500)
    assert await _say(sim, "/compress") == (
        "The model could not write a summary just now; the conversation is unchanged. Try again later.")
    await _exchange(sim, "after")
    assert [m["content"] for m in model.requests[-1]["messages"][1:]] == [
        "turn 0", "Answer 1 to: turn 0", "turn 1", "Answer 2 to: turn 1", "turn 2", "Answer 3 to: turn 2", "after"]


async def test_compress_without_context_tokens_says_it_is_off(tg) -> None:
    sim, model, start = tg
    await start()
    assert await _say(sim, "/compress") == (
        "Compression is off on this gateway (its operator sets model.context_tokens to turn it on).")
    assert model.requests == []


# -- /sethome -------------------------------------------------------------------------------------------------


async def test_sethome_makes_a_chat_the_home_of_jobs_delivering_home(tg) -> None:
    sim, model, start = tg
    gateway = await start()
    group = DEFAULT_GROUP_ID
    assert (await _say(sim, "/sethome", chat_id=group, chat_type="group")).startswith(
        "This chat is now your home channel")
    home = await (await _settings(gateway)).home(f"telegram:{CHAT}")
    assert home == HomeChannel("telegram", str(group), None)
    # In the DM, the user has the assistant schedule a job delivering home; it fires into the group.
    model.responder.tools["digest please"] = tool_call(
        "cronjob", {"action": "create", "prompt": "daily digest", "schedule": "every 1d", "deliver": "home"})
    await _exchange(sim, "digest please")
    assert gateway.cron is not None
    (job,) = await gateway.cron.list_jobs(f"telegram:{CHAT}")
    assert job.deliver == "home"
    assert await gateway.cron.run_now(job.id, f"telegram:{CHAT}")
    await sim.wait_for(lambda: any(s.text.endswith("to: daily digest") for s in sim.sent_messages(group)),
                       timeout=10)
    assert not any(s.text.endswith("to: daily digest") for s in sim.sent_messages(CHAT))


# -- the commands config --------------------------------------------------------------------------------------


async def test_disabled_and_admin_only_commands(tg) -> None:
    sim, _model, start = tg
    await start({"commands": {"disabled": ["title"], "admin_only": ["/model"]}})
    assert await _say(sim, "/title x") == "/title is turned off on this gateway."
    assert await _say(sim, "/model") == "Only gateway admins can use /model."
    listed = await _say(sim, "/help")
    assert "/title" not in listed and "/model" not in listed and "/retry" in listed
    # An admin may use /model and sees it listed.
    group = DEFAULT_GROUP_ID
    assert await _say(sim, "/model", chat_id=group, chat_type="group", user_id=1002) == "Model: scripted-model"
    assert "/model - " in await _say(sim, "/help", chat_id=group, chat_type="group", user_id=1002)


def test_an_unknown_command_in_the_config_names_the_key_and_a_suggestion(tmp_path: Path) -> None:
    from gateway.config import ConfigError
    from gateway.plugins import check_with_plugins
    from tools.plugins import LoadedPlugins
    from tools.registry import registry

    # A plugin's command could have that name: it is refused once the plugins are loaded (here: none).
    cfg = parse_config({"commands": {"disabled": ["titel"]}}, env={"HERMES_GATEWAY_HOME": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        check_with_plugins(cfg, LoadedPlugins(registry))
    message = str(err.value)
    assert "commands.disabled" in message and "'titel'" in message and "did you mean 'title'" in message
