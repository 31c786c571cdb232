"""The command framework: what a handler gets, what it may ask of the gateway, and the registry.

Each module of this package registers its commands with ``@command``; ``gateway.commands`` imports them all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.config import Config
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


@dataclass(slots=True, frozen=True)
class Command:
    """A registered command: its help line, its handler, and whether only gateway admins may use it."""

    name: str
    description: str
    handler: Handler
    admin_only: bool = False


COMMANDS: dict[str, Command] = {}
"""Every command by name, aliases included (an alias maps to its command's entry)."""
ALIASES: set[str] = set()


def command(name: str, description: str, *, aliases: tuple[str, ...] = (),
            admin_only: bool = False) -> Callable[[Handler], Handler]:
    """Register the decorated handler as ``/name`` (and its aliases)."""
    def register(handler: Handler) -> Handler:
        entry = Command(name, description, handler, admin_only)
        for key in (name, *aliases):
            if key in COMMANDS:
                raise ValueError(f"command /{key} is registered twice")
            COMMANDS[key] = entry
        ALIASES.update(aliases)
        return handler
    return register
