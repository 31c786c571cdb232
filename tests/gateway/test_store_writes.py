"""Write transactions on SQLite: one writer at a time, urgent (ack path) writers first, cancellation-safe."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.store import NewRun, Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A store on a fresh SQLite file."""
    s = await Store.open(f"sqlite:///{tmp_path}/state.db")
    yield s
    await s.close()


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0)
    await asyncio.wait_for(wait(), timeout)


async def test_urgent_writer_goes_before_writers_queued_earlier(store: Store) -> None:
    order: list[str] = []
    release = asyncio.Event()

    async def holder() -> None:
        async with store.write():
            order.append("holder")
            await release.wait()

    async def writer(name: str, urgent: bool) -> None:
        async with store.write(urgent=urgent):
            order.append(name)

    held = asyncio.create_task(holder())
    await _until(lambda: order == ["holder"])
    normal = asyncio.create_task(writer("normal", urgent=False))
    await asyncio.sleep(0.01)
    urgent = asyncio.create_task(writer("urgent", urgent=True))
    await asyncio.sleep(0.01)
    assert order == ["holder"], "nobody enters while the gate is held"
    release.set()
    await asyncio.wait_for(asyncio.gather(held, normal, urgent), 5)
    assert order == ["holder", "urgent", "normal"]


async def test_accept_is_not_queued_behind_other_writes(store: Store) -> None:
    release = asyncio.Event()
    entered: list[str] = []

    async def slow_write(name: str) -> None:
        async with store.write():
            entered.append(name)
            await (release.wait() if name == "first" else asyncio.sleep(0.05))

    first = asyncio.create_task(slow_write("first"))
    await _until(lambda: entered == ["first"])
    later = [asyncio.create_task(slow_write(f"w{i}")) for i in range(5)]
    await asyncio.sleep(0.01)
    run = NewRun(uuid.uuid4().hex, "chat", "telegram", [], "hi")
    accept = asyncio.create_task(store.accept("telegram:1", "telegram", "chat", "telegram:dm:1", {}, run))
    await asyncio.sleep(0.01)
    release.set()
    acc = await asyncio.wait_for(accept, 5)
    assert not acc.duplicate
    # FIFO would have let all five 50 ms writers in first; at most the next one slipped in since.
    assert entered[0] == "first" and len(entered) <= 2
    await asyncio.wait_for(asyncio.gather(first, *later), 5)
    assert entered[1:] == [f"w{i}" for i in range(5)], "the others keep their order"


async def test_a_cancelled_waiter_does_not_block_the_gate(store: Store) -> None:
    release = asyncio.Event()
    done: list[str] = []

    async def holder() -> None:
        async with store.write():
            await release.wait()

    async def writer(name: str) -> None:
        async with store.write():
            done.append(name)

    held = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    doomed = asyncio.create_task(writer("doomed"))
    await asyncio.sleep(0.01)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    release.set()
    await asyncio.wait_for(held, 5)
    await asyncio.wait_for(writer("next"), 5)
    assert done == ["next"]


async def test_a_waiter_cancelled_as_it_is_handed_the_gate_passes_it_on(store: Store) -> None:
    release = asyncio.Event()
    done: list[str] = []
    tasks: dict[str, asyncio.Task[None]] = {}

    async def holder() -> None:
        async with store.write():
            await release.wait()
        tasks["a"].cancel()  # the gate was just handed to "a", which has not run yet

    async def writer(name: str) -> None:
        async with store.write():
            done.append(name)

    held = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    tasks["a"] = asyncio.create_task(writer("a"))
    await asyncio.sleep(0.01)
    tasks["b"] = asyncio.create_task(writer("b"))
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.wait_for(held, 5)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(tasks["a"], 5)
    await asyncio.wait_for(tasks["b"], 5)
    assert done == ["b"]
