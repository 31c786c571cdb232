"""Slash commands, identical on every platform.

A command is recognised only when it is known; anything else starting with ``/``
goes to the agent as ordinary text. ``/cmd@botname`` is accepted for this bot; a
``/cmd@otherbot`` addressed to another bot is dropped by the router (``for_another_bot``).
``commands.disabled`` turns commands off and ``commands.admin_only`` keeps them to gateway admins.
"""

from __future__ import annotations

import re

from gateway.commands import approvals, background, busy, conversation, core, preferences, usage  # noqa: F401  (they register their commands)
from gateway.commands.base import (
    ALIASES,
    COMMANDS,
    CommandContext,
    CommandHost,
    CronControl,
    McpControl,
    ParsedCommand,
)
from gateway.commands.permissions import admin_only, enabled, menu_commands

__all__ = ["ALIASES", "COMMANDS", "CommandContext", "CommandHost", "CronControl", "McpControl", "ParsedCommand",
           "for_another_bot", "menu_commands", "parse_command", "run_command"]


_OTHER_BOT_COMMAND = re.compile(r"/[A-Za-z0-9_]{1,32}@([A-Za-z][A-Za-z0-9_]{2,31}[Bb][Oo][Tt])(?:\s|$)")


def for_another_bot(text: str, bot_username: str | None) -> bool:
    """Whether ``text`` is a ``/command@somebot`` addressed to a bot other than ``bot_username`` (in a group
    where several bots listen): such a message is for that bot, not for this one's agent."""
    match = _OTHER_BOT_COMMAND.match(text)
    return match is not None and match.group(1).lower() != (bot_username or "").lower().lstrip("@")


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
    """Execute a parsed command (when this gateway allows it to this user) and return the reply text."""
    entry, cfg, e = COMMANDS[cmd.name], ctx.host.cfg, ctx.event
    if not enabled(cfg, entry.name):
        return f"/{cmd.name} is turned off on this gateway."
    if admin_only(cfg, entry.name) and not ctx.host.is_admin(e.platform, e.user_id):
        return f"Only gateway admins can use /{cmd.name}."
    return await entry.handler(ctx)
