"""Slash commands, identical on every platform.

A command is recognised only when it is known; anything else starting with ``/``
goes to the agent as ordinary text. ``/cmd@botname`` is accepted for this bot and
ignored for another bot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from platforms.base import MessageEvent


@dataclass(slots=True, frozen=True)
class ParsedCommand:
    """A recognised command and its argument text."""

    name: str
    args: str


class CommandHost(Protocol):
    """What commands may ask of the gateway."""

    async def reset_session(self, session_key: str) -> None:
        """Start a fresh conversation for the session."""

    def stop_session(self, session_key: str) -> bool:
        """Cancel the session's running run; whether one was running."""

    def session_status(self, session_key: str) -> dict[str, object]:
        """Model, queue depth, busy flag and uptime for ``/status``."""

    def session_tools(self, session_key: str, platform: str) -> list[str]:
        """The tools this session's runs may use."""


@dataclass(slots=True)
class CommandContext:
    """Everything a command handler gets."""

    event: MessageEvent
    session_key: str
    args: str
    host: CommandHost


Handler = Callable[[CommandContext], Awaitable[str]]


async def _help(ctx: CommandContext) -> str:
    lines = ["Commands:"]
    lines += [f"/{name} - {desc}" for name, (desc, _) in sorted(COMMANDS.items()) if name not in ALIASES]
    lines.append("Anything else is sent to the assistant.")
    return "\n".join(lines)


async def _new(ctx: CommandContext) -> str:
    await ctx.host.reset_session(ctx.session_key)
    return "Started a new conversation. Earlier messages are forgotten."


async def _stop(ctx: CommandContext) -> str:
    return "Stopped the current run." if ctx.host.stop_session(ctx.session_key) else "Nothing is running."


async def _status(ctx: CommandContext) -> str:
    s = ctx.host.session_status(ctx.session_key)
    return (f"Model: {s['model']}\nSession: {ctx.session_key}\nRunning: {'yes' if s['busy'] else 'no'}"
            f"\nQueued: {s['queued']}\nUptime: {s['uptime']}")


async def _model(ctx: CommandContext) -> str:
    current = ctx.host.session_status(ctx.session_key)["model"]
    if ctx.args.strip():
        return f"Model: {current}. Changing the model from chat is not enabled on this gateway."
    return f"Model: {current}"


async def _tools(ctx: CommandContext) -> str:
    tools = ctx.host.session_tools(ctx.session_key, ctx.event.platform)
    return "Tools available here: " + (", ".join(tools) if tools else "none")


async def _whoami(ctx: CommandContext) -> str:
    e = ctx.event
    return (f"Platform: {e.platform}\nUser: {e.user_id} ({e.user_name})\nChat: {e.chat_id} ({e.chat_type})"
            + (f"\nThread: {e.thread_id}" if e.thread_id else ""))


COMMANDS: dict[str, tuple[str, Handler]] = {
    "help": ("show this help", _help),
    "new": ("start a new conversation", _new),
    "reset": ("same as /new", _new),
    "stop": ("cancel the running reply", _stop),
    "status": ("model, queue and uptime", _status),
    "model": ("show the model", _model),
    "tools": ("list the tools available here", _tools),
    "whoami": ("your ids as the gateway sees them", _whoami),
}
ALIASES = frozenset({"reset"})


def parse_command(text: str, bot_username: str | None = None) -> ParsedCommand | None:
    """The known command in ``text``, or None (not a command, unknown, or addressed to another bot)."""
    if not text.startswith("/"):
        return None
    head, _, rest = text[1:].partition(" ")
    head, _, first_line_rest = head.partition("\n")
    name, _, target = head.partition("@")
    if target and (not bot_username or target.lower() != bot_username.lower().lstrip("@")):
        return None
    name = name.lower()
    if name not in COMMANDS:
        return None
    args = " ".join(p for p in (first_line_rest, rest) if p).strip()
    return ParsedCommand(name, args)


async def run_command(cmd: ParsedCommand, ctx: CommandContext) -> str:
    """Execute a parsed command and return the reply text."""
    _, handler = COMMANDS[cmd.name]
    return await handler(ctx)
