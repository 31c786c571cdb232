"""Slash commands: parsing, and the replies of /help, /whoami, /tools and /model through the gateway."""

from __future__ import annotations

import pytest

from gateway.commands import ALIASES, COMMANDS, ParsedCommand, for_another_bot, parse_command
from tests.conftest import GatewayFactory, Harness


@pytest.mark.parametrize(("text", "bot", "expected"), [
    ("/new", "hermes_bot", ParsedCommand("new", "")),
    ("/NEW", None, ParsedCommand("new", "")),
    ("/reset", None, ParsedCommand("reset", "")),
    ("/new@hermes_bot", "hermes_bot", ParsedCommand("new", "")),
    ("/new@Hermes_Bot", "@hermes_bot", ParsedCommand("new", "")),
    ("/new@otherbot", "hermes_bot", None),
    ("/new@hermes_bot", None, None),
    ("/unknown", "hermes_bot", None),
    ("/unknown@hermes_bot", "hermes_bot", None),
    ("/model gpt-4o  ", None, ParsedCommand("model", "gpt-4o")),
    ("/model  two  words", None, ParsedCommand("model", "two  words")),
    ("/model\ngpt-4o", None, ParsedCommand("model", "gpt-4o")),
    ("/model a\nb", None, ParsedCommand("model", "a\nb")),
    ("/model@hermes_bot\nline one\nline two", "hermes_bot", ParsedCommand("model", "line one\nline two")),
    ("hello /new", None, None),
    (" /new", None, None),
    ("/", None, None),
    ("", None, None),
])
def test_parse_command(text: str, bot: str | None, expected: ParsedCommand | None) -> None:
    assert parse_command(text, bot) == expected


@pytest.mark.parametrize(("text", "bot", "expected"), [
    ("/new@otherbot", "hermes_bot", True),
    ("/frobnicate@Other_Bot please", "hermes_bot", True),
    ("/new@otherbot", None, True),
    ("/new@hermes_bot", "@Hermes_Bot", False),
    ("/new", "hermes_bot", False),
    ("/etc@host is a path", "hermes_bot", False),  # not a bot username (bot usernames end in "bot")
    ("ask /new@otherbot", "hermes_bot", False),
    ("/new@otherbotx", "hermes_bot", False),
])
def test_for_another_bot(text: str, bot: str | None, expected: bool) -> None:
    assert for_another_bot(text, bot) is expected


async def _reply(h: Harness, text: str, **kwargs: str) -> str:
    before = len(h.chat.sent)
    await h.chat.user_says(text, **kwargs)
    await h.chat.wait_for(lambda: len(h.chat.sent) > before)
    return h.chat.sent[before].text


async def test_help_lists_every_command_once(make_gateway: GatewayFactory) -> None:
    h = await make_gateway()
    lines = (await _reply(h, "/help")).splitlines()
    listed = [line.split(" - ")[0] for line in lines if line.startswith("/")]
    # The harness's user is no admin: commands only admins may use are not listed for them.
    assert sorted(listed) == sorted(f"/{name}" for name, entry in COMMANDS.items()
                                    if name not in ALIASES and not entry.admin_only)
    assert "/reload-mcp" not in listed and len(listed) >= 10
    assert {"/help", "/new", "/stop", "/status", "/model", "/tools", "/whoami"} <= set(listed)
    assert h.model.requests == [], "commands never reach the model"


async def test_whoami_reports_the_ids_the_gateway_sees(make_gateway: GatewayFactory) -> None:
    h = await make_gateway()
    assert await _reply(h, "/whoami") == "Platform: telegram\nUser: 1001 (user1001)\nChat: 100 (dm)"
    assert await _reply(h, "/whoami@hermes_bot", chat_id="-500", chat_type="group", user_id="1002",
                        thread_id="7") == "Platform: telegram\nUser: 1002 (user1002)\nChat: -500 (group)\nThread: 7"


async def test_tools_lists_what_the_session_s_runs_get(make_gateway: GatewayFactory) -> None:
    h = await make_gateway({"toolsets": {"telegram": ["todo", "memory"]}})
    assert await _reply(h, "/tools") == "Tools available here: memory, todo"
    await _reply(h, "hello")
    offered = sorted(t["function"]["name"] for t in h.model.requests[-1]["tools"])
    assert offered == ["memory", "todo"]


async def test_model_without_model_allowed_shows_the_model_and_refuses_to_switch(make_gateway: GatewayFactory) -> None:
    h = await make_gateway()
    assert await _reply(h, "/model") == "Model: scripted-model"
    assert await _reply(h, "/MODEL gpt-5") == (
        "Model: scripted-model. Switching models is not enabled on this gateway (its operator lists the models "
        "a chat may use in model.allowed).")
    assert h.model.requests == []
