"""Live tool progress: one status message per chat run, a line per tool call as it starts.

The tool pipeline's ``pre_tool_call`` hook (the one the ``chat`` CLI prints its ``→ tool(...)`` lines from) is
called on tool worker threads; the line is built and redacted there and handed to the run's ``ToolProgress`` on
the event loop, which sends the message once and edits it at most every ``interval`` seconds (longer when the
platform asks for a ``retry_after``). At the end the message is collapsed to one line, deleted or kept.
Progress is best-effort: a failed send or edit is logged and never fails or delays the run's answer, and
nothing of it is stored, so a run redone after a crash starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol, cast, get_args

import model_tools
from gateway.config import Config
from gateway.config.platforms import ChatPlatform, ToolProgressDone, ToolProgressMode
from gateway.logs import redactor
from platforms.base import BasePlatformAdapter, SendResult
from tools.registry import registry

logger = logging.getLogger(__name__)

MODES: tuple[ToolProgressMode, ...] = get_args(ToolProgressMode)
SUMMARY_CHARS = 60
VERBOSE_CHARS = 400
DEFAULT_EMOJI = "🔧"
FINISH_TIMEOUT = 5.0  # seconds an edit in flight may hold up the end of a run
_SPACES = re.compile(r"\s+")
_BACKTICKS = re.compile(r"`+")


def _cut(text: str, limit: int) -> str:
    """``text`` on one line, redacted, then cut to ``limit`` characters (redacted first: a cut secret could slip)."""
    text = redactor(_SPACES.sub(" ", text).strip())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _code(text: str) -> str:
    """``text`` as a Markdown code span, so the platform shows it as written (a glob's ``*`` is no emphasis)."""
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def describe_call(name: str, args: Mapping[str, Any], verbose: bool) -> str:
    """One progress line: ``<emoji> <tool>: <argument summary>`` (the argument values, or all arguments as JSON
    when ``verbose``), redacted and cut."""
    entry = registry.get(name)
    emoji = entry.emoji if entry is not None and entry.emoji else DEFAULT_EMOJI
    if verbose:
        shown = _cut(json.dumps(dict(args), ensure_ascii=False, default=str), VERBOSE_CHARS)
    else:
        shown = _cut(", ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
                               for v in args.values()), SUMMARY_CHARS)
    return f"{emoji} {name}: {_code(shown)}" if shown else f"{emoji} {name}"


class Destination(Protocol):
    """Where a run answers (``gateway.runs.Target``)."""

    chat_id: str
    thread_id: str | None
    reply_to: str | None


def platform_settings(cfg: Config, platform: str) -> ChatPlatform | None:
    """The progress settings of a chat platform; None for others (webhook, cron, the terminal)."""
    settings = getattr(cfg.platforms, platform, None)
    return settings if isinstance(settings, ChatPlatform) else None


def mode_for(cfg: Config, platform: str, chosen: str | None) -> ToolProgressMode:
    """The progress mode of a session: its ``/verbose`` choice (stored in its settings), else its platform's
    ``tool_progress``."""
    if chosen in MODES:
        return cast(ToolProgressMode, chosen)
    settings = platform_settings(cfg, platform)
    return settings.tool_progress if settings is not None else "off"


class ToolProgress:
    """One run's status message: the lines of its tool calls, sent once the run has used tools for ``delay``
    seconds, then edited at most every ``interval`` seconds."""

    def __init__(self, adapter: BasePlatformAdapter, chat_id: str, metadata: Mapping[str, str],
                 reply_to: str | None, mode: ToolProgressMode, done: ToolProgressDone, delay: float,
                 interval: float) -> None:
        self.adapter = adapter
        self.chat_id = chat_id
        self.metadata = dict(metadata)
        self.reply_to = reply_to
        self.mode = mode
        self.done = done
        self.delay = delay
        self.interval = interval
        self.message_id: str | None = None
        self._loop = asyncio.get_running_loop()
        self._names: list[str] = []
        self._lines: list[str] = []
        self._shown = ""
        self._next_at = 0.0
        self._flusher: asyncio.Task[None] | None = None
        self._sleeping = False
        self._closed = False

    def on_call(self, name: str, args: Mapping[str, Any]) -> None:
        """Called on a tool worker thread as a call starts: build its line there, show it from the loop."""
        line = describe_call(name, args, self.mode == "verbose")
        self._loop.call_soon_threadsafe(self._add, name, line)

    def _add(self, name: str, line: str) -> None:
        if self._closed:  # a call that started as the run ended
            return
        if not self._names:  # the first call: the message appears if the run still works after the delay
            self._next_at = time.monotonic() + self.delay
        repeated = bool(self._names) and self._names[-1] == name
        self._names.append(name)
        if self.mode == "new" and repeated:
            return
        self._lines.append(line)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        """Show the latest lines, no sooner than the edit interval (or the platform's retry_after) allows."""
        while not self._closed and (text := self._text()) != self._shown:
            if (delay := self._next_at - time.monotonic()) > 0:
                self._sleeping = True
                try:
                    await asyncio.sleep(delay)
                finally:
                    self._sleeping = False
                text = self._text()
            result = await self._show(text)
            wait = result.retry_after if result.retry_after else self.interval
            self._next_at = time.monotonic() + wait
            if result.success or not result.retry_after:  # a failure without a hint is not tried again as is
                self._shown = text

    def _text(self) -> str:
        """The lines, the oldest left out (and counted) while they do not fit one message."""
        lines, text = self._lines, "\n".join(self._lines)
        while len(lines) > 1 and self.adapter.length_fn(text) > self.adapter.max_message_length:
            lines = lines[len(lines) // 4 + 1:]
            text = f"… {len(self._lines) - len(lines)} earlier\n" + "\n".join(lines)
        return text

    async def _show(self, text: str) -> SendResult:
        try:
            if self.message_id is None:
                result = await self.adapter.send(self.chat_id, text, reply_to=self.reply_to, metadata=self.metadata)
                self.message_id = result.message_id if result.success else None
            else:
                result = await self.adapter.edit_message(self.chat_id, self.message_id, text, self.metadata)
        except Exception as exc:  # progress never fails the run
            result = SendResult(False, error=repr(exc))
        if not result.success:
            logger.info("tool progress in %s:%s failed: %s", self.adapter.name, self.chat_id, result.error)
        return result

    async def finish(self) -> None:
        """End the status message: an edit in flight is awaited briefly, a pending one dropped; then collapse it to
        one line, delete it (where the platform can, else collapse) or leave the lines."""
        self._closed = True
        if self._flusher is not None:
            if self._sleeping:
                self._flusher.cancel()
            await asyncio.wait({self._flusher}, timeout=FINISH_TIMEOUT / 2)
            self._flusher.cancel()
        if self.message_id is None:
            return
        if self.done == "delete" and self.adapter.can_delete:
            try:
                result = await self.adapter.delete_message(self.chat_id, self.message_id, self.metadata)
            except Exception as exc:
                result = SendResult(False, error=repr(exc))
            if not result.success:
                logger.info("tool progress in %s:%s not deleted: %s", self.adapter.name, self.chat_id, result.error)
            return
        text = self._text() if self.done == "keep" else self.summary()
        if text != self._shown:
            await self._show(text)

    def summary(self) -> str:
        """The collapsed line: ``🔧 2 tools: search_files, read_file`` (each tool named once)."""
        count = len(self._names)
        return f"{DEFAULT_EMOJI} {count} tool{'s' if count != 1 else ''}: {', '.join(dict.fromkeys(self._names))}"


class _Hub:
    """Routes the ``pre_tool_call`` hook to the progress of the run making the call (by ``run_id``); the hook is
    registered only while some run is watched."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, ToolProgress] = {}

    def watch(self, run_id: str, progress: ToolProgress) -> None:
        with self._lock:
            if not self._runs:
                model_tools.register_hook("pre_tool_call", self._on_call)
            self._runs[run_id] = progress

    def unwatch(self, run_id: str) -> None:
        with self._lock:
            if self._runs.pop(run_id, None) is not None and not self._runs:
                model_tools.unregister_hook("pre_tool_call", self._on_call)

    def _on_call(self, name: str, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> None:
        with self._lock:
            progress = self._runs.get(ctx.get("run_id") or "")
        if progress is not None:
            progress.on_call(name, args)


_hub = _Hub()


def start_progress(cfg: Config, run_id: str, adapter: BasePlatformAdapter, target: Destination,
                   chosen: str | None = None) -> ToolProgress | None:
    """The progress of a chat run, watching its tool calls (``chosen``: the session's ``/verbose`` mode); None
    when the mode is off or the platform cannot edit messages. Call ``stop_progress`` when the run ends."""
    settings = platform_settings(cfg, adapter.name)
    mode = mode_for(cfg, adapter.name, chosen)
    if settings is None or mode == "off" or not adapter.can_edit:
        return None
    meta = {"thread_id": target.thread_id} if target.thread_id else {}
    progress = ToolProgress(adapter, target.chat_id, meta, target.reply_to, mode, settings.tool_progress_done,
                            settings.tool_progress_delay, cfg.gateway.stream_edit_interval)
    _hub.watch(run_id, progress)
    return progress


async def stop_progress(run_id: str, progress: ToolProgress) -> None:
    """Stop watching the run's tool calls and end its status message (within ``FINISH_TIMEOUT``)."""
    _hub.unwatch(run_id)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(progress.finish(), FINISH_TIMEOUT)
