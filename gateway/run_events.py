"""Live events of the runs executing in this process, for the HTTP API (gateway/api).

``RunExecutor`` opens a channel when a run starts and publishes to it: ``started``, ``text`` (a model turn's
redacted text as it streams, as deltas), ``tool`` (a tool call as it starts, from the ``pre_tool_call`` hook on a
worker thread) and ``finished`` (once the completion is stored). A subscriber gets what the channel published
so far, then what follows. Nothing here is stored: ``follow`` falls back on the store, so a run finished before
anyone listened, or executed by another replica, still ends its stream.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import model_tools
from gateway.logs import redactor
from gateway.store import FINAL_RUN_STATES, Store
from gateway.tool_progress import describe_call

POLL_SECONDS = 1.0  # how often a follower looks at the store when no event comes


@dataclass(slots=True, frozen=True)
class RunEvent:
    """One event of a run: ``type`` is started, text, tool or finished."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


class RunChannel:
    """The events of one run: published on the event loop (or handed to it from a tool thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: list[RunEvent] = []
        self.queues: list[asyncio.Queue[RunEvent]] = []
        self.opened = False  # False: subscribers wait for a run that has not started here (yet)
        self._raw = ""  # the current model turn's text as the model wrote it
        self._sent = ""  # what of it went out (redacted)
        self._turn = 0

    def publish(self, event: RunEvent) -> None:
        """Record and hand out one event (on the event loop)."""
        self.events.append(event)
        for queue in self.queues:
            queue.put_nowait(event)

    async def text(self, full: str) -> None:
        """The agent's ``on_text`` hook: the current model turn's text so far, published as redacted deltas
        (a text that does not continue the last one is the next turn's)."""
        if not full.startswith(self._raw):
            self._turn, self._sent = self._turn + 1, ""
        self._raw = full
        safe = redactor.redact_unfinished(full)
        if safe.startswith(self._sent) and len(safe) > len(self._sent):
            delta, self._sent = safe[len(self._sent):], safe
            self.publish(RunEvent("text", {"turn": self._turn, "delta": delta}))


class RunEventHub:
    """The channels of the runs executing here, by run id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, RunChannel] = {}

    def _channel(self, run_id: str) -> RunChannel:
        with self._lock:
            if not self._channels:
                model_tools.register_hook("pre_tool_call", self._on_call)
            return self._channels.setdefault(run_id, RunChannel(asyncio.get_running_loop()))

    def _drop(self, run_id: str) -> RunChannel | None:
        with self._lock:
            channel = self._channels.pop(run_id, None)
            if channel is not None and not self._channels:
                model_tools.unregister_hook("pre_tool_call", self._on_call)
        return channel

    def open(self, run_id: str, kind: str) -> RunChannel:
        """A run starts: its channel, with ``started`` published."""
        channel = self._channel(run_id)
        channel.opened = True
        channel.publish(RunEvent("started", {"run_id": run_id, "kind": kind}))
        return channel

    def finish(self, run_id: str, status: str, result: str | None) -> None:
        """The run's completion is stored: publish ``finished`` and close its channel."""
        channel = self._drop(run_id)
        if channel is not None:
            channel.publish(RunEvent("finished", {"status": status, "result": result}))

    def subscribe(self, run_id: str) -> asyncio.Queue[RunEvent]:
        """A queue with the run's events so far and those to come (a run not started yet: all of them)."""
        channel = self._channel(run_id)
        queue: asyncio.Queue[RunEvent] = asyncio.Queue()
        for event in channel.events:
            queue.put_nowait(event)
        channel.queues.append(queue)
        return queue

    def unsubscribe(self, run_id: str, queue: asyncio.Queue[RunEvent]) -> None:
        """Stop handing events to ``queue``."""
        with self._lock:
            channel = self._channels.get(run_id)
        if channel is not None and queue in channel.queues:
            channel.queues.remove(queue)
            if not channel.opened and not channel.queues:  # nobody waits for it any more
                self._drop(run_id)

    def _on_call(self, name: str, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> None:
        with self._lock:
            channel = self._channels.get(ctx.get("run_id") or "")
        if channel is not None:  # on a tool thread: the line is built (and redacted) here, published on the loop
            event = RunEvent("tool", {"name": name, "line": describe_call(name, args, False)})
            channel.loop.call_soon_threadsafe(channel.publish, event)


run_events = RunEventHub()


async def follow(store: Store, run_id: str, hub: RunEventHub = run_events) -> AsyncIterator[RunEvent]:
    """The run's events until it ends, ``finished`` last (built from the store when no channel here says it:
    a run that ended before, or runs on another replica)."""
    queue = hub.subscribe(run_id)
    try:
        while True:
            row = await store.get_run(run_id)
            if row is None or row.status in FINAL_RUN_STATES:
                # Events still queued came before the end was stored: hand them out first.
                while not queue.empty():
                    event = queue.get_nowait()
                    yield event
                    if event.type == "finished":
                        return
                yield RunEvent("finished", {"status": row.status if row else "unknown",
                                            "result": row.result if row else None})
                return
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), POLL_SECONDS)
                except TimeoutError:
                    break
                yield event
                if event.type == "finished":
                    return
    finally:
        hub.unsubscribe(run_id, queue)
