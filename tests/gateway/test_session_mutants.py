"""Session rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/session.py`` it
kills. Driven by events, no sleeps."""

from __future__ import annotations

import asyncio

import pytest

from gateway.session import SessionLanes, background_session_key, chat_session_of, session_key
from platforms.base import SessionSource


def test_group_sessions_are_per_user_by_default() -> None:
    """Kills session_key's ``per_user_in_groups: bool = False`` (one shared session for a whole group)."""
    source = SessionSource(platform="telegram", chat_id="-100", chat_type="group", user_id="7")
    assert session_key(source) == "telegram:group:-100:7"


async def test_the_second_item_of_a_lane_can_be_stopped_too() -> None:
    """Kills _drain's ``lane.current, lane.stopping = None, True`` (after one /stop, every later item of the
    session would ignore /stop)."""
    lanes = SessionLanes()
    started = [asyncio.Event(), asyncio.Event()]
    cancelled: list[int] = []

    def item(i: int):
        async def work() -> None:
            started[i].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(i)
                raise
        return work

    lanes.submit("s", item(0))
    lanes.submit("s", item(1))
    await asyncio.wait_for(started[0].wait(), 5)
    assert lanes.cancel_current("s")
    await asyncio.wait_for(started[1].wait(), 5)
    assert lanes.cancel_current("s")
    assert await lanes.wait_idle(5)
    assert cancelled == [0, 1]


async def test_shutdown_stops_lanes_waits_for_their_cleanup_and_refuses_new_work() -> None:
    """Kills shutdown's ``_closed = None`` / ``False`` (a cancelled lane would go on to its queued items, and
    submit would still accept work), ``gather(return_exceptions=None / False / left out)`` (shutdown would raise
    the workers' CancelledError) and ``gather(return_exceptions=True)`` without the workers (it would return
    before their cleanup ran)."""
    lanes = SessionLanes()
    running = asyncio.Event()
    events: list[str] = []

    async def first() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that takes a loop turn
            events.append("first cleaned up")

    async def queued() -> None:
        events.append("queued item ran")

    lanes.submit("s", first)
    lanes.submit("s", queued)
    await asyncio.wait_for(running.wait(), 5)
    await asyncio.wait_for(lanes.shutdown(), 5)
    assert events == ["first cleaned up"]
    with pytest.raises(RuntimeError):
        lanes.submit("s", queued)
    await asyncio.sleep(0.05)
    assert events == ["first cleaned up"]


# -- found by the run of 2026-12-04 ----------------------------------------------------------------------------

def test_a_background_tasks_session_belongs_to_its_chat() -> None:
    """Kills chat_session_of's ``... and session``, ``[1]``, the separator misspelt or in capitals (a background
    task's session taken for a chat of its own: its answer, /stop and /status would miss the chat) and
    ``partition`` (the last ``:bg:`` marks the task, whatever the chat's key holds)."""
    chat = "telegram:group:-100:7"
    assert chat_session_of(background_session_key(chat, "t1")) == chat
    assert chat_session_of(chat) == chat
    nested = background_session_key(background_session_key(chat, "t1"), "t2")
    assert chat_session_of(nested) == background_session_key(chat, "t1")


async def test_an_item_submitted_first_runs_before_those_waiting() -> None:
    """Kills submit's ``lane.queue.appendleft(None)`` (the lane's worker fails on the item and drops the rest)."""
    lanes, ran, release = SessionLanes(), [], asyncio.Event()

    def item(name: str, wait: bool = False):
        async def work() -> None:
            ran.append(name)
            if wait:
                await release.wait()
        return work

    lanes.submit("s", item("running", wait=True))
    while not ran:  # the worker has taken the first item
        await asyncio.sleep(0)
    lanes.submit("s", item("queued"))
    lanes.submit("s", item("urgent"), first=True)
    release.set()
    assert await lanes.wait_idle(5)
    assert ran == ["running", "urgent", "queued"]


async def test_shutdown_returns_once_the_lanes_have_stopped() -> None:
    """Kills shutdown's ``asyncio.gather(return_exceptions=True)`` without the workers (shutdown would return
    while an item is still cleaning up, after the gateway closed the store it writes to)."""
    lanes, started, cleaned = SessionLanes(), asyncio.Event(), []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            cleaned.append("work")

    lanes.submit("s", work)
    await asyncio.wait_for(started.wait(), 5)
    await lanes.shutdown()
    assert cleaned == ["work"] and lanes.active == 0


async def test_stop_before_the_lane_has_started_its_first_item() -> None:
    """A /stop that lands right after a message was submitted, before the lane's worker took it: nothing is
    running yet, so nothing is stopped (and the item then runs).

    Kills cancel_current's ``lane.current is None and lane.current.done()`` (None.done() raises)."""
    lanes, ran = SessionLanes(), []

    async def work() -> None:
        ran.append("work")

    lanes.submit("s", work)
    assert lanes.cancel_current("s") is False
    assert await lanes.wait_idle(5) and ran == ["work"]
