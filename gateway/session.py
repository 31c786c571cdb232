"""Session keys and per-session serial execution.

Keys follow Hermes: ``<platform>:dm:<chat>[:<thread>]`` for direct messages and
``<platform>:group:<chat>[:<thread>][:<user>]`` for groups (one session per user
by default). Work for one session runs strictly one item at a time, in order; a
session's worker task exists only while it has work, so idle sessions cost nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from platforms.base import SessionSource

logger = logging.getLogger(__name__)


def session_key(source: SessionSource, per_user_in_groups: bool = True) -> str:
    """The session a message belongs to."""
    if source.chat_type == "dm":
        parts = [source.platform, "dm", source.chat_id]
        if source.thread_id:
            parts.append(source.thread_id)
    else:
        parts = [source.platform, "group", source.chat_id]
        if source.thread_id:
            parts.append(source.thread_id)
        if per_user_in_groups and source.user_id:
            parts.append(source.user_id)
    return ":".join(parts)


def background_session_key(chat_session: str, task: str) -> str:
    """The session of a chat's background task (``/background``): its own, so the chat goes on meanwhile."""
    return f"{chat_session}:bg:{task}"


def chat_session_of(session: str) -> str:
    """The chat session a background task's session belongs to (any other session is its own)."""
    return session.rpartition(":bg:")[0] or session


Work = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class _Lane:
    queue: deque[Work] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    current: asyncio.Task[None] | None = None
    # Set once the running item was cancelled: a second cancel would land in its cleanup
    # (recording the cancellation) and leave the run unfinished.
    stopping: bool = False


class SessionLanes:
    """Runs submitted work serially per session key; sessions run concurrently with each other."""

    def __init__(self) -> None:
        self._lanes: dict[str, _Lane] = {}
        self._closed = False

    def submit(self, key: str, work: Work, *, first: bool = False) -> None:
        """Queue ``work`` behind whatever the session is already doing (``first``: ahead of what waits)."""
        if self._closed:
            raise RuntimeError("session lanes are shut down")
        lane = self._lanes.setdefault(key, _Lane())
        if first:
            lane.queue.appendleft(work)
        else:
            lane.queue.append(work)
        if lane.worker is None:
            lane.worker = asyncio.create_task(self._drain(key, lane), name=f"session:{key}")

    async def _drain(self, key: str, lane: _Lane) -> None:
        try:
            while lane.queue:
                work = lane.queue.popleft()
                lane.current = asyncio.create_task(work(), name=f"work:{key}")
                try:
                    await lane.current
                except asyncio.CancelledError:
                    if self._closed:
                        raise
                    # the item was cancelled (/stop or interrupt); the lane goes on
                except Exception:
                    logger.exception("work for session %s failed", key)
                finally:
                    lane.current, lane.stopping = None, False
        finally:
            lane.worker = None
            if not lane.queue and self._lanes.get(key) is lane:
                del self._lanes[key]

    def is_busy(self, key: str) -> bool:
        """Whether the session has an item running."""
        lane = self._lanes.get(key)
        return lane is not None and lane.current is not None

    def queued(self, key: str) -> int:
        """Items waiting behind the running one."""
        lane = self._lanes.get(key)
        return len(lane.queue) if lane else 0

    def cancel_current(self, key: str) -> bool:
        """Cancel the running item of a session (the queue goes on); returns whether one was running.

        Cancelling an item that is already stopping is a no-op (still True).
        """
        lane = self._lanes.get(key)
        if lane is None or lane.current is None or lane.current.done():
            return False
        if not lane.stopping:
            lane.stopping = True
            lane.current.cancel()
        return True

    @property
    def closed(self) -> bool:
        """Whether the lanes were shut down (nothing more may be submitted)."""
        return self._closed

    @property
    def active(self) -> int:
        """Number of sessions with work."""
        return len(self._lanes)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no session has work, up to ``timeout``; returns whether idle."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._lanes and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return not self._lanes

    async def shutdown(self) -> None:
        """Cancel every lane (checkpointed work resumes from the inbox on the next start)."""
        self._closed = True
        workers = [lane.worker for lane in self._lanes.values() if lane.worker]
        for worker in workers:
            worker.cancel()
        for lane in self._lanes.values():
            if lane.current:
                lane.current.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._lanes.clear()
