"""The command framework: what a handler gets, what it may ask of the gateway, and the registry.

Each module of this package registers its commands with ``@command``; ``gateway.commands`` imports them all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.engine import Connection

from gateway.approvals import Approval
from gateway.config import Config
from gateway.session_settings import SettingsStore
from gateway.session_summary import PreparedHistory
from gateway.store import Store
from platforms.base import MessageEvent
from tools.cronjob_tools import CronJob

Effect = Callable[[Connection], object]
"""A change a command makes to stored state, run in the transaction that stores its reply and closes its inbox
event: a command interrupted by a crash is redone whole or not at all, never applied twice."""


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
    store: Store
    settings: SettingsStore

    def is_admin(self, platform: str, user_id: str) -> bool:
        """Whether the user is a gateway admin."""

    async def stop_session(self, session_key: str) -> bool:
        """Cancel the session's running run (on whichever replica runs it), or its accepted run that has not
        started yet; whether there was one."""

    def session_status(self, session_key: str) -> dict[str, object]:
        """Queue depth, busy flag and uptime for ``/status``."""

    def session_tools(self, session_key: str, platform: str) -> list[str]:
        """The tools this session's runs may use."""

    def model_for(self, choice: str | None) -> str:
        """The model a session with this ``/model`` choice uses."""

    async def session_busy(self, session_key: str) -> bool:
        """Whether a run of the session has not finished yet (here, or on another replica)."""

    async def compress_session(self, session_key: str, event: MessageEvent) -> PreparedHistory | None:
        """Summarise the session's older turns now; None when compression is off (no ``model.context_tokens``)."""

    def retry(self, ctx: CommandContext, text: str) -> None:
        """Run ``text`` again as a message of the command's chat: accepted with the command's effects, started
        once they are stored."""

    def start_background(self, ctx: CommandContext, prompt: str) -> str:
        """Accept ``prompt`` as a background task of the command's chat (with the command's reply); its id."""

    def answer_approval(self, ctx: CommandContext, approval: Approval, status: str, scope: str | None = None,
                        reason: str | None = None) -> None:
        """Record the answer to a waiting approval and resume its run, with the command's reply."""

    async def approve_pairing(self, event: MessageEvent, code: str) -> str:
        """Approve a pairing code if the sender is an admin; the reply text."""


@dataclass(slots=True)
class CommandContext:
    """Everything a command handler gets."""

    event: MessageEvent
    session_key: str
    args: str
    host: CommandHost
    effects: list[Effect] = field(default_factory=list)
    """Stored with the reply, atomically (see ``Effect``)."""
    after: list[Callable[[], None]] = field(default_factory=list)
    """Called once the reply and the effects are stored (e.g. start a run the effects accepted)."""
    replace_pressed: bool = False
    """The reply replaces the message whose button sent the command (its buttons go): the answer to a prompt."""
    also_replace: str | None = None
    """With ``replace_pressed``, when the command was typed: the platform id of the prompt the reply also replaces
    (so its buttons go too)."""


Handler = Callable[[CommandContext], Awaitable[str]]


@dataclass(slots=True, frozen=True)
class Command:
    """A registered command: its help line, its handler, and whether only gateway admins may use it."""

    name: str
    description: str
    handler: Handler
    admin_only: bool = False
    slow: bool = False
    """Handled off the adapter's path (it calls the model): the platform is acknowledged first."""


COMMANDS: dict[str, Command] = {}
"""Every command by name, aliases included (an alias maps to its command's entry)."""
ALIASES: set[str] = set()


def add_command(entry: Command, aliases: tuple[str, ...] = ()) -> None:
    """Register ``entry`` as ``/name`` (and its aliases); ValueError when a name is taken."""
    taken = [key for key in (entry.name, *aliases) if key in COMMANDS]
    if taken:
        raise ValueError(f"command /{taken[0]} is registered twice")
    COMMANDS.update(dict.fromkeys((entry.name, *aliases), entry))
    ALIASES.update(aliases)


def remove_command(entry: Command) -> None:
    """Unregister a command added with ``add_command`` (a plugin's, when the gateway stops); no-op when absent."""
    for key in [key for key, value in COMMANDS.items() if value is entry]:
        del COMMANDS[key]
        ALIASES.discard(key)


def command(name: str, description: str, *, aliases: tuple[str, ...] = (),
            admin_only: bool = False, slow: bool = False) -> Callable[[Handler], Handler]:
    """Register the decorated handler as ``/name`` (and its aliases)."""
    def register(handler: Handler) -> Handler:
        add_command(Command(name, description, handler, admin_only, slow), aliases)
        return handler
    return register
