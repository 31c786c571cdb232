"""Reactions as status: the bot's reaction on a chat message shows where its run is.

received (accepted; behind a busy session it waits there) → working (its run started) → done, failed, or
cancelled (``/stop``: the reaction is removed unless ``reaction_emoji.cancelled`` names one). Each state replaces
the one before it, which follows from the state alone (working replaces received, an end replaces working), so
nothing is remembered across a restart or between replicas. The calls for one message are made in order, each
after the previous one answered; the end of a run waits for them (briefly), the rest happens in the background.
Reactions are best-effort: a failed call is logged and never fails or delays a run's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Literal, Protocol

from gateway.config import Config
from gateway.tool_progress import platform_settings
from platforms.base import BasePlatformAdapter, MessageEvent, SendResult

logger = logging.getLogger(__name__)

State = Literal["received", "working", "done", "failed", "cancelled"]
_BEFORE: dict[State, State | None] = {"received": None, "working": "received", "done": "working",
                                      "failed": "working", "cancelled": "working"}
_END_STATES: dict[str, State] = {"completed": "done", "failed": "failed", "cancelled": "cancelled"}
CALL_TIMEOUT = 10.0  # seconds one reaction call may take
FINISH_TIMEOUT = 5.0  # seconds the end of a run waits for its message's reactions


class ChatTarget(Protocol):
    """Where a chat run answers (``gateway.runs.Target``): ``reply_to`` is the user's message."""

    platform: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None


class Reactions:
    """The status reactions of one gateway's chat messages."""

    def __init__(self, cfg: Config, adapters: Mapping[str, BasePlatformAdapter]) -> None:
        self.cfg = cfg
        self.adapters = adapters
        self._last: dict[tuple[str, str, str], asyncio.Task[None]] = {}  # message -> its latest call
        self._tasks: set[asyncio.Task[None]] = set()

    def received(self, kind: str, event: MessageEvent) -> None:
        """A message was accepted for a run of ``kind`` (not started yet): for a chat run, it was received."""
        if kind == "chat":
            self._show(event.platform, event.chat_id, event.message_id, event.thread_id, "received")

    def working(self, kind: str, target: ChatTarget | None) -> None:
        """A run of ``kind`` started: for a chat run, its message's run is working."""
        if kind == "chat" and target is not None:
            self._show(target.platform, target.chat_id, target.reply_to, target.thread_id, "working")

    async def finished(self, kind: str, target: ChatTarget | None, status: str) -> None:
        """A run of ``kind`` ended with ``status`` (completed, failed, cancelled): for a chat run, show it on its
        message, waiting up to ``FINISH_TIMEOUT`` for the message's calls."""
        state = _END_STATES.get(status)
        if kind != "chat" or target is None or state is None:
            return
        task = self._show(target.platform, target.chat_id, target.reply_to, target.thread_id, state)
        if task is not None:
            await asyncio.wait({task}, timeout=FINISH_TIMEOUT)

    def _show(self, platform: str, chat_id: str, message_id: str | None, thread_id: str | None,
              state: State) -> asyncio.Task[None] | None:
        settings = platform_settings(self.cfg, platform)
        adapter = self.adapters.get(platform)
        if settings is None or not settings.reactions or adapter is None or not adapter.can_react or not message_id:
            return None
        emojis = settings.reaction_emoji
        emoji = getattr(emojis, state) or None
        before = _BEFORE[state]
        previous = getattr(emojis, before) if before is not None else None
        if emoji == previous:
            return None
        key = (platform, chat_id, message_id)
        meta = {"thread_id": thread_id} if thread_id else {}
        task = asyncio.create_task(self._call(adapter, chat_id, message_id, emoji, previous, meta,
                                              self._last.get(key)))
        self._last[key] = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(key, t))
        return task

    async def _call(self, adapter: BasePlatformAdapter, chat_id: str, message_id: str, emoji: str | None,
                    previous: str | None, meta: Mapping[str, str], after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait({after})
        try:
            result = await asyncio.wait_for(adapter.set_reaction(chat_id, message_id, emoji, previous, meta),
                                            CALL_TIMEOUT)
        except Exception as exc:  # a reaction never fails the run
            result = SendResult(False, error=repr(exc))
        if not result.success:
            logger.info("reaction %s on %s:%s:%s failed: %s", emoji or "removal", adapter.name, chat_id, message_id,
                        result.error)

    def _done(self, key: tuple[str, str, str], task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._last.get(key) is task:
            del self._last[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("reaction task failed", exc_info=exc)

    async def close(self) -> None:
        """Cancel the calls still waiting or in flight (shutdown)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
