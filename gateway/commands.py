"""Slash commands, identical on every platform.

A command is recognised only when it is known; anything else starting with ``/``
goes to the agent as ordinary text. ``/cmd@botname`` is accepted for this bot; a
``/cmd@otherbot`` addressed to another bot is dropped by the router (``for_another_bot``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.config import Config
from gateway.tool_progress import MODES, chat_modes, mode_for
from platforms.base import MessageEvent
from tools.cronjob_tools import CronJob


@dataclass(slots=True, frozen=True)
class ParsedCommand:
    """A recognised command and its argument text."""

    name: str
    args: str


class CronControl(Protocol):
    """The scheduler operations ``/cron`` uses; ``actor`` is the user key, None for an admin (all jobs)."""

    async def list_jobs(self, actor: str | None) -> list[CronJob]:
        """The actor's jobs."""
        ...

    async def pause(self, job_id: str, actor: str | None) -> CronJob | None:
        """Stop a job firing; None when the actor has no such job."""
        ...

    async def resume(self, job_id: str, actor: str | None) -> CronJob | None:
        """Let a paused job fire again."""
        ...

    async def remove(self, job_id: str, actor: str | None) -> bool:
        """Delete a job."""
        ...

    async def run_now(self, job_id: str, actor: str | None) -> str | None:
        """Fire a job once now; the run id."""
        ...


class McpControl(Protocol):
    """What ``/reload-mcp`` uses."""

    def reload(self) -> str:
        """Reconnect every MCP server and re-list its tools; the reply text."""
        ...


class CommandHost(Protocol):
    """What commands may ask of the gateway."""

    cfg: Config
    cron: CronControl | None
    mcp: McpControl | None

    def is_admin(self, platform: str, user_id: str) -> bool:
        """Whether the user is a gateway admin."""

    async def reset_session(self, session_key: str) -> None:
        """Start a fresh conversation for the session."""

    async def stop_session(self, session_key: str) -> bool:
        """Cancel the session's running run (on whichever replica runs it), or its accepted run that has not
        started yet; whether there was one."""

    def session_status(self, session_key: str) -> dict[str, object]:
        """Model, queue depth, busy flag and uptime for ``/status``."""

    def session_tools(self, session_key: str, platform: str) -> list[str]:
        """The tools this session's runs may use."""

    async def approve_pairing(self, event: MessageEvent, code: str) -> str:
        """Approve a pairing code if the sender is an admin; the reply text."""


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
    return "Stopped the current run." if await ctx.host.stop_session(ctx.session_key) else "Nothing is running."


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


async def _pair(ctx: CommandContext) -> str:
    action, _, code = ctx.args.partition(" ")
    if action != "approve" or not code.strip():
        return "Usage: /pair approve CODE"
    return await ctx.host.approve_pairing(ctx.event, code.strip())


_CRON_USAGE = "Usage: /cron list | /cron pause ID | /cron resume ID | /cron remove ID | /cron run ID"


async def _cron(ctx: CommandContext) -> str:
    cron = ctx.host.cron
    if cron is None:
        return "Scheduled jobs are not available on this gateway."
    e = ctx.event
    actor = None if ctx.host.is_admin(e.platform, e.user_id) else f"{e.platform}:{e.user_id}"
    action, _, job_id = ctx.args.partition(" ")
    action, job_id = action.lower() or "list", job_id.strip()
    if action == "list":
        jobs = await cron.list_jobs(actor)
        if not jobs:
            return "No scheduled jobs. Ask me to schedule something, e.g. 'every weekday at 9:00, summarize the news'."
        return "\n".join(["Scheduled jobs:", *(j.summary() for j in jobs)])
    if action not in ("pause", "resume", "remove", "run") or not job_id:
        return _CRON_USAGE
    missing = f"No job {job_id!r}. /cron list shows your jobs."
    if action == "remove":
        return f"Removed job {job_id}." if await cron.remove(job_id, actor) else missing
    if action == "run":
        return f"Running job {job_id} now." if await cron.run_now(job_id, actor) else missing
    job = await (cron.pause if action == "pause" else cron.resume)(job_id, actor)
    return missing if job is None else f"{action.capitalize()}d: {job.summary()}"


_MODE_HELP = {
    "off": "no tool progress",
    "new": "a line when the assistant starts using another tool",
    "all": "a line for every tool call",
    "verbose": "every tool call with its full arguments",
}


async def _verbose(ctx: CommandContext) -> str:
    e = ctx.event
    wanted = ctx.args.strip().lower()
    if wanted and wanted not in MODES:
        return "Usage: /verbose [" + "|".join(MODES) + "] (without a mode: the next one)"
    current = mode_for(ctx.host.cfg, e.platform, e.chat_id)
    mode = MODES[MODES.index(wanted) if wanted else (MODES.index(current) + 1) % len(MODES)]
    chat_modes.set(e.platform, e.chat_id, mode)
    return f"Tool progress here: {mode} ({_MODE_HELP[mode]})."


async def _reload_mcp(ctx: CommandContext) -> str:
    if not ctx.host.is_admin(ctx.event.platform, ctx.event.user_id):
        return "Only gateway admins can reload MCP servers."
    return ctx.host.mcp.reload() if ctx.host.mcp is not None else "No MCP servers are configured."


COMMANDS: dict[str, tuple[str, Handler]] = {
    "help": ("show this help", _help),
    "new": ("start a new conversation", _new),
    "reset": ("same as /new", _new),
    "stop": ("cancel the running reply", _stop),
    "status": ("model, queue and uptime", _status),
    "model": ("show the model", _model),
    "tools": ("list the tools available here", _tools),
    "whoami": ("your ids as the gateway sees them", _whoami),
    "verbose": ("tool progress in this chat: off, new, all or verbose (without a mode: the next one)", _verbose),
    "cron": ("your scheduled jobs (/cron list|pause|resume|remove|run ID)", _cron),
    "pair": ("admins: approve a pairing code (/pair approve CODE)", _pair),
    "reload-mcp": ("admins: reconnect the MCP servers and re-list their tools", _reload_mcp),
    "reload_mcp": ("same as /reload-mcp", _reload_mcp),
}
ALIASES = frozenset({"reset", "reload_mcp"})


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
    """Execute a parsed command and return the reply text."""
    _, handler = COMMANDS[cmd.name]
    return await handler(ctx)
