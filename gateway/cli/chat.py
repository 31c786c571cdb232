"""``chat``: talk to the agent from the terminal.

The terminal is one more chat platform (``platforms/terminal.py``, platform ``cli``) of a gateway of its own
(``Gateway(local=True)``) on the configured store: each line is accepted into the inbox, routed (slash commands
included), run by the same agent, tool pipeline and sandbox, and its answer delivered through the outbox. The
session is ``cli:dm:<user>``, so its history persists across invocations. The terminal's user is the operator
(they hold the config): a gateway admin on platform ``cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.cli.common import CliError, config_parent, err, load

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.config import Config
    from platforms.terminal import TerminalAdapter

ORDER = 2
# The chat platforms' tools without cronjob: a job made here would fire into a terminal nobody watches.
DEFAULT_TOOLSETS = ("web", "file", "terminal", "memory", "todo", "clarify")
EXIT_COMMANDS = frozenset({"/exit", "/quit"})
_ARG_CHARS = 60
_FINISHED = ("completed", "failed", "cancelled")


def _show_tool_call(name: str, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> None:
    """``pre_tool_call`` hook: each tool call of a terminal run, as it starts, on stderr."""
    if ctx.get("platform") == "cli":
        shown = ", ".join(f"{key}={value!r}"[:_ARG_CHARS] for key, value in args.items())
        print(f"→ {name}({shown})", file=sys.stderr, flush=True)


def _chat_config(cfg: Config, user: str, toolsets: list[str]) -> Config:
    """The config with the terminal's user as an admin on ``cli`` and ``toolsets`` for its runs."""
    auth = cfg.auth.model_copy(update={"admins": [*cfg.auth.admins, f"cli:{user}"]})
    return cfg.model_copy(update={"auth": auth, "toolsets": {**cfg.toolsets, "cli": toolsets}})


async def _read_line(prompt: str | None) -> str | None:
    """The next line of stdin (None at EOF), read on a daemon thread so Ctrl-C at the prompt exits at once."""
    loop = asyncio.get_running_loop()
    line: asyncio.Future[str | None] = loop.create_future()

    def settle(value: str | None) -> None:
        if not line.done():
            line.set_result(value)

    def read() -> None:
        try:
            value = input(prompt) if prompt is not None else (sys.stdin.readline() or None)
        except EOFError:
            value = None
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value)

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()
    return await line


async def _turn(gateway: Gateway, adapter: TerminalAdapter, text: str) -> bool:
    """Send one line and wait until its answer is printed; whether it was accepted and (for a run) completed."""
    assert gateway.store is not None and gateway.router is not None
    accepted, answered = await adapter.say(text)
    if accepted is None or answered is None:
        err("(the gateway did not take that message)")
        return False
    run_id = accepted.run_id
    try:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answered), 1.0)
                break
            # A run stopped elsewhere (``/stop`` from another terminal) finishes without an answer.
            run = await gateway.store.get_run(run_id) if run_id else None
            if run is not None and run.status in _FINISHED and not any(
                    part.status == "pending" for part in await gateway.store.outbox_rows(run_id)):
                break
    except asyncio.CancelledError:  # Ctrl-C: the run is stopped, as /stop would, not left to resume
        await gateway.router.stop_session(f"cli:dm:{adapter.user}")
        raise
    run = await gateway.store.get_run(run_id) if run_id else None
    return run is None or run.status == "completed"


async def _repl(gateway: Gateway, adapter: TerminalAdapter) -> int:
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 - line editing and history for input()
        err(f"chatting as {adapter.user} (session cli:dm:{adapter.user}); /new starts over, /help lists commands, "
            "/exit or Ctrl-D quits")
    while (line := await _read_line("you> " if interactive else None)) is not None:
        text = line.strip()
        if text in EXIT_COMMANDS:
            break
        if text:
            await _turn(gateway, adapter, text)
    return 0


async def _chat(cfg: Config, user: str, message: str | None) -> int:
    import model_tools
    from gateway.app import Gateway
    from platforms.terminal import TerminalAdapter

    adapter = TerminalAdapter(user, sys.stdout)
    gateway = Gateway(cfg, {"cli": adapter}, local=True)
    model_tools.register_hook("pre_tool_call", _show_tool_call)
    try:
        await gateway.start()
        if message is not None:
            return 0 if await _turn(gateway, adapter, message) else 1
        return await _repl(gateway, adapter)
    finally:
        model_tools.unregister_hook("pre_tool_call", _show_tool_call)
        await gateway.stop(drain_timeout=0)


def _cmd_chat(args: argparse.Namespace) -> int:
    from toolsets import SOURCE_PREFIXES, TOOLSETS, validate_toolset

    toolsets = args.toolset or list(DEFAULT_TOOLSETS)
    unknown = [n for n in toolsets if not validate_toolset(n) and not n.startswith(SOURCE_PREFIXES)]
    if unknown:
        raise CliError(f"unknown toolset {unknown[0]!r}; known: {', '.join(sorted(TOOLSETS))}", 2)
    args.log_level = args.log_level or "WARNING"  # the gateway's start-up lines would bury the conversation
    cfg = load(args)
    user = args.user or getpass.getuser()
    return asyncio.run(_chat(_chat_config(cfg, user, toolsets), user, args.message))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``chat``."""
    chat = sub.add_parser(
        "chat", parents=[config_parent()], help="talk to the agent from the terminal",
        description="Talk to the agent through the gateway's own inbox, runs, tools, sandbox and store, as the "
                    "session cli:dm:USER (history is kept across invocations; /new starts over). Without -m, read "
                    "lines until EOF or /exit. Tool calls are shown on stderr as they start.")
    chat.add_argument("-m", "--message", help="send one message, print the answer and exit (1 if the run failed)")
    chat.add_argument("--user", help="your name in the session (default: your login name)")
    chat.add_argument("--toolset", action="append", metavar="NAME",
                      help=f"toolset for the runs, repeatable (default: {', '.join(DEFAULT_TOOLSETS)}: the chat "
                           "platforms' tools without cronjob)")
    chat.set_defaults(func=_cmd_chat)
