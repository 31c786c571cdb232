"""The outbox sender against the real store and a scripted platform double."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from gateway.metrics import Metrics
from gateway.outbox import CLAIM_TTL_SECONDS, MAX_ATTEMPTS, MAX_BACKOFF_SECONDS, OutboxSender, backoff_delay
from gateway.store import Claim, OutboxPart, OutboxRow, Store
from platforms.base import AdapterState, BasePlatformAdapter, OnMessage, SendResult

RETRY = SendResult(success=False, error="429 too many requests", retryable=True, retry_after=0.01)
GONE = SendResult(success=False, error="chat not found")


@dataclass(slots=True)
class _Call:
    kind: str  # "send" or "edit"
    chat_id: str
    delivery_id: str
    text: str
    metadata: dict[str, str]
    at: float
    ok: bool


Outcome = SendResult | Exception


class _Platform(BasePlatformAdapter):
    """A chat platform double: every attempt is logged; ``script`` maps "send:<delivery id>" or
    "edit:<delivery id>" to the outcomes of its next attempts (then success); ``gate`` holds attempts
    (``entered`` lists attempts begun, held or not)."""

    name = "telegram"
    max_message_length = 4096
    can_edit = True

    def __init__(self, jitter: Callable[[], float] = lambda: 0.0) -> None:
        super().__init__()
        self.calls: list[_Call] = []
        self.entered: list[str] = []
        self.script: dict[str, list[Outcome]] = {}
        self.gate: dict[str, asyncio.Event] = {}
        self.jitter = jitter
        self._ids = 0
        self._changed = asyncio.Event()

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        self._set_state(AdapterState.CONNECTED)

    async def disconnect(self) -> None:
        self._set_state(AdapterState.DISCONNECTED)

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        return await self._attempt("send", chat_id, content, metadata)

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        return await self._attempt("edit", chat_id, content, metadata, message_id)

    async def _attempt(self, kind: str, chat_id: str, content: str, metadata: Mapping[str, str] | None,
                       message_id: str | None = None) -> SendResult:
        meta = dict(metadata or {})
        delivery_id = meta["delivery_id"]
        self.entered.append(delivery_id)
        self._changed.set()
        if delivery_id in self.gate:
            await asyncio.wait_for(self.gate[delivery_id].wait(), 5)
        if (delay := self.jitter()) > 0:
            await asyncio.sleep(delay)
        outcomes = self.script.get(f"{kind}:{delivery_id}")
        outcome = outcomes.pop(0) if outcomes else None
        call = _Call(kind, chat_id, delivery_id, content, meta, time.monotonic(), outcome is None)
        self.calls.append(call)
        self._changed.set()
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is not None:
            return outcome
        self._ids += 1
        return SendResult(success=True, message_id=message_id or f"m{self._ids}")

    def delivered(self, chat_id: str | None = None) -> list[str]:
        """Delivery ids confirmed, in order."""
        return [c.delivery_id for c in self.calls if c.ok and (chat_id is None or c.chat_id == chat_id)]

    def attempts(self, delivery_id: str) -> list[_Call]:
        """Every attempt at one part."""
        return [c for c in self.calls if c.delivery_id == delivery_id]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate`` holds after some attempt."""
        async def _wait() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(_wait(), timeout)


@asynccontextmanager
async def _running(store: Store, platform: _Platform) -> AsyncIterator[OutboxSender]:
    sender = OutboxSender(store, {platform.name: platform}, Metrics())
    sender.start()
    try:
        yield sender
    finally:
        await sender.stop()


@asynccontextmanager
async def _waking(sender: OutboxSender) -> AsyncIterator[None]:
    """Wake the sender every millisecond, so scans keep overlapping deliveries in flight."""
    async def _waker() -> None:
        while True:
            sender.wake()
            await asyncio.sleep(0.001)
    waker = asyncio.create_task(_waker())
    try:
        yield
    finally:
        waker.cancel()


def _parts(chat_id: str, n: int, *, run: str | None = None, edit_first: str | None = None,
           thread_id: str | None = None, platform: str = "telegram") -> list[OutboxPart]:
    run_id = run or f"run-{chat_id}"
    return [OutboxPart(f"{run_id}:{i}", platform, chat_id, f"{chat_id} part {i}", thread_id=thread_id,
                       edit_message_id=edit_first if i == 0 else None, part_index=i, parts_total=n, run_id=run_id)
            for i in range(n)]


async def _rows(store: Store) -> dict[str, OutboxRow]:
    return {r.dedupe_key: r for r in await store.outbox_rows()}


async def _settled(store: Store, sender: OutboxSender) -> dict[str, OutboxRow]:
    assert await sender.flush(5), "the outbox drained"
    return await _rows(store)


async def test_a_retry_holds_back_its_chat_while_other_chats_proceed(store: Store) -> None:
    platform = _Platform()
    platform.script["send:run-A:0"] = [SendResult(success=False, error="429", retryable=True, retry_after=0.3)]
    await store.enqueue(_parts("A", 3, thread_id="t9"))
    await store.enqueue(_parts("B", 3))
    async with _running(store, platform) as sender:
        await platform.wait_for(lambda: len(platform.delivered("B")) == 3)
        assert platform.delivered("A") == [], "A's later parts wait behind its retrying first part"
        rows = await _settled(store, sender)
    assert platform.delivered("A") == ["run-A:0", "run-A:1", "run-A:2"]
    assert [c.delivery_id for c in platform.calls if c.chat_id == "A"] == [
        "run-A:0", "run-A:0", "run-A:1", "run-A:2"]
    first, second = platform.attempts("run-A:0")
    assert second.at - first.at >= 0.3, "retry_after honoured"
    assert second.metadata == {"delivery_id": "run-A:0", "run_id": "run-A", "part_index": "0",
                               "parts_total": "3", "thread_id": "t9"}
    assert {k: (r.status, r.attempts) for k, r in rows.items() if k.startswith("run-A")} == {
        "run-A:0": ("sent", 2), "run-A:1": ("sent", 1), "run-A:2": ("sent", 1)}


async def test_non_retryable_failure_marks_failed_and_moves_on(store: Store) -> None:
    platform = _Platform()
    platform.script["send:run-A:0"] = [GONE]
    await store.enqueue(_parts("A", 2))
    async with _running(store, platform) as sender:
        rows = await _settled(store, sender)
    assert len(platform.attempts("run-A:0")) == 1
    assert (rows["run-A:0"].status, rows["run-A:0"].last_error) == ("failed", "chat not found")
    assert rows["run-A:1"].status == "sent" and platform.delivered() == ["run-A:1"]


async def test_adapter_exception_is_retried(store: Store) -> None:
    platform = _Platform()
    platform.script["send:run-A:0"] = [ConnectionResetError("peer went away")]
    await store.enqueue(_parts("A", 1))
    async with _running(store, platform) as sender:
        row = await _row_when(store, "run-A:0", lambda r: r.status == "sent")
        assert await sender.flush(1)
    assert len(platform.attempts("run-A:0")) == 2 and row.attempts == 2


async def _row_when(store: Store, key: str, predicate: Callable[[OutboxRow], bool]) -> OutboxRow:
    async def _poll() -> OutboxRow:
        while not predicate(row := (await _rows(store))[key]):
            await asyncio.sleep(0.02)
        return row
    return await asyncio.wait_for(_poll(), 5)


async def test_part_without_an_adapter_fails_without_blocking_others(store: Store) -> None:
    platform = _Platform()
    await store.enqueue(_parts("X", 1, platform="nowhere"))
    await store.enqueue(_parts("A", 1))
    async with _running(store, platform) as sender:
        rows = await _settled(store, sender)
    assert rows["run-X:0"].status == "failed" and "no adapter" in (rows["run-X:0"].last_error or "")
    assert platform.delivered() == ["run-A:0"]


@pytest.mark.parametrize(("edit_outcomes", "kinds", "message_id"), [
    ([], ["edit"], "preview-1"),
    ([GONE], ["edit", "send"], "m1"),
    ([RETRY], ["edit", "edit"], "preview-1"),
])
async def test_part_zero_edits_the_preview(store: Store, edit_outcomes: list[SendResult], kinds: list[str],
                                           message_id: str) -> None:
    platform = _Platform()
    platform.script["edit:run-A:0"] = list(edit_outcomes)
    await store.enqueue(_parts("A", 2, edit_first="preview-1"))
    async with _running(store, platform) as sender:
        rows = await _settled(store, sender)
    assert [c.kind for c in platform.attempts("run-A:0")] == kinds
    assert [c.kind for c in platform.attempts("run-A:1")] == ["send"]
    assert rows["run-A:0"].status == "sent" and rows["run-A:0"].platform_message_id == message_id


async def test_gives_up_after_max_attempts(store: Store) -> None:
    platform = _Platform()
    chats = [f"c{i}" for i in range(8)]
    for chat in chats:
        platform.script[f"send:run-{chat}:0"] = [RETRY] * (MAX_ATTEMPTS + 3)
        await store.enqueue(_parts(chat, 2))
    async with _running(store, platform) as sender, _waking(sender):  # scans racing the retries
        rows = await _settled(store, sender)
    for chat in chats:
        assert len(platform.attempts(f"run-{chat}:0")) == MAX_ATTEMPTS
        assert (rows[f"run-{chat}:0"].status, rows[f"run-{chat}:0"].attempts) == ("failed", MAX_ATTEMPTS)
        assert platform.delivered(chat) == [f"run-{chat}:1"]


async def test_restart_sends_pending_parts_and_never_resends_sent_ones(store: Store) -> None:
    before = _Platform()
    before.gate["run-A:1"] = asyncio.Event()  # the process dies while this send is in flight
    before.script["send:run-B:0"] = [SendResult(success=False, error="429", retryable=True, retry_after=0.4)]
    await store.enqueue(_parts("A", 3))
    await store.enqueue(_parts("B", 1))
    async with _running(store, before):
        await before.wait_for(lambda: "run-A:1" in before.entered)
        await _row_when(store, "run-A:0", lambda r: r.status == "sent")
        await _row_when(store, "run-B:0", lambda r: r.attempts == 1)
    failed_at = before.attempts("run-B:0")[0].at
    assert {k: r.status for k, r in (await _rows(store)).items()} == {
        "run-A:0": "sent", "run-A:1": "pending", "run-A:2": "pending", "run-B:0": "pending"}

    after = _Platform()
    async with _running(store, after) as sender:
        rows = await _settled(store, sender)
    assert after.delivered("A") == ["run-A:1", "run-A:2"]
    assert after.delivered("B") == ["run-B:0"]
    in_doubt = {c.delivery_id for c in after.calls if c.metadata.get("in_doubt") == "1"}
    assert in_doubt == {"run-A:1"}, "only the part that was in flight when the sender died is in doubt"
    assert rows["run-A:1"].in_doubt == 1 and rows["run-A:2"].in_doubt == 0
    assert after.attempts("run-B:0")[0].at - failed_at >= 0.4, "the retry time survives the restart"
    assert all(r.status == "sent" for r in rows.values())


async def test_every_part_is_delivered_exactly_once_in_order_under_churn(store: Store) -> None:
    rng = random.Random(7)
    platform = _Platform(jitter=lambda: rng.choice((0.0, 0.0, 0.001, 0.003)))
    chats = [f"c{i}" for i in range(10)]
    for chat in chats:
        platform.script[f"send:run-{chat}-0:1"] = [RETRY]
    async with _running(store, platform) as sender, _waking(sender):
        for batch in range(3):  # new parts keep arriving while earlier ones are being sent
            for chat in chats:
                await store.enqueue(_parts(chat, 4, run=f"run-{chat}-{batch}"))
            await asyncio.sleep(0.01)
        rows = await _settled(store, sender)
    counts = Counter(platform.delivered())
    assert len(counts) == len(rows) == 120 and set(counts.values()) == {1}
    for chat in chats:
        expected = [f"run-{chat}-{b}:{i}" for b in range(3) for i in range(4)]
        assert platform.delivered(chat) == expected
    assert all(r.status == "sent" for r in rows.values())


async def test_a_scan_read_before_a_part_was_sent_does_not_send_it_again(store: Store,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan that read the store before a part was marked sent still lists it as pending, claimed by this very
    sender: the sender must remember the part as done for good. Driven step by step: the scans read what the
    test hands them, the send is awaited through the store's mark_sent, the clock stands still.

    Fails on the mutant ``self._done(lane, row, self.clock())`` for ``self._done(lane, row, float("inf"))`` in
    ``OutboxSender._drain`` (done only "until now": the stale scan puts the part back and it is sent twice)."""
    platform = _Platform()
    stored = await store.enqueue(_parts("A", 1), claim=Claim("me", CLAIM_TTL_SECONDS))
    assert stored is not None
    now = time.time()
    sender = OutboxSender(store, {platform.name: platform}, Metrics(), owner="me", clock=lambda: now,
                          scan_interval=3600)
    stale = await store.pending_outbox()  # a scan's read, taken before the part is sent
    assert [(r.status, r.claimed_by) for r in stale] == [("pending", "me")]

    reads: asyncio.Queue[list[OutboxRow]] = asyncio.Queue()
    scanned, sent = asyncio.Event(), asyncio.Event()

    async def scan_read(limit: int = 500) -> list[OutboxRow]:
        rows = await reads.get()
        scanned.set()  # the scan goes on to submit these before the test runs again
        return rows

    mark_sent = store.mark_sent

    async def marked_sent(outbox_id: int, platform_message_id: str | None) -> None:
        await mark_sent(outbox_id, platform_message_id)
        sent.set()  # the lane then forgets the part and ends before the test runs again

    monkeypatch.setattr(store, "pending_outbox", scan_read)
    monkeypatch.setattr(store, "mark_sent", marked_sent)
    sender.submit(stored)
    sender.start()
    try:
        await asyncio.wait_for(sent.wait(), 5)
        assert platform.delivered() == ["run-A:0"] and not sender.busy
        await reads.put(stale)
        await asyncio.wait_for(scanned.wait(), 5)
        assert not sender.busy, "the stale scan put the sent part back to be sent again"
    finally:
        await sender.stop()
    assert len(platform.calls) == 1 and (await _rows(store))["run-A:0"].status == "sent"


async def test_stop_is_prompt_when_a_wake_coincides_with_it(store: Store) -> None:
    sender = OutboxSender(store, {}, Metrics())
    sender.start()
    await asyncio.sleep(0.05)  # the sender is idle, waiting to be woken
    sender.wake()
    await asyncio.wait_for(sender.stop(), 2)


def test_backoff_honours_the_hint_and_grows_to_a_cap() -> None:
    assert backoff_delay(3, 7.5) == 7.5
    for attempts, base in ((1, 0.5), (2, 1.0), (4, 4.0)):
        assert 0.8 * base <= backoff_delay(attempts, None) <= 1.2 * base
        assert 0.8 * base <= backoff_delay(attempts, 0) <= 1.2 * base
    assert backoff_delay(50, None) <= 1.2 * MAX_BACKOFF_SECONDS


class _Callback(_Platform):
    name = "callback"
    ordered_per_chat = False


async def test_parts_of_different_runs_to_one_callback_target_do_not_wait_for_each_other(store: Store) -> None:
    platform = _Callback()
    platform.gate["run-1:0"] = asyncio.Event()  # run 1's delivery hangs
    for run in ("run-1", "run-2"):
        await store.enqueue([OutboxPart(f"{run}:{i}", "callback", "sink", f"{run} {i}", part_index=i, parts_total=2,
                                        run_id=run, lane=f"callback:sink:{run}") for i in range(2)])
    async with _running(store, platform) as sender:
        await platform.wait_for(lambda: platform.delivered() == ["run-2:0", "run-2:1"])
        assert "run-1:1" not in platform.entered, "run 1's second part still waits for its first"
        platform.gate["run-1:0"].set()
        rows = await _settled(store, sender)
    assert platform.delivered() == ["run-2:0", "run-2:1", "run-1:0", "run-1:1"]
    assert all(r.status == "sent" for r in rows.values())
