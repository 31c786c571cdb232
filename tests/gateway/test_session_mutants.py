"""Session rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/session.py`` it
kills. Driven by events, no sleeps."""

from __future__ import annotations

import asyncio

import pytest

from gateway.session import SessionLanes, session_key
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
